"""Compiling .cu sources to per-architecture objects: NVRTC (from pip) or nvcc.

Every backend has the same contract, `compile(source, arch, options) -> ObjectCode`, so the
object cache and the build wrap them once.
"""

from __future__ import annotations

import functools
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from ._parallel import CpuSlots
from ._proc import run_tool
from .archs import Arch, check_supported, ptx_fallback_archs
from .errors import CompileError, KitError
from .toolchain import find_nvrtc, load_nvfatbin, load_nvrtc

ObjectFormat = Literal["ptx", "cubin", "fatbin"]
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
    # C++ kernel names (`scale<float>`) NVRTC must instantiate and name in the object; nvcc
    # has no such switch, so there a template kernel needs an explicit instantiation.
    name_expressions: tuple[str, ...] = ()

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
    kernel entries and the PTX ISA version from it.
    """

    data: bytes = field(repr=False)
    format: ObjectFormat
    archs: tuple[Arch, ...]
    source: Path
    compiler: str
    ptx: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_ptx(cls, data: bytes, arch: Arch, source: Path, compiler: str) -> "ObjectCode":
        ptx = data.rstrip(b"\0")
        return cls(ptx, "ptx", (arch,), source, compiler, ptx)

    @classmethod
    def from_cubin(cls, data: bytes, arch: Arch, source: Path, compiler: str, ptx: bytes | None = None) -> "ObjectCode":
        return cls(data, "cubin", (arch,), source, compiler, ptx)

    @classmethod
    def from_fatbin(cls, data: bytes, archs: tuple[Arch, ...], source: Path, compiler: str, ptx: bytes | None = None) -> "ObjectCode":
        return cls(data, "fatbin", archs, source, compiler, ptx)

    @property
    def arch(self) -> Arch:
        return self.archs[0]

    @property
    def file_name(self) -> str:
        if self.format == "fatbin":
            return f"{self.source.stem}.{'_'.join(a.name for a in self.archs)}.fatbin"
        return f"{self.source.stem}.{self.arch.name}.{self.format}"


class Compiler(Protocol):
    name: str

    def version(self) -> str: ...

    def supported_archs(self) -> tuple[Arch, ...]: ...

    def compile(self, source: Path, arch: Arch, fmt: ObjectFormat, options: CompileOptions) -> ObjectCode: ...

    def compile_fatbin(self, source: Path, archs: tuple[Arch, ...], options: CompileOptions) -> ObjectCode: ...


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
    """NVRTC in process through cuda-python: from the CUDA 13 or CUDA 12 wheels (or a
    toolkit), whichever `toolchain.find_nvrtc` finds; no toolkit needed."""

    name = "nvrtc"

    def __init__(self, slots: CpuSlots | None = None) -> None:
        self._slots = slots or CpuSlots()

    @functools.cached_property
    def _nvrtc(self):
        # Loaded on the first compile, not before: a build whose objects all come from the
        # cache never needs it (importing cuda-python's NVRTC takes ~40 ms).
        return load_nvrtc()

    def version(self) -> str:
        """The full version of the NVRTC this backend loads (toolchain.find_nvrtc: found on
        disk, not loaded); else the loaded library's major.minor."""
        install = find_nvrtc()
        return install.version if install is not None else self.library_version()

    def library_version(self) -> str:
        major, minor = self._check(self._nvrtc.nvrtcVersion(), "nvrtcVersion")
        return f"{major}.{minor}"

    @functools.cached_property
    def _supported(self) -> tuple[Arch, ...]:
        (archs,) = self._check(self._nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
        return tuple(Arch(a // 10, a % 10) for a in archs)

    def supported_archs(self) -> tuple[Arch, ...]:
        return self._supported

    def compile(self, source: Path, arch: Arch, fmt: ObjectFormat, options: CompileOptions) -> ObjectCode:
        check_archs(self, (arch,))
        nvrtc = self._nvrtc
        target = arch.compute_name if fmt == "ptx" else arch.name
        prog = self._compiled(source, [f"--gpu-architecture={target}", *self._flags(source, options)], options.name_expressions)
        try:
            if fmt == "ptx":
                return ObjectCode.from_ptx(self._ptx(prog), arch, source, self.name)
            (size,) = self._check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
            buf = bytearray(size)
            self._check(nvrtc.nvrtcGetCUBIN(prog, buf), "cubin")
            return ObjectCode.from_cubin(bytes(buf), arch, source, self.name, ptx=self._ptx(prog))
        finally:
            nvrtc.nvrtcDestroyProgram(prog)

    def lowered_names(self, source: Path, names: tuple[str, ...], options: CompileOptions) -> dict[str, str]:
        """The mangled entry names of C++ kernels (`scale`, `scale<float>`) through NVRTC
        name expressions (the build's NVRTC compiles add the same expressions, which also
        instantiates templates)."""
        prog = self._compiled(source, self._flags(source, options), names)
        try:
            out = {}
            for name in names:
                (lowered,) = self._check(self._nvrtc.nvrtcGetLoweredName(prog, name.encode()), f"lowered name of {name}")
                out[name] = lowered.decode() if isinstance(lowered, bytes) else str(lowered)
            return out
        finally:
            self._nvrtc.nvrtcDestroyProgram(prog)

    def _flags(self, source: Path, options: CompileOptions) -> list[str]:
        # NVRTC resolves quoted includes against the working folder, nvcc against the
        # source's folder; make NVRTC behave like nvcc. The CUDA headers (cuda_fp16.h,
        # mma.h, ...) come from the wheels of NVRTC's CUDA major, as nvcc has its own.
        install = find_nvrtc()
        headers = install.include_dirs if install is not None else ()
        return [*options.flags(), f"-I{source.parent}", *(f"-I{h}" for h in headers)]

    def _compiled(self, source: Path, opts: list[str], names: tuple[str, ...]):
        """A compiled NVRTC program (the caller destroys it), or a CompileError with the log."""
        nvrtc = self._nvrtc
        text = read_source(source)
        (prog,) = self._check(nvrtc.nvrtcCreateProgram(text, str(source).encode(), 0, [], []), "create")
        try:
            for name in names:
                self._check(nvrtc.nvrtcAddNameExpression(prog, name.encode()), f"name expression {name}")
            with self._slots:
                (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
            log = self._log(prog)
            if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                target = next((o.split("=", 1)[1] for o in opts if o.startswith("--gpu-architecture=")), "")
                raise CompileError(
                    f"NVRTC failed to compile {source}" + (f" for {target}" if target else ""),
                    where=_first_error_location(log) or str(source),
                    log=log,
                    argv=["nvrtc", *opts, str(source)],
                    fix="fix the error in the kernel source shown in the log",
                )
        except BaseException:
            nvrtc.nvrtcDestroyProgram(prog)
            raise
        return prog

    def _ptx(self, prog) -> bytes:
        (size,) = self._check(self._nvrtc.nvrtcGetPTXSize(prog), "ptx size")
        buf = bytearray(size)
        self._check(self._nvrtc.nvrtcGetPTX(prog, buf), "ptx")
        return bytes(buf).rstrip(b"\0")

    def compile_fatbin(self, source: Path, archs: tuple[Arch, ...], options: CompileOptions) -> ObjectCode:
        """SASS for every architecture plus PTX (see `ptx_fallback_archs`), packed with
        nvFatbin from pip: no toolkit needed."""
        # NVRTC releases the GIL: the architectures compile in parallel (1.66 s -> 0.89 s for
        # three architectures of kernels/softmax on two cores), each in a slot of its own.
        check_archs(self, archs)
        with ThreadPoolExecutor(max_workers=len(archs)) as pool:
            cubins = list(pool.map(lambda arch: self.compile(source, arch, "cubin", options), archs))
        by_arch = {c.arch: c for c in cubins}
        ptx = [by_arch[a] for a in ptx_fallback_archs(archs)]
        data = pack_fatbin(cubins, ptx)
        return ObjectCode.from_fatbin(data, tuple(archs), source, self.name, ptx=cubins[-1].ptx)

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


# --------------------------------------------------------------------------------- nvcc


class NvccCompiler:
    """The CUDA toolkit's nvcc, one subprocess per object."""

    name = "nvcc"

    def __init__(self, nvcc: str | None = None, slots: CpuSlots | None = None) -> None:
        self._slots = slots or CpuSlots()
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
        check_archs(self, (arch,))
        read_source(source)  # a clear error for a missing file before nvcc's own
        with tempfile.TemporaryDirectory(prefix="kitdispatch-nvcc-") as tmp:
            out = Path(tmp) / f"out.{fmt}"
            arch_flag = f"-arch={arch.compute_name}" if fmt == "ptx" else f"-arch={arch.name}"
            argv = [self.path, f"--{fmt}", arch_flag, *options.flags(), "-o", str(out), str(source)]
            self._run(argv, source, arch.name)
            data = out.read_bytes()
        make = ObjectCode.from_ptx if fmt == "ptx" else ObjectCode.from_cubin
        return make(data, arch, source, self.name)

    def compile_fatbin(self, source: Path, archs: tuple[Arch, ...], options: CompileOptions) -> ObjectCode:
        check_archs(self, archs)
        read_source(source)
        gencode = [f"-gencode=arch={a.compute_name},code={a.name}" for a in archs]
        gencode += [f"-gencode=arch={a.compute_name},code={a.compute_name}" for a in ptx_fallback_archs(archs)]
        with tempfile.TemporaryDirectory(prefix="kitdispatch-nvcc-") as tmp:
            out = Path(tmp) / "out.fatbin"
            argv = [self.path, "--fatbin", *gencode, *options.flags(), "-o", str(out), str(source)]
            self._run(argv, source, ", ".join(a.name for a in archs))
            return ObjectCode.from_fatbin(out.read_bytes(), tuple(archs), source, self.name)

    def _run(self, argv: list[str], source: Path, what: str) -> None:
        with self._slots:
            res = run_tool(argv, timeout=NVCC_TIMEOUT_S)
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


def get_compiler(name: str, slots: CpuSlots | None = None) -> Compiler:
    """A backend by name; `slots` bounds its compiler runs together with the build's other
    CPU-heavy steps (default: a bound of its own, one run per core)."""
    if name == "nvrtc":
        return NvrtcCompiler(slots)
    if name == "nvcc":
        return NvccCompiler(slots=slots)
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
