"""Compiling .cu sources to per-architecture objects: NVRTC (from pip) or nvcc.

Every backend has the same contract, `compile(source, arch, options) -> ObjectCode`, so the
object cache and the build wrap them once.
"""

from __future__ import annotations

import functools
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from ._proc import run_tool
from .archs import Arch, check_supported
from .errors import CompileError, KitError

ObjectFormat = Literal["ptx", "cubin"]
OBJECT_FORMATS: tuple[str, ...] = ("ptx", "cubin")
NVCC_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class CompileOptions:
    """Source-level options, lowered the same way for NVRTC and nvcc."""

    include_dirs: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    std: str | None = "c++17"
    fast_math: bool = False
    line_info: bool = False
    extra_flags: tuple[str, ...] = ()

    def flags(self) -> list[str]:
        flags = [f"-I{d}" for d in self.include_dirs] + [f"-D{d}" for d in self.defines]
        if self.std:
            flags.append(f"-std={self.std}")
        if self.fast_math:
            flags.append("--use_fast_math")
        if self.line_info:
            flags.append("-lineinfo")
        return flags + list(self.extra_flags)


@dataclass(frozen=True)
class ObjectCode:
    """One compiled object: raw bytes for one architecture, as IREE will embed them."""

    data: bytes = field(repr=False)
    format: ObjectFormat
    arch: Arch
    source: Path
    compiler: str

    @classmethod
    def from_ptx(cls, data: bytes, arch: Arch, source: Path, compiler: str) -> "ObjectCode":
        return cls(data.rstrip(b"\0"), "ptx", arch, source, compiler)

    @classmethod
    def from_cubin(cls, data: bytes, arch: Arch, source: Path, compiler: str) -> "ObjectCode":
        return cls(data, "cubin", arch, source, compiler)

    @property
    def file_name(self) -> str:
        return f"{self.source.stem}.{self.arch.name}.{self.format}"


class Compiler(Protocol):
    name: str

    def version(self) -> str: ...

    def supported_archs(self) -> tuple[Arch, ...]: ...

    def compile(self, source: Path, arch: Arch, fmt: ObjectFormat, options: CompileOptions) -> ObjectCode: ...


def read_source(source: Path) -> bytes:
    try:
        return source.read_bytes()
    except FileNotFoundError:
        raise KitError(
            f"kernel source {source} does not exist",
            fix="check the 'source' path in the manifest; it is relative to the manifest's folder",
        ) from None
    except OSError as exc:
        raise KitError(f"cannot read kernel source {source}: {exc.strerror}", fix="check the file") from None


# -------------------------------------------------------------------------------- NVRTC


