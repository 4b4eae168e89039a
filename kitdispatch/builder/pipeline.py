"""The build pipeline: kernel descriptions -> objects -> MLIR -> .vmfb, published atomically."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kitdispatch._version import __version__
from kitdispatch._files import not_an_option, read_regular_file, write_atomic
from kitdispatch._parallel import CpuSlots
from kitdispatch._workers import run_in_threads
from kitdispatch.check.arch_features import check_arch_features
from kitdispatch.compile.archs import Arch, ptx_fallback_archs
from kitdispatch.compile.bridge import BridgingCompiler, entry_bridge
from kitdispatch.compile.cache import Cache, CachedCompiler, CachedLinker, Linked, checks_key
from kitdispatch.compile.compilers import ANY_SEVERITY, log_location, CompileOptions, Compiler, ObjectCode, get_compiler
from kitdispatch.errors import BuildsFailed, KitError, ManifestError, ToolError
from kitdispatch.iree.tools import choose_codegen_target, target_release, compile_args, compile_vmfb, iree_compiler_version, iree_flags, link_in_worker
from kitdispatch.describe.manifest import MANIFEST_NAME, load_manifest
from kitdispatch.builder.publish import OutputFolder, disk_full, keep_for_rerun, os_error, prepare_output_dir, staging_dir
from kitdispatch.compile.toolchain import nvrtc_for_driver
from kitdispatch.run.driver_ptx import PreflightError, Version, check_ptx_loads, local_driver, ptx_isa
from kitdispatch.check.ptx import check_kernel_against_ptx, param_accesses, parse_entries
from kitdispatch.describe.record import BuildRecord, Diagnostic, journal_name, record_name, sha256
from kitdispatch.emit.render import ExecutableObjects, VariantObject, render_module
from kitdispatch.check.roles import settle_roles
from kitdispatch.check.declarations import check_compiled_types
from kitdispatch.builder.options import BuildOptions
from kitdispatch.describe.types import FunctionSignature
from kitdispatch.describe.module import ModuleSpec


@dataclass(frozen=True)
class ProgressEvent:
    done: int
    total: int
    what: str
    seconds: float


@dataclass(frozen=True)
class BuildResult:
    name: str
    out_dir: Path
    mlir: Path
    vmfb: Path | None
    record: Path
    objects: tuple[Path, ...]
    codegen_target: str
    notes: tuple[str, ...] = field(default=())
    compiler_runs: int = 0  # CUDA compiler invocations (0 when every object came from the cache)
    iree_compile_runs: int = 0
    diagnostics: tuple[Diagnostic, ...] = ()  # tools' warnings on success, also in the record
    names: dict = field(default_factory=dict)  # kernel -> {function, entry} the kit chose
    removed: tuple[str, ...] = ()  # stale files of the folder's previous build, removed
    # The commands this build ran, to re-run by hand (NVRTC's as equivalent nvcc commands,
    # the link as iree-compile on the published files); cached steps ran nothing.
    commands: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "out_dir": str(self.out_dir),
            "mlir": str(self.mlir),
            "vmfb": str(self.vmfb) if self.vmfb else None,
            "record": str(self.record),
            "objects": [str(o) for o in self.objects],
            "codegen_target": self.codegen_target,
            "notes": list(self.notes),
            "compiler_runs": self.compiler_runs,
            "iree_compile_runs": self.iree_compile_runs,
            "diagnostics": [dataclasses.asdict(d) for d in self.diagnostics],
            "names": self.names,
            "removed": list(self.removed),
            "commands": list(self.commands),
        }


Progress = Callable[[ProgressEvent], None]


def build(
    spec: ModuleSpec | str | Path,
    options: BuildOptions,
    out_dir: str | Path,
    *,
    progress: Progress | None = None,
) -> BuildResult:
    """Compiles every kernel, renders the MLIR and links a .vmfb into `out_dir`."""
    return _build_modules([spec], options, lambda _: Path(out_dir), progress, make_vmfb=True)[0]


def generate(
    spec: ModuleSpec | str | Path,
    options: BuildOptions,
    out_dir: str | Path,
    *,
    progress: Progress | None = None,
) -> BuildResult:
    """Like `build` but stops after the objects and the MLIR, for splicing by hand."""
    return _build_modules([spec], options, lambda _: Path(out_dir), progress, make_vmfb=False)[0]


def build_all(
    specs: Sequence[ModuleSpec | str | Path],
    options: BuildOptions,
    out_root: str | Path,
    *,
    progress: Progress | None = None,
) -> tuple[BuildResult, ...]:
    """Builds several modules at once, each into `out_root/<module name>`.

    Their compiler runs and links share the cores (`options.jobs`), so a link runs while
    another module still compiles. Every module is published on its own: when some fail,
    the others are still built, and the error (`BuildsFailed` for several) names each failure.
    """
    return _build_modules(specs, options, lambda spec: Path(out_root) / spec.name, progress, make_vmfb=True)


def generate_all(
    specs: Sequence[ModuleSpec | str | Path],
    options: BuildOptions,
    out_root: str | Path,
    *,
    progress: Progress | None = None,
) -> tuple[BuildResult, ...]:
    """Like `build_all` but stops after the objects and the MLIR."""
    return _build_modules(specs, options, lambda spec: Path(out_root) / spec.name, progress, make_vmfb=False)


def _loaded(spec: ModuleSpec | str | Path) -> ModuleSpec:
    return spec if isinstance(spec, ModuleSpec) else load_manifest(spec)


def _check_unique_names(specs: Sequence[ModuleSpec]) -> None:
    seen: dict[str, ModuleSpec] = {}
    for spec in specs:
        if spec.name in seen:
            raise ManifestError(
                f"the modules of {seen[spec.name].root} and {spec.root} are both named {spec.name!r}, "
                "and each module is built into a folder of its name",
                fix="give every module its own 'name', or build them one at a time into separate folders",
            )
        seen[spec.name] = spec


@dataclass
class _Shared:
    """What the modules of one build share: the cache, the compiler, the cores, the count."""

    cache: Cache | None
    compiler: object
    slots: CpuSlots
    progress: Progress | None
    total: int  # steps: compiler jobs and links, over every module
    modules: int
    driver: Version | None  # the CUDA driver the PTX must load on (None: no driver here, no check)
    done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self, what: str, seconds: float) -> None:
        if self.progress is None:
            return
        with self.lock:  # one line at a time, numbered in the order steps finish
            self.done += 1
            self.progress(ProgressEvent(self.done, self.total, what, seconds))


def _build_modules(
    specs: Sequence[ModuleSpec | str | Path], options: BuildOptions, out_dir_of: Callable[[ModuleSpec], Path], progress: Progress | None, *, make_vmfb: bool
) -> tuple[BuildResult, ...]:
    with ThreadPoolExecutor(max_workers=1) as side:
        # Loading libcuda for its version takes ~15 ms on a GPU machine (a third of a build with
        # nothing new): it loads while the manifests are read (dlopen releases the GIL).
        driver = side.submit(lambda: Version.parse(options.min_driver) if options.min_driver else local_driver())
        specs = [_with_formats(_loaded(s), options) for s in specs]
    _check_unique_names(specs)  # before any work: each module's folder is named after it
    out_dirs = [out_dir_of(s) for s in specs]
    slots = CpuSlots(options.jobs)
    cache = Cache(Path(options.cache_dir) if options.cache_dir else None) if options.use_cache else None
    # The compiler checks the architectures as it compiles (a cached build never loads it).
    compiler = get_compiler(options.compiler, slots, timeout=options.compile_timeout)
    total = sum(len(_jobs(s, options)) + make_vmfb for s in specs)
    shared = _Shared(cache, compiler, slots, progress, total, len(specs), driver.result())
    if len(specs) == 1:
        return (_run(specs[0], options, out_dirs[0], shared, make_vmfb=make_vmfb),)
    # A thread per module: they wait on slots, not on each other.
    futures = run_in_threads(lambda pair: _run(pair[0], options, pair[1], shared, make_vmfb=make_vmfb), zip(specs, out_dirs))
    failures = [(s.name, f.exception()) for s, f in zip(specs, futures) if f.exception() is not None]
    for _, exc in failures:
        if not isinstance(exc, KitError):
            raise exc  # a kitdispatch bug: its traceback matters more than the other modules
    if len({exc.render() for _, exc in failures}) == 1:
        raise failures[0][1]  # one failure, or the same one in every module (an unknown arch)
    if failures:
        raise BuildsFailed(failures, len(specs))
    return tuple(f.result() for f in futures)


def _with_formats(spec: ModuleSpec, options: BuildOptions) -> ModuleSpec:
    """Kernels that name no object format take the build's."""
    return dataclasses.replace(
        spec, kernels=tuple(dataclasses.replace(k, format=k.format or options.format) for k in spec.kernels)
    )


