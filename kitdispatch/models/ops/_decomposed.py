"""Attention as exporters write it without SDPA, read from its last matmul up its producers.

ONNX opset 17 (and eager PyTorch) write attention as MatMul(Q, Transpose(K)), Div by sqrt(d)
or Mul by 1/sqrt(d), an optional Add of a mask, Softmax over the keys, MatMul with V. At IREE's
global optimization (measured, 3.13) that is a `linalg.batch_matmul` (K through a transpose
generic, or read transposed by the matmul's maps) into a zero fill, an f32-to-f16 truncation,
one elementwise generic (scale, mask add, extension to f32), a `linalg.softmax` of the last
dim, a truncation, and the `linalg.batch_matmul` with V, with collapse/expand_shapes between
[b, h, s, s] and [b*h, s, s]. The chain is read from that last matmul (the anchor) up; the op replaced is the
first single user down from it whose result is the kernel's O (the truncation to f16, and the
expand_shape back to [b, h, s, d] where Q is read so), and every op of the chain dies with
it, so each must have no other user.

torch's SDPA as the dynamo exporter writes it (transformers' default attention) scales Q and K^T
by d^-1/4 each before their matmul, leaves the scores unscaled (the kernel is given scale 1 and
the scaled Q and K), and guards the softmax's result with where(isnan(p), 0, p) (is_nan_guard),
which changes only a row whose every score is -inf (or one holding NaN or +inf: inputs not
finite, where the kernel's row is NaN): taken where the mask leaves every row a finite score
(_guard_differs). Where no entry reads K and V of one head per query head in their
layout, an entry for shared heads does with g = h (Chain.reads_heads_as_groups, a fallback).

The kernel computes the scores, their scale and the softmax in f32; the chain rounds the scores
and probabilities to f16 between its ops. That is the only difference accepted: the scale must
be the kernel's (a constant, or none), the mask none or causal (_masks.py), or key padding: an
additive [b, t] mask, or boolean [b, t] flags (anded with a causal one) added as
select(keep, 0, masked), or a bias the scores' generic computes from one [b, t] tensor (the mask's
own ops, fused in by IREE; at batch 1 flags [t] read by a tensor.extract at positions 0 .. t-1,
the gather IREE fuses in: _captured_flags): the chain then keeps that tensor (`Chain.keep`) for the kernel to
read, how the bias is made from it (`Chain.bias`, _bias.py) and the masked value
(`Chain.masked`); the softmax over the keys.

Q, K and V may be the three equal slices of one packed projection (GPT-2's c_attn: [b, s, 3*h*d]
split on its last dim, each slice reshaped to [b, s, h, d]): each then is also readable as that
one tensor (order "bs3hd", `Input.reshape` viewing it as [b, s, 3, h, d]), which a packed kernel
reads in place; the slices and their reshapes die with the chain. `Chain.unpacked` says why a
chain whose Q, K or V is such a slice cannot be read so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import math

from dataclasses import dataclass, field

from kitdispatch.models.ops._bias import BiasProgram, Unsliceable, flags_program, slice_program
from kitdispatch.models.ops._masks import (
    NONE, OTHER, MaskForm, evaluates_to_arange, is_masked_value, per_key, read_additive, read_body_mask, read_mask, with_key_padding,
)
from kitdispatch.models.ops.base import CAPTURED, Reshape, TensorFacts, location, map_dims, tensor_facts
from kitdispatch.models.ops.generic import plain_transpose
from kitdispatch.models.ops.matmul import init_source

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

MATMULS = ("linalg.batch_matmul", "linalg.matmul")
_THROUGH = ("tensor.collapse_shape", "tensor.expand_shape", "iree_tensor_ext.compute_barrier.start", "iree_tensor_ext.compute_barrier.end")
_CASTS = ("arith.truncf", "arith.extf")
_F16_LARGEST, _F16_OVERFLOW = 65504.0, 65520.0  # f16's largest finite value; sums from this magnitude round to inf
_IS_NAN = (13, 14)  # arith.cmpf une / uno of a value with itself
_SEARCH = 12  # ops walked up from the anchor looking for the softmax
PACKED = "bs3hd"  # Q, K and V as parts 0, 1 and 2 of one packed projection [b, s, 3, h, d]


@dataclass(frozen=True)
class Input:
    """A tensor the kernel reads: its operand path from the marked op, its type, and the order
    of its axes as the kernels name them ("bhsd": [b, h, s, d]; "bshd"; "bhds" for K^T; "" where
    it cannot be told; a tensor without b runs as b = 1)."""

    path: tuple[int, ...]
    tensor: TensorFacts
    order: str = "bhsd"
    reshape: Reshape | None = None  # how the kernel views it, where that is not by unit dims in front (a packed QKV; MQA's K, V)
    value: object = field(default=None, compare=False, repr=False)  # the ir.Value (the [b, s, h, d] reads: a packed slice?)


@dataclass(frozen=True)
class Chain:
    """What the chain computes, as the attention kind checks it."""

    q: Input
    k: Input
    v: Input
    result: TensorFacts  # the marked op's result
    marked: int  # single users down from the anchor matmul to the op replaced (see _down)
    scale: float | None  # what the scores are multiplied by (1/c for a division); None: not a constant
    scale_text: str
    mask: MaskForm | None
    repeated_heads: str | None
    problem: str | None  # why this is not the attention the kernel computes
    ops: tuple = field(default=(), compare=False, repr=False)  # the ir ops that die with the replacement
    options: tuple[tuple[Input, ...], ...] = ()  # Q, K, V: each readable as these (nearest first, q/k/v among them)
    o_order: str = "bhsd"  # the marked op's result as the kernel's O
    keep: Input | None = None  # the key-padding mask [b, t] (additive, or i1 flags) the kernel reads, where the mask has it
    masked: float | None = None  # what select(keep, 0, masked) adds to a padded key's score (flags)
    mask_dtype: str = ""  # the element type the mask is added in
    bias: BiasProgram | None = None  # how the kernel's bias is computed from `keep` (flags, a mask computed in the scores' generic)
    unpacked: str | None = None  # why Q, K and V, one of them a slice, are not one packed tensor's three

    def read_as(self, orders: tuple[str, ...]) -> tuple[Input, ...] | None:
        """Q, K and V as a kernel of these orders (Q, K, V, O) reads them; None if one is not there."""
        if orders[3] != self.o_order:
            return None
        chosen = [self._option(options, order) for options, order in zip(self.options, orders)]
        return None if None in chosen else tuple(chosen)

    def reads_heads_as_groups(self, orders: tuple[str, ...]) -> bool:
        """Whether a kernel of these orders reads this chain's K and V, a head per query head,
        as shared heads (g = h)."""
        return self.repeated_heads is None and any("g" in order for order in orders[1:3])

    def _option(self, options: tuple[Input, ...], order: str) -> Input | None:
        """The option of this order; for a kernel order naming g (K/V heads shared by query
        heads) and a chain whose K and V have a head per query head, the one naming h: the
        kernel runs with g = h (attention.cu reads one K/V head per query head then)."""
        exact = next((x for x in options if x.order == order), None)
        if exact is not None or "g" not in order or self.repeated_heads is not None:
            return exact
        return next((x for x in options if x.order == order.replace("g", "h")), None)



def _owner(value: ir.Value) -> ir.Operation | None:
    return getattr(value.owner, "operation", None)


def _users(value: ir.Value) -> int:
    return sum(1 for _ in value.uses)


def looks_like_attention(op: ir.Operation) -> bool:
    """A matmul whose A is a softmax's result, through reshapes and casts."""
    if op.name not in MATMULS:
        return False
    value = op.operands[0]
    for _ in range(_SEARCH):
        owner = _owner(value)
        if owner is None:
            return False
        if owner.name == "linalg.softmax":
            return True
        if owner.name not in _THROUGH and not _is_cast(owner) and not is_nan_guard(owner):
            return False
        value = owner.operands[0]
    return False


