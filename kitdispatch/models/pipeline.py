"""Kit kernels inside imported models: ops of a model replaced by kernels that declare `replaces`.

The route (IREE 3.13), each step a tool run with its own command to re-run:
1. import: ONNX through `iree-import-onnx`; MLIR (linalg or torch dialect) as it is; a PyTorch
   module through `export_torch` (iree-turbine) first.
2. `iree-compile --compile-to=global-optimization`: importers emit softmax as five
   `linalg.generic`s, which global optimization raises to `linalg.softmax`; there the ops are
   in the form the kernels are matched against. Const-eval has run by then, so replaced
   models need no flag the baseline lacks (a custom dispatch with constant inputs crashes
   const-eval in 3.13: here none is there yet when it runs).
   A kind may need passes run first (its `prepare`: for linalg.generic, IREE's elementwise
   fusion, so that the generics are the ones IREE would compile).
3. replace.py decides per op, asking the kind's module (models/ops); each op to replace gets
   the attribute `kitdispatch.replace`.
4. `iree-opt` runs the generated transform spec (spec.py, mlir_templates/replace_spec.mlir.j2), which
   imports the kernel's executable and a `util.func` wrapper that dispatches it, and
   cast_and_calls the wrapper in place of every marked op; `inline` folds the wrapper in.
5. `iree-compile --compile-from=global-optimization` finishes the .vmfb.
The baseline is the model compiled by one plain `iree-compile` with IREE's default flags.
Tools, flags, staging, publishing and a failed step's kept inputs are the module build's own
(iree/tools.py, builder/publish.py); the record is record.py's ModelRecord.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses
import errno
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kitdispatch._version import __version__
from kitdispatch._files import not_an_option, write_atomic
from kitdispatch.builder.publish import OutputError, OutputFolder, disk_full, keep_for_rerun, os_error, prepare_output_dir, staging_dir
from kitdispatch.describe.record import sha256
from kitdispatch._proc import run_checked, run_tool
from kitdispatch.builder.pipeline import BuildOptions, project_files_in
from kitdispatch.errors import IreeCompileError, KitError, UsageError
from kitdispatch.compile.archs import Arch
from kitdispatch.iree.tools import IREE_COMPILE_TIMEOUT_S, choose_codegen_target, find_tool, iree_compiler_version, target_flags
from kitdispatch.models.ops import OP_KINDS
from kitdispatch.models.ops.base import OpFacts, Preparation
from kitdispatch.models.projects import ModelProjects, Project, model_projects
from kitdispatch.describe.model_record import ModelRecord, ReplacedOp, claimed_files, failed_record, model_record_name, read_model_record
from kitdispatch.models.functions import model_functions
from kitdispatch.models.probes import HeldOutBuilder, ProbeBuilder, ProbeBuilt, Tuning, apply_tune, chains, hold_out, make_probes, same_kernel, tuning_of
from kitdispatch.describe.probe_record import probes_record_name, read_tune_record
from kitdispatch.models.replace import COVERED_ATTRIBUTE, MARK_ATTRIBUTE, Decision, decide, read_ops, replacing_kernels, settle
from kitdispatch.models.spec import SPEC_PIPELINE, check_all_replaced, spec_path_fits, check_symbols_free, kernel_symbols, parse_mlir, render_spec
from kitdispatch.models.transients import FLAGS as TRANSIENTS_FLAGS, Twins, add_twins
from kitdispatch.describe.kernel import ARITHMETICS, Kernel
from kitdispatch.describe.names import TRANSIENTS_SUFFIX, as_identifier

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

STAGE = "global-optimization"


@dataclass(frozen=True)
class ModelBuild:
    """What `build_model` wrote, and what it decided for every candidate op."""

    name: str
    out_dir: Path
    vmfb: Path
    baseline_vmfb: Path | None
    spec: Path
    report: Path  # JSON; the same as text beside it (.txt)
    record: Path
    decisions: tuple[Decision, ...]
    codegen_target: str
    probes: Path | None = None  # the probe record (`probes=True`), for `tune`
    tuning: Tuning | None = None  # what a tune record (`tuned=`) decided

    @property
    def replaced(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.kernel is not None)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "out_dir": str(self.out_dir),
            "vmfb": str(self.vmfb),
            "baseline_vmfb": str(self.baseline_vmfb) if self.baseline_vmfb else None,
            "spec": str(self.spec),
            "report": str(self.report),
            "codegen_target": self.codegen_target,
            "replaced": [d.to_json() for d in self.replaced],
            "not_replaced": [d.to_json() for d in self.decisions if d.kernel is None],
            **({"probes": str(self.probes)} if self.probes else {}),
            **({"tune": self.tuning.to_json()} if self.tuning else {}),
        }


def build_model(
    project: Project | Sequence[Project] | None,
    model: str | Path,
    options: BuildOptions,
    out_dir: str | Path,
    *,
    library: bool = True,
    with_baseline: bool = False,
    name: str | None = None,
    tf32: bool = False,
    probes: bool = False,
    tuned: str | Path | None = None,
    untuned_reason: str | None = None,
) -> ModelBuild:
    """Builds `model` (.mlir or .onnx) into `out_dir/<name>.vmfb` with every op that a kernel
    computes exactly replaced by that kernel. The kernels are those of `project` (a path, a
    ModuleSpec, a sequence of them, or None), then, unless `library` is False, the kit's
    library (projects.py): for an op several kernels fit, the first project's wins. Also
    writes the transform spec, the kernels' objects, a report (`<name>.replace.json` and
    `.txt`) and a record for `compare_model`; with `with_baseline`, `<name>.baseline.vmfb`
    compiled by IREE alone. f32 matmuls get kernels that compute in 3xTF32 (f32-level error);
    with `tf32`, kernels in plain TF32 (faster, ~1e-3 relative error) come first where they
    fit. A build that fails once its ops are matched (no op replaced, a
    kernel or IREE failing) still writes its report, and raises ModelBuildFailed.

    With `probes`, also writes what `tune` needs (models/probes.py): per distinct replaced
    chain of ops a probe module built with the kernel and by IREE alone, for kinds IREE fuses
    otherwise inside a model (norms, softmax, generics) the model with the chains of one kind,
    kernel and shape left to IREE (held-out builds), the capture module and `<name>.probes.json`. With `tuned` (a `<name>.tune.json` written by tune on such a
    build of this model), the ops whose probe tune kept stay IREE's, with tune's reason; the
    others follow the rule. `untuned_reason`: why a build asked to tune did not (no GPU),
    for its report."""
    builders = _probe_builders(project, model, options, library, tf32) if probes else (None, None)
    tuning = _Tuning(Path(tuned) if tuned is not None else None, untuned_reason, *builders)
    return _build(project, model, options, out_dir, library, with_baseline, name, tf32, tuning)


def _build(
    project: Project | Sequence[Project] | None, model: str | Path, options: BuildOptions, out_dir: str | Path, library: bool,
    with_baseline: bool, name: str | None, tf32: bool, tuning: _Tuning,
) -> ModelBuild:
    projects = model_projects(project, library=library)
    kernels = replacing_kernels(projects.module)
    model = not_an_option(Path(model))  # both reach IREE's tools as arguments
    name = name or _model_name(model)
    out_dir = spec_path_fits(not_an_option(Path(out_dir)))
    codegen = choose_codegen_target(options.archs, options.codegen_target).target
    flags = target_flags(codegen, options.iree_flags)  # IREE's defaults otherwise: the baseline is IREE alone
    record_name = model_record_name(name)
    created = prepare_output_dir(out_dir)
    try:
        protected = frozenset().union(*(project_files_in(p, out_dir) for p in projects.projects)) | _model_in(model, out_dir)
        folder = OutputFolder(out_dir, name, record=record_name, claims=claimed_files, protected=protected)
        target = _Target(model, name, out_dir, codegen, tuple(flags), tf32, tuning)
        return _build_model_in(projects, kernels, target, options, folder, with_baseline)
    except BaseException:
        if created:
            try:
                out_dir.rmdir()  # a failed build leaves no folder it made (one with its report stays)
            except OSError:
                pass
        raise


def _probe_builders(
    project: Project | Sequence[Project] | None, model: str | Path, options: BuildOptions, library: bool, tf32: bool,
) -> tuple[ProbeBuilder, HeldOutBuilder]:
    """Builds one probe as the model was built (the same projects, library and options): with
    its kernel and by IREE alone; no module where it does not replace the op as the model did.
    And the model itself with some probes' ops left to IREE (a held-out build)."""
    def build_probe(mlir: Path, folder: Path, pid: str, decision: Decision) -> ProbeBuilt:
        try:
            built = build_model(project, mlir, options, folder, library=library, with_baseline=True, name=pid, tf32=tf32)
        except KitError as exc:
            return ProbeBuilt(None, None, f"the probe's own build failed: {exc.what}")
        why = same_kernel(decision, built.decisions)
        if why:
            return ProbeBuilt(None, None, why)
        return ProbeBuilt(built.vmfb.read_bytes(), built.baseline_vmfb.read_bytes())

    def build_held_out(folder: Path, digests: frozenset[str]) -> tuple[bytes | None, str]:
        try:
            built = _build(project, model, options, folder, library, False, "heldout", tf32, _Tuning(held_out=digests))
        except KitError as exc:  # the model without it replaces nothing, say: tune then judges by the probe alone
            return None, f"the model without it could not be built: {exc.what}"
        return built.vmfb.read_bytes(), ""

    return build_probe, build_held_out