def _run(spec: ModuleSpec, options: BuildOptions, out_dir: Path, shared: _Shared, *, make_vmfb: bool) -> BuildResult:
    out_dir = not_an_option(out_dir)  # its files reach iree-compile's command line
    created = prepare_output_dir(out_dir)
    try:
        return _run_in(spec, options, out_dir, shared, make_vmfb=make_vmfb)
    except BaseException:
        if created:
            _remove_if_empty(out_dir)  # a failed build leaves no folder it made
        raise


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def _run_in(spec: ModuleSpec, options: BuildOptions, out_dir: Path, shared: _Shared, *, make_vmfb: bool) -> BuildResult:
    # What the folder's previous build wrote; the project's own files there are never the kit's.
    folder = OutputFolder(out_dir, spec.name, protected=project_files_in(spec, out_dir))
    compiler = _counting(shared.compiler, shared.cache)
    if not make_vmfb:
        # gen's MLIR is spliced into the user's own program, and nothing tests it: the
        # [[programs]] and the reference file are neither read nor copied.
        spec = dataclasses.replace(spec, programs=(), test=dataclasses.replace(spec.test, reference=None))
    programs = [_read_program(spec, p.source) for p in spec.programs]
    reference = _reference_path(spec)
    label = f"{spec.name}: " if shared.modules > 1 else ""  # whose step it is, when there are several

    # Fixed before the entries are resolved: the resolved spec names C++ kernels by their entries.
    source_options = {s: compile_options_for(spec, s, options) for s in dict.fromkeys(spec.source_path(k.source) for k in spec.kernels)}
    built = _compile_all(spec, options, source_options, compiler, lambda what, secs: shared.report(label + what, secs))
    # After the compile, which refuses an architecture the compiler cannot target with the
    # list of those it can: a better first message for `--arch sm_50` than IREE's targets.
    codegen = choose_codegen_target(options.archs, options.codegen_target)
    spec = _resolve_entries(spec, built)
    # The pointers' roles are settled here, from the code: the MLIR is rendered after.
    spec, abi_warnings = _check_objects(spec, built, compiler, options, source_options, shared.cache)
    preflight_notes = _preflight(built, shared.driver)

    templates = shared.cache.template_dir if shared.cache is not None else None
    objects = _object_files(built)
    rendered = render_module(
        spec, _executable_objects(spec, built), programs=programs, archs=options.archs, template_cache=templates,
        spelling=target_release().spelling,
    )
    mlir_name, vmfb_name = f"{spec.name}.mlir", f"{spec.name}.vmfb" if make_vmfb else None
    _check_reference_name(reference, [*objects, mlir_name, vmfb_name, record_name(spec.name), journal_name(spec.name)])
    outputs = objects | {mlir_name: rendered.text.encode()}
    inputs: dict[str, bytes] = {}  # files of the folder the build reads and does not write
    diagnostics = _compile_diagnostics(built) + abi_warnings
    iree_runs = 0
    commands = tuple(c for b in built for c in b.obj.commands)
    with staging_dir(out_dir) as stage:
        if vmfb_name is not None:
            link = _Link(rendered.text, objects, codegen.target, stage, mlir_name, vmfb_name)
            linked = _link(link, options, shared, label)
            check_declared_functions(spec, linked.declarations)
            outputs[vmfb_name], iree_runs = linked.vmfb, int(linked.ran)
            if linked.ran:
                argv = compile_args(out_dir / mlir_name, out_dir / vmfb_name, codegen.target, out_dir, options.iree_flags)
                commands += (shlex.join(argv),)
            diagnostics += tuple(Diagnostic("iree-compile", mlir_name, d) for d in linked.diagnostics)
        if reference is not None:
            # A reference that lives in the output folder itself is already in place: it is
            # recorded with its hash, never published (nor ever removed) as the kit's.
            into = inputs if reference.name in folder.protected else outputs
            into[reference.name] = _read_reference(reference)
        record = _record(spec, options, compiler, codegen.target, built, outputs, mlir_name, vmfb_name, reference, diagnostics)
        record = dataclasses.replace(record, inputs={n: sha256(d) for n, d in inputs.items()})
        outputs[record_name(spec.name)] = record.to_bytes()  # last: it marks a complete build
        published = folder.publish(stage, outputs)

    return BuildResult(
        name=spec.name,
        out_dir=out_dir,
        mlir=out_dir / mlir_name,
        vmfb=out_dir / vmfb_name if vmfb_name else None,
        record=out_dir / record_name(spec.name),
        objects=tuple(out_dir / name for name in objects),
        codegen_target=codegen.target.name,
        notes=((codegen.note,) if codegen.note and programs else ()) + preflight_notes,
        compiler_runs=compiler.compiles,
        iree_compile_runs=iree_runs,
        diagnostics=diagnostics,
        names=record.names,
        removed=published.removed,
        commands=commands,
    )


