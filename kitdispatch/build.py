"""The build pipeline: kernel descriptions -> objects -> MLIR -> .vmfb, published atomically."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from ._files import publish, staging_dir, write_atomic
from ._parallel import CpuSlots
from .arch_features import check_arch_features
from .archs import Arch, parse_arch_list, ptx_fallback_archs
from .cache import Cache, CachedCompiler, vmfb_key
from .compilers import CompileOptions, ObjectCode, get_compiler
from .errors import BuildsFailed, IreeCompileError, KitError, ManifestError
from .iree_compile import choose_codegen_target, compile_args, compile_in_process, compile_vmfb, iree_compiler_version
from .manifest import load_manifest
from .preflight import PreflightError, Version, check_ptx_loads, local_driver, ptx_isa
from .ptx import check_kernel_against_ptx, parse_entries
from .render import ExecutableObjects, VariantObject, render_module
from .runtime import RECORD_SUFFIX
from .spec import OBJECT_FORMATS, ModuleSpec

RECORD_SCHEMA = 1


@dataclass(frozen=True)
class BuildOptions:
    """How to build: target architectures, compiler, object format and tool settings."""

    archs: tuple[Arch, ...]
    compiler: str = "nvrtc"
    format: str = "fatbin"
    compile_options: CompileOptions = CompileOptions()
    codegen_target: str | None = None
    iree_flags: tuple[str, ...] = ()
    jobs: int | None = None
    # Oldest CUDA driver the build must load on (PTX ISA check); None: the local GPU's.
    min_driver: str | None = None
    # Link through IREE's in-process compiler API (faster); False: always run iree-compile.
    iree_in_process: bool = True
    use_cache: bool = True
    cache_dir: str | None = None  # None: KITDISPATCH_CACHE_DIR, XDG_CACHE_HOME or ~/.cache

    @classmethod
    def create(cls, archs: Sequence[str] | str, **kwargs) -> "BuildOptions":
        fmt = kwargs.get("format", cls.format)
        if fmt not in OBJECT_FORMATS:
            raise KitError(f"unknown object format {fmt!r}", fix=f"use one of {', '.join(OBJECT_FORMATS)}")
        if kwargs.get("jobs") is not None and kwargs["jobs"] < 1:
            raise KitError(f"--jobs must be at least 1, got {kwargs['jobs']}", fix="pass a positive number, or leave it out for one per core")
        if kwargs.get("min_driver") is not None:
            Version.parse(kwargs["min_driver"], "--min-driver")
        return cls(parse_arch_list(archs), **kwargs)


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
    specs, options: BuildOptions, out_dir_of: Callable[[ModuleSpec], Path], progress, *, make_vmfb: bool
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
    compiler = get_compiler(options.compiler, slots)  # it checks the architectures as it compiles
    total = sum(len(_jobs(s, options)) + make_vmfb for s in specs)
    shared = _Shared(cache, compiler, slots, progress, total, len(specs), driver.result())
    if len(specs) == 1:
        return (_run(specs[0], options, out_dirs[0], shared, make_vmfb=make_vmfb),)
    # A thread per module: they wait on slots, not on each other.
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = [pool.submit(_run, s, options, d, shared, make_vmfb=make_vmfb) for s, d in zip(specs, out_dirs)]
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
    compiler = _counting(shared.compiler, shared.cache)
    codegen = choose_codegen_target(options.archs, options.codegen_target)
    programs = [_read_program(spec, p.source) for p in spec.programs]
    reference = _reference_path(spec)
    label = f"{spec.name}: " if shared.modules > 1 else ""  # whose step it is, when there are several

    objects = _compile_all(spec, options, compiler, lambda what, secs: shared.report(label + what, secs))
    _check_abi(spec, objects, compiler, options)
    check_arch_features(objects, lambda src, arch: compiler.compile(src, arch, "ptx", dataclasses.replace(compile_options_for(spec, src, options), line_info=True)).data)
    preflight_notes = _preflight(objects, options, shared.driver)

    templates = shared.cache.template_dir if shared.cache is not None else None
    rendered = render_module(spec, _executable_objects(spec, objects), programs=programs, template_cache=templates)
    mlir_name, record_name = f"{spec.name}.mlir", f"{spec.name}{RECORD_SUFFIX}"
    outputs = {o.file_name: o.data for o in objects} | {mlir_name: rendered.text.encode()}
    vmfb_name, iree_runs = None, 0
    with staging_dir(out_dir) as stage:
        if make_vmfb:
            vmfb_name = f"{spec.name}.vmfb"
            link = _Link(spec, programs, objects, codegen.target, stage, mlir_name, vmfb_name)
            outputs[vmfb_name], iree_runs = _link(link, outputs, options, shared, label)
        if reference is not None:
            outputs[reference.name] = reference.read_bytes()
        record = _record(spec, options, compiler, codegen.target, objects, mlir_name, vmfb_name, reference)
        outputs[record_name] = (json.dumps(record, indent=2) + "\n").encode()  # last: it marks a complete build
        if not _already_published(out_dir, outputs):  # a build with nothing new leaves its folder untouched
            for name, data in outputs.items():
                if not (stage / name).exists():
                    write_atomic(stage / name, data)
            publish(stage, out_dir, list(outputs))

    return BuildResult(
        name=spec.name,
        out_dir=out_dir,
        mlir=out_dir / mlir_name,
        vmfb=out_dir / vmfb_name if vmfb_name else None,
        record=out_dir / record_name,
        objects=tuple(out_dir / o.file_name for o in objects),
        codegen_target=codegen.target.name,
        notes=((codegen.note,) if codegen.note and programs else ()) + preflight_notes,
        compiler_runs=compiler.compiles,
        iree_compile_runs=iree_runs,
    )


def _already_published(out_dir: Path, outputs: dict[str, bytes]) -> bool:
    for name, data in outputs.items():
        try:
            if (out_dir / name).stat().st_size != len(data) or (out_dir / name).read_bytes() != data:
                return False
        except OSError:
            return False
    return True


def _counting(compiler, cache: Cache | None) -> CachedCompiler:
    """Every module goes through a CachedCompiler of its own, which counts its compiler runs;
    with no cache it uses an unusable one, so every compile is a miss."""
    return CachedCompiler(compiler, cache if cache is not None else Cache.disabled())


# -------------------------------------------------------------------------- compiling


@dataclass(frozen=True)
class _Job:
    """One compiler run: a source to one object of one format."""

    source: Path
    format: str
    archs: tuple[Arch, ...]

    def describe(self) -> str:
        return f"{self.source.name} for {', '.join(a.name for a in self.archs)} ({self.format})"


def _jobs(spec: ModuleSpec, options: BuildOptions) -> list[_Job]:
    """ptx: one per architecture. cubin: one per architecture, plus PTX fallbacks for GPUs
    the cubins cannot serve. fatbin: one object holding all of it."""
    jobs: list[_Job] = []
    for kernel in spec.kernels:
        src = spec.source_path(kernel.source)
        if kernel.format == "fatbin":
            wanted = [_Job(src, "fatbin", options.archs)]
        else:
            wanted = [_Job(src, kernel.format, (a,)) for a in options.archs]
            if kernel.format == "cubin":
                wanted += [_Job(src, "ptx", (a,)) for a in ptx_fallback_archs(options.archs)]
        jobs += [j for j in wanted if j not in jobs]
    return jobs


def compile_options_for(spec: ModuleSpec, source: Path, options: BuildOptions) -> CompileOptions:
    """The build's options plus the C++ kernel names of this source, which NVRTC must
    instantiate and name (`scale<float>`)."""
    names = tuple(k.name for k in spec.kernels if k.symbol is not None and spec.source_path(k.source) == source)
    return dataclasses.replace(options.compile_options, name_expressions=names) if names else options.compile_options


def _compile_all(spec: ModuleSpec, options: BuildOptions, compiler, report: Callable[[str, float], None]) -> list[ObjectCode]:
    """Cached objects first, in this thread; then what is left, each on a thread of its own
    (the compiler's slots bound how many run at once)."""
    jobs = _jobs(spec, options)
    source_options = {job.source: compile_options_for(spec, job.source, options) for job in jobs}
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
    if missing:
        with ThreadPoolExecutor(max_workers=len(missing)) as pool:
            found |= dict(zip(missing, pool.map(one, missing)))
    return [found[job] for job in jobs]


def _check_abi(spec: ModuleSpec, objects: list[ObjectCode], compiler, options: BuildOptions) -> None:
    """Every kernel against the PTX of its source: entry name, parameters, block size.
    nvcc's cubins and fatbins carry no PTX, so those sources get one PTX compile to check."""
    ptx_by_source: dict[Path, tuple[bytes, str]] = {}
    for obj in objects:
        if obj.ptx is not None:
            ptx_by_source.setdefault(obj.source, (obj.ptx, obj.arch.name))
    for kernel in spec.kernels:
        src = spec.source_path(kernel.source)
        if src not in ptx_by_source:
            oldest = min(options.archs)
            probe = compiler.compile(src, oldest, "ptx", compile_options_for(spec, src, options))
            ptx_by_source[src] = (probe.ptx, oldest.name)
        ptx, arch = ptx_by_source[src]
        check_kernel_against_ptx(kernel, parse_entries(ptx.decode(errors="replace")), f"{src} ({arch})")


def _preflight(objects: list[ObjectCode], options: BuildOptions, driver: Version | None) -> tuple[str, ...]:
    """PTX that is the only code for a GPU must load on the oldest driver the build targets;
    PTX that is a fallback (beside cubins, inside a fatbin) gets a note instead."""
    if driver is None:
        return ()
    notes = []
    for obj in objects:
        version = ptx_isa(obj.data if obj.format == "ptx" else obj.ptx or b"")
        if version is None:
            continue
        is_primary = obj.format == "ptx" and options.format == "ptx"
        try:
            check_ptx_loads(version, driver, compiler=obj.compiler, where=obj.file_name)
        except PreflightError:
            if is_primary:
                raise
            notes.append(f"{obj.file_name}: PTX ISA {version} is newer than driver {driver} loads; "
                         "GPUs that need this PTX fallback will not load it")
    return tuple(dict.fromkeys(notes))


def _executable_objects(spec: ModuleSpec, objects: list[ObjectCode], object_dir: Path | None = None) -> list[ExecutableObjects]:
    """Per source and format: the variants' objects in the order they are tried: the
    primary objects newest first, then (for cubin) the PTX fallbacks newest first.
    Object paths are file names, or absolute under `object_dir` when given."""
    out = []
    for source, fmt in dict.fromkeys((k.source, k.format) for k in spec.kernels):
        path = spec.source_path(source)
        primary = sorted((o for o in objects if o.source == path and o.format == fmt), key=lambda o: o.arch, reverse=True)
        fallback = []
        if fmt == "cubin":
            fallback = sorted((o for o in objects if o.source == path and o.format == "ptx"), key=lambda o: o.arch, reverse=True)
        out.append(
            ExecutableObjects(
                source,
                fmt,
                tuple(
                    VariantObject(o.arch, o.format, str(object_dir / o.file_name) if object_dir else o.file_name)
                    for o in primary + fallback
                ),
            )
        )
    return out


# ---------------------------------------------------------------------------- linking


@dataclass(frozen=True)
class _Link:
    """One module's link step: what it renders and where it stages its inputs."""

    spec: ModuleSpec
    programs: list
    objects: list[ObjectCode]
    codegen: Arch
    stage: Path
    mlir_name: str
    vmfb_name: str


def _link(link: _Link, outputs: dict[str, bytes], options: BuildOptions, shared: _Shared, label: str) -> tuple[bytes, int]:
    """The module's .vmfb bytes, and how many links ran (0 or 1): from the cache when it holds
    one linked from the very same inputs, else linked in process, or by iree-compile as a
    subprocess when that is off or fails (for its log and a command to re-run)."""
    start = time.perf_counter()
    stage, mlir, vmfb = link.stage, link.stage / link.mlir_name, link.stage / link.vmfb_name
    argv = compile_args(mlir, vmfb, link.codegen, stage, options.iree_flags)
    cache, key = shared.cache, None
    if cache is not None and cache.usable:
        flags = [a.replace(str(stage), "<out>") for a in argv[2:]]
        key = vmfb_key(outputs[link.mlir_name].decode(), [(o.file_name, o.data) for o in link.objects], flags, iree_compiler_version())
        hit = cache.get("vmfb", key)
        if hit is not None:
            shared.report(f"{label}cached: {link.vmfb_name}", time.perf_counter() - start)
            return hit[1], 0
    for name in [o.file_name for o in link.objects] + [link.mlir_name]:
        write_atomic(stage / name, outputs[name])
    # The in-process API has no object search path: its MLIR names objects by absolute path.
    templates = cache.template_dir if cache is not None else None
    objects = _executable_objects(link.spec, link.objects, stage)
    linkable = render_module(link.spec, objects, programs=link.programs, template_cache=templates).text
    with shared.slots:
        linked = options.iree_in_process and compile_in_process(linkable, vmfb, link.codegen, options.iree_flags)
        try:
            if not linked:
                compile_vmfb(argv, mlir)
        except IreeCompileError as exc:
            raise _keep_for_rerun(exc, stage) from None
    data = vmfb.read_bytes()
    if key is not None:
        cache.put("vmfb", key, {"name": link.vmfb_name}, data)
    shared.report(f"{label}iree-compile: {link.vmfb_name}", time.perf_counter() - start)
    return data, 1


def _keep_for_rerun(exc: IreeCompileError, stage: Path) -> IreeCompileError:
    """The output folder stays untouched; the failing inputs move to a temp folder so the
    printed command can be re-run as it is."""
    keep = Path(tempfile.mkdtemp(prefix="kitdispatch-failed-"))
    for f in stage.iterdir():
        shutil.move(str(f), keep / f.name)
    argv = [a.replace(str(stage), str(keep)) for a in exc.argv or []]
    log = exc.log.replace(str(stage), str(keep))
    return IreeCompileError(
        exc.what,
        where=(exc.where or "").replace(str(stage), str(keep)),
        argv=argv,
        returncode=exc.returncode,
        log=log,
        fix=f"{exc.fix}; the generated MLIR and objects are kept in {keep}",
    )


# --------------------------------------------------------------------- inputs/record


def _read_program(spec: ModuleSpec, source: Path) -> tuple[str, str]:
    path = spec.source_path(source)
    try:
        return str(path), path.read_text()
    except FileNotFoundError:
        raise ManifestError(
            f"program file {path} does not exist",
            fix="check the program's 'source' path; it is relative to the manifest's folder",
        ) from None


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


def _record(spec, options, compiler, codegen: Arch, objects, mlir_name, vmfb_name, reference) -> dict:
    ptx_versions = [v for o in objects if o.format == "ptx" and (v := ptx_isa(o.data))]
    return {
        "schema": RECORD_SCHEMA,
        "kitdispatch": __version__,
        "name": spec.name,
        "mlir": mlir_name,
        "vmfb": vmfb_name,
        "archs": [a.name for a in options.archs],
        "format": options.format,
        "kernel_formats": {k.name: k.format for k in spec.kernels},
        # The PTX ISA the module needs from the driver when it runs PTX only.
        "ptx_isa": str(max(ptx_versions)) if ptx_versions and options.format == "ptx" else None,
        "compiler": {"name": compiler.name, "version": compiler.version()},
        "iree_compiler": iree_compiler_version() if vmfb_name else None,
        "codegen_target": codegen.name,
        "objects": [o.file_name for o in objects],
        "functions": [s.to_json() for s in spec.signatures],
        "test": {
            "reference": reference.name if reference else None,
            "sizes": dict(spec.test.sizes),
            "seed": spec.test.seed,
        },
    }
