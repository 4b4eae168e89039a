"""iree_linalg_ext.attention: O = softmax(Q K^T * scale) V, the contract of kernels/attention.

A kernel that replaces attention takes Q, K, V and writes O, all of one layout [b, h, s, d]
(row-major, one s for queries and keys), with scale = 1/sqrt(d) in f32 (attention.cu computes
rsqrtf(float(d))) and no mask, or, for a kernel with replace_when's `mask = "causal"`, a causal
one; a mask operand that masks nothing is no mask (_masks.py reads what the mask is). A kernel
of `mask = "key_padding"` (or "causal_key_padding") takes a fourth input, `bias` [b, s] (or
[b, t]) of Q's type: the decomposed chain's additive mask per (batch, key), or its boolean
flags as select(keep, 0, masked) made in the adapter, and the scalars `scale` and `masked`
(what the chain adds to a causally masked key's score). An op with one batch dim runs as b = 1, through an
adapter in the spec that adds the unit dim; V may be read through the plain transpose IREE's
global optimization puts before it (the spec passes the transpose's input). A kernel whose
first buffer is [b, s, 3, h, d] (`qkv`, order "bs3hd") reads Q, K and V from one packed
projection, parts 0, 1 and 2 of its third dim: the spec passes that tensor once (decomposed
attention whose Q, K and V are the three slices of one value, _decomposed.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses
from dataclasses import dataclass

import numpy as np

from kitdispatch.describe.kernel import Buffer, Kernel, Scalar
from kitdispatch.models.ops.base import (
    Call, Constant, Layout, OpFacts, OpKind, Operand, Reshape, TensorFacts, condition_mismatch, expect, function_of, kernel_buffers, location,
    map_dims, op_name, tensor_facts, type_mismatch,
)
from kitdispatch.models.ops.generic import plain_transpose
from kitdispatch.models.ops._bias import f32_literal
from kitdispatch.models.ops._decomposed import MATMULS, PACKED, Chain, Input, looks_like_attention, read_attention_op, read_chain, repeated_heads
from kitdispatch.models.ops._masks import CAUSAL, CAUSAL_KEY_PADDING, KEY_PADDING, NONE, OTHER, MaskForm, mask_ops, read_mask

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

HEAD_DIMS = (64, 80, 96, 128)  # the head dims kernels/attention has code for (80 and 96 padded to 128); a kernel with replace_when's `when` says its own
BATCH_DIMS = 2  # the kernel's b and h; an op with one batch dim runs as b = 1
ROLES = ("Q", "K", "V", "O")
PLAIN = ("bhsd",) * 4  # every tensor [b, h, s, d]
SCALE = "scale"  # an f32 scalar argument: the kernel scales the scores by the op's constant
MASKED = "masked"  # an f32 scalar argument of key-padding kernels: the value added past the diagonal (causal)
BIAS = "bias"  # key-padding kernels' fourth input: [b, s] of Q's type, added to the scores per (batch, key)
PADDING = (KEY_PADDING, CAUSAL_KEY_PADDING)
KEYS = "t"  # K and V's sequence dim where a kernel takes another key length (cross-attention)
# The orders a kernel's tensors may have, named by their dims (b, h, s, d): projections leave
# Q, K, V [b, s, h, d] before their heads are transposed out, K as K^T [b, h, d, s], and O goes
# back to [b, s, h, d] (_decomposed.py reads which the op gives).
ORDERS = (("bhsd", "bshd", PACKED), ("bhsd", "bshd", "bhds", "bgsd", "bsgd", PACKED), ("bhsd", "bshd", "bgsd", "bsgd", PACKED), ("bhsd", "bshd"))
# g: K and V with fewer heads than Q (GQA/MQA), query head i reading K/V head i / (h / g);
# PACKED ([b, s, 3, h, d]): one buffer, `qkv`, holding Q, K and V (the kernel's first input is all three)


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
    mask: MaskForm | None  # what the mask operand is (_masks.py); None: the op has none
    plain_scores: bool  # the score region yields its argument unchanged
    repeated_heads: str | None = None  # K or V broadcast from fewer heads (GQA/MQA), as the report says it
    chain: Chain | None = None  # decomposed attention (_decomposed.py): read from its last matmul up
    anchor: str = ""  # the op read, where it is not an attention op (the chain's last matmul)

    @property
    def summary(self) -> str | None:
        if self.chain is None:
            return None
        if not self.anchor:  # the attention op, read through K's and V's broadcast
            return "K and V read before their broadcast to the query heads"
        return f"decomposed, ending in {self.anchor}" + (f"; Q, K and V {self.chain.unpacked}" if self.chain.unpacked else "")

    def to_json(self) -> dict:
        mask = None if self.mask is None else {"form": self.mask.form, "what": self.mask.text}
        data = {"scale": self.scale_text, "mask": mask, "v_through_transpose": self.v_transposed}
        if self.chain is not None and not self.anchor:
            data["grouped"] = {"replaced": f"{self.chain.marked} single user(s) down from the op"}
        elif self.chain is not None:
            data["decomposed"] = {"anchor": self.anchor, "replaced": f"{self.chain.marked} single user(s) down from it"}
            if self.chain.unpacked:
                data["decomposed"]["unpacked"] = self.chain.unpacked
        return {"attention": data}

    @property
    def mask_form(self) -> str:
        return NONE if self.mask is None else self.mask.form


class Attention(OpKind):
    name = "iree_linalg_ext.attention"
    reads = MATMULS  # decomposed attention, read from its last matmul (the anchor) up

    def candidate(self, op: ir.Operation) -> bool:
        # An attention op's scale operand is a scalar: `facts` reads the op whole. A matmul is
        # one where its A comes from a softmax.
        return op.name == self.name or looks_like_attention(op)

    def facts(self, op: ir.Operation) -> OpFacts:
        return _attention_facts(op) if op.name == self.name else _decomposed_facts(op)

    def claims(self, op: ir.Operation) -> tuple:
        """The chain of a decomposed attention; for an attention op, the ops that make its mask
        for it alone (the kernel applies the mask itself: they die with the op)."""
        if op.name != self.name:
            return read_chain(op).ops
        grouped = read_attention_op(op) if repeated_heads(op.operands[1], op.operands[2]) is not None else None
        return ((op,) + (mask_ops(op.operands[4]) if len(op.operands) == 6 else ())
                + (grouped.ops if grouped is not None and grouped.problem is None else ()))

    def contract(self, kernel: Kernel, where: str) -> Layout:
        args, result = kernel_buffers(_without_scale(kernel), self.name, where)
        if args and _buffer_order(args[0]) == PACKED:  # one buffer in the roles of Q, K and V
            args = [args[0]] * 3 + args[1:]
        padding = kernel.replaces.mask in PADDING
        expect(len(args) == 3 + padding and result.access != "inout", "it must take Q, K and V in that order (then, for a "
               "key_padding mask, its `bias` [b, s]) and write one new result O", where)
        if padding:
            bias = args[3].type
            expect(args[3].name == BIAS and bias.dtype == args[0].type.dtype and len(bias.shape) == 2 and bias.shape[0] == args[1].type.shape[0]
                   and bias.shape[1] in ("s", KEYS) and {SCALE, MASKED} <= {p.name for p in kernel.function_arguments},
                   f"a {kernel.replaces.mask} kernel takes `bias` [b, s] (or [b, t]) of Q's type after V, and the f32 scalars "
                   "`scale` and `masked`", where)
        shapes = {b.type.shape for b in args[:3] + [result]}
        dtypes = {b.type.dtype for b in args[:3] + [result]}
        expect(
            len(dtypes) == 1 and len(result.type.shape) == BATCH_DIMS + 2,
            "Q, K, V and O must be one type [b, h, s, d] (same names, one element type)",
            where,
        )
        # The function's arguments in its order, by role: input buffer i, or "scale" (the op's constant)
        roles = tuple(args.index(p) if isinstance(p, Buffer) else p.name for p in kernel.function_arguments)
        packed = len(args) > 1 and args[0] is args[1]  # the function takes it once: the call passes it so (its roles)
        layout = Layout(tuple(args), result, accumulates=False, pattern=roles if SCALE in roles or MASKED in roles or packed else None)
        expect(
            len(shapes) == 1 or all(o in allowed for o, allowed in zip(kernel_orders(layout), ORDERS)),
            "Q, K, V and O must be one type [b, h, s, d], or name their dims b, h, s, d in the orders the kit "
            "reads: Q, V and O [b, h, s, d] or [b, s, h, d], K also [b, h, d, s] (K^T); K and V [b, g, s, d] or "
            "[b, s, g, d] for g K/V heads shared by the h query heads (t for K and V's s: another key length); "
            "or Q, K and V as one first buffer qkv [b, s, 3, h, d]",
            where,
        )
        return layout

    def semantic_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout) -> str | None:
        """The op must be plain attention in the kernel's layout: Q (batch, m, k1), K (batch, k2, k1),
        V (batch, k2, n), O (batch, m, n), with no mask and an unmodified score."""
        a = op.detail
        if a.repeated_heads is not None and not any("g" in o for o in kernel_orders(layout)):
            return (f"grouped-query attention: {a.repeated_heads}; the kernel reads one K and V head per query head "
                    "and has no code for shared heads (it would need K and V [b, kv_heads, s, d] and h / kv_heads query heads per K/V head)")
        if a.chain is not None and a.chain.problem:
            return f"decomposed attention: {a.chain.problem}"
        why = _mask_mismatch(a, kernel.replaces.mask) or _padding_mismatch(op, a)
        if why:
            return why
        why = _order_mismatch(a, kernel_orders(layout))
        if why:
            return why
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
        orders = kernel_orders(layout)
        tensors = [_kernel_side(x) for x in _read(op, orders)] + [op.result]
        buffers = list(layout.inputs[:3]) + [layout.result]
        s_and_d = [_s_and_d(t, o) for t, o in zip(tensors, orders)]
        seq_q, seq_k = s_and_d[0][0], s_and_d[1][0]
        if None not in (seq_q, seq_k) and seq_q != seq_k and KEYS not in layout.inputs[1].type.shape:
            return (f"cross-attention: {seq_q} queries and {seq_k} keys; the kernel takes one sequence length for both "
                    "(it would need a key length of its own)")
        for role, tensor, buffer in zip(ROLES, tensors, buffers):
            if tensor.dtype != buffer.type.dtype:
                return f"element type: the op's {role} is {tensor.text}, the kernel's {buffer.name} is {buffer.type}"
            padded = TensorFacts(tensor.dtype, (1,) * (BATCH_DIMS + 2 - len(tensor.shape)) + tensor.shape)
            why = type_mismatch(role, padded, buffer, sizes)
            if why:
                return why
        if len(layout.inputs) > 3:  # the key-padding mask [b, t], or the bias computed from it (flags' select, ...)
            chain = op.detail.chain
            given = _as_rows(chain.keep.tensor)
            bias = TensorFacts(chain.bias.result_type, given.shape) if chain.bias is not None else given
            why = type_mismatch("key-padding mask", bias, layout.inputs[3], sizes)
            if why:
                return why
        if sizes.get("g") and sizes.get("h") and sizes["h"] % sizes["g"]:
            return f"grouped-query attention: {sizes['h']} query heads are not a multiple of {sizes['g']} K/V heads"
        unknown = [r for r, sd in zip(ROLES, s_and_d) if None in sd]
        if unknown:
            return f"shape: the sequence length or head dim of {unknown[0]} is dynamic, and the kernel's must be checked"
        head = s_and_d[0][1]
        if kernel.replaces.when is not None:  # the kernel says which head dims it has code for (attention_f32: d <= 64)
            why = condition_mismatch(kernel, sizes)
            if why:
                return why
        elif head not in HEAD_DIMS:
            return f"head dim {head}: the kernel has code for {', '.join(map(str, HEAD_DIMS[:-1]))} and {HEAD_DIMS[-1]} only"
        if SCALE in (layout.pattern or ()):  # the kernel scales by the op's constant
            if op.detail.scale is None:
                return f"the op's scale is {op.detail.scale_text}, not a constant"
            # attention.cu takes a scale that is not positive as "use 1/sqrt(d)": never pass one
            if not (np.isfinite(np.float32(op.detail.scale)) and np.float32(op.detail.scale) > 0):
                return f"the op's scale is {op.detail.scale_text}; the kernel takes a positive, finite scale"
            return None
        return _scale_mismatch(op.detail, head)

    def call(self, op: OpFacts, layout: Layout) -> Call:
        """Q, K and V (V through its transpose where the op reads it so; for decomposed
        attention, up the chain, each as the kernel's order reads it); an op tensor with fewer
        dims than the kernel's four through an adapter that adds them in front as unit dims."""
        chain = op.detail.chain
        if chain is not None:
            inputs = _read(op, kernel_orders(layout))
            paths, ranks, marked = [x.path for x in inputs], [len(x.tensor.shape) for x in inputs], chain.marked
            tensors = [x.tensor for x in inputs]
        else:
            paths, marked = [(0,), (1,), (2, 0) if op.detail.v_transposed else (2,)], 0
            ranks, tensors = [len(op.detail.maps[0])] * 3, list(op.inputs)
        ranks.append(len(op.result.shape))
        reshapes = [_unit_dims(rank) for rank in ranks]
        if chain is not None:  # a packed QKV: viewed as [b, s, 3, h, d]
            reshapes[:3] = [x.reshape or r for x, r in zip(inputs, reshapes)]
        if len(set(ranks)) == 1:
            variant = f"_batch{ranks[0] - 2}" if ranks[0] < BATCH_DIMS + 2 else ""
        else:
            variant = "_rank" + "".join(map(str, ranks))
        arguments = [Operand(p, r, t if t != given else None) for p, r, t, given in zip(paths, reshapes, tensors, op.inputs)]
        if layout.pattern is not None:
            given: dict = dict(enumerate(arguments))
            if SCALE in layout.pattern:
                given[SCALE] = Constant("f32", repr(float(np.float32(op.detail.scale))))
            if chain is not None and chain.keep is not None:
                # flags, or a mask computed from [b, t] in the scores' generic: passed as the bias they add
                rows = None if len(chain.keep.tensor.shape) == 2 else Reshape(((0, 1),))  # [t]: one row, [1, t]
                given[3] = Operand(chain.keep.path, rows, chain.keep.tensor, bias=chain.bias)
                given[MASKED] = Constant("f32", f32_literal(chain.masked) if chain.masked is not None else "0.0")
            arguments = [given[role] for role in layout.pattern]
        fallback = chain is not None and chain.reads_heads_as_groups(kernel_orders(layout))
        return Call(tuple(arguments), result=reshapes[3], marked=marked, variant=variant, fallback=fallback)


def _as_rows(keep: TensorFacts) -> TensorFacts:
    """The key-padding tensor as the kernel reads it, [b, t]: a [t] one (the same for every
    batch) as one row."""
    return keep if len(keep.shape) == 2 else TensorFacts(keep.dtype, (1, *keep.shape))


def _without_scale(kernel: Kernel) -> Kernel:
    """The kernel as kernel_buffers checks it: `scale` and `masked` scalars (f32) are the op's to give."""
    def given(p: Buffer | Scalar) -> bool:
        return isinstance(p, Scalar) and p.name in (SCALE, MASKED) and p.dtype == "f32" and kernel.is_function_argument(p)

    if not any(given(p) for p in kernel.params):
        return kernel
    return dataclasses.replace(kernel, params=tuple(p for p in kernel.params if not given(p)))


def _buffer_order(buffer: Buffer) -> str:
    return "".join(map(str, buffer.type.shape)).replace(KEYS, "s")


def _kernel_side(x: Input) -> TensorFacts:
    """An input as the kernel's buffer sees it, where a reshape other than unit dims views it (a packed QKV)."""
    return x.tensor if x.reshape is None or x.reshape.shape is None else TensorFacts(x.tensor.dtype, x.reshape.shape)


def kernel_orders(layout: Layout) -> tuple[str, ...]:
    """The order of the kernel's Q, K, V and O, read from their dims' names where those are the
    kit's (b, h, s, d, g; t, K and V's sequence, is s); "bhsd" for all where they are one type of
    other names."""
    orders = tuple(_buffer_order(b) for b in (*layout.inputs[:3], layout.result))
    if all(o in allowed for o, allowed in zip(orders, ORDERS)):
        return orders
    return PLAIN


def _read(op: OpFacts, orders: tuple[str, ...]) -> tuple[Input, ...]:
    """Q, K and V as a kernel of these orders reads them (the op's inputs where it cannot)."""
    chain = op.detail.chain
    if chain is None:
        return tuple(Input((), t) for t in op.inputs)
    return chain.read_as(orders) or (chain.q, chain.k, chain.v)


def _s_and_d(tensor: TensorFacts, order: str) -> tuple[int | None, int | None]:
    padded = (1,) * (BATCH_DIMS + 2 - len(tensor.shape)) + tensor.shape
    return padded[order.index("s")], padded[order.index("d")]


def _unit_dims(rank: int) -> Reshape | None:
    """[.., s, d] of `rank` dims as the kernel's four, unit dims in front."""
    pad = BATCH_DIMS + 2 - rank
    return Reshape(((*range(pad + 1),), *((i + pad,) for i in range(1, rank)))) if pad > 0 else None


def _order_mismatch(a: AttentionFacts, orders: tuple[str, ...]) -> str | None:
    """The kernel reads Q, K, V and writes O in `orders`; the op must give them so."""
    if a.chain is None:
        return None if orders == PLAIN else "layout: the op's Q, K, V and O are [b, h, s, d], the kernel's " + _orders_text(orders)
    if a.chain.read_as(orders) is not None:
        return None
    given = [" or ".join(_dims(x.order) for x in options if x.order) or "(not a layout a kernel names)" for options in a.chain.options]
    shown = ", ".join(f"{r} {g}" for r, g in zip(ROLES, given + [_dims(a.chain.o_order) or "(not a layout a kernel names)"]))
    unpacked = f" ({a.chain.unpacked})" if PACKED in orders and a.chain.unpacked else ""
    return f"layout: the op gives {shown}; the kernel's {_orders_text(orders)}{unpacked}"


def _dims(order: str) -> str:
    return "[b, s, 3, h, d] (one packed qkv)" if order == PACKED else f"[{', '.join(order)}]" if order else ""


def _orders_text(orders: tuple[str, ...]) -> str:
    return ", ".join(f"{r} {_dims(o)}" for r, o in zip(ROLES, orders))


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
    mask = _mask(op.operands[4], maps[4], maps[0], maps[1]) if masked else None
    scale = op.operands[3].owner
    constant = op_name(scale) == "arith.constant" and isinstance(scale.attributes["value"], ir.FloatAttr)
    body = list(op.regions[0].blocks[0].operations)
    plain = len(body) == 1 and body[0].operation.name == "iree_linalg_ext.yield" and list(body[0].operands) == [
        op.regions[0].blocks[0].arguments[0]
    ]
    facts = OpFacts(
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
            mask=mask,
            plain_scores=plain,
            repeated_heads=repeated_heads(k, v),
        ),
    )
    grouped = read_attention_op(op) if facts.detail.repeated_heads is not None else None
    return facts if grouped is None else _grouped_op_facts(facts, grouped)