def _counting(compiler: Compiler, cache: Cache | None) -> CachedCompiler:
    """Every module goes through a CachedCompiler of its own, which counts its compiler runs;
    with no cache it uses an unusable one, so every compile is a miss."""
    return CachedCompiler(BridgingCompiler(compiler), cache if cache is not None else Cache.disabled())


# -------------------------------------------------------------------------- compiling


@dataclass(frozen=True)
class _Job:
    """One compiler run: a source to one object of one format. A `fallback` is PTX shipped
    beside cubins for GPUs they cannot serve; the build does not depend on it loading."""

    source: Path
    format: str
    archs: tuple[Arch, ...]
    stem: str  # the object's file name stem, unique in the module
    fallback: bool = False

    def describe(self) -> str:
        return f"{self.source.name} for {', '.join(a.name for a in self.archs)} ({self.format})"


@dataclass(frozen=True)
class _Built:
    """A job's object, and its file name in the output folder."""

    job: _Job
    obj: ObjectCode

    @property
    def file_name(self) -> str:
        return self.obj.file_name(self.job.stem)


def _jobs(spec: ModuleSpec, options: BuildOptions) -> list[_Job]:
    """ptx: one per architecture. cubin: one per architecture, plus PTX fallbacks for GPUs
    the cubins cannot serve. fatbin: one object holding all of it, or one per architecture
    where a kernel of the source reserves different dynamic shared memory on them (IREE
    launches an export with one size: each size needs a variant of its own)."""
    jobs: list[_Job] = []
    per_arch = _sources_with_shared_memory_per_arch(spec, options.archs)
    for kernel in spec.kernels:
        src, stem = spec.source_path(kernel.source), spec.source_stem(kernel.source)
        if kernel.format == "fatbin" and src not in per_arch:
            wanted = [_Job(src, "fatbin", options.archs, stem)]
        elif kernel.format == "fatbin":
            wanted = [_Job(src, "fatbin", (a,), stem) for a in options.archs]
        else:
            wanted = [_Job(src, kernel.format, (a,), stem) for a in options.archs]
            if kernel.format == "cubin":
                wanted += [_Job(src, "ptx", (a,), stem, fallback=True) for a in ptx_fallback_archs(options.archs)]
        jobs += [j for j in wanted if j not in jobs and dataclasses.replace(j, fallback=not j.fallback) not in jobs]
    return jobs


