"""LayerNorm and RMSNorm over the last dim, read from the linalg.generics IREE makes of them
(the kinds layer_norm.py and rms_norm.py; this module is what they share).

IREE 3.13 brings a norm to global optimization, and IREE's elementwise fusion (generic.py's
`prepare`, which these kinds run too) then leaves, for x [..., cols]:
- LayerNorm (ONNX LayerNormalization, or ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div spelled
  out): a sum of x from a zero fill, a generic `x - sum / cols`, a sum of its squares (mulf or
  math.fpowi 2), and the generic that ends the norm, `c * rsqrt(var / cols + eps) * w + b`
  (`c / sqrt(...)` when spelled out); an f16 model reads x through an extf generic and rounds
  (truncf) before w and b, which it applies in f16.
- RMSNorm as Llama writes it: a sum of x^2, a generic `sum / cols + eps`, and
  `x * (1 / sqrt(.))` (ONNX Reciprocal: with a cf.assert, also in a generic of its own that
  IREE strips with --iree-opt-strip-assertions) times w; an f16 model reads x through an extf,
  rounds, and multiplies by w in a generic of its own (the last).
The anchor, the op the registry reads and the spec replaces, is the generic that ends the
norm. `_Reader` reads its value back through the generics that make it into one expression
(sums over loop dims, body ops, the tensors read, constants), and `parse_norm` matches that
against the forms above, commuted operands included. What only a kernel can say (its type,
weight and bias, a fixed eps) is the kinds' `mismatch`; what makes an op no exact norm over
the last dim (another dim, a divisor other than cols, statistics in f16, a chain op with a user
outside the chain) is its facts' `problem`, the reason in the report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kitdispatch.describe.kernel import Buffer, Kernel, Scalar
from kitdispatch.errors import ManifestError
from kitdispatch.models.ops.base import (
    Call, Constant, Layout, OpFacts, OpKind, Operand, Preparation, Reshape, TensorFacts, expect, function_of,
    location, map_dims, op_name, pairs_mismatch, takes_tensors, tensor_facts,
)
from kitdispatch.models.ops.generic import FUSION_PASS, FUSION_PIPELINE

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

GENERIC = "linalg.generic"
MAX_DEPTH = 8  # generics read back from the anchor: a norm takes 5 at most
SCALARS = ("eps", "round_first")  # the scalar arguments a norm kernel may leave to the op


# ------------------------------------------------------------------ expressions


@dataclass(frozen=True, eq=False)
class Leaf:
    """A tensor the norm reads and does not make, at the anchor's loop dims (one per tensor dim)."""

    value: object  # ir.Value
    dims: tuple[int, ...]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Leaf) and self.dims == other.dims and self.value == other.value


@dataclass(frozen=True)
class Const:
    value: float
    text: str


@dataclass(frozen=True)
class Apply:
    """A body op (arith.*, math.*) on its operands' expressions."""

    op: str
    args: tuple
    type: str


@dataclass(frozen=True)
class Sum:
    """A sum from zero over the anchor's loop dims `dims` (a linalg.generic reduction)."""

    body: object
    dims: tuple[int, ...]
    type: str


@dataclass(frozen=True)
class Made:
    """A tensor a generic makes from sums, read back as its expression; where the norm reads it
    as a tensor (x after a residual add of an earlier norm), it is a Leaf of `value`."""

    value: object  # ir.Value
    dims: tuple[int, ...]
    expr: object

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Made) and self.dims == other.dims and self.value == other.value


@dataclass(frozen=True)
class Opaque:
    why: str


class _Acc:
    """A reduction body's accumulator (its `outs` argument)."""


ACC = _Acc()


def contains(e: object, test: Callable[[object], bool]) -> bool:
    if test(e):
        return True
    if isinstance(e, Apply):
        return any(contains(a, test) for a in e.args)
    if isinstance(e, Made):
        return contains(e.expr, test)
    return isinstance(e, Sum) and contains(e.body, test)


def _has_sum(e: object) -> bool:
    return contains(e, lambda x: isinstance(x, Sum))


# ------------------------------------------------------------------ reading the IR