def _grouped_op_facts(facts: OpFacts, chain: Chain) -> OpFacts:
    """The op's facts where K and V reach it broadcast to the query heads: Q, K, V and O as the
    reading gives them (read_attention_op), in the plain maps of Q's rank; its scale, mask and
    score region stay the op's."""
    q, k, v = (x.tensor for x in (chain.q, chain.k, chain.v))
    batch = tuple(range(len(q.shape) - 2))
    m, k1, k2, n = (len(batch) + i for i in range(4))
    detail = dataclasses.replace(
        facts.detail, maps=(batch + (m, k1), batch + (k2, k1), batch + (k2, n), batch + (m, n)), loops=len(batch) + 4,
        v_transposed=False, repeated_heads=chain.repeated_heads, chain=chain)
    return dataclasses.replace(facts, inputs=(q, k, v), init=chain.result, result=chain.result, detail=detail)


def _decomposed_facts(anchor: ir.Operation) -> OpFacts:
    """The chain ending in `anchor` as the attention it computes: Q, K and V as the chain reads
    them, O as the op replaced gives it."""
    chain = read_chain(anchor)
    q, k, v = (x.tensor for x in (chain.q, chain.k, chain.v))
    loops = len(q.shape) + 2
    batch = tuple(range(len(q.shape) - 2))
    m, k1, k2, n = (len(batch) + i for i in range(4))
    return OpFacts(
        kind=Attention.name,
        function=function_of(anchor),
        location=location(anchor),
        inputs=(q, k, v),
        init=chain.result,
        result=chain.result,
        detail=AttentionFacts(
            maps=(batch + (m, k1), batch + (k2, k1), batch + (k2, n), batch + (m, n)),
            loops=loops,
            v_transposed=False,
            scale=chain.scale,
            scale_text=chain.scale_text,
            mask=chain.mask,
            plain_scores=True,
            repeated_heads=chain.repeated_heads,
            chain=chain,
            anchor=anchor.name,
        ),
    )