def _sources_with_shared_memory_per_arch(spec: ModuleSpec, archs: Sequence[Arch]) -> set[Path]:
    return {
        spec.source_path(k.source) for k in spec.kernels if len({k.shared_memory_for(a.name) for a in archs}) > 1
    }


def compile_options_for(spec: ModuleSpec, source: Path, options: BuildOptions) -> CompileOptions:
    """The build's options plus the C++ kernel names of this source, which NVRTC must
    instantiate and name (`scale<float>`), and the entries to bridge to IREE's parameter
    passing (bridge.py)."""
    mine = [k for k in spec.kernels if spec.source_path(k.source) == source]
    names = tuple(k.name for k in mine if k.cpp_name and k.symbol is None)
    bridges = tuple(entry_bridge(k) for k in mine if k.needs_bridge)
    base = _with_manifest_flags(spec, source, options.compile_options)
    return dataclasses.replace(base, name_expressions=names, bridges=bridges)


def _with_manifest_flags(spec: ModuleSpec, source: Path, options: CompileOptions) -> CompileOptions:
    """The manifest's include_dirs and defines for `source` before the build's own (-I, -D:
    the command line has the last word). Each folder must exist: a typo would otherwise
    show up as a missing header, far from its cause."""
    dirs, defines = spec.source_flags(source)
    for d in dirs:
        if not Path(d).is_dir():
            raise ManifestError(
                f"include directory {d} (for {source.name}) is not a folder",
                where=f"module {spec.name!r}",
                fix="fix include_dirs; relative folders are relative to the manifest's folder",
            )
    if not dirs and not defines:
        return options
    return dataclasses.replace(
        options,
        include_dirs=(*dirs, *(d for d in options.include_dirs if d not in dirs)),
        defines=(*defines, *options.defines),
    )