def _model_in(model: Path, out_dir: Path) -> frozenset[str]:
    """The model's own name when it sits in the output folder: never the kit's to replace."""
    try:
        return frozenset({model.name}) if model.resolve().parent == out_dir.resolve() else frozenset()
    except (OSError, RuntimeError):
        return frozenset()


@dataclass(frozen=True)
class _Tuning:
    """What a model build does for tune: read a tune record (`tuned`), make probes
    (`probe_builder`, `held_out_builder`), or leave the ops of some probes to IREE (`held_out`:
    their digests; a probe's held-out build)."""

    tuned: Path | None = None
    untuned_reason: str | None = None
    probe_builder: ProbeBuilder | None = None
    held_out_builder: HeldOutBuilder | None = None
    held_out: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Target:
    """What one model build makes, and where."""

    model: Path
    name: str
    out_dir: Path
    codegen: Arch
    flags: tuple[str, ...]
    tf32: bool = False  # whether kernels computing in plain TF32 may replace f32 ops
    tuning: _Tuning = _Tuning()


@dataclass(frozen=True)
class _Matched:
    """The model at the stage its ops are matched, and what was decided for each op."""

    imported: Path
    context: object  # the ir.Context that `module` lives in
    module: object  # ir.Module
    ops: tuple  # the ir.Operations, in the order of `decisions`
    decisions: tuple[Decision, ...]
    kinds: tuple[str, ...]
    prepared: tuple[Preparation, ...]
    found: tuple = ()  # read_ops' (op, facts), in the order of `decisions`
    tuning: Tuning | None = None


