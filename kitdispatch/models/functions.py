"""The model's public functions as its record keeps them (describe/model_record.py): their tensor
inputs and outputs (IREE's ABI), and for each integer input that indexes a gather (an embedding's
token ids, a position table's positions) the size of the dimension it indexes.

The bounds are read at the stage the ops are matched (global optimization), where an ONNX Gather
or a torch embedding is a `linalg.generic` whose body `tensor.extract`s from the table at an index
computed from the input (after the importer's `index < 0 ? index + size : index`), or an
`iree_linalg_ext.gather`. An input gets a bound only where a gather's index depends on that input
alone; an input that several gathers index gets the smallest size. `compare` (on a machine
without the compiler) draws such inputs from 0 .. bound-1 instead of from an integer range that
would read out of bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kitdispatch.describe.model_record import ModelFunction, ModelTensor
from kitdispatch.models.ops.base import tensor_facts
from kitdispatch.models.spec import top_ops

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

Input = tuple[str, int]  # (public function name, input number)


def model_functions(module: ir.Module) -> tuple[ModelFunction, ...]:
    """Public functions with their tensor inputs and outputs, from IREE's ABI ops
    (hal.tensor.import/export), so `compare` can make inputs on a machine without a compiler.
    Importers' models have `f` call `f$async`, which holds the ABI ops: `f` takes its types."""
    bounds = gather_bounds(module)
    found: dict[str, ModelFunction] = {}
    for op in top_ops(module):
        if op.name != "util.func" or "iree.abi.stub" not in op.attributes:
            continue
        inputs, outputs = _abi_tensors(op)
        public = _public_name(op)
        if inputs or outputs or public not in found:
            numbers = sorted(inputs)
            indexed = tuple(bounds.get((public, i)) for i in numbers)
            found[public] = ModelFunction(public, tuple(inputs[i] for i in numbers), tuple(outputs), indexed if any(indexed) else ())
    return tuple(found.values())


def _abi_tensors(func: ir.Operation) -> tuple[dict[int, ModelTensor], list[ModelTensor]]:
    """A function's inputs (by argument number) and outputs, from its hal.tensor.import/export."""
    from iree.compiler import ir

    inputs: dict[int, ModelTensor] = {}
    outputs: list[ModelTensor] = []

    def visit(inner: ir.Operation):
        if inner.name == "hal.tensor.import" and isinstance(inner.operands[0], ir.BlockArgument):
            inputs[ir.BlockArgument(inner.operands[0]).arg_number] = tensor_facts(inner.results[0].type)
        elif inner.name == "hal.tensor.export":
            outputs.append(tensor_facts(inner.operands[0].type))
        return ir.WalkResult.ADVANCE

    func.walk(visit)
    return inputs, outputs


def gather_bounds(module: ir.Module) -> dict[Input, int]:
    """(function, input) -> the smallest size of a dimension that input alone indexes."""
    from iree.compiler import ir

    bounds: dict[Input, int] = {}

    def note(index: ir.Value, size: int | None) -> None:
        sources = inputs_of(index)
        if size and len(sources) == 1:
            (source,) = sources
            bounds[source] = min(size, bounds.get(source, size))

    def visit(op: ir.Operation):
        if op.name == "tensor.extract":
            shape = _static_shape(op.operands[0].type)
            for axis, index in enumerate(list(op.operands)[1:]):
                note(index, shape[axis] if shape else None)
        elif op.name == "iree_linalg_ext.gather" and "dimension_map" in op.attributes:
            shape = _static_shape(op.operands[0].type)
            dims = list(ir.DenseI64ArrayAttr(op.attributes["dimension_map"]))
            if shape and dims:
                note(op.operands[1], min(shape[d] for d in dims))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return bounds


def inputs_of(value: ir.Value) -> frozenset[Input]:
    """The public functions' inputs a value depends on: back through every producer, through a
    linalg op's body to the operands its block arguments stand for, up to `hal.tensor.import`s
    of function arguments."""
    from iree.compiler import ir

    found: set[Input] = set()
    seen: set = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if isinstance(v, ir.BlockArgument):
            stack += _block_argument_sources(ir.BlockArgument(v))
            continue
        op = ir.OpResult(v).owner.operation
        if op.name == "hal.tensor.import":
            arg = op.operands[0]
            if isinstance(arg, ir.BlockArgument):
                found.add((_public_name(_function_of(op)), ir.BlockArgument(arg).arg_number))
        elif op.name.startswith("linalg.") and len(op.regions) == 1 and _yielded(op):
            stack.append(_yielded(op)[ir.OpResult(v).result_number])
        else:
            stack += list(op.operands)
    return frozenset(found)


def _block_argument_sources(arg: ir.BlockArgument) -> list:
    """What a block argument stands for: a linalg op's operand, or (any other region) every
    operand of the op that holds the block; nothing for a function's arguments."""
    parent = arg.owner.owner.operation
    if parent.name in ("util.func", "func.func"):
        return []
    operands = list(parent.operands)
    if parent.name.startswith("linalg.") and arg.arg_number < len(operands):
        return [operands[arg.arg_number]]
    return operands


def _yielded(op: ir.Operation) -> list:
    blocks = list(op.regions[0].blocks)
    if not blocks:
        return []
    last = list(blocks[0].operations)[-1]
    return list(last.operands) if last.name == "linalg.yield" else []


def _function_of(op: ir.Operation) -> ir.Operation:
    while op.name not in ("util.func", "func.func"):
        op = op.parent.operation
    return op


def _public_name(func: ir.Operation) -> str:
    from iree.compiler import ir

    return ir.StringAttr(func.attributes["sym_name"]).value.removesuffix("$async")


def _static_shape(t: ir.Type) -> tuple[int | None, ...] | None:
    try:
        return tensor_facts(t).shape
    except (ValueError, TypeError):
        return None


__all__ = ["gather_bounds", "inputs_of", "model_functions"]