def _compile_all(
    spec: ModuleSpec, options: BuildOptions, source_options: dict[Path, CompileOptions], compiler: CachedCompiler, report: Callable[[str, float], None]
) -> list[_Built]:
    """Cached objects first, in this thread; then what is left, each on a thread of its own
    (the compiler's slots bound how many run at once)."""
    jobs = _jobs(spec, options)
    found = {job: compiler.lookup(job.source, job.archs, job.format, source_options[job.source]) for job in jobs}
    for job, obj in found.items():
        if obj is not None:
            report(f"cached: {job.describe()}", 0.0)

    def one(job: _Job) -> ObjectCode:
        start = time.perf_counter()
        if job.format == "fatbin":
            obj = compiler.compile_fatbin(job.source, job.archs, source_options[job.source])
        else:
            obj = compiler.compile(job.source, job.archs[0], job.format, source_options[job.source])
        report(f"{compiler.name}: {job.describe()}", time.perf_counter() - start)
        return obj

    missing = [job for job in jobs if found[job] is None]
    futures = run_in_threads(one, missing)
    for f in futures:
        if f.exception() is not None:
            raise f.exception()
    found |= {job: f.result() for job, f in zip(missing, futures)}
    return [_Built(job, found[job]) for job in jobs]


def _resolve_entries(spec: ModuleSpec, built: list[_Built]) -> ModuleSpec:
    """C++ kernels get their entries (mangled names) from the build's own objects: NVRTC
    reports them for its name expressions, nvcc's entries unit names them in its PTX
    (compilers.entries_unit); either compiler alone, the other need not compile the source."""
    kernels = []
    for k in spec.kernels:
        if k.cpp_name and k.symbol is None:
            src = spec.source_path(k.source)
            lowered = next((dict(b.obj.lowered)[k.name] for b in built if b.obj.source == src and k.name in dict(b.obj.lowered)), None)
            if lowered is None:
                raise KitError(
                    f"the compiled objects of {src} do not say the entry of C++ kernel {k.name!r}",
                    where=str(src),
                    fix="report this to kitdispatch; meanwhile name the kernel by its mangled entry, with `params`",
                )
            k = dataclasses.replace(k, symbol=lowered)
        kernels.append(k)
    return dataclasses.replace(spec, kernels=tuple(kernels))


def _ptx_with_lines(source: Path, arch: Arch, compiler: CachedCompiler, source_options: dict[Path, CompileOptions]) -> bytes:
    """The source's PTX with -lineinfo, for an error that names the source line."""
    with_lines = dataclasses.replace(source_options[source], line_info=True)
    return compiler.compile(source, arch, "ptx", with_lines).data


def _check_objects(
    spec: ModuleSpec, built: list[_Built], compiler: CachedCompiler, options: BuildOptions, source_options: dict[Path, CompileOptions], cache: Cache | None
) -> tuple[ModuleSpec, tuple[Diagnostic, ...]]:
    """The objects against the kernels (ABI, pointer roles, architecture features): the spec
    with every pointer's role settled by the code (roles.py), and the warnings. The verdict
    is cached under both, so a rebuild with nothing new does not re-read megabytes of PTX. A
    failing check raises, so only passing verdicts (roles and warnings) are stored."""
    key = None
    if cache is not None and cache.usable:
        described = repr((str(spec.root), spec.kernels))
        key = checks_key(described, [(b.obj.data, b.obj.ptx) for b in built], f"{compiler.name} {compiler.version()}")
        hit = cache.get("checks", key)
        if hit is not None and isinstance(hit[0].get("roles"), list) and len(hit[0]["roles"]) == len(spec.kernels):
            kernels = tuple(k.with_roles(r, k.name) for k, r in zip(spec.kernels, hit[0]["roles"]))
            warnings = tuple(Diagnostic(**d) for d in hit[0].get("warnings", []))
            return dataclasses.replace(spec, kernels=kernels), warnings
    settled, warnings = _check_abi(spec, built, compiler, options, source_options)
    check_arch_features([b.obj for b in built], lambda src, arch: _ptx_with_lines(src, arch, compiler, source_options))
    if key is not None:
        roles = [{b.name: b.access for b in k.buffers} for k in settled.kernels]
        cache.put("checks", key, {"warnings": [dataclasses.asdict(w) for w in warnings], "roles": roles}, b"")
    return settled, warnings


