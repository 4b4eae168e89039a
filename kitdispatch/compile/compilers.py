"""Compiling .cu sources to per-architecture objects: NVRTC (from pip) or nvcc.

Every backend has the same contract, `compile(source, arch, options) -> ObjectCode`, so the
object cache and the build wrap them once.
"""

from __future__ import annotations

import functools
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kitdispatch._files import FileTooLarge, not_an_option, read_regular_file
from kitdispatch._parallel import CpuSlots
from kitdispatch._proc import run_tool
from kitdispatch._resources import installed_version, kit_headers
from kitdispatch._workers import POOL, map_in_threads
from kitdispatch.compile.archs import Arch, check_supported, ptx_fallback_archs
from kitdispatch.compile.cxx_names import ENTRIES_UNIT, entries_named, entries_unit, entries_unit_digest, name_in_nvrtc_error, name_in_unit_error, unknown_kernel_error
from kitdispatch.errors import CompileError, KitError, ManifestError, ToolError
from kitdispatch.compile.toolchain import find_nvrtc, load_nvfatbin, not_installed_error
from kitdispatch.describe.choices import CompilerName, ObjectFormat
from kitdispatch.describe.limits import COMPILE_TIMEOUT_S



@dataclass(frozen=True)
class CompileOptions:
    """Source-level options, lowered the same way for NVRTC and nvcc."""

    include_dirs: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    std: str | None = "c++17"
    fast_math: bool = False
    line_info: bool = False
    extra_flags: tuple[str, ...] = ()
    # C++ kernel names (`scale<float>`) the compiler must instantiate and name in the object:
    # NVRTC's name expressions; nvcc compiles the source through `entries_unit`.
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
    entries in the object (NVRTC name expressions, nvcc's entries unit); `diagnostics` holds what the compiler
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
    def from_ptx(cls, data: bytes, arch: Arch, source: Path, compiler: str, **extra: tuple[str, ...] | tuple[tuple[str, str], ...]) -> "ObjectCode":
        ptx = data.rstrip(b"\0")
        return cls(ptx, "ptx", (arch,), source, compiler, ptx, **extra)

    @classmethod
    def from_cubin(cls, data: bytes, arch: Arch, source: Path, compiler: str, ptx: bytes | None = None, **extra: tuple[str, ...] | tuple[tuple[str, str], ...]) -> "ObjectCode":
        return cls(data, "cubin", (arch,), source, compiler, ptx, **extra)

    @classmethod
    def from_fatbin(cls, data: bytes, archs: tuple[Arch, ...], source: Path, compiler: str, ptx: bytes | None = None, **extra: tuple[str, ...] | tuple[tuple[str, str], ...]) -> "ObjectCode":
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

    def include_search(self, source: Path, options: CompileOptions) -> IncludeSearch:
        install = find_nvrtc()
        if install is None:
            return IncludeSearch((*options.include_dirs, str(source.parent)))
        versions = tuple((d, installed_version(d, "nvidia") or "none") for d in install.layout.header_distributions)
        headers = kit_headers()
        return IncludeSearch(
            (*options.include_dirs, str(source.parent)),
            (*(str(d) for d in install.include_dirs), str(headers.folder)),
            (*(versions or (("toolkit", install.version),)), ("kitdispatch-headers", headers.digest)),
        )

    def _flags(self, source: Path, options: CompileOptions) -> list[str]:
        # NVRTC resolves quoted includes against the working folder, nvcc against the
        # source's folder; make NVRTC behave like nvcc. The CUDA headers (cuda_fp16.h,
        # mma.h, ...) and CCCL come from the wheels of NVRTC's CUDA major, as nvcc has its
        # own; the kit's C library headers come last, and its prelude gives what nvcc's
        # implicit includes make visible (kitdispatch/include/README.md).
        install = find_nvrtc()
        headers = install.include_dirs if install is not None else ()
        kit = kit_headers()
        return [
            *options.flags(), f"-I{source.parent}", *(f"-I{h}" for h in headers),
            f"-I{kit.folder}", f"--pre-include={kit.prelude}",
        ]

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
            named = name_in_nvrtc_error(reply["log"], _LOCATION_RE.search(reply["log"]))
            if named is not None:
                raise unknown_kernel_error("NVRTC", named, source, log=reply["log"], argv=argv)
            raise CompileError(
                f"NVRTC failed to compile {source}" + (f" for {target}" if target else ""),
                where=log_location(reply["log"]) or str(source),
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
    # nvcc has the host's C headers: the kit's NVRTC stand-ins would shadow them.
    kit = kit_headers()
    own = {f"-I{kit.folder}", f"--pre-include={kit.prelude}"}
    rest = [o for o in nvrtc_options if not o.startswith("--gpu-architecture=") and o not in own]
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
            fix="pip install cuda-python 'nvidia-cuda-nvrtc==13.0.*' (kitdispatch's build extra), or use --compiler nvcc",
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
        # nvcc's own headers: its version. C++ names compile through the entries unit, a
        # function of the names (in the key) and of how the kit writes it (its digest here).
        unit = (("kitdispatch-entries-unit", entries_unit_digest()),) if options.name_expressions else ()
        return IncludeSearch(tuple(options.include_dirs), header_versions=unit)

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
        arch_flag = f"-arch={arch.compute_name}" if fmt == "ptx" else f"-arch={arch.name}"
        data, extra = self._compile([f"--{fmt}", arch_flag], f"out.{fmt}", source, arch.name, options)
        make = ObjectCode.from_ptx if fmt == "ptx" else ObjectCode.from_cubin
        return make(data, arch, source, self.name, **extra)

    def compile_fatbin(self, source: Path, archs: tuple[Arch, ...], options: CompileOptions) -> ObjectCode:
        check_archs(self, archs)
        read_source(source)
        gencode = [f"-gencode=arch={a.compute_name},code={a.name}" for a in archs]
        gencode += [f"-gencode=arch={a.compute_name},code={a.compute_name}" for a in ptx_fallback_archs(archs)]
        what = ", ".join(a.name for a in archs)
        data, extra = self._compile(["--fatbin", *gencode], "out.fatbin", source, what, options)
        return ObjectCode.from_fatbin(data, tuple(archs), source, self.name, **extra)

    def _compile(self, mode: list[str], out_name: str, source: Path, what: str, options: CompileOptions) -> tuple[bytes, dict]:
        """One nvcc run in a temporary folder: the object's bytes and ObjectCode's `lowered`
        and `commands`. A source with C++ kernel names compiles through its entries unit
        (`entries_unit`), and the PTX nvcc made says each name's entry."""
        with tempfile.TemporaryDirectory(prefix="kitdispatch-nvcc-") as tmp:
            folder = Path(tmp)
            out, unit, keep = folder / out_name, source, []
            names = options.name_expressions
            if names:
                unit = folder / ENTRIES_UNIT
                unit.write_text(entries_unit(source, names))
                if not out_name.endswith(".ptx"):  # a cubin or fatbin lacks the PTX that names the entries: keep nvcc's
                    (folder / "kept").mkdir()
                    keep = ["--keep", f"--keep-dir={folder / 'kept'}"]
            argv = [self.path, *mode, *options.flags(), *keep, "-o", str(out), str(not_an_option(unit))]
            self._run(argv, source, what, names, folder)
            data = out.read_bytes()
            lowered = entries_named(_kept_ptx(folder, out), source, names) if names else {}
            commands = ((f"# {ENTRIES_UNIT}: {_one_line(unit.read_text())}",) if names else ()) + (shlex.join(_shown_argv(argv, folder)),)
            return data, {"lowered": tuple(lowered.items()), "commands": commands}

    def _run(self, argv: list[str], source: Path, what: str, names: tuple[str, ...], folder: Path) -> None:
        with self._slots:
            res = run_tool(argv, timeout=self.timeout)
        if res.returncode != 0:
            log = res.stderr + res.stdout
            if names:  # the unit is gone with its folder: the log says what to write to re-run
                log = f"{ENTRIES_UNIT}, the unit nvcc compiled:\n{(folder / ENTRIES_UNIT).read_text()}\n{log}"
            shown = _shown_argv(argv, folder)
            named = name_in_unit_error(_LOCATION_RE.search(log), names, folder / ENTRIES_UNIT)
            if named is not None:
                raise unknown_kernel_error("nvcc", named, source, log=log, argv=shown, returncode=res.returncode)
            raise CompileError(
                f"nvcc failed to compile {source} for {what}",
                where=log_location(log) or str(source),
                argv=shown,
                returncode=res.returncode,
                log=log,
                fix="fix the error in the kernel source shown in the log",
            )


def _kept_ptx(folder: Path, out: Path) -> bytes:
    """The PTX of this nvcc run: the output itself, or what `--keep` left (any architecture's:
    mangled names do not depend on it)."""
    if out.suffix == ".ptx":
        return out.read_bytes()
    kept = sorted((folder / "kept").glob("*.ptx"))
    if not kept:
        raise KitError("nvcc kept no PTX for the kernels' entries", fix="report this to kitdispatch with the nvcc version")
    return kept[0].read_bytes()


def _one_line(text: str) -> str:
    return text.strip().replace("\n", " \\n ")


def _shown_argv(argv: list[str], folder: Path) -> list[str]:
    """nvcc's command with the paths in its temporary folder named relative to it."""
    return [a.replace(f"{folder}/", "") for a in argv]


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


def get_compiler(name: CompilerName | str, slots: CpuSlots | None = None, *, timeout: float = COMPILE_TIMEOUT_S) -> Compiler:
    """A backend by name; `slots` bounds its compiler runs together with the build's other
    CPU-heavy steps (default: a bound of its own, one run per core); `timeout` bounds each run."""
    if name == CompilerName.NVRTC:
        return NvrtcCompiler(slots, timeout=timeout)
    if name == CompilerName.NVCC:
        return NvccCompiler(slots=slots, timeout=timeout)
    raise KitError(f"unknown compiler {name!r}", fix=f"use one of {', '.join(CompilerName.choices())}")


def check_archs(compiler: Compiler, archs: Iterable[Arch]) -> None:
    """Every backend checks its targets as it compiles (not before: a build whose objects
    all come from the cache never loads its compiler)."""
    check_supported(archs, compiler.supported_archs(), compiler.name)


# Where NVRTC and nvcc point in their logs: `k.cu(12): error: ...`.
_LOCATION_RE = re.compile(r"^(?P<file>[^\s(]+)\((?P<line>\d+)\): (?P<severity>catastrophic error|error|warning|remark)", re.M)
ERRORS = ("error", "catastrophic error")
ANY_SEVERITY = (*ERRORS, "warning", "remark")


def log_location(log: str, severities: tuple[str, ...] = ERRORS) -> str | None:
    """The first place a compiler log points to with one of `severities`, as 'k.cu:12' (the
    form editors and terminals link)."""
    for m in _LOCATION_RE.finditer(log):
        if m.group("severity") in severities:
            return f"{m.group('file')}:{m.group('line')}"
    return None
