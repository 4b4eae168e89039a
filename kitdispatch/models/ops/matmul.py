"""linalg.matmul: C = A B on plain operands ([m,k] x [k,n] -> [m,n]), into a zero fill unless
the kernel accumulates (its result inout, taking the op's `outs`). batch_matmul.py is the same
contract with a leading batch dim."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass

from kitdispatch.describe.kernel import Kernel
from kitdispatch.models.ops import epilogue
from kitdispatch.models.ops.base import Call, Layout, OpFacts, OpKind, destination_facts, expect, init_operand, kernel_buffers, op_name
from kitdispatch.models.ops.generic import Generic

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations


@dataclass(frozen=True)
class MatmulFacts:
    plain_maps: bool  # no transposed, broadcast or cast operand
    init_source: str  # what makes the `outs` operand ("zero fill", "linalg.fill of 1.0", ...)
    chain: epilogue.EpilogueChain | None = None  # the elementwise ops after it (epilogue.with_chain)

    @property
    def summary(self) -> str | None:
        return self.chain.summary if self.chain else None

    @property
    def zero_init(self) -> bool:
        return self.init_source == "zero fill"

    def to_json(self) -> dict:
        return {"init": self.init_source, **(self.chain.to_json() if self.chain else {})}


class Matmul(OpKind):
    """A named matmul op of `rank`-D operands whose plain operand maps are `plain_maps`: any
    other `indexing_maps` (transposed or broadcast operands, which newer linalg spells on the
    same op) is not a plain matmul."""

    # IREE's elementwise fusion first: the generics after a matmul are then those IREE would
    # fuse into its dispatch, which a kernel's epilogue replaces with it.
    prepare = Generic.prepare

    def __init__(self, name: str, rank: int, plain_maps: str, shapes: str) -> None:
        self.name, self.rank, self.plain_maps, self.shapes = name, rank, plain_maps, shapes

    def facts(self, op: ir.Operation) -> OpFacts:
        attrs = op.attributes
        plain = ("indexing_maps" not in attrs or str(attrs["indexing_maps"]) == self.plain_maps) and "cast" not in attrs
        return epilogue.with_chain(destination_facts(op, MatmulFacts(plain, init_source(init_operand(op)))), op)

    def contract(self, kernel: Kernel, where: str) -> Layout:
        kernel, ending = epilogue.split_epilogue(kernel, where)
        args, result = kernel_buffers(kernel, self.name, where)
        accumulates = result.access == "inout"
        wanted = 3 if accumulates else 2
        expect(len(args) == wanted, f"it must take A and B{' and the accumulator' if accumulates else ''} in that order", where)
        a, b, c = args[0].type.shape, args[1].type.shape, result.type.shape
        ok = all(len(s) == self.rank for s in (a, b, c)) and a[-1] == b[-2] and a[-2] == c[-2] and b[-1] == c[-1]
        expect(ok and (self.rank == 2 or a[0] == b[0] == c[0]), f"its shapes must read {self.shapes} (same names where sizes agree)", where)
        return Layout(tuple(args[:2]) + ending.buffers, result, accumulates, epilogue=ending)

    def semantic_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout) -> str | None:
        if not op.detail.plain_maps:
            return "the op's operands are transposed, broadcast or cast (not a plain matmul)"
        if not layout.accumulates and not op.detail.zero_init:
            return f"the op accumulates into {op.detail.init_source}, not a zero fill, and the kernel does not accumulate"
        form = epilogue.chosen(op, layout)
        same_inputs = all(t.dtype == b.type.dtype for t, b in zip(op.inputs, layout.inputs))  # else: the types' reason
        return form if isinstance(form, str) and same_inputs else None

    def sizes_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout, sizes: dict[str, int | None]) -> str | None:
        return super().sizes_mismatch(epilogue.covered(op, layout), kernel, layout, sizes)

    def call(self, op: OpFacts, layout: Layout) -> Call:
        return epilogue.epilogue_call(op, layout, super().call(op, layout))

    def replaced(self, op: OpFacts, layout: Layout) -> OpFacts:
        return epilogue.covered(op, layout)


def init_source(value: ir.Value) -> str:
    """'zero fill' when the value is all zeros by construction: a linalg.fill of a zero
    constant, or a zero splat constant; else what makes it."""
    owner = value.owner
    name = op_name(owner)
    if name == "linalg.fill":
        scalar = owner.operands[0].owner
        if getattr(scalar, "name", None) == "arith.constant":
            return "zero fill" if _is_zero(scalar.attributes["value"]) else f"linalg.fill of {scalar.attributes['value']}"
        return "linalg.fill of a computed value"
    if name == "arith.constant" and _is_zero(owner.attributes["value"]):
        return "zero fill"
    return name


def _is_zero(attr: ir.Attribute) -> bool:
    from iree.compiler import ir

    if isinstance(attr, ir.DenseElementsAttr):
        return attr.is_splat and _is_zero(attr.get_splat_value())
    return isinstance(attr, (ir.FloatAttr, ir.IntegerAttr)) and attr.value == 0


KIND = Matmul(
    "linalg.matmul",
    rank=2,
    plain_maps="[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>]",
    shapes="[m,k] x [k,n] -> [m,n]",
)