class ModelBuildFailed(KitError):
    """A model build that failed after its ops were matched: its report (`report`, the JSON
    written to `report_path`; None where even that could not be written) says what was
    decided for each op. What failed, where and what to do are the cause's."""

    def __init__(self, cause: KitError, report: dict, report_path: Path | None):
        self.cause = cause
        self.report = report
        self.report_path = report_path
        self.exit_code = cause.exit_code
        super().__init__(cause.what, where=cause.where, fix=cause.fix)

    def render(self) -> str:
        text = self.cause.render()
        return text + (f"\n  report: {self.report_path}" if self.report_path else "")


def _build_model_in(projects: ModelProjects, kernels: tuple[Kernel, ...], target: _Target, options: BuildOptions, folder: OutputFolder, with_baseline: bool) -> ModelBuild:
    with staging_dir(target.out_dir) as stage:
        matched = _match(kernels, target, options, stage)
        try:
            return _finish(projects, matched, target, options, folder, stage, with_baseline)
        except OutputError:  # a file not the kit's in the way, a full disk: the folder stays as it was
            raise
        except KitError as exc:
            failure = exc
    raise _failed(projects, matched.decisions, target, folder, failure) from None


def _match(kernels: tuple[Kernel, ...], target: _Target, options: BuildOptions, stage: Path) -> _Matched:
    """Imports the model, brings it to the stage where ops are matched, and decides per op."""
    model, name, timeout = target.model, target.name, options.link_timeout  # --timeout bounds every step
    imported = import_model(model, stage / f"{name}.imported.mlir", timeout=timeout)
    staged = _run_iree(
        [find_tool("iree-compile"), str(imported), *target.flags, f"--compile-to={STAGE}", "--mlir-print-debuginfo",
         "-o", str(stage / f"{name}.{STAGE}.mlir")],
        what=f"iree-compile could not bring {model} to {STAGE}",
        stage=stage,
        timeout=timeout,
    )
    kinds = tuple(sorted({kind for k in kernels for kind in k.replaces.ops}))
    prepared = tuple(_preparations(kinds))
    for step in prepared:  # passes a kind needs run first (IREE's elementwise fusion for generics)
        staged = _run_iree(
            [find_tool("iree-opt"), str(staged), f"--pass-pipeline={step.pipeline}", "--mlir-print-debuginfo",
             "-o", str(stage / f"{name}.fused.mlir")],
            what=f"iree-opt could not run {step.what} on the model",
            stage=stage,
            timeout=timeout,
        )
    context, module = parse_mlir(staged)
    found = read_ops(module, kinds)
    # Imported models are published beside the vmfb: their locations name that copy.
    found = [(op, dataclasses.replace(f, location=f.location.replace(str(stage), str(target.out_dir)))) for op, f in found]
    decided = decide([facts for _, facts in found], kernels, tf32=target.tf32)
    decisions = settle(found, decided)
    tuning, overrides = None, {}
    if target.tuning.tuned is not None:  # tune's measurements overrule the rule where they cover an op
        path = target.tuning.tuned
        overrides, tuned = apply_tune(read_tune_record(path), path, model, found, decisions, context)
        decisions = settle(found, [overrides.get(i, d) for i, d in enumerate(decided)])
        tuning = tuning_of(path, tuned, decisions)
    if target.tuning.held_out:  # a probe's held-out build: its ops stay IREE's
        overrides |= hold_out(target.tuning.held_out, found, decisions, context)
        decisions = settle(found, [overrides.get(i, d) for i, d in enumerate(decided)])
    return _Matched(imported, context, module, tuple(op for op, _ in found), tuple(decisions), kinds, prepared, tuple(found), tuning)