def _check_abi(
    spec: ModuleSpec, built: list[_Built], compiler: CachedCompiler, options: BuildOptions, source_options: dict[Path, CompileOptions]
) -> tuple[ModuleSpec, tuple[Diagnostic, ...]]:
    """Every kernel against the PTX of its source: entry name, parameters, block size; then
    its pointers' roles from the loads and stores of its code (roles.py). nvcc's cubins and
    fatbins carry no PTX, so those sources get one PTX compile."""
    ptx_by_source: dict[Path, tuple[bytes, Arch]] = {}
    warnings: list[Diagnostic] = []
    kernels = []
    for b in built:
        if b.obj.ptx is not None:
            ptx_by_source.setdefault(b.obj.source, (b.obj.ptx, b.obj.arch))
    for kernel in spec.kernels:
        src = spec.source_path(kernel.source)
        if src not in ptx_by_source:
            oldest = min(options.archs)
            probe = compiler.compile(src, oldest, "ptx", source_options[src])
            ptx_by_source[src] = (probe.ptx, oldest)
        ptx, arch = ptx_by_source[src]
        text = ptx.decode(errors="replace")
        where = f"{src} ({arch.name})"
        check_kernel_against_ptx(kernel, parse_entries(text), where)
        check_compiled_types(kernel, src, arch, source_options[src], where, timeout=options.compile_timeout)
        try:
            kernel, found = settle_roles(kernel, param_accesses(text, kernel.entry), where)
        except ManifestError:  # again on PTX with line info, so the error names the source line
            lined = _ptx_with_lines(src, arch, compiler, source_options).decode(errors="replace")
            settle_roles(kernel, param_accesses(lined, kernel.entry) or param_accesses(text, kernel.entry), where)
            raise
        kernels.append(kernel)
        warnings += [Diagnostic("kitdispatch", str(src), w) for w in found]
    return dataclasses.replace(spec, kernels=tuple(kernels)), tuple(warnings)


def _preflight(built: list[_Built], driver: Version | None) -> tuple[str, ...]:
    """PTX that is the only code for a GPU (a kernel built as PTX, whatever the build's own
    format) must load on the oldest driver the build targets; PTX that is a fallback (beside
    cubins, inside a fatbin) gets a note instead."""
    if driver is None:
        return ()
    notes = []
    for b in built:
        obj = b.obj
        version = ptx_isa(obj.data if obj.format == "ptx" else obj.ptx or b"")
        if version is None:
            continue
        try:
            check_ptx_loads(version, driver, compiler=obj.compiler, where=b.file_name, rebuild_with=nvrtc_for_driver(driver))
        except PreflightError:
            if _is_primary_ptx(b):
                raise
            notes.append(f"{b.file_name}: PTX ISA {version} is newer than driver {driver} loads; "
                         "GPUs that need this PTX fallback will not load it")
    return tuple(dict.fromkeys(notes))


def _is_primary_ptx(b: _Built) -> bool:
    return b.obj.format == "ptx" and not b.job.fallback


def _compile_diagnostics(built: list[_Built]) -> tuple[Diagnostic, ...]:
    seen: dict[tuple[str, str], Diagnostic] = {}
    for b in built:
        for text in b.obj.diagnostics:
            where = log_location(text, ANY_SEVERITY) or str(b.obj.source)
            seen.setdefault((where, text), Diagnostic(b.obj.compiler, where, text))
    return tuple(seen.values())


def _object_files(built: list[_Built]) -> dict[str, bytes]:
    """Each object's bytes by its file name; two objects of one name would lose one unseen."""
    files: dict[str, _Built] = {}
    for b in built:
        other = files.setdefault(b.file_name, b)
        if other is not b:
            raise KitError(
                f"{other.job.source} and {b.job.source} would both be written as {b.file_name}",
                fix="rename one of the two sources",
            )
    return {name: b.obj.data for name, b in files.items()}


