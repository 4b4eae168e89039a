"""Build options: what a build targets and how it runs its tools."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kitdispatch.compile.archs import Arch, parse_arch_list
from kitdispatch.compile.compilers import COMPILE_TIMEOUT_S, CompileOptions
from kitdispatch.describe.choices import DEFAULT_COMPILER, DEFAULT_FORMAT, CompilerName, ObjectFormat
from kitdispatch.describe.limits import MAX_TIMEOUT_S
from kitdispatch.errors import UsageError
from kitdispatch.iree.tools import IREE_COMPILE_TIMEOUT_S
from kitdispatch.run.driver_ptx import Version

@dataclass(frozen=True)
class BuildOptions:
    """How to build: target architectures, compiler, object format and tool settings."""

    archs: tuple[Arch, ...]
    compiler: CompilerName = DEFAULT_COMPILER
    format: ObjectFormat = DEFAULT_FORMAT
    compile_options: CompileOptions = CompileOptions()
    codegen_target: str | None = None
    iree_flags: tuple[str, ...] = ()
    jobs: int | None = None
    # Oldest CUDA driver the build must load on (PTX ISA check); None: the local GPU's.
    min_driver: str | None = None
    # Link through IREE's compiler API in a worker (faster); False: always run iree-compile.
    iree_in_process: bool = True
    use_cache: bool = True
    cache_dir: str | None = None  # None: KITDISPATCH_CACHE_DIR, XDG_CACHE_HOME or ~/.cache
    # Seconds one compiler run may take, and one link; past it the tool is stopped (an error).
    compile_timeout: float = COMPILE_TIMEOUT_S
    link_timeout: float = IREE_COMPILE_TIMEOUT_S

    @classmethod
    def create(cls, archs: Sequence[str] | str, **kwargs: object) -> "BuildOptions":
        fmt = kwargs.get("format", cls.format)
        if fmt not in ObjectFormat.choices():
            raise UsageError(f"unknown object format {fmt!r}", fix=f"use one of {', '.join(ObjectFormat.choices())}")
        kwargs["format"] = ObjectFormat(fmt)
        compiler = kwargs.get("compiler", cls.compiler)
        if compiler not in CompilerName.choices():
            raise UsageError(f"unknown compiler {compiler!r}", fix=f"use one of {', '.join(CompilerName.choices())}")
        kwargs["compiler"] = CompilerName(compiler)
        if kwargs.get("jobs") is not None and kwargs["jobs"] < 1:
            raise UsageError(f"--jobs must be at least 1, got {kwargs['jobs']}", fix="pass a positive number, or leave it out for one per core")
        if kwargs.get("min_driver") is not None:
            Version.parse(kwargs["min_driver"], "--min-driver")
        for name in ("compile_timeout", "link_timeout"):
            value = kwargs.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < MAX_TIMEOUT_S):
                raise UsageError(f"{name} {value!r} is not a positive number of seconds below {MAX_TIMEOUT_S:g}", fix="e.g. --timeout 300")
        return cls(parse_arch_list(archs), **kwargs)
