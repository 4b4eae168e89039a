"""iree_linalg_ext.attention: O = softmax(Q K^T * scale) V, the contract of kernels/attention.

A kernel that replaces attention takes Q, K, V and writes O, all of one layout [b, h, s, d]
(row-major, one s for queries and keys), with scale = 1/sqrt(d) in f32 and no mask
(attention.cu computes rsqrtf(float(d))). An op with one batch dim runs as b = 1, through an
adapter in the spec that adds the unit dim; V may be read through the plain transpose IREE's
global optimization puts before it (the spec passes the transpose's input).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass

import numpy as np

from kitdispatch.describe.kernel import Kernel
from kitdispatch.models.ops.base import (
    Call, Layout, OpFacts, OpKind, Operand, Reshape, TensorFacts, expect, function_of, kernel_buffers, location, map_dims, op_name,
    tensor_facts, type_mismatch,
)
from kitdispatch.models.ops.generic import plain_transpose

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

HEAD_DIMS = (64, 128)  # the head dims the kernel has code for
BATCH_DIMS = 2  # the kernel's b and h; an op with one batch dim runs as b = 1
ROLES = ("Q", "K", "V", "O")


@dataclass(frozen=True)
class AttentionFacts:
    """What an attention op computes beyond its tensors' types. Maps are the loop dims each of
    Q, K, V, O reads, in order (None: not a plain projection); V's is composed with the plain
    transpose that IREE's global optimization puts before it, which the kernel reads through."""

    maps: tuple[tuple[int, ...] | None, ...]  # Q, K, V, O
    loops: int
    v_transposed: bool
    scale: float | None  # None: not a constant
    scale_text: str
    mask: str | None  # what makes the mask operand; None: the op has none
    plain_scores: bool  # the score region yields its argument unchanged

    summary = None

    def to_json(self) -> dict:
        return {"attention": {"scale": self.scale_text, "mask": self.mask, "v_through_transpose": self.v_transposed}}


class Attention(OpKind):
    name = "iree_linalg_ext.attention"

    def candidate(self, op: ir.Operation) -> bool:
        return True  # its scale operand is a scalar: `facts` reads the op whole

    def facts(self, op: ir.Operation) -> OpFacts:
        return _attention_facts(op)

    def contract(self, kernel: Kernel, where: str) -> Layout:
        args, result = kernel_buffers(kernel, self.name, where)
        expect(len(args) == 3 and result.access != "inout", "it must take Q, K and V in that order and write one new result O", where)
        shapes = {b.type.shape for b in args + [result]}
        dtypes = {b.type.dtype for b in args + [result]}
        expect(
            len(shapes) == 1 and len(dtypes) == 1 and len(result.type.shape) == BATCH_DIMS + 2,
            "Q, K, V and O must be one type [b, h, s, d] (same names, one element type)",
            where,
        )
        return Layout(tuple(args), result, accumulates=False)

    def semantic_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout) -> str | None:
        """The op must be plain attention in the kernel's layout: Q (batch, m, k1), K (batch, k2, k1),
        V (batch, k2, n), O (batch, m, n), with no mask and an unmodified score."""
        a = op.detail
        if a.mask is not None:
            return f"the op has a mask operand (made by {a.mask}), and the kernel takes no mask"
        if not a.plain_scores:
            return "the op's score region changes the scores, and the kernel uses them as they are"
        if not _kernel_layout(a):
            shown = ", ".join(f"{r} {_map_text(m, a.loops)}" for r, m in zip(ROLES, a.maps))
            return (
                f"operand maps: {shown}{' (V read through its transpose)' if a.v_transposed else ''}; the kernel reads "
                "Q (batch, m, k1), K (batch, k2, k1), V (batch, k2, n), O (batch, m, n) with one or two batch dims"
            )
        return None

    def sizes_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout, sizes: dict[str, int | None]) -> str | None:
        """Types and sizes in the kernel's [b, h, s, d] (an op with one batch dim runs as b = 1),
        the head dim, one static s for queries and keys, and the scale the kernel computes.
        Fills `sizes` with the kernel's dimensions (replace_when's limits are not read)."""
        tensors = list(op.inputs) + [op.result]
        pad = BATCH_DIMS + 2 - len(op.result.shape)
        buffers = list(layout.inputs) + [layout.result]
        for role, tensor, buffer in zip(ROLES, tensors, buffers):
            if tensor.dtype != buffer.type.dtype:
                return f"element type: the op's {role} is {tensor.text}, the kernel's {buffer.name} is {buffer.type}"
            padded = TensorFacts(tensor.dtype, (1,) * pad + tensor.shape)
            why = type_mismatch(role, padded, buffer, sizes)
            if why:
                return why
        unknown = [r for r, t in zip(ROLES, tensors) if None in t.shape[-2:]]
        if unknown:
            return f"shape: the sequence length or head dim of {unknown[0]} is dynamic, and the kernel's must be checked"
        head, seq_q, seq_k = op.inputs[0].shape[-1], op.inputs[0].shape[-2], op.inputs[1].shape[-2]
        if seq_q != seq_k:
            return f"shape: {seq_q} queries and {seq_k} keys; the kernel takes one sequence length for both"
        if head not in HEAD_DIMS:
            return f"head dim {head}: the kernel has code for {' and '.join(map(str, HEAD_DIMS))} only"
        return _scale_mismatch(op.detail, head)

    def call(self, op: OpFacts, layout: Layout) -> Call:
        """Q, K and V (V through its transpose where the op reads it so); an op with fewer batch
        dims than the kernel through an adapter that adds them as unit dims."""
        batch = len(op.detail.maps[0]) - 2
        pad = BATCH_DIMS - batch
        reshape = Reshape(((*range(pad + 1),), *((i + pad,) for i in range(1, batch + 2)))) if pad > 0 else None
        paths = [(0,), (1,), (2, 0) if op.detail.v_transposed else (2,)]
        return Call(tuple(Operand(p, reshape) for p in paths), result=reshape, variant=f"_batch{batch}" if pad > 0 else "")