def _executable_objects(spec: ModuleSpec, built: list[_Built]) -> list[ExecutableObjects]:
    """Per source and format: the variants' objects in the order they are tried: the
    primary objects newest first, then (for cubin) the PTX fallbacks newest first."""
    out = []
    for source, fmt in dict.fromkeys((k.source, k.format) for k in spec.kernels):
        path = spec.source_path(source)
        mine = [b for b in built if b.obj.source == path]
        primary = sorted((b for b in mine if b.obj.format == fmt), key=lambda b: b.obj.arch, reverse=True)
        fallback = []
        if fmt == "cubin":
            fallback = sorted((b for b in mine if b.job.fallback), key=lambda b: b.obj.arch, reverse=True)
        variants = tuple(VariantObject(b.obj.arch, b.obj.format, b.file_name) for b in primary + fallback)
        out.append(ExecutableObjects(source, fmt, variants))
    return out


# ---------------------------------------------------------------------------- linking


@dataclass(frozen=True)
class _Link:
    """One module's link step: the MLIR, the objects it names, where it stages its inputs."""

    mlir: str
    objects: dict[str, bytes]
    codegen: Arch
    stage: Path
    mlir_name: str
    vmfb_name: str


def _link(link: _Link, options: BuildOptions, shared: _Shared, label: str) -> Linked:
    """The module's .vmfb: from the cache when it holds one linked from the very same inputs,
    else linked through IREE's API in a worker, or by iree-compile as a subprocess when that
    is off or fails (for its log and a command to re-run)."""
    start = time.perf_counter()
    flags = iree_flags(link.codegen, options.iree_flags)
    linker = CachedLinker(shared.cache, iree_compiler_version())
    linked = linker.link(link.mlir, sorted(link.objects.items()), flags, lambda: _run_link(link, options, shared))
    what = "iree-compile" if linked.ran else "cached"
    shared.report(f"{label}{what}: {link.vmfb_name}", time.perf_counter() - start)
    return linked


def _run_link(link: _Link, options: BuildOptions, shared: _Shared) -> tuple[bytes, list[str]]:
    stage, mlir, vmfb = link.stage, link.stage / link.mlir_name, link.stage / link.vmfb_name
    try:
        for name, data in [*link.objects.items(), (link.mlir_name, link.mlir.encode())]:
            write_atomic(stage / name, data)
    except OSError as exc:
        raise os_error(exc, f"cannot stage the link inputs in {stage}") from None
    argv = compile_args(mlir, vmfb, link.codegen, stage, options.iree_flags)
    log = ""
    with shared.slots:
        try:
            ok = False
            if options.iree_in_process:
                ok, log = link_in_worker(link.mlir, stage, vmfb, link.codegen, options.iree_flags, timeout=options.link_timeout)
            if not ok:
                log = compile_vmfb(argv, mlir, timeout=options.link_timeout)
        except ToolError as exc:
            if disk_full(stage, exc.log):  # IREE dies on a write error: say what really failed
                raise os_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(stage.parent)), f"cannot link {link.vmfb_name}") from None
            raise keep_for_rerun(exc, stage, kept="the generated MLIR and objects") from None
    try:
        return vmfb.read_bytes(), [log] if log.strip() else []
    except OSError as exc:
        raise os_error(exc, f"cannot read the linked module {vmfb}") from None


# ------------------------------------------------------------------ declared functions


_DECLARATION_RE = re.compile(r"func @[\w$.-]+\((?P<args>.*)\)\s*->\s*\((?P<results>.*)\)\s*\Z", re.S)


def check_declared_functions(spec: ModuleSpec, declarations: dict[str, str]) -> None:
    """Every function the manifest declares ([[programs]] functions, and each kernel's) is in
    the linked module with exactly the declared argument and result types."""
    for program in spec.programs:
        for sig in program.functions:
            _check_declaration(sig, declarations, str(spec.source_path(program.source)))
    for kernel in spec.kernels:
        _check_declaration(kernel.signature(), declarations, f"kernel {kernel.name!r}")


def _check_declaration(sig: FunctionSignature, declarations: dict[str, str], where: str) -> None:
    if sig.name not in declarations:
        raise ManifestError(
            f"function {sig.name!r} is declared but the compiled module has no such function",
            where=where,
            fix=f"declare the functions the program defines (the module has: {', '.join(sorted(declarations)) or 'none'})",
        )
    m = _DECLARATION_RE.search(declarations[sig.name])
    if m is None:
        return  # a declaration IREE wrote in a form this kit does not know: nothing to compare
    have = (_declared_types(m.group("args")), _declared_types(m.group("results")))
    want = (tuple(m for t in sig.args for m in t.mlir_types), tuple(m for t in sig.results for m in t.mlir_types))
    if have != want:
        raise ManifestError(
            f"function {sig.name!r} is declared as ({', '.join(want[0])}) -> ({', '.join(want[1])}) but the "
            f"compiled module has ({', '.join(have[0])}) -> ({', '.join(have[1])})",
            where=where,
            fix="make the manifest's args and results match the program's func.func signature",
        )