def _finish(projects: ModelProjects, matched: _Matched, target: _Target, options: BuildOptions, folder: OutputFolder, stage: Path, with_baseline: bool) -> ModelBuild:
    """Builds the kernels of the ops to replace into the model and publishes the build."""
    model, name, out_dir, flags, timeout = target.model, target.name, target.out_dir, list(target.flags), options.link_timeout
    spec, decisions, module = projects.module, matched.decisions, matched.module
    used = list(dict.fromkeys(d.kernel for d in decisions if d.kernel is not None))
    if not used:
        raise KitError(
            f"no op of {model} can be replaced by a kernel of {projects.names}",
            where=str(model),
            fix=_no_match_fix(decisions, matched.kinds, module),
        )
    objects, symbols = kernel_symbols(spec, used, options, stage)
    check_symbols_free(module, symbols, model)
    probe_files = _probes(matched, target, stage) if target.tuning.probe_builder else {}
    for op, decision in zip(matched.ops, decisions):
        if decision.kernel is not None:
            _mark(op, decision, matched.context)
    marked = stage / f"{name}.marked.mlir"
    write_atomic(marked, module.operation.get_asm(enable_debug_info=True))
    spec_name = f"{name}.spec.mlir"
    write_atomic(stage / spec_name, render_spec(projects.names, name, used, decisions, symbols))
    replaced = stage / f"{name}.replaced.mlir"
    _run_iree(
        [find_tool("iree-opt"), str(marked), f"--pass-pipeline={SPEC_PIPELINE.format(spec=stage / spec_name)}",
         "--mlir-print-debuginfo", "-o", str(replaced)],
        what="iree-opt rejected the generated transform spec",
        stage=stage,
        timeout=timeout,
    )
    check_all_replaced(replaced, decisions, symbols.executables, stage)
    vmfb_name = f"{name}.vmfb"
    twins, flags = _finish_compile(replaced, stage / vmfb_name, flags, stage, timeout)
    outputs = [vmfb_name, spec_name, *objects]
    baseline_name = None
    if with_baseline:
        baseline_name = f"{name}.baseline.vmfb"
        _run_iree(
            [find_tool("iree-compile"), str(matched.imported), *flags, "-o", str(stage / baseline_name)],
            what=f"iree-compile could not compile {model} (the baseline, IREE alone)",
            stage=stage,
            timeout=timeout,
        )
        outputs.append(baseline_name)
    if matched.imported != model:
        outputs.append(matched.imported.name)
    files = {n: (stage / n).read_bytes() for n in outputs} | probe_files
    report_name, report = _report_files(files, projects, model, name, decisions, tune=_tune_report(matched, target), twins=twins)
    replaced_json, kept_json = report["replaced"], report["not_replaced"]
    record = ModelRecord(
        kitdispatch=__version__,
        model=str(model),
        project=projects.names,
        vmfb=vmfb_name,
        baseline_vmfb=baseline_name,
        spec=spec_name,
        archs=tuple(a.name for a in options.archs),
        codegen_target=target.codegen.name,
        iree_compiler=iree_compiler_version(),
        iree_flags=tuple(flags),
        matched_after=(STAGE, *(step.pass_name for step in matched.prepared)),
        functions=tuple(dataclasses.replace(f, transients=f.name in twins.names) for f in model_functions(module)),
        replaced=tuple(ReplacedOp(r["op"], r["location"], r["kernel_entry"], r) for r in replaced_json),
        not_replaced=tuple(kept_json),
        kernel_executables=symbols.executables,
        files={n: sha256(data) for n, data in files.items()},
    )
    files[folder.record] = record.to_bytes()  # last: it marks a complete build
    folder.publish(stage, files)

    return ModelBuild(
        name=name,
        out_dir=out_dir,
        vmfb=out_dir / vmfb_name,
        baseline_vmfb=out_dir / baseline_name if baseline_name else None,
        spec=out_dir / spec_name,
        report=out_dir / report_name,
        record=out_dir / folder.record,
        decisions=tuple(decisions),
        codegen_target=target.codegen.name,
        probes=out_dir / probes_record_name(name) if probe_files else None,
        tuning=matched.tuning,
    )