class _Reader:
    """Reads a generic's result back through the generics that make it: a producer generic is
    read into the expression where its value depends on a sum (a Made), or where it only casts
    one tensor (extf: the norm reads x through it); any other value is a Leaf."""

    def __init__(self, anchor: ir.Operation):
        self.anchor = anchor
        self.made: dict = {}  # (value, dims) -> its expression, each read once

    def read(self) -> object:
        rank = len(tensor_facts(self.anchor.results[0].type).shape)
        return self._generic(self.anchor, tuple(range(rank)), 0)

    def _value(self, value: ir.Value, dims: tuple[int, ...], depth: int) -> object:
        owner = value.owner
        if op_name(owner) == "arith.constant" and _scalar(value):
            return _constant(owner)
        if op_name(owner) == GENERIC and len(owner.results) == 1 and depth < MAX_DEPTH:
            if (value, dims) not in self.made:
                self.made[(value, dims)] = self._generic(owner.operation, dims, depth + 1)
            e = self.made[(value, dims)]
            if isinstance(e, Apply) and e.op == "arith.extf" and isinstance(e.args[0], Made):
                # x widened from a tensor made of sums (the residual add after an earlier norm,
                # BERT's second LayerNorm): the norm reads that tensor, as it is, through the cast
                e = Apply(e.op, (Leaf(e.args[0].value, e.args[0].dims),), e.type)
            if _has_sum(e):
                return Made(value, dims, e)
            if isinstance(e, Apply) and e.op == "arith.extf" and isinstance(e.args[0], Leaf):
                return e
        return Leaf(value, dims)

    def _generic(self, op: ir.Operation, dims: tuple[int, ...], depth: int) -> object:
        from iree.compiler import ir

        if not takes_tensors(op) or len(op.results) != 1:
            return Opaque("a generic that is not tensors in, one tensor out")
        maps = [map_dims(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
        iterators = [str(a).rsplit("<", 1)[-1].rstrip(">") for a in ir.ArrayAttr(op.attributes["iterator_types"])]
        loops = _loop_dims(maps, iterators, dims)
        if isinstance(loops, Opaque):
            return loops
        block = op.regions[0].blocks[0]
        inputs = len(op.operands) - 1
        env: dict = {block.arguments[inputs]: ACC}
        pending = {block.arguments[k]: (op.operands[k], tuple(loops[d] for d in maps[k])) for k in range(inputs)}

        def resolve(v: ir.Value) -> object:
            if v not in env and v in pending:
                operand, at = pending.pop(v)
                env[v] = self._value(operand, at, depth)
            if v in env:
                return env[v]
            if op_name(v.owner) == "arith.constant" and _scalar(v):
                return _constant(v.owner)
            return Opaque(f"a value from outside the op ({op_name(v.owner)})")

        result = Opaque("a body without a yield")
        for inner in block.operations:
            inner = inner.operation
            if inner.name == "linalg.yield":
                result = resolve(inner.operands[0])
            elif inner.name == "arith.constant":
                env[inner.results[0]] = _constant(inner)
            elif inner.name == "arith.truncf" and "roundingmode" in inner.attributes:
                return Opaque("a truncf with its own rounding mode")  # the kernel rounds to nearest even
            elif inner.name != "cf.assert" and len(inner.results) == 1 and not inner.regions:
                env[inner.results[0]] = Apply(inner.name, tuple(resolve(o) for o in inner.operands), str(inner.results[0].type))
            elif inner.name != "cf.assert":
                return Opaque(f"a body op {inner.name}")
        reduced = tuple(loops[d] for d, it in enumerate(iterators) if it == "reduction")
        result = _as_sum(op, result, reduced) if reduced else result
        if contains(result, lambda x: x is ACC):
            return Opaque("a generic that reads its output")
        return result


def _loop_dims(maps: list, iterators: list[str], dims: tuple[int, ...]) -> list[int] | Opaque:
    """The anchor dim of each loop: a parallel loop's from where the consumer reads the result,
    a reduction loop's from its place in the first input that reads it (IREE's reductions read
    their input whole, in order)."""
    if None in maps or len(maps[-1]) != len(dims):
        return Opaque("an indexing map that is not a projection")
    loops: list = [None] * len(iterators)
    for t, d in enumerate(maps[-1]):
        loops[d] = dims[t]
    for d, it in enumerate(iterators):
        if (it == "reduction") != (loops[d] is None):
            return Opaque("a result indexed by a reduction loop")
        if loops[d] is None:
            loops[d] = next((m.index(d) for m in maps[:-1] if d in m), None)
    if None in loops or len(set(loops)) != len(loops):
        return Opaque("reduction loops that do not line up with the result's dims")
    return loops


def _as_sum(op: ir.Operation, body: object, reduced: tuple[int, ...]) -> object:
    """A reduction generic is a Sum where its body adds one term to the accumulator and its
    `outs` is a fill of zero."""
    init = op.operands[len(op.operands) - 1].owner
    start = _constant(init.operands[0].owner) if op_name(init) == "linalg.fill" and op_name(init.operands[0].owner) == "arith.constant" else None
    if not isinstance(start, Const) or start.value != 0.0:
        return Opaque("a reduction that does not start from a fill of zero")
    if isinstance(body, Apply) and body.op == "arith.addf" and ACC in body.args:
        term = body.args[1] if body.args[0] is ACC else body.args[0]
        if term is not ACC:
            return Sum(term, reduced, body.type)
    return Opaque("a reduction that is not a sum")


def _scalar(value: ir.Value) -> bool:
    return "tensor" not in str(value.type)


def _constant(op: ir.Operation) -> object:
    from iree.compiler import ir

    attr = op.attributes["value"]
    for kind in (ir.FloatAttr, ir.IntegerAttr):
        try:
            return Const(float(kind(attr).value), str(attr))
        except ValueError:  # the cast refuses another kind of attribute
            continue
    return Opaque(f"a constant {attr}")


# ------------------------------------------------------------------ the norm's forms


@dataclass(frozen=True)
class NormShape:
    """What `parse_norm` read from the anchor's expression."""

    kind: str  # "layer_norm" or "rms_norm"
    x: Leaf
    x_cast: bool  # x is read through an extf
    sums: tuple[Sum, ...]
    divisors: tuple[Const, ...]
    eps: Const
    weight: Leaf | None
    bias: Leaf | None
    round_first: bool  # the normalized value is rounded to the result's type before weight and bias


def _in(e: object) -> object:
    """The expression of a tensor a generic made (where the norm looks inside it)."""
    while isinstance(e, Made):
        e = e.expr
    return e


def _apply(e: object, op: str) -> Apply | None:
    e = _in(e)
    return e if isinstance(e, Apply) and e.op == op else None


def _pairs(e: object, op: str):
    """(a, b) and, for commutative ops, (b, a) of a two-operand `op`."""
    a = _apply(e, op)
    if a is None or len(a.args) != 2:
        return []
    return [a.args, a.args[::-1]] if op in ("arith.addf", "arith.mulf") else [a.args]


def _tensor_read(e: object) -> tuple[Leaf, bool] | None:
    """A tensor the norm reads (a model input, or one made before it), through an extf or not,
    as (leaf, through a cast)."""
    if isinstance(e, Made):
        return Leaf(e.value, e.dims), False
    cast = e if isinstance(e, Apply) and e.op == "arith.extf" else None
    if cast is not None:
        e = cast.args[0]
    return (e, cast is not None) if isinstance(e, Leaf) else None


def _broadcast(e: object, rank: int) -> Leaf | None:
    """A weight or bias: a tensor read along fewer dims than the result has."""
    read = _tensor_read(e)
    return read[0] if read is not None and len(read[0].dims) < rank else None


def _peel_affine(e: object, rank: int) -> tuple[object, Leaf | None, Leaf | None]:
    """(normalized, weight, bias) of `normalized * weight + bias` (either may be left out)."""
    bias = weight = None
    for a, b in _pairs(e, "arith.addf"):
        if _broadcast(b, rank) is not None and _has_sum(a):
            e, bias = a, _broadcast(b, rank)
            break
    for a, b in _pairs(e, "arith.mulf"):
        if _broadcast(b, rank) is not None and _has_sum(a):
            e, weight = a, _broadcast(b, rank)
            break
    return e, weight, bias


def _mean(e: object) -> tuple[Sum, Const] | None:
    """sum / n, or sum * (1 / n): (the sum, n)."""
    for a, b in _pairs(e, "arith.divf"):
        if isinstance(_in(a), Sum) and isinstance(b, Const):
            return _in(a), b
    for a, b in _pairs(e, "arith.mulf"):
        if isinstance(_in(a), Sum) and isinstance(b, Const) and b.value != 0.0:
            return _in(a), Const(float(np.float32(1.0) / np.float32(b.value)), f"1 / {b.text}")
    return None


def _square_of(e: object) -> object | None:
    m = _apply(e, "arith.mulf")
    if m is not None and len(m.args) == 2 and m.args[0] == m.args[1]:
        return m.args[0]
    for op in ("math.fpowi", "math.powf"):
        p = _apply(e, op)
        if p is not None and isinstance(p.args[1], Const) and p.args[1].value == 2.0:
            return p.args[0]
    return None


def _inverse_root(e: object) -> object | None:
    """The v of rsqrt(v) or 1 / sqrt(v)."""
    r = _apply(e, "math.rsqrt")
    if r is not None:
        return r.args[0]
    for a, b in _pairs(e, "arith.divf"):
        if isinstance(a, Const) and a.value == 1.0 and _apply(b, "math.sqrt") is not None:
            return _apply(b, "math.sqrt").args[0]
    return None


def _normalized(e: object) -> tuple[object, object] | None:
    """(c, v) of c * rsqrt(v), c * (1 / sqrt(v)) or c / sqrt(v)."""
    for a, b in _pairs(e, "arith.mulf"):
        v = _inverse_root(b)
        if v is not None:
            return a, v
    for a, b in _pairs(e, "arith.divf"):
        if _apply(b, "math.sqrt") is not None:
            return a, _apply(b, "math.sqrt").args[0]
    return None


def parse_norm(e: object, rank: int) -> NormShape | None:
    """The norm the anchor's expression computes, or None where it is no LayerNorm or RMSNorm
    (whatever its dims, divisors and types: those are checked after)."""
    e, weight, bias = _peel_affine(e, rank)
    trunc = _apply(e, "arith.truncf")
    round_first = trunc is not None and (weight is not None or bias is not None)
    if trunc is not None:
        e = trunc.args[0]
        if weight is None and bias is None:
            e, weight, bias = _peel_affine(e, rank)
    found = _normalized(e)
    if found is None:
        return None
    centered, variance = found
    eps = moment = None
    for a, b in _pairs(variance, "arith.addf"):
        if isinstance(b, Const) and _mean(a) is not None:
            eps, moment = b, _mean(a)
            break
    if moment is None or _square_of(moment[0].body) is None or _square_of(moment[0].body) != centered:
        return None
    sums, divisors = [moment[0]], [moment[1]]
    kind, x = "rms_norm", centered
    for a, b in _pairs(centered, "arith.subf"):
        mean = _mean(b)
        if mean is not None and mean[0].body == a:
            kind, x = "layer_norm", a
            sums, divisors = [mean[0], *sums], [mean[1], *divisors]
    read = _tensor_read(x)
    if read is None:
        return None
    return NormShape(kind, read[0], read[1], tuple(sums), tuple(divisors), eps, weight, bias, round_first)


# ------------------------------------------------------------------ facts


@dataclass(frozen=True)
class NormFacts:
    """A norm as the kernel takes it: where its tensors are (Operand paths from the anchor), its
    eps and where it rounds; `problem`: why it is no exact norm over the last dim (None: it is)."""

    kind: str
    eps: float
    eps_text: str
    weight: bool
    bias: bool
    round_first: bool
    paths: tuple[tuple[int, ...], ...]  # x, then weight and bias where the op has them
    rank: int
    ops: int  # the generics of the chain, the anchor included
    problem: str | None

    @property
    def summary(self) -> str:
        parts = [f"eps {str(np.float32(self.eps))}"] + (["weight"] if self.weight else []) + (["bias"] if self.bias else [])
        return f"{', '.join(parts)}; {self.ops} generics"

    def to_json(self) -> dict:
        return {"norm": {"kind": self.kind, "eps": self.eps_text, "weight": self.weight, "bias": self.bias,
                         "round_first": self.round_first, "generics": self.ops}}


def read_norm(op: ir.Operation) -> tuple[NormShape, list] | None:
    """The norm `op` ends, with the generics it is made of (the anchor last), or None."""
    if op.name != GENERIC or not takes_tensors(op) or len(op.results) != 1:
        return None
    e = _Reader(op).read()
    if not _has_sum(e):
        return None
    shape = parse_norm(e, len(tensor_facts(op.results[0].type).shape))
    if shape is None:
        return None
    stops = [t for t in (shape.x, shape.weight, shape.bias) if t is not None]
    chain: list = []
    _collect(e, stops, chain)
    return shape, chain + [op]


def _collect(e: object, stops: list, chain: list) -> None:
    """The generics the norm looks inside (not those that make x, the weight or the bias)."""
    if isinstance(e, Made):
        if any(s == Leaf(e.value, e.dims) for s in stops):
            return
        op = e.value.owner.operation
        if all(op != c for c in chain):
            chain.append(op)
        _collect(e.expr, stops, chain)
    elif isinstance(e, Apply):
        for a in e.args:
            _collect(a, stops, chain)
    elif isinstance(e, Sum):
        _collect(e.body, stops, chain)


def ends_norm(op: ir.Operation, kind: str) -> bool:
    """Whether `op` is the generic that ends a norm of `kind`: it reads as one, and its one
    user (if a generic) does not read as a longer one (RMSNorm's multiply by the weight, which
    IREE keeps apart from the normalizing generic that holds an assert)."""
    read = read_norm(op)
    if read is None or read[0].kind != kind:
        return False
    users = [u.owner for u in op.results[0].uses]
    if len(users) == 1 and op_name(users[0]) == GENERIC:
        longer = read_norm(users[0].operation)  # a norm of `op`'s result (its x) does not count
        return longer is None or longer[0].kind != kind or all(op != c for c in longer[1])
    return True


def norm_facts(op: ir.Operation) -> OpFacts:
    shape, chain = read_norm(op)
    rank = len(tensor_facts(op.results[0].type).shape)
    tensors = [shape.x] + [t for t in (shape.weight, shape.bias) if t is not None]
    paths = tuple(_path(op, t.value) for t in tensors)
    x = tensor_facts(shape.x.value.type)
    result = tensor_facts(op.results[0].type)
    return OpFacts(
        kind=shape.kind,
        function=function_of(op),
        location=location(op),
        inputs=tuple(tensor_facts(t.value.type) for t in tensors),
        init=result,
        result=result,
        detail=NormFacts(
            kind=shape.kind, eps=shape.eps.value, eps_text=shape.eps.text, weight=shape.weight is not None,
            bias=shape.bias is not None, round_first=shape.round_first, paths=paths, rank=rank, ops=len(chain),
            problem=_problem(shape, chain, op, x, result),
        ),
    )


def _path(anchor: ir.Operation, value: ir.Value) -> tuple[int, ...]:
    """The Operand path from the anchor to `value` (the shortest, through producer generics)."""
    frontier = [(anchor, ())]
    seen = []
    while frontier:
        op, path = frontier.pop(0)
        for i, operand in enumerate(op.operands):
            if operand == value:
                return path + (i,)
            owner = operand.owner
            if op_name(owner) == GENERIC and all(owner.operation != s for s in seen):
                seen.append(owner.operation)
                frontier.append((owner.operation, path + (i,)))
    raise AssertionError("a tensor the norm reads is no operand of its chain")  # read_norm found it there


def _problem(shape: NormShape, chain: list, anchor: ir.Operation, x: TensorFacts, result: TensorFacts) -> str | None:
    """Why the chain is no exact norm over the last dim of x, or None."""
    rank = len(result.shape)
    last = rank - 1
    cols = result.shape[-1]
    if shape.x.dims != tuple(range(rank)) or x.shape != result.shape:
        return f"x ({x.text}) is not read element for element as the result ({result.text})"
    for s in shape.sums:
        if s.dims != (last,):
            dims = ", ".join(str(d) for d in s.dims)
            return f"it normalizes over dim(s) {dims} of {x.text}; the kernel over the last dim ({last})"
        if s.type != "f32":
            return f"it sums in {s.type}; the kernel computes its statistics in f32"
    if cols is None:
        return f"the last dim of {x.text} is dynamic, so its mean's divisor cannot be checked"
    for d in shape.divisors:
        if d.value != float(cols):
            return f"a mean divides by {d.text}, and the last dim of {x.text} has {cols}"
    for name, t in (("weight", shape.weight), ("bias", shape.bias)):
        if t is not None and t.dims != (last,):
            return f"its {name} ({tensor_facts(t.value.type).text}) is read along dims {t.dims}; the kernel's along the last dim only"
    outside = _outside_users(chain, anchor)
    if outside:
        return outside
    return None


def _outside_users(chain: list, anchor: ir.Operation) -> str | None:
    """The chain goes with the anchor: none of its other generics may have a user outside it
    (a generic of only asserts counts as in it: IREE strips those)."""
    for op in chain:
        if op == anchor:
            continue
        for use in op.results[0].uses:
            user = use.owner.operation
            if any(user == c for c in chain) or _only_asserts(user):
                continue
            return f"a generic of the norm ({location(op)}) has a user outside it: {user.name} at {location(user)}"
    return None


def _only_asserts(op: ir.Operation) -> bool:
    if op.name != GENERIC or len(op.results):
        return False
    names = {inner.operation.name for inner in op.regions[0].blocks[0].operations}
    return "cf.assert" in names and names <= {"cf.assert", "math.sqrt", "arith.cmpf", "arith.constant", "linalg.yield"}


# ------------------------------------------------------------------ the kinds


class Norm(OpKind):
    """A layer_norm or rms_norm kernel: x [rows, cols] in, weight and bias [cols] (in, x's type)
    where it applies them, one new result of x's type and shape; scalars without a value:
    `eps` (f32; with a value the kernel replaces only ops of that eps) and `round_first`
    (i32: 1 where the op rounds its normalized value to the result's type before the weight and
    bias)."""

    op = GENERIC
    prepare = Preparation(FUSION_PIPELINE, FUSION_PASS, "IREE's elementwise fusion")
    suggested = False
    timed_in_model = True  # IREE splits a norm in a model over dispatches shared with its neighbours

    def __init__(self, name: str, affine: tuple[str, ...]):
        self.name = name
        self.affine = affine  # the weight and bias it may apply, in order

    def candidate(self, op: ir.Operation) -> bool:
        return ends_norm(op, self.name)

    def facts(self, op: ir.Operation) -> OpFacts:
        return norm_facts(op)

    def covers(self, op: ir.Operation) -> list:
        """The norm's other generics: its reductions and the generics between them and `op`."""
        return read_norm(op)[1][:-1]

    def contract(self, kernel: Kernel, where: str) -> Layout:
        buffers = [b for b in kernel.buffers]
        results = [b for b in buffers if b.is_result]
        args = [b for b in buffers if b.is_argument]
        expect(len(results) == 1 and results[0].access == "out", f"it must write one new result; {self.name} has one", where)
        result = results[0]
        expect(len(result.type.shape) == 2, f"its result must be [rows, cols], not {result.type}", where)
        expect(1 <= len(args) <= 1 + len(self.affine), f"its buffers must be x, then {' and '.join(self.affine)} where it applies them", where)
        x, affine = args[0], args[1:]
        expect(x.type.shape == result.type.shape and x.type.dtype == result.type.dtype, "x and its result must be one type [rows, cols]", where)
        cols = result.type.shape[1]
        for b in affine:
            expect(b.type.shape == (cols,) and b.type.dtype == x.type.dtype, f"its {b.name} must be [{cols}] of x's type", where)
        for s in kernel.scalars:
            if kernel.is_function_argument(s) and s.name not in SCALARS:
                raise ManifestError(
                    f"its function needs scalar argument {s.name}, which {self.name} does not give", where=where,
                    fix=f"give it a value, name it after a dimension, or call it {' or '.join(SCALARS)}",
                )
        eps = _scalar_param(kernel, "eps")
        expect(eps is not None and eps.dtype == "f32", "it must take eps as an f32 scalar (a value fixes it)", where)
        round_first = _scalar_param(kernel, "round_first")
        expect(round_first is None or round_first.dtype == "i32", "its round_first must be an i32", where)
        # The function's arguments in its order, by role: input buffer i, or a scalar's name.
        roles = tuple(args.index(p) if isinstance(p, Buffer) else p.name for p in kernel.function_arguments)
        return Layout(tuple(args), result, accumulates=False, pattern=roles)

    def semantic_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout) -> str | None:
        n = op.detail
        if n.problem:
            return n.problem
        has = [name for name, there in zip(("weight", "bias"), (n.weight, n.bias)) if there]
        takes = self.applies(layout.inputs[1:])
        if has != takes:
            return f"the op applies {_listing(has)}, the kernel {_listing(takes)}"
        eps = _scalar_param(kernel, "eps")
        if not kernel.is_function_argument(eps) and np.float32(eps.value) != np.float32(n.eps):
            return f"the op's eps is {n.eps_text}, the kernel's is fixed at {eps.value}"
        round_first = _scalar_param(kernel, "round_first")
        fixed = round_first is not None and not kernel.is_function_argument(round_first)
        if n.round_first and op.result.dtype != "f32" and (round_first is None or fixed and not round_first.value):
            return f"the op rounds to {op.result.dtype} before its weight and bias, and the kernel does not"
        return None

    def applies(self, affine: tuple[Buffer, ...]) -> list[str]:
        """What a kernel's buffers after x apply: by position (x, then the weight, then the
        bias), except that one buffer named `bias` is a bias (a LayerNorm whose weight of ones
        IREE folded away has a bias alone; taken by a weight-only kernel, it was silently wrong)."""
        if len(affine) == 1 and affine[0].name == "bias" and "bias" in self.affine:
            return ["bias"]
        return list(self.affine[: len(affine)])

    def sizes_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout, sizes: dict[str, int | None]) -> str | None:
        """x and the result as [rows, cols] (rows: the leading dims together), weight and bias [cols]."""
        pairs = [("x", _rows_cols(op.inputs[0]), layout.inputs[0])]
        pairs += [(b.name, t, b) for t, b in zip(op.inputs[1:], layout.inputs[1:])]
        pairs.append(("result", _rows_cols(op.result), layout.result))
        return pairs_mismatch(pairs, kernel, sizes)

    def call(self, op: OpFacts, layout: Layout) -> Call:
        """In the function's order: x (its leading dims as the kernel's rows), weight and bias,
        and eps and round_first as constants of the op where the kernel leaves them to it."""
        n = op.detail
        groups = _row_groups(n.rank)
        reshape = Reshape(groups) if groups != ((0,), (1,)) else None
        given = {
            0: Operand(n.paths[0], reshape),
            "eps": Constant("f32", _f32_text(n.eps)),
            "round_first": Constant("i32", "1" if n.round_first else "0"),
        }
        given.update({i: Operand(p) for i, p in enumerate(n.paths) if i})
        return Call(arguments=tuple(given[role] for role in layout.pattern), result=reshape)


def _scalar_param(kernel: Kernel, name: str) -> Scalar | None:
    return next((s for s in kernel.scalars if s.name == name), None)


def _listing(names: list[str]) -> str:
    return " and ".join(names) if names else "neither weight nor bias"


def _rows_cols(t: TensorFacts) -> TensorFacts:
    """A tensor of rank >= 1 as [rows, cols]: its leading dims collapsed (None where one is dynamic)."""
    rows: int | None = 1
    for d in t.shape[:-1]:
        rows = None if rows is None or d is None else rows * d
    return TensorFacts(t.dtype, (rows, t.shape[-1]))


def _row_groups(rank: int) -> tuple[tuple[int, ...], ...]:
    """The Reshape between the op's x (rank r) and the kernel's [rows, cols]."""
    if rank == 1:
        return ((0, 1),)
    return (tuple(range(rank - 1)), (rank - 1,))


def _f32_text(value: float) -> str:
    return repr(float(np.float32(value)))


__all__ = ["Norm", "NormFacts", "NormShape", "parse_norm", "read_norm"]