def _declared_types(text: str) -> tuple[str, ...]:
    """`%input0: tensor<?xf32>, %input1: i32` -> ('tensor<?xf32>', 'i32')."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "<([{"
        depth -= ch in ">)]}"
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    types = [item.split(":", 1)[1].strip() if ":" in item else item.strip() for item in items]
    return tuple(t.split(" {", 1)[0] for t in types if t)


# --------------------------------------------------------------------- inputs/record


def _read_program(spec: ModuleSpec, source: Path) -> tuple[str, str]:
    path = spec.source_path(source)
    try:
        return str(path), read_regular_file(path).decode()
    except FileNotFoundError:
        raise ManifestError(
            f"program file {path} does not exist",
            fix="check the program's 'source' path; it is relative to the manifest's folder",
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(f"cannot read program file {path}: {getattr(exc, 'strerror', None) or exc}", fix="point 'source' at a UTF-8 MLIR file") from None


def _reference_path(spec: ModuleSpec) -> Path | None:
    if spec.test.reference is None:
        return None
    path = spec.source_path(spec.test.reference)
    if not path.is_file():
        raise ManifestError(
            f"reference file {path} does not exist",
            fix="check [test] reference; it is relative to the manifest's folder",
        )
    return path


def project_files_in(spec: ModuleSpec, out_dir: Path) -> frozenset[str]:
    """Names of the project's own files (manifest, kernel and program sources, reference) that
    sit in `out_dir`: building into the project's folder must never adopt or remove them."""
    paths = [spec.root / MANIFEST_NAME, *(spec.source_path(k.source) for k in spec.kernels)]
    paths += [spec.source_path(p.source) for p in spec.programs]
    if spec.test.reference is not None:
        paths.append(spec.source_path(spec.test.reference))
    try:
        here = out_dir.resolve()
        return frozenset(p.name for p in paths if p.resolve().parent == here)
    except (OSError, RuntimeError, ValueError):  # a symlink loop in a path: nothing of it is here
        return frozenset()


def _check_reference_name(reference: Path | None, outputs: list[str | None]) -> None:
    """A reference named like one of the build's outputs would be shipped in its place."""
    if reference is not None and reference.name in outputs:
        raise ManifestError(
            f"[test] reference {reference.name!r} has the name of one of the build's outputs",
            where=str(reference),
            fix="rename the reference file (e.g. reference.py) and its [test] reference entry",
        )


def _read_reference(path: Path) -> bytes:
    try:
        return read_regular_file(path)
    except OSError as exc:
        raise ManifestError(f"cannot read reference file {path}: {exc.strerror}", fix="point [test] reference at a Python file") from None


def _record(spec: ModuleSpec, options: BuildOptions, compiler: CachedCompiler, codegen: Arch, built: list[_Built], outputs: dict[str, bytes], mlir_name: str, vmfb_name: str | None, reference: Path | None, diagnostics: tuple[Diagnostic, ...]) -> BuildRecord:
    ptx_versions = [v for b in built if _is_primary_ptx(b) and (v := ptx_isa(b.obj.data))]
    return BuildRecord(
        name=spec.name,
        kitdispatch=__version__,
        mlir=mlir_name,
        vmfb=vmfb_name,
        archs=tuple(a.name for a in options.archs),
        format=options.format,
        kernel_formats={k.name: k.format for k in spec.kernels},
        ptx_isa=str(max(ptx_versions)) if ptx_versions else None,
        compiler={"name": compiler.name, "version": compiler.version()},
        iree_compiler=iree_compiler_version() if vmfb_name else None,
        codegen_target=codegen.name,
        objects=tuple(b.file_name for b in built),
        functions=spec.signatures,
        test=dataclasses.replace(spec.test, reference=Path(reference.name) if reference else None),
        files={name: sha256(data) for name, data in outputs.items()},
        names={
            k.name: {"function": k.function, "entry": k.entry}
            for k in spec.kernels
            if k.function != k.name or k.entry != k.name
        },
        diagnostics=diagnostics,
    )