def _finish_compile(replaced: Path, vmfb: Path, flags: list[str], stage: Path, timeout: float) -> tuple[Twins, list[str]]:
    """`iree-compile --compile-from=STAGE` of the replaced model into `vmfb`, with a twin of each
    function whose calls then never block the host (models/transients.py); where IREE rejects
    the module with twins, the module without them, and the report says why. Returns the twins
    and the flags the module was compiled with."""
    def argv(source: Path, extra: Sequence[str]) -> list[str]:
        return [find_tool("iree-compile"), str(source), *flags, *extra, f"--compile-from={STAGE}",
                f"--iree-hal-executable-object-search-path={stage}", "-o", str(vmfb)]

    twins = add_twins(replaced.read_text())
    if twins.names:
        source = stage / f"{replaced.name.removesuffix('.replaced.mlir')}.transients.mlir"
        write_atomic(source, twins.text)
        tried = run_tool(argv(source, TRANSIENTS_FLAGS), timeout=timeout)
        if tried.returncode == 0:
            return twins.sized(vmfb), [*flags, *TRANSIENTS_FLAGS]
        # The module without twins is still the model: build that, and say why.
        first = next((line for line in (tried.stderr + tried.stdout).splitlines() if "error" in line), "no error line")
        why = f"iree-compile rejected the module with them (exit code {tried.returncode}): {first.strip()[:300]}"
        twins = Twins(twins.text, (), {n: why for n in twins.names} | twins.reasons)
    _run_iree(argv(replaced, ()), what="iree-compile could not finish the model with its replacements", stage=stage, timeout=timeout)
    return twins, flags


