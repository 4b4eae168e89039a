"""linalg.softmax: a kernel of one input and one new result of its shape, normalizing the
op's dimension (replace_when's `dimension`, default the last).

An op of higher rank than the kernel that normalizes its last dimension is rows of the
kernel's last one: a [b, h, s, s] softmax is b*h*s rows of s, its leading dims collapsed into
the kernel's first (a Reshape both ways, in the spec's adapter; dynamic leading dims too, the
result's sizes read off the input's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass

import numpy as np

from kitdispatch.describe.kernel import Kernel
from kitdispatch.models.ops.base import (
    Call, Layout, OpFacts, OpKind, Operand, Reshape, TensorFacts, destination_facts, expect, fused_consumer, kernel_buffers, plain_call,
)

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations


@dataclass(frozen=True)
class SoftmaxFacts:
    dimension: int  # the dimension the op normalizes
    fused_next: str | None = None  # its one reader where IREE fuses it into the softmax's dispatch (base.fused_consumer)

    summary = None

    def to_json(self) -> dict:
        return {"dimension": self.dimension}


class Softmax(OpKind):
    name = "linalg.softmax"
    timed_in_model = True  # its producer and consumer may share its dispatches in a model

    def facts(self, op: ir.Operation) -> OpFacts:
        from iree.compiler import ir

        return destination_facts(op, SoftmaxFacts(ir.IntegerAttr(op.attributes["dimension"]).value, fused_consumer(op.results[0])))

    def contract(self, kernel: Kernel, where: str) -> Layout:
        args, result = kernel_buffers(kernel, self.name, where)
        expect(len(args) == 1 and result.access != "inout", "it must take one input tensor and write one new result", where)
        expect(args[0].type.shape == result.type.shape, "its input and result must have the same shape", where)
        rank = len(result.type.shape)
        dim = kernel.replaces.dimension
        expect(rank >= 1 and (dim is None or -rank <= dim < rank), f"replace_when dimension {dim} is not a dimension of its {rank}-D input", where)
        return Layout(tuple(args), result, accumulates=False)

    def semantic_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout) -> str | None:
        rank, op_rank = len(layout.result.type.shape), len(op.result.shape)
        wanted = (kernel.replaces.dimension if kernel.replaces.dimension is not None else rank - 1) % rank
        if op_rank == rank and op.detail.dimension != wanted:
            return f"the op normalizes dimension {op.detail.dimension}, the kernel dimension {wanted}"
        if op_rank > rank and wanted != rank - 1:
            return (f"the op is {op_rank}-D and the kernel ({rank}-D) normalizes dimension {wanted}, not its last: "
                    "only a kernel over its last dimension takes an op's leading dims as more rows")
        if op_rank > rank and op.detail.dimension != op_rank - 1:
            return (f"the op normalizes dimension {op.detail.dimension} of its {op_rank}, not the last; the kernel "
                    f"normalizes its last dimension ({rank}-D), and no kernel declares dimension {op.detail.dimension} of {op_rank}-D ops")
        if op.detail.fused_next:
            return (f"its one reader, {op.detail.fused_next}, is fused by IREE into the softmax's dispatch and would run "
                    "as a dispatch of its own (a softmax kernel does not compute it)")
        return None

    def sizes_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout, sizes: dict[str, int | None]) -> str | None:
        """An op of higher rank is checked as the kernel sees it: its leading dims as one."""
        groups = row_groups(len(op.result.shape), len(layout.result.type.shape))
        if groups is None:
            return super().sizes_mismatch(op, kernel, layout, sizes)
        seen = collapsed(op.inputs[0], groups), collapsed(op.init, groups), collapsed(op.result, groups)
        return super().sizes_mismatch(OpFacts(op.kind, op.function, op.location, seen[:1], seen[1], seen[2], op.detail), kernel, layout, sizes)


    def call(self, op: OpFacts, layout: Layout) -> Call:
        """The input collapsed to the kernel's rows and the result expanded back (its dynamic
        sizes read off the input, which has the result's shape)."""
        groups = row_groups(len(op.result.shape), len(layout.result.type.shape))
        if groups is None:
            return plain_call(1)
        return Call((Operand((0,), Reshape(groups)),), result=Reshape(groups, sizes_from=0), variant="_rows")


def row_groups(op_rank: int, kernel_rank: int) -> tuple[tuple[int, ...], ...] | None:
    """How an op's dims collapse into the kernel's: its leading dims into the kernel's first
    (None: the same rank, nothing collapses)."""
    if op_rank <= kernel_rank:
        return None
    lead = op_rank - kernel_rank + 1
    return (tuple(range(lead)),) + tuple((i,) for i in range(lead, op_rank))


def collapsed(tensor: TensorFacts, groups: tuple[tuple[int, ...], ...]) -> TensorFacts:
    def size(group: tuple[int, ...]) -> int | None:
        dims = [tensor.shape[i] for i in group]
        return None if None in dims else int(np.prod(dims))

    return TensorFacts(tensor.dtype, tuple(size(g) for g in groups))


KIND = Softmax()
