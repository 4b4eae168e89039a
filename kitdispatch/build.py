"""The build pipeline: kernel descriptions -> objects -> MLIR -> .vmfb, published atomically."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from ._files import publish, staging_dir, write_atomic
from .archs import Arch, parse_arch_list, ptx_fallback_archs
from .cache import Cache, CachedCompiler, vmfb_key
from .compilers import CompileOptions, ObjectCode, check_archs, get_compiler
from .errors import IreeCompileError, KitError, ManifestError
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
    return _run(spec, options, Path(out_dir), progress, make_vmfb=True)


def generate(
    spec: ModuleSpec | str | Path,
    options: BuildOptions,
    out_dir: str | Path,
    *,
    progress: Progress | None = None,
) -> BuildResult:
    """Like `build` but stops after the objects and the MLIR, for splicing by hand."""
    return _run(spec, options, Path(out_dir), progress, make_vmfb=False)


def _run(spec, options: BuildOptions, out_dir: Path, progress: Progress | None, *, make_vmfb: bool) -> BuildResult:
    if not isinstance(spec, ModuleSpec):
        spec = load_manifest(spec)
    spec = dataclasses.replace(
        spec, kernels=tuple(dataclasses.replace(k, format=k.format or options.format) for k in spec.kernels)
    )
    cache = Cache(Path(options.cache_dir) if options.cache_dir else None) if options.use_cache else None
    compiler = _counting(get_compiler(options.compiler), cache)
    check_archs(compiler, options.archs)
    codegen = choose_codegen_target(options.archs, options.codegen_target)
    programs = [_read_program(spec, p.source) for p in spec.programs]
    reference = _reference_path(spec)

    objects = _compile_all(spec, options, compiler, progress)
    _check_abi(spec, objects, compiler, options)
    preflight_notes = _preflight(objects, options)

    with staging_dir(out_dir) as stage:
        names: list[str] = []
        for obj in objects:
            write_atomic(stage / obj.file_name, obj.data)
            names.append(obj.file_name)
        rendered = render_module(spec, _executable_objects(spec, objects), programs=programs)
        mlir_name = f"{spec.name}.mlir"
        write_atomic(stage / mlir_name, rendered.text)
        names.append(mlir_name)
        vmfb_name = None
        iree_runs = 0
        if make_vmfb:
            vmfb_name = f"{spec.name}.vmfb"
            # The in-process API has no object search path: it gets absolute object paths.
            linkable = render_module(spec, _executable_objects(spec, objects, stage), programs=programs).text
            iree_runs = _link(stage, mlir_name, vmfb_name, linkable, codegen.target, options, progress, len(objects), cache)
            names.append(vmfb_name)
        if reference is not None:
            shutil.copyfile(reference, stage / reference.name)
            names.append(reference.name)
        record_name = f"{spec.name}{RECORD_SUFFIX}"
        record = _record(spec, options, compiler, codegen.target, objects, mlir_name, vmfb_name, reference)
        write_atomic(stage / record_name, json.dumps(record, indent=2) + "\n")
        names.append(record_name)  # last: its presence marks a complete build
        published = publish(stage, out_dir, names)

    by_name = {p.name: p for p in published}
    return BuildResult(
        name=spec.name,
        out_dir=out_dir,
        mlir=by_name[mlir_name],
        vmfb=by_name[vmfb_name] if vmfb_name else None,
        record=by_name[record_name],
        objects=tuple(by_name[o.file_name] for o in objects),
        codegen_target=codegen.target.name,
        notes=((codegen.note,) if codegen.note and programs else ()) + preflight_notes,
        compiler_runs=compiler.compiles,
        iree_compile_runs=iree_runs,
    )


def _counting(compiler, cache: Cache | None) -> CachedCompiler:
    """Every build goes through CachedCompiler, which counts compiler runs; with no cache it
    uses an unusable one, so every compile is a miss."""
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


def _compile_all(spec: ModuleSpec, options: BuildOptions, compiler, progress: Progress | None) -> list[ObjectCode]:
    jobs = _jobs(spec, options)
    source_options = {job.source: compile_options_for(spec, job.source, options) for job in jobs}
    workers = max(1, min(len(jobs), options.jobs or os.cpu_count() or 1))
    total = len(jobs) + 1  # + the iree-compile step

    def one(job: _Job):
        start = time.perf_counter()
        if job.format == "fatbin":
            obj = compiler.compile_fatbin(job.source, job.archs, source_options[job.source])
        else:
            obj = compiler.compile(job.source, job.archs[0], job.format, source_options[job.source])
        return job, obj, time.perf_counter() - start

    objects = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for n, (job, obj, secs) in enumerate(pool.map(one, jobs), start=1):
            objects.append(obj)
            if progress:
                progress(ProgressEvent(n, total, f"{compiler.name}: {job.describe()}", secs))
    return objects


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


def _preflight(objects: list[ObjectCode], options: BuildOptions) -> tuple[str, ...]:
    """PTX that is the only code for a GPU must load on the oldest driver the build targets;
    PTX that is a fallback (beside cubins, inside a fatbin) gets a note instead."""
    driver = Version.parse(options.min_driver) if options.min_driver else local_driver()
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


def _link(
    stage: Path, mlir_name: str, vmfb_name: str, linkable: str, codegen: Arch, options: BuildOptions, progress, n_objects, cache
) -> int:
    """Links the module, unless the cache holds one linked from the very same inputs.
    In process first; iree-compile as a subprocess when that is off or fails (for its log).
    Returns the number of links run (0 or 1)."""
    start = time.perf_counter()
    argv = compile_args(stage / mlir_name, stage / vmfb_name, codegen, stage, options.iree_flags)
    key = None
    if cache is not None and cache.usable:
        flags = [a.replace(str(stage), "<out>") for a in argv[2:]]
        inputs = [(p.name, p.read_bytes()) for p in stage.iterdir() if p.name != mlir_name]
        key = vmfb_key((stage / mlir_name).read_text(), inputs, flags, iree_compiler_version())
        hit = cache.get("vmfb", key)
        if hit is not None:
            write_atomic(stage / vmfb_name, hit[1])
            if progress:
                progress(ProgressEvent(n_objects + 1, n_objects + 1, f"cached: {vmfb_name}", time.perf_counter() - start))
            return 0
    linked = options.iree_in_process and compile_in_process(linkable, stage / vmfb_name, codegen, options.iree_flags)
    try:
        if not linked:
            compile_vmfb(argv, stage / mlir_name)
    except IreeCompileError as exc:
        raise _keep_for_rerun(exc, stage) from None
    if key is not None:
        cache.put("vmfb", key, {"name": vmfb_name}, (stage / vmfb_name).read_bytes())
    if progress:
        progress(ProgressEvent(n_objects + 1, n_objects + 1, f"iree-compile: {vmfb_name}", time.perf_counter() - start))
    return 1


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