def _probes(matched: _Matched, target: _Target, stage: Path) -> dict[str, bytes]:
    """The probe files of the build (models/probes.py); the capture module compiled by IREE
    alone from the matching stage."""
    def compile_capture(text: str) -> bytes:
        source = stage / f"{target.name}.capture.mlir"
        write_atomic(source, text)
        vmfb = _run_iree(
            [find_tool("iree-compile"), str(source), *target.flags, f"--compile-from={STAGE}", "-o", str(stage / f"{target.name}.capture.vmfb")],
            what="iree-compile could not build the capture module (the model with its probes' inputs traced)",
            stage=stage,
            timeout=IREE_COMPILE_TIMEOUT_S,
        )
        return vmfb.read_bytes()

    found_chains = chains(matched.found, matched.decisions, matched.context)
    return make_probes(target.name, target.model, matched.module, found_chains, stage, target.tuning.probe_builder, compile_capture,
                       target.tuning.held_out_builder)


def _tune_report(matched: _Matched, target: _Target) -> dict | None:
    """The report's `tune` field: what a tune record decided, or why a build asked to tune did not."""
    if matched.tuning is not None:
        return matched.tuning.to_json()
    if target.tuning.untuned_reason:
        return {"status": "not tuned", "reason": target.tuning.untuned_reason}
    return None


def _report_files(
    files: dict[str, bytes], projects: ModelProjects, model: Path, name: str, decisions: Sequence[Decision], error: KitError | None = None,
    *, tune: dict | None = None, twins: Twins | None = None,
) -> tuple[str, dict]:
    """Adds the report (`NAME.replace.json` and `.txt`) to `files`; returns its name and JSON."""
    report = {
        "model": str(model),
        "projects": [p.name for p in projects.projects],
        "library": projects.library,
        "replaced": [d.to_json() for d in decisions if d.kernel is not None],
        "not_replaced": [d.to_json() for d in decisions if d.kernel is None],
    }
    text = format_report(str(model), decisions)
    if twins is not None:
        report["transients"] = {"functions": [n + TRANSIENTS_SUFFIX for n in twins.names], "not": twins.reasons}
        text += "".join(f"\n{n}{TRANSIENTS_SUFFIX}: {n}$async with caller-provided transient memory (calls do not block the host)" for n in twins.names)
        text += "".join(f"\n{n}: no {TRANSIENTS_SUFFIX} twin: {why}" for n, why in twins.reasons.items())
    if tune is not None:
        report["tune"] = tune
        text += "\n" + ("\n".join(Tuning(tune["file"], tuple(tune["tuned"]), tuple(tune["untuned"])).lines()) if "file" in tune else f"not tuned: {tune['reason']}")
    if error is not None:
        report["error"] = error.render()
        text += "\nthe build failed; nothing was built:\n  " + error.render().replace("\n", "\n  ")
    report_name = f"{name}.replace.json"
    files[report_name] = (json.dumps(report, indent=2) + "\n").encode()
    files[f"{name}.replace.txt"] = (text + "\n").encode()
    return report_name, report


