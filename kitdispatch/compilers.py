"""Compiling .cu sources to per-architecture objects: NVRTC (from pip) or nvcc.

Every backend has the same contract, `compile(source, arch, options) -> ObjectCode`, so the
object cache and the build wrap them once.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from ._files import FileTooLarge, not_an_option, read_regular_file
from ._parallel import CpuSlots
from ._proc import run_tool
from ._resources import installed_version
from ._workers import POOL, map_in_threads
from .archs import Arch, check_supported, ptx_fallback_archs
from .errors import CompileError, KitError, ManifestError, ToolError
from .toolchain import find_nvrtc, load_nvfatbin, not_installed_error

ObjectFormat = Literal["ptx", "cubin", "fatbin"]
COMPILE_TIMEOUT_S = 300.0  # a compile of one source for one target; --timeout changes it


@dataclass(frozen=True)
class CompileOptions:
    """Source-level options, lowered the same way for NVRTC and nvcc."""

    include_dirs: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    std: str | None = "c++17"
    fast_math: bool = False
    line_info: bool = False
    extra_flags: tuple[str, ...] = ()
    # C++ kernel names (`scale<float>`) NVRTC must instantiate and name in the object; nvcc
    # has no such switch, so there a template kernel needs an explicit instantiation.
    name_expressions: tuple[str, ...] = ()
    # Entries to adapt to IREE's parameter passing, (kernel name, pointer positions) each;
    # applied by bridge.BridgingCompiler, not by the compiler itself (no flag).
    bridges: tuple[tuple[str, tuple[int, ...]], ...] = ()

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
    """One compiled object, raw bytes as IREE will embed them.

    `archs` holds one architecture for PTX and cubin, every SASS architecture for a fatbin.
    `ptx` is the PTX the object was made from, when the compiler gave it: the build reads
    kernel entries and the PTX ISA version from it. `lowered` maps C++ kernel names to their
    entries in the object (NVRTC name expressions); `diagnostics` holds what the compiler
    printed on success (warnings).
    """

    data: bytes = field(repr=False)
    format: ObjectFormat
    archs: tuple[Arch, ...]
    source: Path
    compiler: str
    ptx: bytes | None = field(default=None, repr=False)
    lowered: tuple[tuple[str, str], ...] = ()
    diagnostics: tuple[str, ...] = ()
    # What ran to make it, as commands to re-run (NVRTC's as the equivalent nvcc command);
    # empty for an object from the cache.
    commands: tuple[str, ...] = ()

    @classmethod
    def from_ptx(cls, data: bytes, arch: Arch, source: Path, compiler: str, **extra) -> "ObjectCode":
        ptx = data.rstrip(b"\0")
        return cls(ptx, "ptx", (arch,), source, compiler, ptx, **extra)

    @classmethod
    def from_cubin(cls, data: bytes, arch: Arch, source: Path, compiler: str, ptx: bytes | None = None, **extra) -> "ObjectCode":
        return cls(data, "cubin", (arch,), source, compiler, ptx, **extra)

    @classmethod
    def from_fatbin(cls, data: bytes, archs: tuple[Arch, ...], source: Path, compiler: str, ptx: bytes | None = None, **extra) -> "ObjectCode":
        return cls(data, "fatbin", archs, source, compiler, ptx, **extra)

    @property
    def arch(self) -> Arch:
        return self.archs[0]

    def file_name(self, stem: str | None = None) -> str:
        """`stem.sm_90.ptx`; `stem` (default: the source's) tells apart sources of one name."""
        stem = stem or self.source.stem
        if self.format == "fatbin":
            return f"{stem}.{'_'.join(a.name for a in self.archs)}.fatbin"
        return f"{stem}.{self.arch.name}.{self.format}"

    def check_content(self) -> str | None:
        """Why these bytes are not an object of this format and architecture, or None: a cache
        entry must hold what its key says before it is shipped."""
        if self.format == "ptx":
            m = re.search(rb"^\s*\.target\s+(sm_\w+)", self.data, re.M)
            want = self.arch.name
            if not m or m.group(1).decode().split(",")[0] != want:
                return f"PTX for {m.group(1).decode() if m else 'no target'}, not {want}"
            return None
        if self.format == "cubin":
            return None if self.data[:4] == b"\x7fELF" else "not an ELF cubin"
        return None if self.data[:4] == FATBIN_MAGIC else "not a fatbin"


FATBIN_MAGIC = (0xBA55ED50).to_bytes(4, "little")


@dataclass(frozen=True)
class IncludeSearch:
    """Where a compiler looks for headers, for the cache key: `dirs` (after a quoted
    include's own folder) are the user's and hashed; `toolchain_dirs` hold the toolchain's
    headers, covered by `header_versions` (package, version) instead."""

    dirs: tuple[str, ...]
    toolchain_dirs: tuple[str, ...] = ()
    header_versions: tuple[tuple[str, str], ...] = ()


class Compiler(Protocol):
    name: str

    def include_search(self, source: Path, options: CompileOptions) -> IncludeSearch: ...

    def version(self) -> str: ...

    def supported_archs(self) -> tuple[Arch, ...]: ...

    def compile(self, source: Path, arch: Arch, fmt: ObjectFormat, options: CompileOptions) -> ObjectCode: ...

    def compile_fatbin(self, source: Path, archs: tuple[Arch, ...], options: CompileOptions) -> ObjectCode: ...


def read_source(source: Path) -> bytes:
    """The source's bytes; a FIFO or device would block the build, so only regular files."""
    try:
        return read_regular_file(source)
    except FileTooLarge as exc:
        raise ManifestError(f"the kernel source {exc.strerror}", where=str(source), fix="split it, or generate less code") from None
    except FileNotFoundError:
        raise KitError(
            f"kernel source {source} does not exist",
            fix="check the 'source' path in the manifest; it is relative to the manifest's folder",
        ) from None
    except OSError as exc:
        raise KitError(f"cannot read kernel source {source}: it {exc.strerror}", fix="point 'source' at a regular .cu file") from None
    except ValueError as exc:  # a NUL in the path
        raise KitError(f"cannot read kernel source {source!r}: {exc}", fix="use a plain path") from None


# -------------------------------------------------------------------------------- NVRTC


class NvrtcCompiler:
    """NVRTC through cuda-python: from the CUDA 13 or CUDA 12 wheels (or a toolkit), whichever
    `toolchain.find_nvrtc` finds; no toolkit needed. Each compile runs in a worker process
    (`_workers`) that loads exactly that library, so one that never ends is stopped at its
    deadline."""

    name = "nvrtc"

    def __init__(self, slots: CpuSlots | None = None, *, timeout: float = COMPILE_TIMEOUT_S) -> None:
        self._slots = slots or CpuSlots()
        self.timeout = timeout

    @functools.cached_property
    def _info(self) -> dict:
        # Asked on the first compile, not before: a build whose objects all come from the
        # cache never starts NVRTC.
        _check_nvrtc_importable()
        try:
            info = POOL.call("nvrtc_info", nvrtc_libraries(), timeout=60, what="loading NVRTC")
        except ToolError as exc:
            install = find_nvrtc()
            fix = install.headers_hint if install is not None else not_installed_error().fix
            raise KitError(f"NVRTC library could not be loaded: {exc.what}", fix=f"{fix}; or use --compiler nvcc") from None
        install = find_nvrtc()
        if install is not None and not info["version"].startswith(f"{install.cuda_major}."):
            raise KitError(
                f"the compiler process loaded NVRTC {info['version']}, not {install.origin}",
                fix="install only one CUDA major's NVRTC (kitdispatch doctor lists them)",
            )
        return info

    def version(self) -> str:
        """The full version of the NVRTC this backend loads (toolchain.find_nvrtc: found on
        disk, not loaded); else the loaded library's major.minor."""
        install = find_nvrtc()
        return install.version if install is not None else self.library_version()

    def library_version(self) -> str:
        return self._info["version"]

    def supported_archs(self) -> tuple[Arch, ...]:
        return tuple(Arch(a // 10, a % 10) for a in self._info["archs"])

    def compile(self, source: Path, arch: Arch, fmt: ObjectFormat, options: CompileOptions) -> ObjectCode:
        check_archs(self, (arch,))
        target = arch.compute_name if fmt == "ptx" else arch.name
        opts = [f"--gpu-architecture={target}", *self._flags(source, options)]
        reply = self._run(source, opts, options, cubin=fmt != "ptx")
        extra = {
            "lowered": tuple(reply["lowered"].items()),
            "diagnostics": _diagnostics(reply["log"]),
            "commands": (shlex.join(rerun_command(source, opts)),),
        }
        if fmt == "ptx":
            return ObjectCode.from_ptx(reply["ptx"], arch, source, self.name, **extra)
        return ObjectCode.from_cubin(reply["cubin"], arch, source, self.name, ptx=reply["ptx"], **extra)

    def lowered_names(self, source: Path, names: tuple[str, ...], options: CompileOptions) -> dict[str, str]:
        """The mangled entry names of C++ kernels (`scale`, `scale<float>`) through NVRTC
        name expressions; for nvcc builds, whose objects do not say them."""
        named = dataclasses.replace(options, name_expressions=tuple(names))
        return self._run(source, self._flags(source, named), named, cubin=False)["lowered"]

    def include_search(self, source: Path, options: CompileOptions) -> IncludeSearch:
        install = find_nvrtc()
        if install is None:
            return IncludeSearch((*options.include_dirs, str(source.parent)))
        versions = tuple((d, installed_version(d, "nvidia") or "none") for d in install.layout.header_distributions)
        return IncludeSearch(
            (*options.include_dirs, str(source.parent)),
            tuple(str(d) for d in install.include_dirs),
            versions or (("toolkit", install.version),),
        )

    def _flags(self, source: Path, options: CompileOptions) -> list[str]:
        # NVRTC resolves quoted includes against the working folder, nvcc against the
        # source's folder; make NVRTC behave like nvcc. The CUDA headers (cuda_fp16.h,
        # mma.h, ...) come from the wheels of NVRTC's CUDA major, as nvcc has its own.
        install = find_nvrtc()
        headers = install.include_dirs if install is not None else ()
        return [*options.flags(), f"-I{source.parent}", *(f"-I{h}" for h in headers)]

    def _run(self, source: Path, opts: list[str], options: CompileOptions, *, cubin: bool) -> dict:
        """One NVRTC compile in a worker: the reply, or a CompileError with NVRTC's log."""
        text = read_source(source)
        _info = self._info  # noqa: F841 (NVRTC loads, or its error is raised, before a slot is taken)
        target = next((o.split("=", 1)[1] for o in opts if o.startswith("--gpu-architecture=")), "")
        argv = rerun_command(source, opts)
        request = {
            "source": text, "name": str(source), "options": opts, "names": list(options.name_expressions),
            "cubin": cubin, "libraries": nvrtc_libraries(),
        }
        with self._slots:
            reply = POOL.call("nvrtc_compile", request, timeout=self.timeout, what=f"NVRTC compiling {source}", argv=argv)
        if not reply["ok"]:
            raise CompileError(
                f"NVRTC failed to compile {source}" + (f" for {target}" if target else ""),
                where=_first_error_location(reply["log"]) or str(source),
                log=reply["log"],
                argv=argv,
                fix="fix the error in the kernel source shown in the log",
            )
        return reply

    def compile_fatbin(self, source: Path, archs: tuple[Arch, ...], options: CompileOptions) -> ObjectCode:
        """SASS for every architecture plus PTX (see `ptx_fallback_archs`), packed with
        nvFatbin from pip: no toolkit needed."""
        # The architectures compile in parallel (1.66 s -> 0.89 s for three architectures of
        # kernels/softmax on two cores), each in a slot of its own.
        check_archs(self, archs)
        cubins = map_in_threads(lambda arch: self.compile(source, arch, "cubin", options), archs)
        by_arch = {c.arch: c for c in cubins}
        ptx = [by_arch[a] for a in ptx_fallback_archs(archs)]
        data = pack_fatbin(cubins, ptx)
        notes = tuple(dict.fromkeys(n for c in cubins for n in c.diagnostics))
        commands = tuple(c for cubin in cubins for c in cubin.commands) + (fatbin_note(cubins, ptx),)
        return ObjectCode.from_fatbin(data, tuple(archs), source, self.name, ptx=cubins[-1].ptx, lowered=cubins[0].lowered, diagnostics=notes, commands=commands)


def fatbin_note(cubins: list[ObjectCode], ptx: list[ObjectCode]) -> str:
    """What packing a fatbin did, in place of a command (nvFatbin is a library)."""
    return f"# nvFatbin: packed SASS for {', '.join(c.arch.name for c in cubins)} and PTX for {', '.join(p.arch.name for p in ptx)}"


def rerun_command(source: Path, nvrtc_options: list[str]) -> list[str]:
    """An nvcc command that compiles like the NVRTC call (NVRTC has no command of its own)."""
    arch = [o.split("=", 1)[1] for o in nvrtc_options if o.startswith("--gpu-architecture=")]
    rest = [o for o in nvrtc_options if not o.startswith("--gpu-architecture=")]
    mode = ["--ptx", f"-arch={arch[0]}"] if arch and arch[0].startswith("compute_") else ["--cubin", f"-arch={arch[0]}"] if arch else ["--ptx"]
    return ["nvcc", *mode, *rest, "-o", "/dev/null", str(source)]


def _diagnostics(log: str) -> tuple[str, ...]:
    """A successful compile's warnings, as the compiler printed them."""
    text = log.strip()
    return (text,) if text else ()


def _check_nvrtc_importable() -> None:
    try:
        import cuda.bindings.nvrtc  # noqa: F401
    except ImportError as exc:
        raise KitError(
            f"NVRTC is not available: {exc}",
            fix="pip install 'kitdispatch[build]' (cuda-python and nvidia-cuda-nvrtc), or use --compiler nvcc",
        ) from None


def nvrtc_libraries() -> list[str]:
    """The NVRTC library the kit uses and its builtins, for the worker to load first: NVRTC
    opens its builtins by name from a folder on no search path, and cuda-python takes a
    library already loaded under its name before searching for one."""
    install = find_nvrtc()
    if install is None:
        return []
    builtins = sorted(install.library.parent.glob(f"libnvrtc-builtins.so.{install.cuda_major}.*"))
    return [str(b) for b in builtins] + [str(install.library)]


# --------------------------------------------------------------------------------- nvcc


class NvccCompiler:
    """The CUDA toolkit's nvcc, one subprocess per object."""

    name = "nvcc"

    def __init__(self, nvcc: str | None = None, slots: CpuSlots | None = None, *, timeout: float = COMPILE_TIMEOUT_S) -> None:
        self._slots = slots or CpuSlots()
        self.timeout = timeout
        found = nvcc or shutil.which("nvcc")
        if not found:
            raise KitError(
                "nvcc is not on PATH",
                fix="install the CUDA toolkit, pass its path, or use the default --compiler nvrtc",
            )
        self.path = found

    def include_search(self, source: Path, options: CompileOptions) -> IncludeSearch:
        return IncludeSearch(tuple(options.include_dirs))  # nvcc's own headers: its version

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
        check_archs(self, (arch,))
        read_source(source)  # a clear error for a missing file before nvcc's own
        with tempfile.TemporaryDirectory(prefix="kitdispatch-nvcc-") as tmp:
            out = Path(tmp) / f"out.{fmt}"
            arch_flag = f"-arch={arch.compute_name}" if fmt == "ptx" else f"-arch={arch.name}"
            argv = [self.path, f"--{fmt}", arch_flag, *options.flags(), "-o", str(out), str(not_an_option(source))]
            self._run(argv, source, arch.name)
            data = out.read_bytes()
        make = ObjectCode.from_ptx if fmt == "ptx" else ObjectCode.from_cubin
        return make(data, arch, source, self.name, commands=(_shown_command(argv, out),))

    def compile_fatbin(self, source: Path, archs: tuple[Arch, ...], options: CompileOptions) -> ObjectCode:
        check_archs(self, archs)
        read_source(source)
        gencode = [f"-gencode=arch={a.compute_name},code={a.name}" for a in archs]
        gencode += [f"-gencode=arch={a.compute_name},code={a.compute_name}" for a in ptx_fallback_archs(archs)]
        with tempfile.TemporaryDirectory(prefix="kitdispatch-nvcc-") as tmp:
            out = Path(tmp) / "out.fatbin"
            argv = [self.path, "--fatbin", *gencode, *options.flags(), "-o", str(out), str(not_an_option(source))]
            self._run(argv, source, ", ".join(a.name for a in archs))
            return ObjectCode.from_fatbin(out.read_bytes(), tuple(archs), source, self.name, commands=(_shown_command(argv, out),))

    def _run(self, argv: list[str], source: Path, what: str) -> None:
        with self._slots:
            res = run_tool(argv, timeout=self.timeout)
        if res.returncode != 0:
            log = res.stderr + res.stdout
            raise CompileError(
                f"nvcc failed to compile {source} for {what}",
                where=_first_error_location(log) or str(source),
                argv=argv,
                returncode=res.returncode,
                log=log,
                fix="fix the error in the kernel source shown in the log",
            )


def _shown_command(argv: list[str], out: Path) -> str:
    """nvcc's command with its temporary output named by its file name alone."""
    return shlex.join(out.name if a == str(out) else a for a in argv)


# ------------------------------------------------------------------------------- shared


def pack_fatbin(cubins: list[ObjectCode], ptx: list[ObjectCode]) -> bytes:
    """One fatbin from cubins and the PTX they were compiled from, with nvFatbin (pip)."""
    nvfatbin = load_nvfatbin()
    handle = nvfatbin.create([], 0)
    try:
        for c in cubins:
            nvfatbin.add_cubin(handle, c.data, len(c.data), str(c.arch.capability) + c.arch.suffix, c.source.stem)
        for p in ptx:
            text = p.ptx + b"\0"
            nvfatbin.add_ptx(handle, text, len(text), str(p.arch.capability) + p.arch.suffix, p.source.stem, "")
        buf = bytearray(nvfatbin.size(handle))
        nvfatbin.get(handle, buf)
        return bytes(buf)
    finally:
        nvfatbin.destroy(handle)


COMPILERS = ("nvrtc", "nvcc")


def get_compiler(name: str, slots: CpuSlots | None = None, *, timeout: float = COMPILE_TIMEOUT_S) -> Compiler:
    """A backend by name; `slots` bounds its compiler runs together with the build's other
    CPU-heavy steps (default: a bound of its own, one run per core); `timeout` bounds each run."""
    if name == "nvrtc":
        return NvrtcCompiler(slots, timeout=timeout)
    if name == "nvcc":
        return NvccCompiler(slots=slots, timeout=timeout)
    raise KitError(f"unknown compiler {name!r}", fix=f"use one of {', '.join(COMPILERS)}")


def check_archs(compiler: Compiler, archs) -> None:
    """Every backend checks its targets as it compiles (not before: a build whose objects
    all come from the cache never loads its compiler)."""
    check_supported(archs, compiler.supported_archs(), compiler.name)


_LOCATION_RE = re.compile(r"^(?P<file>[^\s(]+)\((?P<line>\d+)\): (?:error|catastrophic error)", re.M)


def _first_error_location(log: str) -> str | None:
    """'k.cu(12): error: ...' -> 'k.cu:12', the form editors and terminals link."""
    m = _LOCATION_RE.search(log)
    return f"{m.group('file')}:{m.group('line')}" if m else None
