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
from kitdispatch.builder.publish import OutputFolder, disk_full, keep_for_rerun, os_error, prepare_output_dir, staging_dir
from kitdispatch.describe.record import sha256
from kitdispatch._proc import run_checked, run_tool
from kitdispatch.builder.pipeline import BuildOptions, project_files_in
from kitdispatch.errors import IreeCompileError, KitError
from kitdispatch.compile.archs import Arch
from kitdispatch.iree.tools import IREE_COMPILE_TIMEOUT_S, choose_codegen_target, find_tool, iree_compiler_version, target_flags
from kitdispatch.describe.manifest import load_manifest
from kitdispatch.models.ops import OP_KINDS
from kitdispatch.models.ops.base import OpFacts, Preparation, TensorFacts, tensor_facts
from kitdispatch.models.record import ModelFunction, ModelRecord, ReplacedOp, claimed_files, model_record_name, read_model_record
from kitdispatch.models.replace import MARK_ATTRIBUTE, Decision, decide, read_ops, replacing_kernels
from kitdispatch.models.spec import SPEC_PIPELINE, check_all_replaced, check_symbols_free, kernel_symbols, parse_mlir, render_spec, top_ops
from kitdispatch.describe.kernel import Kernel
from kitdispatch.describe.module import ModuleSpec
from kitdispatch.describe.names import as_identifier

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
        }


def build_model(
    project: ModuleSpec | str | Path,
    model: str | Path,
    options: BuildOptions,
    out_dir: str | Path,
    *,
    with_baseline: bool = False,
    name: str | None = None,
) -> ModelBuild:
    """Builds `model` (.mlir or .onnx) into `out_dir/<name>.vmfb` with every op that a kernel
    of `project` computes exactly replaced by that kernel. Also writes the transform spec,
    the kernels' objects, a report (`<name>.replace.json` and `.txt`) and a record for
    `compare_model`; with `with_baseline`, `<name>.baseline.vmfb` compiled by IREE alone."""
    spec = project if isinstance(project, ModuleSpec) else load_manifest(project)
    kernels = replacing_kernels(spec)
    model = not_an_option(Path(model))  # both reach IREE's tools as arguments
    name = name or _model_name(model)
    out_dir = not_an_option(Path(out_dir))
    codegen = choose_codegen_target(options.archs, options.codegen_target).target
    flags = target_flags(codegen, options.iree_flags)  # IREE's defaults otherwise: the baseline is IREE alone
    record_name = model_record_name(name)
    created = prepare_output_dir(out_dir)
    try:
        protected = project_files_in(spec, out_dir) | _model_in(model, out_dir)
        folder = OutputFolder(out_dir, name, record=record_name, claims=claimed_files, protected=protected)
        return _build_model_in(spec, kernels, model, name, options, out_dir, folder, codegen, flags, with_baseline)
    except BaseException:
        if created:
            try:
                out_dir.rmdir()  # a failed build leaves no folder it made
            except OSError:
                pass
        raise


def _model_in(model: Path, out_dir: Path) -> frozenset[str]:
    """The model's own name when it sits in the output folder: never the kit's to replace."""
    try:
        return frozenset({model.name}) if model.resolve().parent == out_dir.resolve() else frozenset()
    except (OSError, RuntimeError):
        return frozenset()