def _mask(value: ir.Value, mask_map: tuple[int, ...] | None, q_map: tuple[int, ...] | None, k_map: tuple[int, ...] | None) -> MaskForm:
    """The mask operand's form; its map names which of its axes are the queries (Q's m) and keys (K's k2)."""
    if None in (mask_map, q_map, k_map) or q_map[-2] not in mask_map or k_map[-2] not in mask_map:
        return MaskForm(OTHER, f"made by {op_name(value.owner)}, read through a map kitdispatch does not follow")
    return read_mask(value, mask_map.index(q_map[-2]), mask_map.index(k_map[-2]))


def _mask_mismatch(a: AttentionFacts, wanted: str | None) -> str | None:
    """The kernel applies `wanted` (None: no mask); an op's mask that masks nothing is no mask."""
    form = a.mask_form
    if form == (wanted or NONE):
        return None
    if form not in (NONE, CAUSAL, *PADDING):
        return f"the op's mask is {a.mask.text}: the library has no kernel for an arbitrary mask"
    shown = "no mask" if a.mask is None else a.mask.text
    return f"the op has {shown}, the kernel applies {'a ' + wanted + ' mask' if wanted else 'none'}"


def _padding_mismatch(op: OpFacts, a: AttentionFacts) -> str | None:
    """A key-padding kernel adds the masked value to a padded key's score in the scores' type
    (as the chain does: what a fully padded row's softmax sees); the chain must add it so."""
    if a.mask_form not in PADDING or a.chain is None or a.chain.mask_dtype == op.inputs[0].dtype:
        return None
    return (f"the key-padding mask is added to the scores in {a.chain.mask_dtype or 'another form'}; the kernel adds it "
            f"in {op.inputs[0].dtype}, the scores' type")


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