def _attention_facts(op: ir.Operation) -> OpFacts:
    """ins(Q, K, V, scale[, mask]) outs(O), with one indexing map per operand (the scale's `()`)."""
    from iree.compiler import ir

    maps = [map_dims(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    masked = len(op.operands) == 6
    q, k, v = (op.operands[i] for i in range(3))
    v_map, v_value, transposed = maps[2], v, False
    permutation = plain_transpose(v.owner)
    if permutation is not None and v_map is not None:
        v_map, v_value, transposed = tuple(v_map[p] for p in permutation), v.owner.operands[0], True
    scale = op.operands[3].owner
    constant = op_name(scale) == "arith.constant" and isinstance(scale.attributes["value"], ir.FloatAttr)
    body = list(op.regions[0].blocks[0].operations)
    plain = len(body) == 1 and body[0].operation.name == "iree_linalg_ext.yield" and list(body[0].operands) == [
        op.regions[0].blocks[0].arguments[0]
    ]
    return OpFacts(
        kind=op.name,
        function=function_of(op),
        location=location(op),
        inputs=tuple(tensor_facts(x.type) for x in (q, k, v_value)),
        init=tensor_facts(op.operands[-1].type),
        result=tensor_facts(op.results[0].type),
        detail=AttentionFacts(
            maps=(maps[0], maps[1], v_map, maps[-1]),
            loops=ir.AffineMapAttr(ir.ArrayAttr(op.attributes["indexing_maps"])[0]).value.n_dims,
            v_transposed=transposed,
            scale=ir.FloatAttr(scale.attributes["value"]).value if constant else None,
            scale_text=str(scale.attributes["value"]) if constant else f"computed by {op_name(scale)}",
            mask=op_name(op.operands[4].owner) if masked else None,
            plain_scores=plain,
        ),
    )


def _kernel_layout(a: AttentionFacts) -> bool:
    q, k, v, o = a.maps
    if None in a.maps or not len(q) == len(k) == len(v) == len(o) or not 3 <= len(q) <= BATCH_DIMS + 2:
        return False
    batch, m, k1, k2, n = q[:-2], q[-2], q[-1], k[-2], v[-1]
    return (
        k == batch + (k2, k1) and v == batch + (k2, n) and o == batch + (m, n)
        and len(set(batch + (m, k1, k2, n))) == len(batch) + 4 == a.loops
    )


def _map_text(dims: tuple[int, ...] | None, loops: int) -> str:
    return "(not a projection)" if dims is None else f"({', '.join(f'd{i}' for i in dims)}) of {loops} loops"


def _scale_mismatch(a: AttentionFacts, head: int) -> str | None:
    wanted = np.float32(1.0 / np.sqrt(np.float64(head)))
    if a.scale is None:
        return f"the op's scale is {a.scale_text}, not a constant; the kernel's is 1/sqrt({head}) = {wanted}"
    if np.float32(a.scale) != wanted:
        return f"the op's scale is {a.scale_text}, the kernel's 1/sqrt({head}) = {wanted} (f32)"
    return None


KIND = Attention()