def _build_model_in(spec: ModuleSpec, kernels: tuple[Kernel, ...], model: Path, name: str, options: BuildOptions, out_dir: Path, folder: OutputFolder, codegen: Arch, flags: list[str], with_baseline: bool) -> ModelBuild:
    record_name = folder.record
    with staging_dir(out_dir) as stage:
        timeout = options.link_timeout  # --timeout bounds every step of the model's build
        imported = import_model(model, stage / f"{name}.imported.mlir", timeout=timeout)
        staged = _run_iree(
            [find_tool("iree-compile"), str(imported), *flags, f"--compile-to={STAGE}", "--mlir-print-debuginfo",
             "-o", str(stage / f"{name}.{STAGE}.mlir")],
            what=f"iree-compile could not bring {model} to {STAGE}",
            stage=stage,
            timeout=timeout,
        )
        kinds = sorted({kind for k in kernels for kind in k.replaces.ops})
        prepared = _preparations(kinds)
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
        found = [(op, dataclasses.replace(f, location=f.location.replace(str(stage), str(out_dir)))) for op, f in found]
        decisions = decide([facts for _, facts in found], kernels)
        used = list(dict.fromkeys(d.kernel for d in decisions if d.kernel is not None))
        if not used:
            raise KitError(
                f"no op of {model} can be replaced by a kernel of {spec.name}",
                where=str(model),
                fix=_no_match_fix(decisions, kinds, module),
            )
        objects, symbols = kernel_symbols(spec, used, options, stage)
        check_symbols_free(module, symbols, model)
        for (op, _), decision in zip(found, decisions):
            if decision.kernel is not None:
                op.attributes[MARK_ATTRIBUTE] = _string_attr(context, decision.mark)
        marked = stage / f"{name}.marked.mlir"
        write_atomic(marked, module.operation.get_asm(enable_debug_info=True))
        spec_name = f"{name}.spec.mlir"
        write_atomic(stage / spec_name, render_spec(spec.name, name, used, decisions, symbols))
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
        _run_iree(
            [find_tool("iree-compile"), str(replaced), *flags, f"--compile-from={STAGE}",
             f"--iree-hal-executable-object-search-path={stage}", "-o", str(stage / vmfb_name)],
            what="iree-compile could not finish the model with its replacements",
            stage=stage,
            timeout=timeout,
        )
        outputs = [vmfb_name, spec_name, *objects]
        baseline_name = None
        if with_baseline:
            baseline_name = f"{name}.baseline.vmfb"
            _run_iree(
                [find_tool("iree-compile"), str(imported), *flags, "-o", str(stage / baseline_name)],
                what=f"iree-compile could not compile {model} (the baseline, IREE alone)",
                stage=stage,
                timeout=timeout,
            )
            outputs.append(baseline_name)
        if imported != model:
            outputs.append(imported.name)
        replaced_json = [d.to_json() for d in decisions if d.kernel is not None]
        kept_json = [d.to_json() for d in decisions if d.kernel is None]
        report_name, text_name = f"{name}.replace.json", f"{name}.replace.txt"
        files = {n: (stage / n).read_bytes() for n in outputs}
        report = {"model": str(model), "replaced": replaced_json, "not_replaced": kept_json}
        files[report_name] = (json.dumps(report, indent=2) + "\n").encode()
        files[text_name] = (format_report(str(model), decisions) + "\n").encode()
        record = ModelRecord(
            kitdispatch=__version__,
            model=str(model),
            project=spec.name,
            vmfb=vmfb_name,
            baseline_vmfb=baseline_name,
            spec=spec_name,
            archs=tuple(a.name for a in options.archs),
            codegen_target=codegen.name,
            iree_compiler=iree_compiler_version(),
            iree_flags=tuple(flags),
            matched_after=(STAGE, *(step.pass_name for step in prepared)),
            functions=_signatures(module),
            replaced=tuple(ReplacedOp(r["op"], r["location"], r["kernel_entry"], r) for r in replaced_json),
            not_replaced=tuple(kept_json),
            kernel_executables=symbols.executables,
            files={n: sha256(data) for n, data in files.items()},
        )
        files[record_name] = record.to_bytes()  # last: it marks a complete build
        folder.publish(stage, files)

    return ModelBuild(
        name=name,
        out_dir=out_dir,
        vmfb=out_dir / vmfb_name,
        baseline_vmfb=out_dir / baseline_name if baseline_name else None,
        spec=out_dir / spec_name,
        report=out_dir / report_name,
        record=out_dir / record_name,
        decisions=tuple(decisions),
        codegen_target=codegen.name,
    )


def _preparations(kinds: Sequence[str]) -> list[Preparation]:
    """What the kinds need run on the model before their ops are read, each once."""
    return list(dict.fromkeys(OP_KINDS[k].prepare for k in kinds if OP_KINDS[k].prepare))


def _model_name(model: Path) -> str:
    return as_identifier(model.name.split(".")[0], fallback="model", digit_prefix="m_")


# ------------------------------------------------------------------------ importing


def import_model(model: Path, dest: Path, *, timeout: float = IREE_COMPILE_TIMEOUT_S) -> Path:
    """The model as MLIR IREE can compile: ONNX through iree-import-onnx into `dest`, MLIR as it is."""
    if not model.is_file():
        raise KitError(f"no model at {model}", fix="pass a .mlir or .onnx file")
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
    raise KitError(
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


def _string_attr(context: ir.Context, text: str):
    from iree.compiler import ir

    return ir.StringAttr.get(text, context)


# ------------------------------------------------------------------------ reporting


def _signatures(module: ir.Module) -> tuple[ModelFunction, ...]:
    """Public functions with their tensor inputs and outputs, from IREE's ABI ops
    (hal.tensor.import/export), so `compare` can make inputs on a machine without a compiler.
    Importers' models have `f` call `f$async`, which holds the ABI ops: `f` takes its types."""
    from iree.compiler import ir

    found: dict[str, ModelFunction] = {}
    for op in top_ops(module):
        if op.name != "util.func" or "iree.abi.stub" not in op.attributes:
            continue
        inputs: dict[int, TensorFacts] = {}
        outputs: list[TensorFacts] = []

        def visit(inner: ir.Operation):
            if inner.name == "hal.tensor.import" and isinstance(inner.operands[0], ir.BlockArgument):
                inputs[ir.BlockArgument(inner.operands[0]).arg_number] = tensor_facts(inner.results[0].type)
            elif inner.name == "hal.tensor.export":
                outputs.append(tensor_facts(inner.operands[0].type))
            return ir.WalkResult.ADVANCE

        op.walk(visit)
        name = ir.StringAttr(op.attributes["sym_name"]).value
        if inputs or outputs or name.removesuffix("$async") not in found:
            public = name.removesuffix("$async")
            found[public] = ModelFunction(public, tuple(inputs[i] for i in sorted(inputs)), tuple(outputs))
    return tuple(found.values())


def format_report(model: str, decisions: Sequence[Decision]) -> str:
    replaced = [d for d in decisions if d.kernel is not None]
    kept = [d for d in decisions if d.kernel is None]
    lines = [f"{model}: {len(replaced)} of {len(decisions)} candidate op(s) replaced"]
    lines += [f"  replaced  {d.op.describe()}\n            by {d.kernel.name}" for d in replaced]
    for d in kept:
        lines.append(f"  kept      {d.op.describe()}")
        lines += [f"            {r}" for r in d.reasons or ("no kernel declares this op",)]
    return "\n".join(lines)


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


__all__ = ["ModelBuild", "OpFacts", "build_model", "export_torch", "format_report", "import_model", "read_model_record"]
