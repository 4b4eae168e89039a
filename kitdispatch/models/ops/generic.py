"""linalg.generic, by pattern: a kernel replaces the generics whose whole structure (iterator
types, indexing maps, body ops with their operands, attributes and types) is the one generic
of the kernel's pattern file (replace_when's `pattern`), on tensors of its buffers' types.

IREE's elementwise fusion runs on the model before its generics are read (`prepare`): they
are then the ones IREE would compile, a bias Add joined with its activation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import functools
from dataclasses import dataclass
from pathlib import Path

from kitdispatch._files import read_regular_file
from kitdispatch.describe.kernel import Buffer, Kernel
from kitdispatch.errors import ManifestError
from kitdispatch.models.ops.base import (
    Layout, OpFacts, OpKind, Preparation, TensorFacts, destination_facts, expect, kernel_buffers, map_dims, op_name, tensor_facts,
)

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

# IREE's own elementwise fusion, the pass its dispatch creation runs next, run on the model's
# global-optimization stage before generics are matched.
FUSION_PASS = "iree-dispatch-creation-elementwise-op-fusion"
FUSION_PIPELINE = f"builtin.module(util.func({FUSION_PASS}))"


@dataclass(frozen=True)
class BodyOp:
    """One op of a generic's body. Operands are named for what they are: `input 0` / `output 0`
    (the body's arguments), `op 2` (the result of the body's third op), or `constant 3 : i64`
    (an arith.constant, inside the body or captured from outside: IREE hoists them)."""

    name: str
    operands: tuple[str, ...]
    attributes: tuple[tuple[str, str], ...]
    results: tuple[str, ...]  # their types


@dataclass(frozen=True)
class GenericStructure:
    """Everything a linalg.generic computes, apart from its tensors' types and sizes."""

    inputs: int
    outputs: int
    iterator_types: tuple[str, ...]
    indexing_maps: tuple[str, ...]
    arguments: tuple[str, ...]  # the body's argument types
    body: tuple[BodyOp, ...]

    @property
    def summary(self) -> str:
        return ", ".join(op.name.split(".")[-1] for op in self.body if op.name != "linalg.yield")

    def to_json(self) -> dict:
        return {"body": self.summary}

    @property
    def reads_output(self) -> bool:
        return any(f"output {i}" in op.operands for op in self.body for i in range(self.outputs))


_WITH_REGIONS = " (with regions)"


def generic_structure(op: ir.Operation) -> GenericStructure:
    from iree.compiler import ir

    inputs = len(op.operands) - len(op.results)
    block = op.regions[0].blocks[0]
    names = {arg: f"input {i}" if i < inputs else f"output {i - inputs}" for i, arg in enumerate(block.arguments)}
    body = []
    for inner in block.operations:
        inner = inner.operation
        if inner.name == "arith.constant":
            continue  # a constant is named by its value where it is used
        for n, r in enumerate(inner.results):
            names[r] = f"op {len(body)}" + (f"#{n}" if n else "")
        body.append(
            BodyOp(
                inner.name + (_WITH_REGIONS if len(inner.regions) else ""),
                tuple(_operand_name(v, names) for v in inner.operands),
                tuple(sorted((k, str(inner.attributes[k])) for k in inner.attributes)),
                tuple(str(r.type) for r in inner.results),
            )
        )
    return GenericStructure(
        inputs=inputs,
        outputs=len(op.results),
        iterator_types=tuple(_iterator(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])),
        indexing_maps=tuple(str(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])),
        arguments=tuple(str(a.type) for a in block.arguments),
        body=tuple(body),
    )


def _operand_name(value: ir.Value, names: dict) -> str:
    if value in names:
        return names[value]
    owner = value.owner
    if op_name(owner) == "arith.constant":
        return f"constant {owner.operation.attributes['value']}"
    return f"a value from outside the op ({op_name(owner)})"


def _iterator(attr: ir.Attribute) -> str:
    text = str(attr)  # #linalg.iterator_type<parallel>
    return text[text.index("<") + 1 : -1] if "<" in text else text


def structure_mismatch(op: GenericStructure, pattern: GenericStructure) -> str | None:
    """The first way `op` differs from `pattern`, in words; None when they are the same."""
    if (op.inputs, op.outputs) != (pattern.inputs, pattern.outputs):
        return f"the op has {op.inputs} input(s) and {op.outputs} output(s), the pattern {pattern.inputs} and {pattern.outputs}"
    if op.iterator_types != pattern.iterator_types:
        return f"iterator types: the op's are [{', '.join(op.iterator_types)}], the pattern's [{', '.join(pattern.iterator_types)}]"
    for i, (mine, theirs) in enumerate(zip(op.indexing_maps, pattern.indexing_maps)):
        if mine != theirs:
            return f"indexing map of operand {i}: the op's is {mine}, the pattern's {theirs}"
    if op.arguments != pattern.arguments:
        return f"body argument types: the op's are ({', '.join(op.arguments)}), the pattern's ({', '.join(pattern.arguments)})"
    for i, (mine, theirs) in enumerate(zip(op.body, pattern.body)):
        if mine.name != theirs.name:
            return f"body op {i}: the op has {mine.name}, the pattern {theirs.name}"
        if mine.operands != theirs.operands:
            return f"body op {i} ({mine.name}): operands ({', '.join(mine.operands)}), the pattern's ({', '.join(theirs.operands)})"
        if mine.attributes != theirs.attributes or mine.results != theirs.results:
            return f"body op {i} ({mine.name}): attributes or result types differ ({_op_text(mine)} vs the pattern's {_op_text(theirs)})"
    if len(op.body) != len(pattern.body):
        return f"the op's body has {len(op.body)} ops, the pattern's {len(pattern.body)}"
    return None


