"""The transform spec that puts kit kernels in place of a model's marked ops.

The kernels are built by the build pipeline (builder.pipeline.generate: the cache, the ABI and
PTX checks); their generated module becomes what a spec imports (the executables, renamed with
the kit's prefix, and each kernel function as a private `util.func` wrapper). The spec holds one
match-and-call block per way of calling a kernel (the kinds' `call`: operands, operands read
through a transpose, an adapter adding unit dims), rendered from mlir_templates/replace_spec.mlir.j2.
After iree-opt ran it, every marked op must be gone and a kit dispatch in its place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kitdispatch._version import __version__
from kitdispatch.builder.pipeline import BuildOptions, generate
from kitdispatch.builder.publish import keep_staged
from kitdispatch.describe.kernel import Kernel
from kitdispatch.describe.module import ModuleSpec, TestSpec
from kitdispatch.describe.record import read_record
from kitdispatch.emit.mlir_text import mlir_comment, mlir_string
from kitdispatch.emit.render import render_template
from kitdispatch.describe.types import FunctionSignature
from kitdispatch.errors import KitError, ManifestError, UsageError
from kitdispatch.models.ops._bias import BiasProgram
from kitdispatch.models.ops.base import CAPTURED, Call, Constant, OpFacts, Permuted, Reshape, TensorFacts
from kitdispatch.models.replace import COVERED_ATTRIBUTE, KIT_PREFIX, MARK_ATTRIBUTE, Decision, wrapper_name

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

SPEC_PIPELINE = (
    "builtin.module(iree-preprocessing-transform-interpreter{{transform-spec-path=\"{spec}\"}},"
    # Without `inline`, the wrappers' tensor.dim ops fail later in the pipeline (measured).
    "inline,util.func(canonicalize))"
)


def spec_path_fits(out_dir: Path) -> Path:
    """`out_dir`, in which a model build writes the spec whose path SPEC_PIPELINE quotes:
    refused where its path holds a brace, which that syntax matches before it reads quotes
    (measured, 3.13)."""
    path = str(out_dir.absolute())
    braces = sorted(set(path) & set("{}"))
    if braces:
        raise UsageError(f"the output folder's path {path!r} holds {' and '.join(map(repr, braces))}, which IREE's "
                         "pass-pipeline syntax cannot carry (iree-opt takes the transform spec's path in it)",
                         fix="build into a folder whose path has no braces")
    return out_dir


def parse_mlir(path: Path):
    from iree.compiler import ir

    context = ir.Context()
    try:
        return context, ir.Module.parse(path.read_text(), context)
    except Exception as exc:  # MLIRError: the bindings cannot read what iree-compile wrote
        raise KitError(f"cannot parse {path}: {exc}", fix="report it as a kitdispatch bug with the model") from None


# ------------------------------------------------------------------- kernel symbols


@dataclass(frozen=True)
class SpecSymbols:
    text: str  # the executables and wrappers, ready for the spec module
    executables: tuple[str, ...]
    wrappers: tuple[str, ...]


def kernel_symbols(spec: ModuleSpec, kernels: list[Kernel], options: BuildOptions, stage: Path) -> tuple[list[str], SpecSymbols]:
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


def _check_settled_functions(kernels: list[Kernel], functions: Sequence[FunctionSignature]) -> None:
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


def _shown_signature(sig: FunctionSignature) -> str:
    return f"({', '.join(map(str, sig.args))}) -> ({', '.join(map(str, sig.results))})"


def _as_spec_symbols(text: str, kernels: list[Kernel]) -> SpecSymbols:
    from iree.compiler import ir
    from iree.compiler.dialects import util  # noqa: F401 (registers util.func for parsing)

    context = ir.Context()
    module = ir.Module.parse(text, context)
    executables, wrappers = [], []
    with context, ir.Location.unknown():
        for op in top_ops(module):
            name = ir.StringAttr(op.attributes["sym_name"]).value
            if op.name.startswith("hal.executable"):
                new = f"{KIT_PREFIX}{name}"
                ir.SymbolTable.replace_all_symbol_uses(name, new, module.operation)
                ir.SymbolTable.set_symbol_name(op, new)
                executables.append(new)
        for op in top_ops(module):
            if op.name == "func.func":
                kernel = next(k for k in kernels if k.function == ir.StringAttr(op.attributes["sym_name"]).value)
                wrappers.append(_to_util_func(op, wrapper_name(kernel)))
        symbols = "\n".join(op.get_asm(use_local_scope=True) for op in top_ops(module))
    return SpecSymbols(symbols, tuple(executables), tuple(wrappers))


def top_ops(module: ir.Module) -> list:
    """The module's top-level ops as Operations (an OpView's `.name` may be its symbol)."""
    return [op.operation for op in module.body.operations]


def _to_util_func(op: ir.Operation, name: str) -> str:
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


def check_symbols_free(module: ir.Module, symbols: SpecSymbols, model: Path) -> None:
    from iree.compiler import ir

    taken = {ir.StringAttr(op.attributes["sym_name"]).value for op in top_ops(module) if "sym_name" in op.attributes}
    clash = sorted(taken & set(symbols.executables + symbols.wrappers))
    if clash:
        raise KitError(
            f"the model already defines {', '.join(clash)}, which kitdispatch adds",
            where=str(model),
            fix="rename the kernel's function (`function = ...`) or the model's symbol",
        )


# ------------------------------------------------------------------------- the spec


def render_spec(project: str, model: str, kernels: list[Kernel], decisions: Sequence[Decision], symbols: SpecSymbols) -> str:
    """One match-and-call block per way of calling a kernel (its mark); the ops themselves were
    chosen in Python and carry MARK_ATTRIBUTE naming it. Where a call passes constants or
    reshapes tensors (the kinds' `call`), the block calls an adapter of the op's types."""
    blocks, adapters = [], {}
    for kernel in kernels:
        for kind in kernel.replaces.ops:
            mine = [d for d in decisions if d.kernel is kernel and d.op.kind == kind]
            for mark in dict.fromkeys(d.mark for d in mine):
                ops = [d for d in mine if d.mark == mark]
                first = ops[0]
                if first.call.needs_adapter:
                    adapters[first.function] = adapter_lines(first)
                blocks.append(
                    {
                        "doc": mlir_comment(f"{kind} -> {kernel.name} ({len(ops)} op{'s' if len(ops) > 1 else ''})"),
                        "mark": mlir_string(mark),
                        "function": first.function,
                        "imports": list(symbols.executables) + ([wrapper_name(kernel)] if first.call.needs_adapter else []),
                        "operands": [_operand_steps(n, o.path) for n, o in enumerate(first.call.operands)],
                    }
                )
    return render_template(
        "replace_spec.mlir.j2",
        version=__version__, project=mlir_comment(project), model=mlir_comment(model), mark=MARK_ATTRIBUTE, symbols=symbols.text, blocks=blocks,
        adapters=list(adapters.values()),
    )


def _operand_steps(n: int, path: tuple[int, ...]) -> dict:
    """Operand `n` of a call as the transform reaches it from `%op`: the producers of
    operands up the path, then the operand of the last one (for a last step CAPTURED, the
    operand 0 of the one tensor.extract in the last one's body)."""
    of, steps = "%op", []
    for depth, index in enumerate(path[:-1]):
        name = f"%producer_{n}_{depth}"
        steps.append({"name": name, "op": f"transform.get_producer_of_operand {of}[{index}]"})
        of = name
    index = path[-1]
    if index == CAPTURED:  # the extract's tensor: defined outside the op, read in its body
        steps.append({"name": f"%extract_{n}", "op": f'transform.structured.match ops{{["tensor.extract"]}} in {of}'})
        of, index = f"%extract_{n}", 0
    return {"producers": steps, "name": f"%operand_{n}", "of": of, "index": index}


# ------------------------------------------------------------------------- adapters


def tensor_text(t: TensorFacts) -> str:
    return f"tensor<{''.join(('?' if d is None else str(d)) + 'x' for d in t.shape)}{t.dtype}>"


def reshaped_facts(t: TensorFacts, reshape: Reshape) -> TensorFacts:
    """`t`, an op tensor, as the kernel sees it through `reshape` (see Reshape)."""
    if reshape.collapses(len(t.shape)):
        sizes = [[t.shape[i] for i in group] for group in reshape.groups]
        return TensorFacts(t.dtype, tuple(None if None in g else math.prod(g) for g in sizes))
    if reshape.shape is not None:
        return TensorFacts(t.dtype, reshape.shape)
    shape: list[int | None] = [1] * sum(len(g) for g in reshape.groups)
    for size, group in zip(t.shape, reshape.groups):
        shape[group[-1]] = size  # the unit dims lead their group
    return TensorFacts(t.dtype, tuple(shape))


class _Body:
    """The body of an adapter, one statement at a time, with fresh SSA names."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.count = 0

    def add(self, text: str) -> str:
        name = f"%v{self.count}"
        self.count += 1
        self.lines.append(f"{name} = {text}")
        return name

    def dim(self, value: str, facts: TensorFacts, axis: int) -> str:
        index = self.add(f"arith.constant {axis} : index")
        return self.add(f"tensor.dim {value}, {index} : {tensor_text(facts)}")

    def bias(self, value: str, facts: TensorFacts, program: BiasProgram) -> str:
        """The [b, t] bias `program` computes from each element of `value` (attention's key
        padding), by a linalg.generic (arith on tensors is illegal at this stage)."""
        if facts.dtype != program.input_type:
            raise KitError(f"the key-padding bias reads {program.input_type}, but its tensor is {tensor_text(facts)}",
                           fix="report it as a kitdispatch bug, with the model")
        out = TensorFacts(program.result_type, facts.shape)
        dims = [self.dim(value, facts, axis) for axis, size in enumerate(facts.shape) if size is None]
        empty = self.add(f"tensor.empty({', '.join(dims)}) : {tensor_text(out)}")
        loops = ", ".join(f"d{i}" for i in range(len(facts.shape)))
        identity = f"affine_map<({loops}) -> ({loops})>"
        parallel = ", ".join(['"parallel"'] * len(facts.shape))
        lines, element, result = program.renamed(str(self.count))
        body = "".join(f"  {line}\n" for line in lines)
        return self.add(
            f"linalg.generic {{indexing_maps = [{identity}, {identity}], iterator_types = [{parallel}]}} "
            f"ins({value} : {tensor_text(facts)}) outs({empty} : {tensor_text(out)}) {{\n"
            f"^bb0({element}: {program.input_type}, %bout{self.count}: {program.result_type}):\n"
            f"{body}  linalg.yield {result} : {program.result_type}\n}} -> {tensor_text(out)}"
        )

    def cast(self, value: str, have: str, want: str) -> str:
        return value if have == want else self.add(f"tensor.cast {value} : {have} to {want}")

    def collapse(self, value: str, src: TensorFacts, dst: TensorFacts, groups: tuple[tuple[int, ...], ...]) -> str:
        return self.add(f"tensor.collapse_shape {value} {_reassociation(groups)} : {tensor_text(src)} into {tensor_text(dst)}")

    def permuted(self, value: str, src: TensorFacts, how: Permuted) -> tuple[str, TensorFacts]:
        """`value` expanded, transposed (a copy: IREE's dispatch) and collapsed as `how` says."""
        expanded, transposed = TensorFacts(src.dtype, how.shape), TensorFacts(src.dtype, how.permuted_shape)
        value = self.expand(value, src, expanded, how.split, "", src, [])
        empty = self.add(f"tensor.empty() : {tensor_text(transposed)}")
        value = self.add(
            f"linalg.transpose ins({value} : {tensor_text(expanded)}) outs({empty} : {tensor_text(transposed)}) "
            f"permutation = [{', '.join(map(str, how.permutation))}]"
        )
        merged = TensorFacts(src.dtype, how.merged_shape)
        return self.collapse(value, transposed, merged, how.merge), merged

    def expand(self, value: str, src: TensorFacts, dst: TensorFacts, groups: tuple[tuple[int, ...], ...], sizes: str, sizes_facts: TensorFacts, axes: list[int]) -> str:
        """`value` expanded to `dst`; dynamic dim d of `dst` is dim axes[d] of `sizes`."""
        dims = [str(n) if n is not None else self.dim(sizes, sizes_facts, axes[d]) for d, n in enumerate(dst.shape)]
        return self.add(
            f"tensor.expand_shape {value} {_reassociation(groups)} output_shape [{', '.join(dims)}] : {tensor_text(src)} into {tensor_text(dst)}"
        )


def _reassociation(groups: tuple[tuple[int, ...], ...]) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups) + "]"


def _expanded_axes(groups: tuple[tuple[int, ...], ...]) -> list[int]:
    """For each dim of an expansion, the dim of the smaller tensor it comes from."""
    return [i for i, group in enumerate(groups) for _ in group]


def adapter_lines(decision: Decision) -> dict:
    """A `util.func` of the op's tensor types that reshapes them to the kernel's buffers, adds
    the constants, calls the kernel's wrapper and reshapes its result back to the op's."""
    call, op, kernel = decision.call, decision.op, decision.kernel
    signature = kernel.signature()
    body, params, arguments = _Body(), [], []
    tensors = iter(enumerate(op.inputs))
    for argument, kernel_type in zip(call.arguments, (t.mlir_types[0] for t in signature.args)):
        if isinstance(argument, Constant):
            arguments.append((body.add(f"arith.constant {argument.value} : {argument.type}"), kernel_type))
            continue
        i, facts = next(tensors, (len(params), None))  # past the op's inputs: a tensor the call names (attention's keep flags)
        facts = argument.tensor or facts
        value = f"%x{i}"
        params.append(f"{value}: {tensor_text(facts)}")
        if argument.reshape is not None:
            groups, reshaped = argument.reshape.groups, reshaped_facts(facts, argument.reshape)
            if argument.reshape.collapses(len(facts.shape)):
                value = body.collapse(value, facts, reshaped, groups)
            else:
                value = body.expand(value, facts, reshaped, groups, value, facts, _expanded_axes(groups))
            facts = reshaped
        if argument.permuted is not None:  # static shapes (the kind checked): a copy in the new order
            value, facts = body.permuted(value, facts, argument.permuted)
        if argument.bias is not None:  # attention's key padding: the bias the model computes from the [b, t] tensor
            value, facts = body.bias(value, facts, argument.bias), TensorFacts(argument.bias.result_type, facts.shape)
        arguments.append((body.cast(value, tensor_text(facts), kernel_type), kernel_type))
    result_type = signature.results[0].mlir
    types = ", ".join(t for _, t in arguments)
    result = body.add(f"util.call @{wrapper_name(kernel)}({', '.join(v for v, _ in arguments)}) : ({types}) -> {result_type}")
    return {"name": decision.function, "params": ", ".join(params), "type": tensor_text(op.result), "body": body.lines,
            "result": _result_back(body, result, result_type, op, call)}


def _result_back(body: _Body, value: str, kernel_type: str, op: OpFacts, call: Call) -> str:
    """The kernel's result as the op's: cast to the op's sizes, then the result's reshape undone."""
    reshape = call.result
    if reshape is None:
        return body.cast(value, kernel_type, tensor_text(op.result))
    kernel_side = reshaped_facts(op.result, reshape)
    value = body.cast(value, kernel_type, tensor_text(kernel_side))
    if not reshape.collapses(len(op.result.shape)):  # the kernel added unit dims: drop them
        return body.collapse(value, kernel_side, op.result, reshape.groups)
    # The kernel's result has fewer dims: expand it back, reading dynamic sizes off an argument of the result's shape.
    source = reshape.sizes_from
    if source is None and None in op.result.shape:
        raise KitError(f"kitdispatch cannot expand the dynamic result {op.result.text} back", fix="report it as a kitdispatch bug")
    sizes, sizes_facts = (f"%x{source}", op.inputs[source]) if source is not None else ("", op.result)
    return body.expand(value, kernel_side, op.result, reshape.groups, sizes, sizes_facts, list(range(len(op.result.shape))))


def check_all_replaced(replaced: Path, decisions: Sequence[Decision], executables: Sequence[str], stage: Path) -> None:
    """Every marked op must be gone and a dispatch of a kit executable in its place. An op whose
    results nothing reads any more counts as gone: DCE keeps one whose body holds a `cf.assert`
    (IREE's Reciprocal in Llama's RMSNorm), which IREE strips with its other assertions."""
    _, module = parse_mlir(replaced)
    from iree.compiler import ir

    marked, dispatches = [], 0

    def visit(op: ir.Operation):
        nonlocal dispatches
        if (MARK_ATTRIBUTE in op.attributes or COVERED_ATTRIBUTE in op.attributes) and any(
            any(True for _ in r.uses) for r in op.results
        ):
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