def _failed(projects: ModelProjects, decisions: Sequence[Decision], target: _Target, folder: OutputFolder, failure: KitError) -> ModelBuildFailed:
    """`failure`, with the report of what was decided published in the output folder (with a
    record of the failed build that claims it, so the next build may replace it). The files
    of the folder's previous build go: the folder holds what its last build made."""
    files: dict[str, bytes] = {}
    report_name, report = _report_files(files, projects, target.model, target.name, decisions, failure)
    files[folder.record] = failed_record(str(target.model), projects.names, failure.what, {n: sha256(d) for n, d in files.items()})
    try:
        with staging_dir(target.out_dir) as stage:
            folder.publish(stage, files)
    except KitError:  # the report is in the way of a file not the kit's: the failure still says what failed
        return ModelBuildFailed(failure, report, None)
    return ModelBuildFailed(failure, report, target.out_dir / report_name)


def _preparations(kinds: Sequence[str]) -> list[Preparation]:
    """What the kinds need run on the model before their ops are read, each once."""
    return list(dict.fromkeys(OP_KINDS[k].prepare for k in kinds if OP_KINDS[k].prepare))


def _model_name(model: Path) -> str:
    return as_identifier(model.name.split(".")[0], fallback="model", digit_prefix="m_")


# ------------------------------------------------------------------------ importing


def import_model(model: Path, dest: Path, *, timeout: float = IREE_COMPILE_TIMEOUT_S) -> Path:
    """The model as MLIR IREE can compile: ONNX through iree-import-onnx into `dest`, MLIR as it is."""
    if not model.is_file():
        raise UsageError(f"no model at {model}", fix="pass a .mlir or .onnx file")
    suffix = model.suffix.lower()
    if suffix in (".mlir", ".mlirbc"):
        return model
    if suffix == ".onnx":
        try:
            import onnx  # noqa: F401  (iree-import-onnx needs it; say so before it fails)
        except ImportError:
            raise KitError("importing ONNX models needs the onnx package", fix="pip install onnx (kitdispatch's onnx extra)") from None
        argv = [sys.executable, "-m", "iree.compiler.tools.import_onnx", str(model), "-o", str(dest)]
        run_checked(
            argv,
            timeout=timeout,
            what=f"iree-import-onnx could not import {model}",
            where=str(model),
            fix="check that the model loads with onnx.checker.check_model; the importer's message is above",
        )
        return dest
    raise UsageError(
        f"cannot import {model}: unknown model format {suffix or '(no suffix)'}",
        fix="pass a .mlir (linalg or torch dialect) or .onnx file; for a PyTorch module call "
        "kitdispatch.export_torch(module, example_args, 'model.mlir') first",
    )


def export_torch(module: ir.Module, example_args: Sequence, path: str | Path) -> Path:
    """Exports a PyTorch module through iree-turbine (`iree.turbine.aot.export`) to an MLIR
    file (torch dialect) that `build_model` takes. Needs kitdispatch's torch extra (torch and iree-turbine)."""
    try:
        from iree.turbine import aot
    except ImportError as exc:
        raise KitError(
            f"exporting a PyTorch module needs torch and iree-turbine ({exc})",
            fix="pip install torch iree-turbine (kitdispatch's torch extra)",
        ) from None
    path = Path(path)
    try:
        exported = aot.export(module, args=tuple(example_args))
        with tempfile.TemporaryDirectory(prefix="kitdispatch-export-") as tmp:  # never a folder left in the user's
            exported.save_mlir(str(Path(tmp) / path.name))
            write_atomic(path, (Path(tmp) / path.name).read_bytes())
    except KitError:
        raise
    except Exception as exc:  # torch.export's errors: say which module and why
        raise KitError(
            f"iree-turbine could not export {type(module).__name__}: {exc}",
            fix="check that torch.export.export(module, example_args) works for this module",
        ) from None
    return path


# ------------------------------------------------------------------------ IREE tools