def _op_text(op: BodyOp) -> str:
    attrs = ", ".join(f"{k} = {v}" for k, v in op.attributes)
    return f"{{{attrs}}} -> ({', '.join(op.results)})"


@dataclass(frozen=True)
class Pattern:
    """A kernel's pattern file: the one linalg.generic it computes, and that op's tensor types."""

    path: Path
    structure: GenericStructure
    operands: tuple[TensorFacts, ...]  # ins, then the outs


def load_pattern(path: Path) -> Pattern:
    where = str(path)
    try:
        text = read_regular_file(path).decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"cannot read the pattern: {exc}", where=where, fix="point replace_when.pattern at an MLIR file") from None
    return _parse_pattern(path, text)


@functools.lru_cache(maxsize=64)
def _parse_pattern(path: Path, text: str) -> Pattern:
    from iree.compiler import ir

    where, fix = str(path), "write one func.func holding one linalg.generic (see kernels/elementwise/bias_gelu.pattern.mlir)"
    try:
        module = ir.Module.parse(text, ir.Context())
    except Exception as exc:  # MLIRError: the parser's diagnostics say where
        raise ManifestError(f"the pattern is not valid MLIR: {exc}", where=where, fix=fix) from None
    generics = []

    def visit(op: ir.Operation):
        if op.name == Generic.name:
            generics.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if len(generics) != 1:
        raise ManifestError(f"the pattern holds {len(generics)} linalg.generic ops, not one", where=where, fix=fix)
    op = generics[0]
    if len(op.results) != 1:
        raise ManifestError("the pattern's generic must have one result, as the kernel writes one buffer", where=where, fix=fix)
    structure = generic_structure(op)
    outside = [o for b in structure.body for o in b.operands if o.startswith("a value from outside")]
    if outside:
        raise ManifestError(
            f"the pattern's body uses {outside[0]}, which no kernel argument carries", where=where,
            fix="use only the body's arguments and constants",
        )
    nested = [b.name for b in structure.body if b.name.endswith(_WITH_REGIONS)]
    if nested:  # their insides are not compared, so they could not tell two ops apart
        raise ManifestError(f"the pattern's body holds {nested[0]}, which kitdispatch cannot compare", where=where, fix=fix)
    try:
        operands = tuple(tensor_facts(v.type) for v in op.operands)
    except ValueError:
        raise ManifestError("the pattern's generic must work on ranked tensors", where=where, fix=fix) from None
    return Pattern(path, structure, operands)



class Generic(OpKind):
    name = "linalg.generic"
    prepare = Preparation(FUSION_PIPELINE, FUSION_PASS, "IREE's elementwise fusion")
    suggested = False  # nearly every model has generics, which need a kernel with a pattern
    takes_pattern = True
    timed_in_model = True  # elementwise ops are what IREE fuses into its neighbours' dispatches

    def facts(self, op: ir.Operation) -> OpFacts:
        return destination_facts(op, generic_structure(op))

    def contract(self, kernel: Kernel, where: str) -> Layout:
        args, result = kernel_buffers(kernel, self.name, where)
        accumulates = result.access == "inout"
        pattern = _check_pattern(load_pattern(kernel.replaces.pattern), args, result, where)
        return Layout(tuple(args[:-1]) if accumulates else tuple(args), result, accumulates, pattern)

    def semantic_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout) -> str | None:
        why = structure_mismatch(op.detail, layout.pattern.structure)
        return f"not the pattern {layout.pattern.path.name}: {why}" if why else None


def _check_pattern(pattern: Pattern, args: list[Buffer], result: Buffer, where: str) -> Pattern:
    """The kernel's buffers must be the pattern's operands: its inputs in order (then the
    output, inout, where the body reads it), of the same element types and ranks."""
    s = pattern.structure
    wanted = s.inputs + s.reads_output
    expect(
        len(args) == wanted and (result.access == "inout") == s.reads_output and (not s.reads_output or args[-1] is result),
        f"its buffers must be the {s.inputs} input(s) of the pattern ({pattern.path.name}) in order, and its result "
        + ("inout: the pattern reads its output" if s.reads_output else "out: the pattern does not read its output"),
        where,
    )
    buffers = args[:s.inputs] + [result]
    for i, (tensor, buffer) in enumerate(zip(pattern.operands, buffers)):
        want = buffer.type
        expect(
            tensor.dtype == want.dtype and len(tensor.shape) == len(want.shape),
            f"operand {i} of the pattern is {tensor.text}, the kernel's {buffer.name} is {want}",
            where,
        )
    return pattern




def plain_transpose(owner: ir.Operation) -> tuple[int, ...] | None:
    """For a linalg.generic that only transposes its one input (identity output map, a
    permutation for the input, a body that yields the input element), the input map's dims:
    dim j of the input is dim permutation[j] of the output. None for anything else."""
    from iree.compiler import ir

    if op_name(owner) != Generic.name or len(owner.operands) != 2 or len(owner.results) != 1:
        return None
    s = generic_structure(owner)
    maps = [map_dims(a) for a in ir.ArrayAttr(owner.attributes["indexing_maps"])]
    rank = len(s.iterator_types)
    if None in maps or maps[1] != tuple(range(rank)) or sorted(maps[0]) != list(range(rank)):
        return None
    if set(s.iterator_types) != {"parallel"} or [(b.name, b.operands) for b in s.body] != [("linalg.yield", ("input 0",))]:
        return None
    return maps[0]


KIND = Generic()
