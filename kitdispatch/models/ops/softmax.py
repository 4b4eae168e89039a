"""linalg.softmax: a kernel of one input and one new result of its shape, normalizing the
op's dimension (replace_when's `dimension`, default the last)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass

from kitdispatch.describe.kernel import Kernel
from kitdispatch.models.ops.base import Layout, OpFacts, OpKind, destination_facts, expect, kernel_buffers

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations


@dataclass(frozen=True)
class SoftmaxFacts:
    dimension: int  # the dimension the op normalizes

    summary = None

    def to_json(self) -> dict:
        return {"dimension": self.dimension}


class Softmax(OpKind):
    name = "linalg.softmax"

    def facts(self, op: ir.Operation) -> OpFacts:
        from iree.compiler import ir

        return destination_facts(op, SoftmaxFacts(ir.IntegerAttr(op.attributes["dimension"]).value))

    def contract(self, kernel: Kernel, where: str) -> Layout:
        args, result = kernel_buffers(kernel, self.name, where)
        expect(len(args) == 1 and result.access != "inout", "it must take one input tensor and write one new result", where)
        expect(args[0].type.shape == result.type.shape, "its input and result must have the same shape", where)
        rank = len(result.type.shape)
        dim = kernel.replaces.dimension
        expect(rank >= 1 and (dim is None or -rank <= dim < rank), f"replace_when dimension {dim} is not a dimension of its {rank}-D input", where)
        return Layout(tuple(args), result, accumulates=False)

    def semantic_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout) -> str | None:
        rank = len(layout.result.type.shape)
        wanted = kernel.replaces.dimension if kernel.replaces.dimension is not None else rank - 1
        if len(op.result.shape) == rank and op.detail.dimension != wanted % rank:
            return f"the op normalizes dimension {op.detail.dimension}, the kernel dimension {wanted % rank}"
        return None


KIND = Softmax()