def _run_iree(argv: list[str], *, what: str, stage: Path, timeout: float) -> Path:
    res = run_tool(argv, timeout=timeout)
    if res.returncode != 0 and disk_full(stage, res.stderr + res.stdout):
        raise os_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(stage.parent)), what)
    if res.returncode != 0:
        failed = IreeCompileError(what, argv=argv, returncode=res.returncode, log=_trim(res.stderr + res.stdout))
        raise keep_for_rerun(failed, stage, kept="the inputs of the failing step (model stages, spec, objects)")
    return Path(argv[argv.index("-o") + 1])


def _trim(log: str, limit: int = 80) -> str:
    lines = log.splitlines()
    return log if len(lines) <= limit else "\n".join(lines[:limit] + [f"... ({len(lines) - limit} more lines)"])


def _mark(anchor: ir.Operation, decision: Decision, context: ir.Context) -> None:
    """Marks the op the spec replaces, `call.marked` single users down from the op the kind
    read; the ops before it are marked as covered: they must be gone once the spec ran."""
    op = anchor
    for _ in range(decision.call.marked):
        op.attributes[COVERED_ATTRIBUTE] = _string_attr(context, decision.mark)
        users = list(op.results[0].uses)
        if len(users) != 1:
            raise KitError(
                f"{decision.op.describe()}: its result has {len(users)} users where its kind read one",
                fix="report it as a kitdispatch bug with the model",
            )
        op = users[0].owner
    op.attributes[MARK_ATTRIBUTE] = _string_attr(context, decision.mark)


def _string_attr(context: ir.Context, text: str):
    from iree.compiler import ir

    return ir.StringAttr.get(text, context)


# ------------------------------------------------------------------------ reporting


def format_report(model: str, decisions: Sequence[Decision]) -> str:
    replaced = [d for d in decisions if d.kernel is not None]
    kept = [d for d in decisions if d.kernel is None]
    lines = [f"{model}: {len(replaced)} of {len(decisions)} candidate op(s) replaced"]
    lines += [f"  replaced  {d.op.describe()}\n            by {d.kernel.name}{_with_epilogue(d)}{_arithmetic(d)}" for d in replaced]
    for d in kept:
        lines.append(f"  kept      {d.op.describe()}")
        lines += [f"            {r}" for r in d.reasons or ("no kernel declares this op",)]
    return "\n".join(lines)


def _arithmetic(decision: Decision) -> str:
    arithmetic = decision.kernel.replaces.arithmetic
    return f" in {ARITHMETICS[arithmetic]}" if arithmetic is not None else ""


def _with_epilogue(d: Decision) -> str:
    """How many ops after the matched one its kernel replaces with it (a matmul's epilogue)."""
    return f" with the {d.call.marked} op(s) after it (epilogue {d.kernel.replaces.epilogue})" if d.call.marked else ""


def _no_match_fix(decisions: Sequence[Decision], kinds: Sequence[str], module: ir.Module) -> str:
    if decisions:
        listing = "\n".join(format_report("candidates", decisions).splitlines()[1:])
        return f"no kernel computes exactly what these ops compute:\n{listing}"
    census = _op_census(module)
    # Named kinds only: nearly every model has generics, which need a kernel with a pattern.
    others = [k for k, kind in OP_KINDS.items() if k not in kinds and k in census and kind.suggested]
    return (
        f"the model has no {' or '.join(kinds)} after IREE's {STAGE} "
        f"(its linalg ops: {', '.join(f'{n} x{c}' for n, c in sorted(census.items())) or 'none'})"
        + (f"; no kernel of the project declares {' or '.join(others)}, which a kernel could replace" if others else "")
    )


def _op_census(module: ir.Module) -> dict[str, int]:
    from iree.compiler import ir

    counts: dict[str, int] = {}

    def visit(op: ir.Operation):
        if op.name.startswith(("linalg.", "iree_linalg_ext.")) and op.name != "linalg.yield":
            counts[op.name] = counts.get(op.name, 0) + 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return counts


__all__ = ["ModelBuild", "ModelBuildFailed", "OpFacts", "build_model", "export_torch", "format_report", "import_model", "read_model_record"]