class NvrtcCompiler:
    """NVRTC in process, from the nvidia-cuda-nvrtc wheel via cuda-python: no toolkit needed."""

    name = "nvrtc"

    def __init__(self) -> None:
        self._nvrtc = _load_nvrtc()

    def version(self) -> str:
        major, minor = self._check(self._nvrtc.nvrtcVersion(), "nvrtcVersion")
        return f"{major}.{minor}"

    def supported_archs(self) -> tuple[Arch, ...]:
        (archs,) = self._check(self._nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
        return tuple(Arch(a // 10, a % 10) for a in archs)

    def compile(self, source: Path, arch: Arch, fmt: ObjectFormat, options: CompileOptions) -> ObjectCode:
        nvrtc = self._nvrtc
        text = read_source(source)
        (prog,) = self._check(nvrtc.nvrtcCreateProgram(text, str(source).encode(), 0, [], []), "create")
        try:
            target = arch.compute_name if fmt == "ptx" else arch.name
            opts = [f"--gpu-architecture={target}", *options.flags()]
            # NVRTC resolves quoted includes against the working folder, nvcc against the
            # source's folder; make NVRTC behave like nvcc.
            opts.append(f"-I{source.parent}")
            (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
            log = self._log(prog)
            if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                raise CompileError(
                    f"NVRTC failed to compile {source} for {arch.name}",
                    where=_first_error_location(log) or str(source),
                    log=log,
                    argv=["nvrtc", *opts, str(source)],
                    fix="fix the error in the kernel source shown in the log",
                )
            if fmt == "ptx":
                (size,) = self._check(nvrtc.nvrtcGetPTXSize(prog), "ptx size")
                buf = bytearray(size)
                self._check(nvrtc.nvrtcGetPTX(prog, buf), "ptx")
                return ObjectCode.from_ptx(bytes(buf), arch, source, self.name)
            (size,) = self._check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
            buf = bytearray(size)
            self._check(nvrtc.nvrtcGetCUBIN(prog, buf), "cubin")
            return ObjectCode.from_cubin(bytes(buf), arch, source, self.name)
        finally:
            nvrtc.nvrtcDestroyProgram(prog)

    def _log(self, prog) -> str:
        (size,) = self._check(self._nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        buf = bytearray(size)
        self._check(self._nvrtc.nvrtcGetProgramLog(prog, buf), "log")
        return bytes(buf).rstrip(b"\0").decode(errors="replace")

    def _check(self, ret: tuple, what: str) -> tuple:
        err, *values = ret
        if err != self._nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise KitError(f"NVRTC call {what} failed: {err}", fix="check the NVRTC installation (kitdispatch doctor)")
        return tuple(values)


@functools.cache
def _load_nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise KitError(
            f"NVRTC is not available: {exc}",
            fix="pip install 'kitdispatch[build]' (cuda-python and nvidia-cuda-nvrtc), or use --compiler nvcc",
        ) from None
    try:
        err, *_ = nvrtc.nvrtcVersion()
    except Exception as exc:  # cuda-python raises RuntimeError when libnvrtc is missing
        raise KitError(
            f"NVRTC library could not be loaded: {exc}",
            fix="pip install 'nvidia-cuda-nvrtc>=13.0,<13.1', or use --compiler nvcc",
        ) from None
    return nvrtc


# --------------------------------------------------------------------------------- nvcc


class NvccCompiler:
    """The CUDA toolkit's nvcc, one subprocess per object."""

    name = "nvcc"

    def __init__(self, nvcc: str | None = None) -> None:
        found = nvcc or shutil.which("nvcc")
        if not found:
            raise KitError(
                "nvcc is not on PATH",
                fix="install the CUDA toolkit, pass its path, or use the default --compiler nvrtc",
            )
        self.path = found

    def version(self) -> str:
        out = run_tool([self.path, "--version"], timeout=30).stdout
        m = re.search(r"release (\d+\.\d+)", out)
        return m.group(1) if m else "unknown"

    @functools.cached_property
    def _supported(self) -> tuple[Arch, ...]:
        out = run_tool([self.path, "--list-gpu-code"], timeout=30).stdout
        return tuple(Arch.parse(a) for a in out.split() if re.match(r"^sm_\d+$", a))

    def supported_archs(self) -> tuple[Arch, ...]:
        return self._supported

    def compile(self, source: Path, arch: Arch, fmt: ObjectFormat, options: CompileOptions) -> ObjectCode:
        read_source(source)  # a clear error for a missing file before nvcc's own
        with tempfile.TemporaryDirectory(prefix="kitdispatch-nvcc-") as tmp:
            out = Path(tmp) / f"out.{fmt}"
            arch_flag = f"-arch={arch.compute_name}" if fmt == "ptx" else f"-arch={arch.name}"
            argv = [self.path, f"--{fmt}", arch_flag, *options.flags(), "-o", str(out), str(source)]
            res = run_tool(argv, timeout=NVCC_TIMEOUT_S)
            if res.returncode != 0:
                log = res.stderr + res.stdout
                raise CompileError(
                    f"nvcc failed to compile {source} for {arch.name}",
                    where=_first_error_location(log) or str(source),
                    argv=argv,
                    returncode=res.returncode,
                    log=log,
                    fix="fix the error in the kernel source shown in the log",
                )
            data = out.read_bytes()
        make = ObjectCode.from_ptx if fmt == "ptx" else ObjectCode.from_cubin
        return make(data, arch, source, self.name)


# ------------------------------------------------------------------------------- shared

COMPILERS = ("nvrtc", "nvcc")


def get_compiler(name: str) -> Compiler:
    if name == "nvrtc":
        return NvrtcCompiler()
    if name == "nvcc":
        return NvccCompiler()
    raise KitError(f"unknown compiler {name!r}", fix=f"use one of {', '.join(COMPILERS)}")


def check_archs(compiler: Compiler, archs) -> None:
    check_supported(archs, compiler.supported_archs(), compiler.name)


_LOCATION_RE = re.compile(r"^(?P<file>[^\s(]+)\((?P<line>\d+)\): (?:error|catastrophic error)", re.M)


def _first_error_location(log: str) -> str | None:
    """'k.cu(12): error: ...' -> 'k.cu:12', the form editors and terminals link."""
    m = _LOCATION_RE.search(log)
    return f"{m.group('file')}:{m.group('line')}" if m else None
