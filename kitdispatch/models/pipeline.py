"""Kit kernels inside imported models: ops of a model replaced by kernels that declare `replaces`.

The route (IREE 3.13), each step a tool run with its own command to re-run:
1. import: ONNX through `iree-import-onnx`; MLIR (linalg or torch dialect) as it is; a PyTorch
   module through `export_torch` (iree-turbine) first.
2. `iree-compile --compile-to=global-optimization`: importers emit softmax as five
   `linalg.generic`s, which global optimization raises to `linalg.softmax`; there the ops are
   in the form the kernels are matched against. Const-eval has run by then, so replaced
   models need no flag the baseline lacks (a custom dispatch with constant inputs crashes
   const-eval in 3.13: here none is there yet when it runs).
   Where a kernel replaces `linalg.generic`, IREE's elementwise fusion runs first (iree-opt,
   `iree-dispatch-creation-elementwise-op-fusion`, the pass IREE's dispatch creation runs next):
   the generics are then the ones IREE would compile, a bias Add joined with its activation.
3. replace.py decides per op; each op to replace gets the attribute `kitdispatch.replace`.
4. `iree-opt` runs the generated transform spec (mlir_templates/replace_spec.mlir.j2), which
   imports the kernel's executable and a `util.func` wrapper that dispatches it, and
   cast_and_calls the wrapper in place of every marked op; `inline` folds the wrapper in.
5. `iree-compile --compile-from=global-optimization` finishes the .vmfb.
The baseline is the model compiled by one plain `iree-compile` with IREE's default flags.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kitdispatch import __version__
from kitdispatch._files import not_an_option, write_atomic
from kitdispatch.builder.publish import OutputFolder, disk_full, keep_for_rerun, keep_staged, os_error, prepare_output_dir, staging_dir
from kitdispatch.describe.record import read_record, sha256
from kitdispatch._proc import run_checked, run_tool
from kitdispatch.builder.pipeline import BuildOptions, generate, project_files_in
from kitdispatch.errors import IreeCompileError, KitError, ManifestError
from kitdispatch.iree.tools import IREE_COMPILE_TIMEOUT_S, choose_codegen_target, find_tool, iree_compiler_version, target_flags
from kitdispatch.describe.manifest import load_manifest
from kitdispatch.emit.mlir_text import mlir_comment, mlir_string
from kitdispatch.emit.render import render_template
from kitdispatch.models.ops import OP_KINDS
from kitdispatch.models.ops.base import OpFacts, Preparation, TensorFacts, tensor_facts
from kitdispatch.models.record import ModelFunction, ModelRecord, ReplacedOp, claimed_files, model_record_name, read_model_record
from kitdispatch.models.replace import KIT_PREFIX, MARK_ATTRIBUTE, Decision, decide, read_ops, replacing_kernels, wrapper_name
from kitdispatch.describe.kernel import Kernel
from kitdispatch.describe.module import ModuleSpec, TestSpec

SPEC_PIPELINE = (
    "builtin.module(iree-preprocessing-transform-interpreter{{transform-spec-path={spec}}},"
    # Without `inline`, the wrappers' tensor.dim ops fail later in the pipeline (measured).
    "inline,util.func(canonicalize))"
)
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


def _build_model_in(spec, kernels, model, name, options, out_dir, folder, codegen, flags, with_baseline) -> ModelBuild:
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
        context, module = _parse(staged)
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
        objects, symbols = _kernel_symbols(spec, used, options, stage)
        _check_symbols_free(module, symbols, model)
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
        _check_all_replaced(replaced, decisions, symbols.executables, stage)
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
    stem = re.sub(r"[^A-Za-z0-9_]", "_", model.name.split(".")[0]) or "model"
    return stem if not stem[0].isdigit() else f"m_{stem}"


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


def export_torch(module, example_args: Sequence, path: str | Path) -> Path:
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


def _parse(path: Path):
    from iree.compiler import ir

    context = ir.Context()
    try:
        return context, ir.Module.parse(path.read_text(), context)
    except Exception as exc:  # MLIRError: the bindings cannot read what iree-compile wrote
        raise KitError(f"cannot parse {path}: {exc}", fix="report it as a kitdispatch bug with the model") from None


def _string_attr(context, text: str):
    from iree.compiler import ir

    return ir.StringAttr.get(text, context)


# ------------------------------------------------------------------- kernel symbols


@dataclass(frozen=True)
class _Symbols:
    text: str  # the executables and wrappers, ready for the spec module
    executables: tuple[str, ...]
    wrappers: tuple[str, ...]


def _kernel_symbols(spec: ModuleSpec, kernels: list[Kernel], options: BuildOptions, stage: Path) -> tuple[list[str], _Symbols]:
    """Compiles the kernels (build.generate: the cache, the ABI and PTX checks) and turns the
    generated module into what a spec imports: its executables, and each kernel function as
    a private `util.func` (in the model, functions are util.funcs by this stage)."""
    sub = dataclasses.replace(spec, kernels=tuple(kernels), programs=(), test=TestSpec())
    # Inside the staging folder: a killed build leaves nothing the next one does not remove.
    result = generate(sub, options, stage / "kernels" / sub.name)
    _check_settled_functions(kernels, read_record(result.record).functions)
    for obj in result.objects:
        shutil.copy2(obj, stage / obj.name)
    text = result.mlir.read_text()
    return [o.name for o in result.objects], _as_spec_symbols(text, kernels)


def _check_settled_functions(kernels: list[Kernel], functions) -> None:
    """The ops were matched against the kernels as described; the build settles pointers the
    manifest leaves to the compiled code (roles.py), and a function that came out otherwise
    would not fit the ops it replaces."""
    built = {f.name: f for f in functions}
    for kernel in kernels:
        settled = built.get(kernel.function)
        if settled is not None and settled != kernel.signature():
            raise ManifestError(
                f"kernel {kernel.name!r}: its compiled code gives its non-const pointers other roles than "
                f"the manifest implies (function {_shown_signature(settled)}, not {_shown_signature(kernel.signature())})",
                where=f"kernel {kernel.name}: replaces",
                fix="name every non-const pointer's role in the manifest (in = [...], out = [...], inout = [...]), "
                "or make input pointers const",
            )


def _shown_signature(sig) -> str:
    return f"({', '.join(map(str, sig.args))}) -> ({', '.join(map(str, sig.results))})"


def _as_spec_symbols(text: str, kernels: list[Kernel]) -> _Symbols:
    from iree.compiler import ir
    from iree.compiler.dialects import util  # noqa: F401 (registers util.func for parsing)

    context = ir.Context()
    module = ir.Module.parse(text, context)
    executables, wrappers = [], []
    with context, ir.Location.unknown():
        for op in _top_ops(module):
            name = ir.StringAttr(op.attributes["sym_name"]).value
            if op.name.startswith("hal.executable"):
                new = f"{KIT_PREFIX}{name}"
                ir.SymbolTable.replace_all_symbol_uses(name, new, module.operation)
                ir.SymbolTable.set_symbol_name(op, new)
                executables.append(new)
        for op in _top_ops(module):
            if op.name == "func.func":
                kernel = next(k for k in kernels if k.function == ir.StringAttr(op.attributes["sym_name"]).value)
                wrappers.append(_to_util_func(op, wrapper_name(kernel)))
        symbols = "\n".join(op.get_asm(use_local_scope=True) for op in _top_ops(module))
    return _Symbols(symbols, tuple(executables), tuple(wrappers))


def _top_ops(module) -> list:
    """The module's top-level ops as Operations (an OpView's `.name` may be its symbol)."""
    return [op.operation for op in module.body.operations]


def _to_util_func(op, name: str) -> str:
    """Re-homes a generated `func.func` as `util.func private` (same body, util.return)."""
    from iree.compiler import ir
    from iree.compiler.dialects import util

    wrapper = util.FuncOp(name, op.attributes["function_type"], sym_visibility="private", ip=ir.InsertionPoint(op))
    old = op.regions[0].blocks[0]
    block = wrapper.operation.regions[0].blocks.append(*[a.type for a in old.arguments])
    for before, after in zip(old.arguments, block.arguments):
        before.replace_all_uses_with(after)
    for inner in list(old.operations):
        if inner.name == "func.return":
            util.ReturnOp(list(inner.operands), ip=ir.InsertionPoint(block))
        else:
            inner.detach_from_parent()
            block.append(inner)
    op.erase()
    return name


def _check_symbols_free(module, symbols: _Symbols, model: Path) -> None:
    from iree.compiler import ir

    taken = {ir.StringAttr(op.attributes["sym_name"]).value for op in _top_ops(module) if "sym_name" in op.attributes}
    clash = sorted(taken & set(symbols.executables + symbols.wrappers))
    if clash:
        raise KitError(
            f"the model already defines {', '.join(clash)}, which kitdispatch adds",
            where=str(model),
            fix="rename the kernel's function (`function = ...`) or the model's symbol",
        )


# ------------------------------------------------------------------------- the spec


def render_spec(project: str, model: str, kernels: list[Kernel], decisions: Sequence[Decision], symbols: _Symbols) -> str:
    """One match-and-call block per way of calling a kernel (its mark); the ops themselves were
    chosen in Python and carry MARK_ATTRIBUTE naming it. Ops with fewer dims than the kernel
    (their kind's `call` says how many) call an adapter that adds leading unit dims."""
    blocks, adapters = [], {}
    for kernel in kernels:
        for kind in kernel.replaces.ops:
            mine = [d for d in decisions if d.kernel is kernel and d.op.kind == kind]
            for mark in dict.fromkeys(d.mark for d in mine):
                ops = [d for d in mine if d.mark == mark]
                first = ops[0]
                if first.call.unit_dims:
                    adapters[first.function] = _adapter(first)
                blocks.append(
                    {
                        "doc": mlir_comment(f"{kind} -> {kernel.name} ({len(ops)} op{'s' if len(ops) > 1 else ''})"),
                        "op": kind,
                        "mark": mlir_string(mark),
                        "function": first.function,
                        "imports": list(symbols.executables) + ([wrapper_name(kernel)] if first.call.unit_dims else []),
                        "operands": ", ".join(str(i) for i in first.operands),
                        "through": [{"index": i, "through": i in first.through} for i in first.operands] if first.through else [],
                    }
                )
    return render_template(
        "replace_spec.mlir.j2",
        version=__version__, project=mlir_comment(project), model=mlir_comment(model), mark=MARK_ATTRIBUTE, symbols=symbols.text, blocks=blocks,
        adapters=list(adapters.values()),
    )


def _adapter(decision: Decision) -> dict:
    """What the template needs for a `util.func` that takes the op's tensors (rank r), expands
    each with leading unit dims to the kernel's rank, calls the kernel's wrapper, collapses back."""
    rank = len(decision.op.result.shape)
    pad = decision.call.unit_dims
    dtype = decision.op.result.dtype
    return {
        "name": decision.function,
        "wrapper": wrapper_name(decision.kernel),
        "inputs": [f"x{i}" for i in decision.operands],
        "type": f"tensor<{'?x' * rank}{dtype}>",
        "expanded": f"tensor<{'1x' * pad}{'?x' * rank}{dtype}>",
        "kernel_type": f"tensor<{'?x' * (rank + pad)}{dtype}>",
        "dims": list(range(rank)),
        "ones": ", ".join(["1"] * pad),
        "reassociation": "[" + ", ".join([f"[{', '.join(str(i) for i in range(pad + 1))}]"] + [f"[{i + pad}]" for i in range(1, rank)]) + "]",
    }


def _check_all_replaced(replaced: Path, decisions: Sequence[Decision], executables: Sequence[str], stage: Path) -> None:
    """Every marked op must be gone and a dispatch of a kit executable in its place."""
    _, module = _parse(replaced)
    from iree.compiler import ir

    marked, dispatches = [], 0

    def visit(op):
        nonlocal dispatches
        if MARK_ATTRIBUTE in op.attributes:
            marked.append(op.name)
        if op.name == "flow.dispatch" and any(f"@{e}::" in str(op.attributes["entry_points"]) for e in executables):
            dispatches += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    wanted = sum(d.kernel is not None for d in decisions)
    if marked or dispatches != wanted:
        keep = keep_staged(stage)
        raise KitError(
            f"the transform spec left {len(marked)} marked op(s) in place and made {dispatches} kernel "
            f"dispatch(es) for {wanted} op(s) to replace",
            where=str(keep / replaced.name),
            fix=f"report it as a kitdispatch bug; the spec and the model stages are kept in {keep}",
        )


# ------------------------------------------------------------------------ reporting


def _signatures(module) -> tuple[ModelFunction, ...]:
    """Public functions with their tensor inputs and outputs, from IREE's ABI ops
    (hal.tensor.import/export), so `compare` can make inputs on a machine without a compiler.
    Importers' models have `f` call `f$async`, which holds the ABI ops: `f` takes its types."""
    from iree.compiler import ir

    found: dict[str, ModelFunction] = {}
    for op in _top_ops(module):
        if op.name != "util.func" or "iree.abi.stub" not in op.attributes:
            continue
        inputs: dict[int, TensorFacts] = {}
        outputs: list[TensorFacts] = []

        def visit(inner):
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


def _no_match_fix(decisions: Sequence[Decision], kinds: Sequence[str], module) -> str:
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


def _op_census(module) -> dict[str, int]:
    from iree.compiler import ir

    counts: dict[str, int] = {}

    def visit(op):
        if op.name.startswith(("linalg.", "iree_linalg_ext.")) and op.name != "linalg.yield":
            counts[op.name] = counts.get(op.name, 0) + 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return counts


__all__ = ["ModelBuild", "OpFacts", "build_model", "export_torch", "format_report", "import_model", "read_model_record"]