def _is_cast(op: ir.Operation) -> bool:
    """An elementwise generic that only converts its one input (extf / truncf)."""
    permutation = _cast_permutation(op)
    return permutation is not None and permutation == tuple(range(len(permutation)))


def is_nan_guard(op: ir.Operation) -> bool:
    """An elementwise generic writing where(isnan(p), 0, p) of its one input, after an optional
    cast: torch's SDPA as dynamo exports it guards the softmax's result so (a row whose every
    score is -inf is NaN, and becomes 0)."""
    from iree.compiler import ir

    if op.name != "linalg.generic" or len(op.operands) != 2 or len(op.results) != 1:
        return False
    maps = [map_dims(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    if None in maps or maps[0] != maps[1] or maps[1] != tuple(range(len(maps[1]))):
        return False
    body = list(op.regions[0].blocks[0].operations)
    p = op.regions[0].blocks[0].arguments[0]
    if len(body) == 4 and body[0].name in _CASTS:
        p, body = body[0].results[0], body[1:]
    if [o.name for o in body] != ["arith.cmpf", "arith.select", "linalg.yield"]:
        return False
    compare, select, yielded = body
    zero = _owner(select.operands[1])
    return (ir.IntegerAttr(compare.attributes["predicate"]).value in _IS_NAN
            and list(compare.operands) == [p, p] and select.operands[0] == compare.results[0]
            and select.operands[2] == p and yielded.operands[0] == select.results[0]
            and zero is not None and zero.name == "arith.constant" and isinstance(zero.attributes["value"], ir.FloatAttr)
            and ir.FloatAttr(zero.attributes["value"]).value == 0.0)


def _cast_permutation(op: ir.Operation) -> tuple[int, ...] | None:
    """For a generic that only converts its one input (extf / truncf) or copies it (an f32
    model's transpose of O back to [b, s, h, d]), possibly transposing it (identity output map,
    a permutation for the input), the input map's dims: dim j of the input is dim
    permutation[j] of the output. None for anything else."""
    from iree.compiler import ir

    if op.name != "linalg.generic" or len(op.operands) != 2 or len(op.results) != 1:
        return None
    maps = [map_dims(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    body = [o.name for o in op.regions[0].blocks[0].operations]
    rank = len(maps[1]) if maps[1] is not None else -1
    if None in maps or maps[1] != tuple(range(rank)) or sorted(maps[0]) != list(range(rank)):
        return None
    return maps[0] if body[:-1] in (["arith.truncf"], ["arith.extf"], []) else None


# ------------------------------------------------- where Q, K, V and O's axes come from


def _roles(value: ir.Value, last: str) -> tuple[str, ...] | None:
    """A matmul operand's axes as the kernels name them: its batch dim is "B" (b*h, or h where
    b is 1), its last two `last` ("sd": Q [.., s, d]; "ds": K^T)."""
    rank = len(tensor_facts(value.type).shape)
    return ("B",) * (rank - 2) + tuple(last) if rank <= 3 else ("b", "h") + tuple(last) if rank == 4 else None


def _order(roles: tuple[str, ...] | None) -> str:
    """The kernel order of a tensor whose axes have these roles: leading unit axes dropped,
    "B" as h (b = 1), a missing b or h as a unit dim in front; "" for anything else. K and V
    read before their heads are repeated name their heads g."""
    if roles is None:
        return ""
    rest = list(roles)
    while rest and rest[0] == "1":
        rest.pop(0)
    heads = "g" if "g" in rest else "h"  # g: K/V heads each shared by several query heads
    if "B" in rest:
        if "b" in rest or heads in rest:
            return ""
        rest = [heads if x == "B" else x for x in rest]
    rest = (["b"] if "b" not in rest else []) + ([heads] if heads not in rest else []) + rest
    order = "".join(rest)
    return order if sorted(order) == sorted("bsd" + heads) and order[0] == "b" else ""


def _groups(op: ir.Operation) -> list[list[int]]:
    from iree.compiler import ir

    return [[ir.IntegerAttr(i).value for i in ir.ArrayAttr(g)] for g in ir.ArrayAttr(op.attributes["reassociation"])]


def _reshaped(op: ir.Operation, roles: tuple[str, ...], *, down: bool) -> tuple[str, ...] | None:
    """The roles of the axes on the other side of a reshape (or barrier): going down, of its
    result from its source's; going up, of its source from its result's. An axis split in two is
    "B" into b and h, or one role and unit dims; going up, "B" split in three is b, G, R (GQA's
    [b, kv heads, repeat] where a broadcast made it: `_grouped`; no kernel order otherwise).
    Axes merged are b and h into "B", or one role and unit dims. None where the roles cannot be told."""
    if op.name not in ("tensor.collapse_shape", "tensor.expand_shape"):
        return roles
    source, result = tensor_facts(op.operands[0].type).shape, tensor_facts(op.results[0].type).shape
    groups = _groups(op)
    splits = (op.name == "tensor.expand_shape") == down  # the wide side is the one being found
    wide = result if op.name == "tensor.expand_shape" else source
    out: list[str] = []
    if splits:
        for role, group in zip(roles, groups):
            sizes = [wide[i] for i in group]
            if len(group) == 1:
                out.append(role)
            elif role == "B" and len(group) == 2 and 1 not in sizes:
                out += ["b", "h"]
            elif role == "B" and len(group) == 3 and 1 not in sizes and not down:
                out += ["b", "G", "R"]  # b x (heads as outer x inner): GQA's kv heads x repeat, where a broadcast makes it
            elif sizes.count(1) == len(group) - 1:
                out += [role if size != 1 else "1" for size in sizes]
            else:
                return None
        return tuple(out)
    for group in groups:
        parts = [roles[i] for i in group if wide[i] != 1] or ["1"]  # unit axes merge away
        if tuple(parts) == ("b", "h"):
            out.append("B")
        elif len(parts) == 1:
            out.append(parts[0])
        else:
            return None
    return tuple(out)


class _Reader:
    """Walks the chain, recording its ops (each must have one user) and the first problem."""

    def __init__(self) -> None:
        self.ops: list = []
        self.problem: str | None = None
        self.unpacked: str | None = None  # Chain.unpacked
        # Whether Q has a batch dim of its own (None: not read): K's and V's [b, h] read as a
        # broadcast from fewer heads are then [b, heads] (MQA), else [kv heads, repeat] (b = 1)
        self.q_batch: bool | None = None
        # Q's number of heads where it is static: a broadcast read as K's or V's heads repeated
        # must make exactly these (with a dynamic batch nothing else ties its repeat to h / g)
        self.q_heads: int | None = None
        self.guard: ir.Operation | None = None  # where(isnan(p), 0, p) on the softmax's result (is_nan_guard)

    def fail(self, why: str) -> None:
        self.problem = self.problem or why

    def take(self, op: ir.Operation) -> None:
        self.ops.append(op)
        if _users(op.results[0]) != 1:
            self.fail(f"{op.name} at {location(op)} in the chain has {_users(op.results[0])} users; each op "
                      "of the chain must feed only the next, as the kernel leaves no intermediate value")

    def through_roles(self, value: ir.Value, path: tuple[int, ...], roles: tuple[str, ...] | None, *, known: bool = False):
        """`through` reshapes and barriers, following the roles of the value's axes (`known`:
        only while they can be told, and each reshape with no other user)."""
        while True:
            owner = _owner(value)
            if owner is None or owner.name not in _THROUGH:
                return value, path, roles
            before = None if roles is None else _reshaped(owner, roles, down=False)
            if known and (before is None or _users(value) != 1):
                return value, path, roles
            self.take(owner)
            roles, value, path = before, owner.operands[0], path + (0,)

    def further(self, near: Input, value: ir.Value, roles: tuple[str, ...] | None) -> tuple[Input, ...]:
        """`near`, and the tensor before the plain transpose that makes it (a projection's
        [b, s, h, d] before the heads are transposed out of it), where that transpose has no
        other user: it then dies with the chain."""
        owner = _owner(value)
        grouped = _grouped(self, near, value, roles)
        if grouped:
            return (near, *grouped)
        permutation = None if owner is None or roles is None or _users(value) != 1 else plain_transpose(owner)
        if permutation is None:
            return (near,)
        self.ops.append(owner)
        value = owner.operands[0]
        before = tuple(roles[permutation[j]] for j in range(len(permutation)))
        value, path, before = self.through_roles(value, near.path + (0,), before, known=True)
        return (near, Input(path, tensor_facts(value.type), _order(before), value=value))

    def through(self, value: ir.Value, path: tuple[int, ...], *, probabilities: bool = False):
        """Up through reshapes and barriers (and, from P, casts and a NaN guard): the value and its path."""
        while True:
            owner = _owner(value)
            guard = probabilities and owner is not None and is_nan_guard(owner)
            if owner is None or not (owner.name in _THROUGH or guard or (probabilities and _is_cast(owner))):
                return value, path
            if guard:
                self.guard = owner
            self.take(owner)
            value, path = owner.operands[0], path + (0,)


def _grouped(r: _Reader, near: Input, value: ir.Value, roles: tuple[str, ...] | None) -> tuple[Input, ...]:
    """K or V before its heads are repeated (GQA as transformers' repeat_kv leaves it: a
    broadcast generic kv_heads -> kv_heads x group, collapsed into the query heads), its heads
    named g; () where `value` is not made so. `value` is the collapse (its heads "B"), or the
    broadcast where the chain was read through the collapse: its heads split as b, h where b is
    1 (the collapse merged [g, r]), as b, G, R where it is not ([b, g, r]). A broadcast from no
    heads at all (MQA: IREE drops the unit kv-heads dim) is read as g = 1, viewed with that unit
    dim where each kernel order has it. The broadcast and the collapse die with the chain."""
    owner = _owner(value)
    if roles is None or owner is None or _users(value) != 1:
        return ()
    if owner.name == "tensor.collapse_shape":
        groups = _groups(owner)
        merged = [i for i, g in enumerate(groups) if len(g) == 2]
        if len(merged) != 1 or len(groups) != len(roles) or roles[merged[0]] != "B" or _users(owner.operands[0]) != 1:
            return ()
        wide = [role for role, g in zip(roles, groups) for _ in g]
        (kv, repeat), ops, path = groups[merged[0]], [owner], near.path + (0,)
        owner = _owner(owner.operands[0])
    elif "G" in roles and "R" in roles and roles.index("R") == roles.index("G") + 1:  # b > 1: [b, g, r] merged
        wide, kv, repeat, ops, path = list(roles), roles.index("G"), roles.index("R"), [], near.path
    elif "b" in roles and "h" in roles and roles.index("h") == roles.index("b") + 1 and r.q_batch:  # MQA, b > 1
        return _single_head(r, owner, list(roles), roles.index("h"), near.path)
    elif "b" in roles and "h" in roles and roles.index("h") == roles.index("b") + 1:  # b = 1: [g, r] merged
        wide, kv, repeat, ops, path = list(roles), roles.index("b"), roles.index("h"), [], near.path
    elif roles.count("B") == 1 and r.q_batch is False:  # MQA, b = 1: the query heads
        return _single_head(r, owner, ["h" if x == "B" else x for x in roles], roles.index("B"), near.path)
    else:
        return ()
    source = _broadcast_source(owner, kv, repeat)
    if source is None or not _makes_query_heads(r, owner, (kv, repeat)):
        return ()
    wide[kv], wide[repeat] = "g", "r"
    r.ops.extend((*ops, owner))
    return (Input(path + (0,), tensor_facts(owner.operands[0].type), _order(tuple(wide[dim] for dim in source))),)


def _single_head(r: _Reader, owner: ir.Operation | None, wide: list[str], repeat: int, path: tuple[int, ...]) -> tuple[Input, ...]:
    """K or V broadcast to the query heads (dim `repeat`) from a tensor with no heads dim (MQA):
    the source as each kernel order with g reads it ([b, 1, s, d] and [b, s, 1, d]; b = 1
    where it has no b), a view that adds the unit dims; () where it is not such a broadcast."""
    source = _broadcast_source(owner, None, repeat)
    if source is None or not _makes_query_heads(r, owner, (repeat,)):
        return ()
    views = _single_head_views(path + (0,), tensor_facts(owner.operands[0].type), tuple(wide[dim] for dim in source))
    if views:
        r.ops.append(owner)
    return views


def _single_head_views(path: tuple[int, ...], tensor: TensorFacts, roles: tuple[str, ...]) -> tuple[Input, ...]:
    """A K or V of no heads dim (axes `roles`, of b, s and d) as the kernel orders with g read
    it, g = 1: [b, 1, s, d] and [b, s, 1, d] (b = 1 where it has no b)."""
    return tuple(Input(path, tensor, order, reshape=view) for order in ("bgsd", "bsgd")
                 if (view := _unit_view(roles, tensor.shape, order)) is not None)


def _makes_query_heads(r: _Reader, broadcast: ir.Operation, dims: tuple[int, ...]) -> bool:
    """Whether the broadcast's result dims `dims` (kv heads and repeat, or the repeat alone)
    are static and make Q's static number of heads."""
    shape = tensor_facts(broadcast.results[0].type).shape
    sizes = [shape[d] for d in dims]
    return r.q_heads is not None and None not in sizes and math.prod(sizes) == r.q_heads


def _unit_view(roles: tuple[str, ...], shape: tuple[int | None, ...], order: str) -> Reshape | None:
    """A tensor of these axes (a subset of `order`'s, in its order, its last among them) as
    the kernel's `order`, the missing axes unit dims, each leading the group of the next axis
    it has; None where its axes are not so or a size is dynamic."""
    if [x for x in order if x in roles] != list(roles) or order[-1] != roles[-1] or None in shape or len(set(roles)) != len(roles):
        return None
    groups, pending = [], []
    for i, axis in enumerate(order):
        if axis in roles:
            groups.append((*pending, i))
            pending = []
        else:
            pending.append(i)
    sizes = dict(zip(roles, shape))
    return Reshape(tuple(groups), shape=tuple(sizes.get(axis, 1) for axis in order))


def _broadcast_source(op: ir.Operation | None, kv: int | None, repeat: int) -> tuple[int, ...] | None:
    """For a generic that only broadcasts its one input along dim `repeat` (and may permute the
    others, dim `kv` among them where one is named), the input map's dims (input dim j is
    output dim map[j]); None for anything else."""
    from iree.compiler import ir

    if op is None or op.name != "linalg.generic" or len(op.operands) != 2 or len(op.results) != 1:
        return None
    maps = [map_dims(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    body = [o.name for o in op.regions[0].blocks[0].operations]
    rank = len(maps[1]) if maps[1] is not None else 0
    if None in maps or maps[1] != tuple(range(rank)) or body != ["linalg.yield"] or (kv is not None and kv not in maps[0]):
        return None
    return maps[0] if sorted(maps[0]) == [i for i in range(rank) if i != repeat] else None


def read_chain(anchor: ir.Operation) -> Chain:
    """The attention that ends in `anchor` (a matmul for which looks_like_attention holds)."""
    r = _Reader()
    if not _plain_matmul(r, anchor, "P V"):
        r.fail("the P V matmul reads its operands through maps (transposed or broadcast), not P [.., m, s] and V [.., s, d]")
    p, p_path = r.through(anchor.operands[0], (0,), probabilities=True)
    softmax = _owner(p)
    r.take(softmax)
    rank = len(tensor_facts(p.type).shape)
    dim = _int(softmax.attributes["dimension"])
    if dim != rank - 1:
        r.fail(f"the softmax normalizes dimension {dim} of {rank}, not the keys' (the last)")
    scores, s_path, program = _score_program(r, softmax.operands[0], p_path + (0,))
    qk = _owner(scores)
    padding: _Mask | None = None
    if qk is None or qk.name not in MATMULS:
        r.fail(f"the scores come from {'a function argument' if qk is None else qk.name}, not from a matmul of Q and K")
        q_options = k_options = (Input(s_path, tensor_facts(scores.type)),)
        k_value, scale, scale_text, mask = None, None, "not read", None
    else:
        r.take(qk)
        q_options, k_options, k_value = _q_and_k(r, qk, s_path)
        scale, scale_text, mask, padding = _scale_and_mask(r, program)
    v_value, v_path, v_roles = r.through_roles(anchor.operands[1], (1,), _roles(anchor.operands[1], "sd"))
    v_options = r.further(Input(v_path, tensor_facts(v_value.type), _order(v_roles)), v_value, v_roles)
    rows = _merged_rows(anchor)
    if rows is not None and v_roles == ("s", "d"):  # one V [t, d] for every head's rows: MQA's V, as g = 1
        v_options += _single_head_views(v_path, tensor_facts(v_value.type), v_roles)
    down, o_roles = _down(anchor, len(q_options[0].tensor.shape), rows)
    for op in down[:-1]:
        r.take(op)
    marked = len(down) - 1
    options = tuple(tuple(Input((0,) * marked + x.path, x.tensor, x.order, x.reshape) for x in xs)
                    for xs in _with_packed(r, (q_options, k_options, v_options)))
    q, k, v = (xs[0] for xs in options)
    out = tensor_facts(down[-1].results[0].type)
    keep = None if padding is None else Input((0,) * marked + padding.path, tensor_facts(padding.value.type), "")
    added = next((s for s in program if s.name in (_ADD_SELECT, _ADD_COMPUTED, "arith.addf")), None) if keep else None
    if r.guard is not None and keep is not None and (why := _guard_differs(added)):
        r.fail(why)
    return Chain(q, k, v, out, marked, scale, scale_text, mask, repeated_heads(k_value, v_value), r.problem,
                 tuple(r.ops) + (down[-1],), options, _order(o_roles), keep,
                 added.masked if added else None, added.dtype if added else "", _bias_of(added, keep), r.unpacked)


def _guard_differs(added: _Step | None) -> str | None:
    """Why a key-padding mask's chain, its softmax's result guarded by where(isnan(p), 0, p),
    is not the kernel's; None where it is. The guard writes 0 for a row whose every score is
    -inf, where the kernels write NaN; with a finite masked value added in f32 or bf16 no score
    reaches -inf; in f16 (largest 65504, sums from 65520 round to inf) one below -16 does with -65504."""
    guarded = "its softmax's result goes through where(isnan(p), 0, p), which writes 0 for a row whose every key is masked"
    if added is not None and added.masked is None and added.bias is not None:
        return (f"{guarded}; the bias it adds is computed from the model's input ({added.bias.what}), whose values the kit "
                "does not bound, so such a row may be all -inf, where the kernels write NaN")
    if added is None or added.masked is None:
        return f"{guarded}; the mask's values are the model's input, so such a row may be all -inf, where the kernels write NaN"
    if not math.isfinite(added.masked):
        return f"{guarded}; the mask adds {added.masked:g}, so such a row is all -inf, where the kernels write NaN"
    below = _F16_OVERFLOW - abs(added.masked)
    if added.dtype == "f16" and below <= _F16_LARGEST:
        return (f"{guarded}; the mask adds {added.masked:g} in f16, where a score below {-below:g} plus it rounds to -inf, "
                "so such a row may be all -inf, where the kernels write NaN")
    return None


def _bias_of(added: _Step | None, keep: Input | None) -> BiasProgram | None:
    """How the kernel's bias is made from `keep`: None where keep is the additive mask itself."""
    if added is None or keep is None:
        return None
    if added.bias is not None:
        return added.bias
    return flags_program(added.dtype, added.masked) if keep.tensor.dtype == "i1" and added.masked is not None else None


def read_attention_op(op: ir.Operation) -> Chain | None:
    """An `iree_linalg_ext.attention` op read as a chain's Q, K and V are: up through reshapes
    and barriers, K and V before a broadcast that repeats their heads (SDPA's `enable_gqa`: the
    op takes them broadcast to the query heads, their heads then named g), O down to the reshape
    back to Q's rank. The scale and mask stay the op's (the Chain's are not read). None where the
    op's maps are not the plain ones this reading assumes: Q (B.., m, k1), K (B.., k2, k1), V
    (B.., k2, n) or (B.., n, k2), O (B.., m, n), each loop dim once."""
    from iree.compiler import ir

    maps = [map_dims(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    q_map, k_map, v_map, o_map = maps[0], maps[1], maps[2], maps[-1]
    if None in (q_map, k_map, v_map, o_map) or not len(q_map) == len(k_map) == len(v_map) == len(o_map) >= 3:
        return None
    lead, (m, k1), k2, n = q_map[:-2], q_map[-2:], k_map[-2], o_map[-1]
    if k_map != lead + (k2, k1) or o_map != lead + (m, n) or sorted(lead + (m, k1, k2, n)) != list(range(len(lead) + 4)):
        return None
    v_last = "sd" if v_map == lead + (k2, n) else "ds" if v_map == lead + (n, k2) else None
    if v_last is None:
        return None
    r = _Reader()
    q_options = _q_side(r, op.operands[0], (0,))
    k_value, k_path, k_roles = r.through_roles(op.operands[1], (1,), _roles(op.operands[1], "sd"))
    k_options = r.further(Input(k_path, tensor_facts(k_value.type), _order(k_roles)), k_value, k_roles)
    v_value, v_path, v_roles = r.through_roles(op.operands[2], (2,), _roles(op.operands[2], v_last))
    v_options = r.further(Input(v_path, tensor_facts(v_value.type), _order(v_roles)), v_value, v_roles)
    down, o_roles = _down(op, len(q_options[0].tensor.shape))
    for later in down[:-1]:
        r.take(later)
    marked = len(down) - 1
    options = tuple(tuple(Input((0,) * marked + x.path, x.tensor, x.order, x.reshape) for x in xs) for xs in (q_options, k_options, v_options))
    q, k, v = (xs[0] for xs in options)
    return Chain(q, k, v, tensor_facts(down[-1].results[0].type), marked, None, "the op's", None, repeated_heads(k_value, v_value),
                 r.problem, tuple(r.ops) + (down[-1],), options, _order(o_roles))


def _q_side(r: _Reader, value: ir.Value, path: tuple[int, ...]) -> tuple[Input, ...]:
    """Q's options, up from the operand `value` at `path`; records whether Q has a batch dim of
    its own and its static number of heads (what K's and V's broadcasts are read against)."""
    q_value, q_path, q_roles = r.through_roles(value, path, _roles(value, "sd"))
    r.q_batch = None if q_roles is None else "b" in q_roles
    heads = None if q_roles is None else "h" if "h" in q_roles else "B" if q_roles.count("B") == 1 else None
    r.q_heads = None if heads is None else tensor_facts(q_value.type).shape[q_roles.index(heads)]
    return r.further(Input(q_path, tensor_facts(q_value.type), _order(q_roles)), q_value, q_roles)


def _merged_rows(anchor: ir.Operation) -> tuple[int, int] | None:
    """(B, s) where the anchor is a 2-D P V matmul whose P is the softmax's [B, s, t] with its
    heads merged into its rows (IREE's form of P V where one V [t, d] serves every head: MQA at
    b = 1), its sizes static; None otherwise."""
    collapse = _owner(anchor.operands[0])
    if anchor.name != "linalg.matmul" or collapse is None or collapse.name != "tensor.collapse_shape" or _groups(collapse) != [[0, 1], [2]]:
        return None
    lead = tensor_facts(collapse.operands[0].type).shape[:2]
    return None if None in lead else lead


def _down(anchor: ir.Operation, rank: int, rows: tuple[int, int] | None = None) -> tuple[list, tuple | None]:
    """The anchor and its single users down to the op replaced, and the roles of that op's
    result's axes. The op replaced is the first whose result is the kernel's O: Q's rank, a
    16-bit float (the truncation of the f32 accumulator, and where Q is [b, h, s, d], the
    expand_shape of [b*h, s, d] back to it); else the first 16-bit result of an order a kernel
    names (a truncation that also transposes the heads back to [b, s, h, d]); the anchor where
    neither is. `rows`: the anchor's rows are the heads' (B, s) merged (_merged_rows), which
    only the expand_shape back to [B, s, d] of exactly those sizes tells apart."""
    ops, roles = [anchor], [("Bs", "d") if rows is not None else _roles(anchor.results[0], "sd")]
    while len(ops) <= _SEARCH:
        users = list(ops[-1].results[0].uses)
        user = users[0].owner.operation if len(users) == 1 else None
        if user is None or len(user.results) != 1 or roles[-1] is None:
            break
        if roles[-1][0] == "Bs":  # only the split of the rows back into (B, s) reads on
            split = user.name == "tensor.expand_shape" and _groups(user) == [[0, 1], [2]]
            after = ("B", "s", "d") if split and tensor_facts(user.results[0].type).shape[:2] == rows else None
        elif user.name in _THROUGH:
            after = _reshaped(user, roles[-1], down=True)
        elif _cast_permutation(user) is not None:
            permutation = _cast_permutation(user)  # input dim j is output dim permutation[j]
            after = tuple(roles[-1][permutation.index(i)] for i in range(len(permutation)))
        else:
            break
        ops.append(user)
        roles.append(after)
    sixteen = [i for i, op in enumerate(ops) if tensor_facts(op.results[0].type).dtype in ("f16", "bf16") and _order(roles[i])]
    same_rank = [i for i in sixteen if len(tensor_facts(ops[i].results[0].type).shape) == rank
                 and all(op.name in _THROUGH or _is_cast(op) for op in ops[1:i + 1])]
    if tensor_facts(anchor.results[0].type).dtype == "f32" and not sixteen:
        # An f32 chain has no truncation to stop at: it ends at its last op of a kernel's order
        # (the transpose of O back to [b, s, h, d], which the kernel then writes, as the f16
        # chain's transposing truncation).
        ordered = [i for i in range(len(ops)) if _order(roles[i])]
        chosen = ordered[-1] if ordered else 0
    else:
        chosen = same_rank[0] if same_rank else sixteen[0] if sixteen else 0
    return ops[:chosen + 1], roles[chosen]


# ------------------------------------------------- Q, K and V as one packed projection


@dataclass(frozen=True)
class _Part:
    """A [b, s, h, d] tensor read as part `part` of a packed [b, s, 3*h*d] one (`packed`: its
    Input), and the ops that slice and reshape it out (they die with the chain)."""

    packed: Input
    source: object  # the packed ir.Value
    part: int
    ops: tuple


def _with_packed(r: _Reader, options: tuple[tuple[Input, ...], ...]) -> tuple[tuple[Input, ...], ...]:
    """Q, K and V's options, each with the packed tensor added where Q, K and V are its parts
    0, 1 and 2 (their [b, s, h, d] reads sliced out of one value, nothing else reading the
    slices); else as they are, with `r.unpacked` saying why where one of them is a slice."""
    nearest = [next((x for x in xs if x.order == "bshd" and x.value is not None), None) for xs in options]
    parts = [_packed_part(x) if x is not None else None for x in nearest]
    if all(p is None for p in parts):
        return options
    why = next((f"{role}: {p}" for role, p in zip("QKV", parts) if isinstance(p, str)), None)
    if why is None:
        missing = [role for role, p in zip("QKV", parts) if p is None]
        if missing:
            why = f"{' and '.join(missing)} not a slice of the packed tensor the others are sliced from"
        elif not (parts[0].source == parts[1].source == parts[2].source):
            why = "Q, K and V are slices of different tensors"
        elif tuple(p.part for p in parts) != (0, 1, 2):
            why = f"Q, K and V are its parts {', '.join(str(p.part) for p in parts)}, not 0, 1 and 2"
        elif len({p.packed.reshape for p in parts}) != 1:
            why = "Q, K and V view the packed tensor differently"
    if why is not None:
        r.unpacked = f"not one packed QKV tensor: {why}"
        return options
    for p in parts:
        r.ops.extend(p.ops)
    return tuple(xs + (p.packed,) for xs, p in zip(options, parts))


def _packed_part(near: Input) -> _Part | str | None:
    """`near` ([b, s, h, d], or [s, h, d] for b = 1) as a part of a packed tensor: made by an
    expand_shape of its last dim into (h, d) from an extract_slice of h*d columns at offset
    part*h*d of a [.., s, 3*h*d] value, whole in every other dim, unit strides. None where it
    is not such a slice; the reason where it is one that cannot be read in place."""
    from iree.compiler import ir

    expand = _owner(near.value)
    sliced = _owner(expand.operands[0]) if expand is not None and expand.name == "tensor.expand_shape" else None
    if sliced is None or sliced.name != "tensor.extract_slice":
        return None
    rank = len(near.tensor.shape)
    if _groups(expand) != [[i] for i in range(rank - 2)] + [[rank - 2, rank - 1]]:
        return f"the slice is reshaped by {_groups(expand)}, not only its last dim split into heads"
    for value, what in ((near.value, "its reshape to heads"), (sliced.results[0], "the slice")):
        if _users(value) != 1:
            return f"{what} at {location(_owner(value))} has {_users(value)} readers (the kernel would leave it unread)"
    source = sliced.operands[0]
    if len(sliced.operands) != 1:
        return "the slice has dynamic offsets, sizes or strides"
    offsets, sizes, strides = (list(ir.DenseI64ArrayAttr(sliced.attributes[f"static_{n}"])) for n in ("offsets", "sizes", "strides"))
    whole, roles = tensor_facts(source.type).shape, list(near.order[-rank:-2]) + ["P"]  # P: the packed h*d columns
    dropped = len(whole) - (rank - 1)
    source_roles = []
    for axis, size in enumerate(whole):
        assigned = len(source_roles) - source_roles.count("1")
        if dropped and sizes[axis] == 1 and len(whole) - axis > len(roles) - assigned:
            source_roles.append("1")
            dropped -= 1
        else:
            source_roles.append(roles[assigned])
    heads, d = near.tensor.shape[-2:]
    columns = None if None in (heads, d) else heads * d
    if set(strides) != {1} or columns is None or whole[-1] != 3 * columns or sizes[-1] != columns or offsets[-1] % columns:
        return f"the slice {sizes} at {offsets} of {tensor_facts(source.type).text} is not a third of its last dim (3 x h x d)"
    if any(offset != 0 or size != full for offset, size, full in zip(offsets[:-1], sizes[:-1], whole[:-1])):
        return f"the slice {sizes} at {offsets} of {tensor_facts(source.type).text} is not whole in its other dims"
    view = _packed_view(source_roles, whole, heads, d)
    if view is None:
        return f"the packed tensor {tensor_facts(source.type).text} is not [b, s, 3*h*d] (or [s, 3*h*d])"
    packed = Input(near.path + (0, 0), tensor_facts(source.type), PACKED, view, source)
    return _Part(packed, source, offsets[-1] // columns, (expand, sliced))


def _packed_view(roles: list[str], whole: tuple, heads: int, d: int) -> Reshape | None:
    """The packed tensor ([b, s, P], [1, s, P] or [s, P]; P = 3*h*d) as the kernel's [b, s, 3, h, d]."""
    if roles[-2:] != ["s", "P"] or roles[:-2] not in ([], ["b"], ["1"]):
        return None
    s = whole[-2]
    if len(roles) == 2:
        return Reshape(((0, 1), (2, 3, 4)), shape=(1, s, 3, heads, d))
    return Reshape(((0,), (1,), (2, 3, 4)), shape=(whole[0], s, 3, heads, d))


def _int(attr: ir.Attribute) -> int:
    from iree.compiler import ir

    return ir.IntegerAttr(attr).value


def _plain_matmul(r: _Reader, op: ir.Operation, what: str) -> bool:
    """Whether the matmul reads its operands as they are ([.., m, k] x [.., k, n]) into a zero fill."""
    from iree.compiler import ir

    init = init_source(op.operands[2])
    if init != "zero fill":
        r.fail(f"the {what} matmul accumulates into {init}, not a zero fill")
    if "indexing_maps" not in op.attributes:
        return True
    maps = [map_dims(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    lead = tuple(range(len(maps[2]) - 2))
    m, n, k = len(lead), len(lead) + 1, len(lead) + 2
    return maps == [lead + (m, k), lead + (k, n), lead + (m, n)]


def _q_and_k(r: _Reader, qk: ir.Operation, path: tuple[int, ...]) -> tuple[tuple[Input, ...], tuple[Input, ...], ir.Value]:
    """Q as the matmul's A; K as the input of the transpose that makes its B, or its B where the
    matmul's maps read B transposed (Q K^T with K [.., n, k]), or K^T itself (its B, [.., d, s])
    where no transpose makes it; each also before a plain transpose of the heads."""
    from iree.compiler import ir

    q_options = _q_side(r, qk.operands[0], path + (0,))
    b_value, b_path = qk.operands[1], path + (1,)
    if _plain_matmul(r, qk, "Q K^T"):
        b_value, b_path, b_roles = r.through_roles(b_value, b_path, _roles(b_value, "ds"))
        transpose = _owner(b_value)
        rank = len(tensor_facts(b_value.type).shape)
        swap = tuple(range(rank - 2)) + (rank - 1, rank - 2)
        if transpose is not None and plain_transpose(transpose) == swap and _users(b_value) == 1:
            r.take(transpose)
            b_roles = None if b_roles is None else tuple(b_roles[i] for i in swap)
            b_value, b_path, b_roles = r.through_roles(transpose.operands[0], b_path + (0,), b_roles)
    else:
        b_roles = _roles(b_value, "sd")
        maps = [map_dims(a) for a in ir.ArrayAttr(qk.attributes["indexing_maps"])]
        lead = tuple(range(len(maps[2]) - 2))
        m, n, k = len(lead), len(lead) + 1, len(lead) + 2
        if maps != [lead + (m, k), lead + (n, k), lead + (m, n)]:
            r.fail(f"the Q K^T matmul reads its operands through maps {maps}, not Q [.., m, d] and K [.., n, d]")
    k_options = r.further(Input(b_path, tensor_facts(b_value.type), _order(b_roles)), b_value, b_roles)
    return q_options, k_options, b_value


@dataclass(frozen=True)
class _Mask:
    """A tensor the mask is made of: the value, its map in the generic's loops, its operand path."""

    value: ir.Value
    dims: tuple[int, ...] | None
    path: tuple[int, ...]


_ADD_SELECT = "add select"  # scores + select(keep, 0, masked)
_ADD_COMPUTED = "add computed"  # scores + a bias the generic computes from one [b, t] tensor (_bias.py)


@dataclass(frozen=True)
class _Step:
    """One op the scores go through before the softmax: its name and its other operand
    (a constant's value, or the mask's tensors, anded, with their maps in the generic's loops)."""

    name: str
    constant: float | None = None
    constant_text: str = ""
    masks: tuple[_Mask, ...] = ()
    loops: int = 0  # the generic's loops, where the mask is added
    masked: float | None = None  # the value select(keep, 0, masked) adds where keep is false
    dtype: str = ""  # the element type the mask is applied in
    bias: BiasProgram | None = None  # _ADD_COMPUTED: how the bias is computed from masks[0]
    forms: tuple[MaskForm, ...] = ()  # booleans anded in that the body computes from constants, evaluated


def _score_program(r: _Reader, value: ir.Value, path: tuple[int, ...]):
    """From the softmax's input up to the scores' matmul: the elementwise steps in order."""
    from iree.compiler import ir

    program: list[_Step] = []
    while True:
        value, path = r.through(value, path)
        owner = _owner(value)
        if owner is None or owner.name != "linalg.generic":
            return value, path, program
        r.take(owner)
        maps = [map_dims(a) for a in ir.ArrayAttr(owner.attributes["indexing_maps"])]
        inputs = len(owner.operands) - 1
        identity = tuple(range(len(maps[-1])))
        flowing = [i for i in range(inputs) if maps[i] == identity and _reaches_matmul(owner.operands[i])]
        if len(flowing) != 1 or maps[-1] != identity:
            r.fail("the scores reach the softmax through a linalg.generic that is not elementwise on them")
            return value, path, program
        steps = _body_steps(r, owner, flowing[0], maps, path)
        program = steps + program
        value, path = owner.operands[flowing[0]], path + (flowing[0],)


def _reaches_matmul(value: ir.Value) -> bool:
    for _ in range(_SEARCH):
        owner = _owner(value)
        if owner is None:
            return False
        if owner.name in MATMULS:
            return True
        value = owner.operands[0]
    return False


def _body_steps(r: _Reader, op: ir.Operation, flowing: int, maps: list, path: tuple[int, ...]) -> list[_Step]:
    """The generic's body as steps on the scores: each op takes the scores' value and at most
    one other operand (a constant, or another input: the mask). `path`: the generic's, from the anchor."""

    block = op.regions[0].blocks[0]
    args = list(block.arguments)
    current = args[flowing]
    steps: list[_Step] = []
    selects = _mask_selects(op, args, maps)
    # the select and the andi making each mask: read where the scores get it
    made = set(selects) | {a.results[0] for v in selects for a in _and_of(v.owner.operands[0], args[:len(op.operands) - 1])[1]}

    def mask(index: int | ir.Value) -> _Mask:
        if isinstance(index, int):
            return _Mask(op.operands[index], maps[index], path + (index,))
        return _Mask(index, (len(maps[-1]) - 1,), path + (CAPTURED,))  # flags the body reads per key (_captured_flags)

    fused: list = []  # ops that do not read the scores: a mask's own, fused in by IREE (read where the scores get it)
    for inner in block.operations:
        if len(inner.results) == 1 and inner.results[0] in made:
            continue
        if inner.name == "arith.addf" and current in list(inner.operands) and any(v in selects for v in inner.operands):
            indices, masked, flags, forms = selects[next(v for v in inner.operands if v in selects)]
            dtype = str(inner.results[0].type)
            steps.append(_Step(_ADD_SELECT, masks=tuple(mask(i) for i in indices), loops=len(maps[-1]), masked=masked, dtype=dtype,
                               bias=None if flags is None else flags_program(dtype, masked, flags), forms=forms))
            current = inner.results[0]
            continue
        if inner.name == "linalg.yield":
            if inner.operands[0] != current:
                r.fail("the generic before the softmax yields something else than the scores' value")
            return steps
        operands = list(inner.operands)
        if current not in operands and len(inner.results) <= 1:  # cf.assert too: a gather's index check
            fused.append(inner.operation)
            continue
        if current not in operands or len(inner.results) != 1:
            r.fail(f"the scores go through {inner.name}, which does not read them")
            return steps
        others = [v for v in operands if v != current]
        if (inner.name == "arith.addf" and len(others) == 1 and _owner(others[0]) in fused
                and _constant_text(others[0], op, args, maps) is None):
            step = _computed_step(op, args, maps, others[0], fused, path)
            if isinstance(step, str):
                r.fail(step)
                return steps
            steps.append(step)
        elif inner.name in _CASTS and not others:
            steps.append(_Step(inner.name))
        elif inner.name in ("arith.divf", "arith.mulf") and len(others) == 1 and (inner.name == "arith.mulf" or operands[0] == current):
            constant = _constant(others[0], op, args, maps)
            if constant is None:
                r.fail(f"the scores are scaled ({inner.name}) by a value that is not a constant")
                return steps
            steps.append(_Step(inner.name, constant[0], constant[1]))
        elif inner.name == "arith.addf" and len(others) == 1 and _constant(others[0], op, args, maps) is not None:
            constant = _constant(others[0], op, args, maps)
            steps.append(_Step("add constant", constant[0], constant[1]))
        elif inner.name == "arith.select" and operands[1] == current and operands[0] in args[:len(op.operands) - 1] and _masks_out(
                operands[2], op, args, maps, str(inner.results[0].type)):
            index = args.index(operands[0])  # where(keep, scores, -inf), as GPT-2's eager attention masks
            steps.append(_Step("select", masks=(mask(index),), loops=len(maps[-1])))
        elif inner.name == "arith.addf" and len(others) == 1 and others[0] in args[:len(op.operands) - 1]:
            index = args.index(others[0])
            steps.append(_Step(inner.name, masks=(mask(index),), loops=len(maps[-1]), dtype=str(inner.results[0].type)))
        else:
            r.fail(f"the scores go through {inner.name} before the softmax, which the kernel does not compute")
            return steps
        current = inner.results[0]
    return steps


def _computed_step(op: ir.Operation, args: list, maps: list, bias: ir.Value, fused: list, path: tuple[int, ...]) -> _Step | str:
    """scores + `bias`, where the generic computes `bias` from one [b, t] input read per (batch,
    key) and constants (the cast of an attention_mask, its compare, select or (1 - m) * lowest,
    fused in by IREE): a step whose program the spec re-runs on that [b, t] tensor. Else why not."""
    loops = len(maps[-1])
    inputs = args[:len(op.operands) - 1]
    read = [a for a in _block_args_of(bias, inputs) if _constant_text(a, op, args, maps) is None]
    why = (f"the mask is computed inside the scores' generic ({fused[0].name} of its other inputs, fused there by IREE)"
           if fused else "the mask is computed inside the scores' generic")
    if len(read) != 1 or not per_key(maps[args.index(read[0])], loops):
        source = f"{len(read)} of its inputs" if len(read) != 1 else "an input it does not read per batch and key"
        return (f"{why}, from {source}; the kernels read a mask the model holds as a tensor (a [b, t] key-padding mask, "
                "or a constant), or one computed from a [b, t] tensor alone")
    try:
        program = slice_program(bias, read[0], lambda v: _constant_text(v, op, args, maps))
    except Unsliceable as exc:
        return f"{why}: {exc}"
    index = args.index(read[0])
    return _Step(_ADD_COMPUTED, masks=(_Mask(op.operands[index], maps[index], path + (index,)),), loops=loops,
                 dtype=program.result_type, bias=program)


def _block_args_of(value: ir.Value, inputs: list) -> list:
    """The generic's inputs that `value` is computed from in the body (whose block `inputs`
    are the arguments of); what it reads from outside the body is not followed."""
    block = inputs[0].owner if inputs else None
    body = {r for inner in block.operations for r in inner.results} if block is not None else set()
    found, todo = [], [value]
    while todo:
        v = todo.pop()
        if v in inputs:
            found.append(v) if v not in found else None
        elif v in body:
            todo.extend(_owner(v).operands)
    return found


def _constant_text(value: ir.Value, op: ir.Operation, args: list, maps: list) -> str | None:
    """A scalar constant's attribute as MLIR writes it ("0 : i64", "1.000000e+00 : f16")."""
    from iree.compiler import ir

    attr = _constant_attr(value, op, args, maps)
    return str(attr) if isinstance(attr, ir.FloatAttr | ir.IntegerAttr) else None


def _constant_attr(value: ir.Value, op: ir.Operation, args: list, maps: list) -> ir.Attribute | None:
    """A scalar constant's attribute: made in the body, hoisted out of it, or a 0-d constant
    tensor input of the generic (as IREE leaves an ONNX Div's scalar before elementwise fusion)."""
    from iree.compiler import ir

    if value in args and not maps[args.index(value)]:
        value = op.operands[args.index(value)]
    owner = _owner(value)
    if owner is None or owner.name != "arith.constant":
        return None
    attr = owner.attributes["value"]
    if isinstance(attr, ir.DenseElementsAttr) and ir.DenseElementsAttr(attr).is_splat:
        attr = ir.DenseElementsAttr(attr).get_splat_value()
    return attr


def _mask_selects(op: ir.Operation, args: list, maps: list) -> dict:
    """The body's select(keep, 0, masked) of a boolean input, or of inputs anded (the dynamo
    exporter's Where(mask, 0, lowest) added to the scores; GPT-2's causal constant and the
    padding flags of its attention_mask anded), each with its inputs' indices, the masked
    value and, where IREE fused the flags' own ops in (an int64 attention_mask's compare), the
    program computing them from their [b, t] input: added to the scores, it masks exactly where
    `keep` is false, as a boolean mask does."""
    found = {}
    inputs = args[:len(op.operands) - 1]
    for inner in op.regions[0].blocks[0].operations:
        if inner.name != "arith.select":
            continue
        zero, masked = (_constant(v, op, args, maps) for v in inner.operands[1:])
        if zero is None or zero[0] != 0 or masked is None or not is_masked_value(masked[0], str(inner.results[0].type)):
            continue
        indices, flags, forms = [], [], []
        for value in _and_of(inner.operands[0], inputs)[0]:
            captured = _captured_flags(value, op, args, maps)
            if captured is not None:
                indices.append(captured)
                continue
            source, program = (value, None) if value in inputs else _flags_source(value, op, args, maps)
            if source is None and _reads_constants_only(value, op, args, maps):
                forms.append(read_body_mask(op, value))  # transformers' arange compares: causal, or all true
                continue
            if source is None:
                break
            indices.append(args.index(source))
            if program is not None:
                flags.append(program)
        else:
            if len(flags) <= 1:
                found[inner.results[0]] = (tuple(indices), masked[0], flags[0] if flags else None, tuple(forms))
    return found


def _captured_flags(value: ir.Value, op: ir.Operation, args: list, maps: list) -> ir.Value | None:
    """The flags [t] a boolean of the body is read from, where it is tensor.extract(flags,
    positions[k]) of a boolean tensor defined outside the generic at positions 0 .. t-1 read
    per key (IREE's form of a batch-1 model's gather of its attention_mask flags: the gather
    fused into the scores' generic, its indices a hoisted arange); None otherwise, and where
    the body has another tensor.extract (the spec finds this one as the body's only one)."""
    from iree.compiler import ir

    extract = _owner(value)
    if extract is None or extract.name != "tensor.extract" or len(extract.operands) != 2:
        return None
    if sum(inner.name == "tensor.extract" for inner in op.regions[0].blocks[0].operations) != 1:
        return None
    flags, index = extract.operands
    cast = _owner(index)
    shape = ir.ShapedType(flags.type)
    if (cast is None or cast.name != "arith.index_cast" or cast.operands[0] not in args[:len(op.operands) - 1]
            or str(shape.element_type) != "i1" or shape.rank != 1 or _inside(flags, op)):
        return None
    position = args.index(cast.operands[0])
    loops = len(maps[-1])
    keys = tensor_facts(op.operands[position].type).shape
    if maps[position] != (loops - 1,) or keys != tuple(shape.shape) or not evaluates_to_arange(op.operands[position]):
        return None
    return flags


def _inside(value: ir.Value, op: ir.Operation) -> bool:
    """Whether `value` is defined in `op`'s body (one of its block's arguments, or an op's result)."""
    from iree.compiler import ir

    owner = value.owner
    parent = owner.owner if isinstance(owner, ir.Block) else owner.operation.parent
    return parent is not None and parent.operation == op.operation


def _reads_constants_only(value: ir.Value, op: ir.Operation, args: list, maps: list) -> bool:
    """Whether a boolean the body computes reads no input per batch and key, and only inputs
    that are constants (an arange's values, hoisted by IREE): a mask the kit can evaluate."""
    inputs = args[:len(op.operands) - 1]
    read = _block_args_of(value, inputs)
    return str(value.type) == "i1" and bool(read) and all(_is_constant_input(op, args.index(a)) for a in read)


def _is_constant_input(op: ir.Operation, index: int) -> bool:
    owner = _owner(op.operands[index])
    return owner is not None and owner.name == "arith.constant"


def _flags_source(value: ir.Value, op: ir.Operation, args: list, maps: list) -> tuple[ir.Value | None, BiasProgram | None]:
    """The one [b, t] input (read per batch and key) a boolean the body computes is made from,
    with constants, and the program computing it; (None, None) where it is made otherwise or
    cannot be re-computed (_bias.py)."""
    inputs = args[:len(op.operands) - 1]
    read = [a for a in _block_args_of(value, inputs) if _constant_text(a, op, args, maps) is None]
    if (str(value.type) != "i1" or len(read) != 1 or not per_key(maps[args.index(read[0])], len(maps[-1]))
            or _is_constant_input(op, args.index(read[0]))):  # a constant's boolean: read_body_mask evaluates it
        return None, None
    try:
        return read[0], slice_program(value, read[0], lambda v: _constant_text(v, op, args, maps))
    except Unsliceable:
        return None, None


def _and_of(value: ir.Value, inputs: list) -> tuple[list, list]:
    """The values whose `andi` makes `value` (itself, where it is not one), and the andi ops."""
    owner = _owner(value)
    if value not in inputs and owner is not None and owner.name == "arith.andi":
        return list(owner.operands), [owner]
    return [value], []


def _constant(value: ir.Value, op: ir.Operation, args: list, maps: list) -> tuple[float, str] | None:
    """A scalar float constant (_constant_attr): its value and its text."""
    from iree.compiler import ir

    attr = _constant_attr(value, op, args, maps)
    return (ir.FloatAttr(attr).value, str(attr)) if isinstance(attr, ir.FloatAttr) else None


def _masks_out(value: ir.Value, op: ir.Operation, args: list, maps: list, dtype: str) -> bool:
    constant = _constant(value, op, args, maps)
    return constant is not None and is_masked_value(constant[0], dtype)


def _scale_and_mask(r: _Reader, program: list[_Step]):
    """The one scale (a Div or Mul by a constant) and the optional mask Add after it, with the
    mask's key-padding flags where it has them."""
    scales = [s for s in program if s.name in ("arith.divf", "arith.mulf")]
    adds = [s for s in program if s.name in ("arith.addf", "select", _ADD_SELECT, _ADD_COMPUTED)]
    shifts = [s for s in program if s.name == "add constant" and s.constant != 0]
    if shifts:
        r.fail(f"the scores get {shifts[0].constant_text} added before the softmax")
    if len(scales) > 1:
        r.fail(f"the scores are scaled {len(scales)} times before the softmax; the kernel scales them once")
        return None, "not one constant", None, None
    mask, padding = _step_mask(adds[0]) if adds else (None, None)
    if len(adds) > 1:
        r.fail("the scores get more than one mask before the softmax")
    if not scales:  # SDPA as dynamo exports it scales Q and K by d^-1/4 each, before their matmul
        return 1.0, "1 (the scores are not scaled)", mask, padding
    scale = scales[0]
    if adds and program.index(adds[0]) < program.index(scale):
        r.fail("the mask is applied before the scores are scaled; the kernel scales, then masks")
    value = 1.0 / scale.constant if scale.name == "arith.divf" else scale.constant
    text = f"{'1 / ' if scale.name == 'arith.divf' else ''}{scale.constant_text}"
    if scale.name == "arith.divf" and scale.constant == 0:
        r.fail("the scores are divided by zero")
        return None, text, None, None
    return value, text, mask, padding


def _step_mask(step: _Step) -> tuple[MaskForm, _Mask | None]:
    """The form of the mask a step applies, and its key-padding tensor where it has one (a
    [b, t] read per (batch, key), _masks.per_key: flags anded, or the additive mask itself)."""
    flags = [m for m in step.masks if per_key(m.dims, step.loops)]
    rest = [m for m in step.masks if m not in flags]
    if len(flags) > 1 or len(rest) > 1:
        return MaskForm(OTHER, f"a mask anded from {len(step.masks)} tensors"), None
    form = MaskForm(NONE, "")
    if rest:
        dims = rest[0].dims
        q, k = step.loops - 2, step.loops - 1
        if dims is None or q not in dims or k not in dims:
            return MaskForm(OTHER, "a mask broadcast over the queries or the keys"), None
        read = read_additive if step.name == "arith.addf" else read_mask
        form = read(rest[0].value, dims.index(q), dims.index(k))
    for evaluated in step.forms:  # anded booleans the body computes from constants: all true adds nothing
        if evaluated.form == OTHER or form.form != NONE and evaluated.form != NONE:
            return MaskForm(OTHER, evaluated.text if evaluated.form == OTHER else f"{form.text}, anded with {evaluated.text}"), None
        form = evaluated if evaluated.form != NONE else form
    if not flags:
        return form, None
    if step.name == "select":
        return MaskForm(OTHER, "key-padding flags applied as select(keep, scores, masked); the kernels add the masked "
                               "value to the scores, as select(keep, 0, masked) + scores does (a fully padded row differs)"), None
    form = with_key_padding(form, flags[0].value, step.bias.what if step.bias is not None else None)
    return form, (flags[0] if form.form != OTHER else None)


def repeated_heads(*values: ir.Value) -> str | None:
    """How K or V is broadcast from fewer heads: GQA/MQA reach the op as a broadcast generic
    (kv heads -> kv heads x group), collapsed into the query heads."""
    from iree.compiler import ir

    for role, value in zip("KV", values):
        if value is None:
            continue
        owner = _owner(value)
        while owner is not None and owner.name in _THROUGH:
            value = owner.operands[0]
            owner = _owner(value)
        if owner is None or owner.name != "linalg.generic" or len(owner.operands) != 2:
            continue
        maps = [map_dims(a) for a in ir.ArrayAttr(owner.attributes["indexing_maps"])]
        if None not in maps and len(maps[0]) < len(maps[1]):
            source, result = tensor_facts(owner.operands[0].type), tensor_facts(owner.results[0].type)
            return f"{role} is {source.text} broadcast to {result.text}"
    return None
