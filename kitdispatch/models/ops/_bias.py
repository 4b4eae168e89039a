"""A key-padding bias [b, t] as a model computes it, for an attention kernel that adds a bias.

A model's attention mask reaches the scores' generic as a [b, t] tensor read per (batch, key)
(_masks.per_key), and the generic's body turns it into what it adds to the scores: boolean
flags through select(keep, 0, masked); an int64 `attention_mask` through a compare and a
select (f32 models: IREE fuses the cast into the scores' generic); a float mask through
(1 - m) * lowest (older transformers). The kernels read the bias itself. A `BiasProgram` is
that body's slice over the one [b, t] tensor, re-emitted by the spec as a [b, t] linalg.generic
(models/spec.py): the same ops on the same values, so the bias is the model's bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

INPUT = "%b_in"  # the [b, t] tensor's element in a program's lines
_PREFIX = "%b_"

# The ops a program may hold, by how they print: casts "op %x : T to U", binary "op %x, %y : T".
_CASTS = ("arith.sitofp", "arith.uitofp", "arith.extf", "arith.truncf", "arith.extsi", "arith.extui", "arith.trunci",
          "arith.fptosi", "arith.fptoui")
_BINARY = ("arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.maximumf", "arith.minimumf",
           "arith.addi", "arith.subi", "arith.muli", "arith.andi", "arith.ori", "arith.xori")
_CMPI = ("eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge")
_CMPF = ("false", "oeq", "ogt", "oge", "olt", "ole", "one", "ord", "ueq", "ugt", "uge", "ult", "ule", "une", "uno", "true")
PROGRAM_OPS = (*_CASTS, *_BINARY, "arith.negf", "arith.select", "arith.cmpi", "arith.cmpf", "arith.constant")


@dataclass(frozen=True)
class BiasProgram:
    """Statements computing one bias element from one element of the [b, t] tensor: `lines`
    read `INPUT` (of `input_type`) and define their values as %b_0, %b_1, ...; the last line's
    value (`result`, of `result_type`) is the bias. `what` says what it computes, for reports."""

    input_type: str
    result_type: str
    lines: tuple[str, ...]
    what: str

    @property
    def result(self) -> str:
        return self.lines[-1].split(" = ", 1)[0]

    def renamed(self, suffix: str) -> tuple[tuple[str, ...], str, str]:
        """The lines, the input's name and the result's, with `suffix` in every name (SSA names
        are unique in a function, nested regions included)."""
        def rename(text: str) -> str:
            return text.replace(_PREFIX, f"%b{suffix}_")
        return tuple(rename(line) for line in self.lines), rename(INPUT), rename(self.result)


def f32_literal(value: float) -> str:
    """An f32 MLIR literal: -inf and inf as their bits (MLIR has no literal for them)."""
    return repr(float(np.float32(value))) if np.isfinite(value) else ("0xFF800000" if value < 0 else "0x7F800000")


def flags_program(dtype: str, masked: float, flags: BiasProgram | None = None) -> BiasProgram:
    """select(keep, 0, masked) of `dtype`: the bias boolean flags add, the flags the [b, t]
    tensor itself or what `flags` computes from it; `masked` is exact in `dtype` (the model's own
    value), made as an f32 literal (f32 to f32 is no truncf)."""
    lines, keep = (list(flags.lines), flags.result) if flags is not None else ([], INPUT)
    first = len(lines)
    lines += [f"%b_{first} = arith.constant 0.0 : {dtype}", f"%b_{first + 1} = arith.constant {f32_literal(masked)} : f32"]
    if dtype != "f32":
        lines.append(f"%b_{first + 2} = arith.truncf %b_{first + 1} : f32 to {dtype}")
    lines.append(f"%b_{len(lines)} = arith.select {keep}, %b_{first}, {lines[-1].split(' = ')[0]} : {dtype}")
    if flags is None:
        return BiasProgram("i1", dtype, tuple(lines), f"select(keep, 0, {masked:g})")
    return BiasProgram(flags.input_type, dtype, tuple(lines), f"{flags.what.removesuffix(')')}, select)")


class Unsliceable(Exception):
    """The value is not computed from the [b, t] tensor and constants alone; the message says why."""


def slice_program(
    result: ir.Value, source: ir.Value, constant_of: Callable[[ir.Value], str | None]
) -> BiasProgram:
    """The body ops computing `result` from the block argument `source` (the [b, t] tensor's
    element) and constants, as a BiasProgram. `constant_of(value)` is the MLIR attribute text of
    a constant the body reads from outside ("1.000000e+00 : f16"), or None."""
    names: dict = {source: INPUT}
    lines: list[str] = []

    def name_of(value: ir.Value) -> str:
        if value in names:
            return names[value]
        owner = getattr(value.owner, "operation", None)
        text = constant_of(value)
        if text is not None:
            return define(f"arith.constant {text}", value)
        if owner is None or owner.name not in PROGRAM_OPS or len(owner.results) != 1:
            what = "a block argument" if owner is None else owner.name
            raise Unsliceable(f"{what} in the scores' generic, which the bias cannot be computed by")
        return define(_statement(owner, [name_of(v) for v in owner.operands]), value)

    def define(statement: str, value: ir.Value) -> str:
        names[value] = f"{_PREFIX}{len(lines)}"
        lines.append(f"{names[value]} = {statement}")
        return names[value]

    name_of(result)
    if not lines:  # the tensor itself is the bias: an additive mask the kernel reads as it is
        raise Unsliceable("the bias is the tensor itself")
    ops = [line.split(" = ", 1)[1].split(" ", 1)[0].removeprefix("arith.") for line in lines]
    what = ", ".join(o for o in ops if o != "constant")
    return BiasProgram(str(source.type), str(result.type), tuple(lines), f"computed in the scores' generic ({what})")


def _statement(op: ir.Operation, operands: list[str]) -> str:
    from iree.compiler import ir

    name, out = op.name, str(op.results[0].type)
    if name == "arith.constant":
        return f"arith.constant {op.attributes['value']}"
    if name in _CASTS:
        return f"{name} {operands[0]} : {op.operands[0].type} to {out}"
    if name in _BINARY:
        return f"{name} {operands[0]}, {operands[1]} : {out}"
    if name == "arith.negf":
        return f"arith.negf {operands[0]} : {out}"
    if name == "arith.select":
        return f"arith.select {operands[0]}, {operands[1]}, {operands[2]} : {out}"
    predicates = _CMPI if name == "arith.cmpi" else _CMPF
    predicate = predicates[ir.IntegerAttr(op.attributes["predicate"]).value]
    return f"{name} {predicate}, {operands[0]}, {operands[1]} : {op.operands[0].type}"
