"""The epilogue of a matmul: the elementwise ops after it that IREE would fuse into its
dispatch, recognised as one of the GEMM family's epilogues (describe/op_names.py's EPILOGUES;
kernels/matmul/README.md gives their formulas).

The chain is the matmul's result followed through single users while the user is an
elementwise `linalg.generic` on it (all loops parallel, the chain value and the result read
and written whole), as IREE's elementwise fusion leaves them (the kind's `prepare`). Each
prefix of it (0 generics: the bare matmul, 1, 2, ...) is one way of replacing the matmul: the
prefix's ops, read as one expression of the accumulator `acc`, a row-broadcast `bias` [n] and a
`residual` [m, n], are compared with each epilogue's formula.

"Exactly", as this module decides it (the house rule: a kernel replaces only what it computes):
- the same formula over the reals: sums and products in any order and grouping (the kernel
  evaluates them in its own order in f32; reassociation changes f32 roundings only), `x / c`
  as `x * (1/c)` for a constant c, `x / y` as `x * (1/y)`, `x^3` as `x * x * x`;
- every constant the model carries is the kernel's constant rounded to the model's type
  (`x / 1.41421354` and `x * 0.707106769` both match GELU's `x * 0.70710678f`; an f16 model's
  0.04471 matches 0.044715); GELU-tanh's outer constant and `scale`'s factor are passed to the
  kernel as the model carries them (`gelu_c`, `alpha`, as f32);
- NaN propagates as in the kernel: ReLU as a select that keeps NaN (`x ugt 0 ? x : 0`,
  `x olt 0 ? 0 : x`, ... see _RELU_SELECTS) or `maximumf(x, 0)`, as the kernel's `x < 0 ? 0 : x`;
  the selects that give 0 for NaN and `maxnumf` are refused (the sign of a zero result may
  differ: -0 stays -0 in the kernel);
- every op computes in f32 or in the result type: the model's own roundings to the result type
  before the last op (an f16 graph rounds the matmul's f32 result to f16, then adds the bias in
  f16) are ACCEPTED: the kernel computes the same formula in f32 and rounds once, so its result
  is the model's up to those roundings (within the result type's tolerance, never worse). The
  report counts them (`rounds`). Any other type (an f16 op in a bf16 graph, an f64 op) is refused.
- bias [n] broadcast along rows (map (.., d_last) -> (d_last)) and residual read whole, both of
  the result's type; a bias broadcast along another dimension, an extra input or op, a body that
  reads its output: refused, with the reason.
- the transpose to attention heads: after an expand_shape of the [b*s, h*d] product to
  [b, s, h, d] (or [s, h, d] at batch 1), a generic of two inputs that reads it permuted and
  writes [b, h, s, d] (`bias_heads`, Q and V) or [b, h, d, s] (`bias_heads_t`, K^T) while adding
  a bias [h, d] (BERT's and ViT's projections, IREE 3.13 after global optimization). It ends the
  chain; its body must be the bias add (the kernels' `bias`); another permutation is refused.
  IREE runs it in a dispatch of its own (the expand stays before it), so a kernel that stops
  before it costs no fusion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses
import math
import struct
from dataclasses import dataclass

from kitdispatch.describe.kernel import Buffer, Kernel, Scalar
from kitdispatch.models.ops.base import Call, Constant, Layout, OpFacts, Operand, Reshape, TensorFacts, expect, fused_consumer, map_dims, op_name, readers, tensor_facts

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

GENERIC = "linalg.generic"
COLLAPSE = "tensor.collapse_shape"
EXPAND = "tensor.expand_shape"
SQRT1_2 = 0.70710678118654752  # the kernels' constants (gemm.cuh's epilogues)
GELU_CUBE = 0.044715


@dataclass(frozen=True)
class Epilogue:
    """One way of replacing a matmul: the matmul and the first `covers` ops of its chain (its
    single users: generics, and a collapse of unit dims), the last a generic.

    `name` is the epilogue they compute (None: not one the family computes; `why` says why).
    Operand paths are from the last covered generic (the op the spec marks and replaces):
    `chain` leads back to the matmul, `bias` / `residual` to those tensors."""

    covers: int
    name: str | None
    result: TensorFacts  # what the kernel writes in place of the last covered op
    chain: tuple[int, ...] = ()  # operand indices from the last covered generic back to the matmul
    bias: tuple[tuple[int, ...], TensorFacts] | None = None
    residual: tuple[tuple[int, ...], TensorFacts] | None = None
    constant: float | None = None  # gelu_c or alpha, as the model carries it
    rounds: int = 0  # the model's roundings to the result type before its last op
    ops: tuple[str, ...] = ()  # the body ops covered, in words
    why: str | None = None
    # The chain's expand_shape of the 2-D [m, n] product (a 3-D `x @ W` is a collapse, a 2-D
    # matmul, an expand): its reassociation, which collapses `result` (and a residual) back.
    groups: tuple[tuple[int, ...], ...] | None = None
    transposes: bool = False  # the last covered op transposes to heads (its own dispatch in IREE)

    @property
    def heads_sizes(self) -> tuple[int, int]:
        """(batch, seq) of a heads epilogue's result [b, h, s, d] / [b, h, d, s] ([h, ..] at batch 1)."""
        shape = self.result.shape
        return (shape[0] if len(shape) == 4 else 1), shape[-2 if self.name == "bias_heads" else -1]

    @property
    def inputs(self) -> tuple[TensorFacts, ...]:
        """The tensors the epilogue reads beyond the matmul's A and B, in the kernel's order."""
        return tuple(x[1] for x in (self.bias, self.residual) if x is not None)

    @property
    def constant_text(self) -> str:
        """The scalar as MLIR's f32 text (9 significant digits: the f32 exactly)."""
        return f"{_round(self.constant, 'f32'):.9g}"

    def to_json(self) -> dict:
        data = {"epilogue": self.name, "epilogue_ops_after": self.covers, "epilogue_ops": list(self.ops)}
        if self.constant is not None:
            data["epilogue_constant"] = self.constant_text
        if self.rounds:
            data["epilogue_model_roundings"] = self.rounds
        return data


@dataclass(frozen=True)
class EpilogueChain:
    """Every prefix of a matmul's chain of elementwise users that ends in a generic, as an
    Epilogue: the bare matmul first."""

    forms: tuple[Epilogue, ...]
    stop: str  # why the chain ends where it does
    fused_next: str | None = None  # the op the chain stops at where IREE fuses it too (a transposing generic)

    @property
    def longest(self) -> Epilogue:
        """The longest prefix that is an epilogue (the bare matmul, `none`, where it accumulates in f32)."""
        return next((f for f in reversed(self.forms) if f.name is not None), self.forms[0])

    @property
    def summary(self) -> str | None:
        best = self.longest
        return None if best.covers == 0 else f"epilogue {best.name} over {best.covers} op(s)"

    def refused(self) -> str | None:
        """Why the longest chain is not an epilogue, where it is not."""
        last = self.forms[-1]
        return last.why if last.name is None else None

    def to_json(self) -> dict:
        data = self.longest.to_json()
        why = self.refused()
        if why:
            data["epilogue_refused"] = why
        data["epilogue_chain_ends"] = self.stop
        return data

    def choose(self, epilogue: str, result_dtype: str) -> Epilogue | str:
        """The longest prefix computing `epilogue` into `result_dtype`, or why there is none."""
        fits = [f for f in self.forms if f.name == epilogue and f.result.dtype == result_dtype]
        if fits:
            return fits[-1]
        if self.forms[0].name is None:
            return self.forms[0].why
        found = [f"{f.name} -> {f.result.dtype}" for f in self.forms if f.name is not None]
        refused = self.refused()
        return (
            f"epilogue: the kernel computes {epilogue} -> {result_dtype}; the op and its users compute "
            f"{' or '.join(found)}" + (f" (the whole chain: {refused})" if refused else "")
        )


# ------------------------------------------------------------------- following the chain


def read_chain(matmul: ir.Operation, *, limit: int = 4) -> EpilogueChain:
    """The matmul's chain of elementwise single users, each prefix recognised."""
    result = tensor_facts(matmul.results[0].type)
    if result.dtype != "f32":  # an f16 result is an f16 accumulator: the kernels accumulate in f32
        why = f"the op accumulates in {result.dtype} (its result's type); the kernels accumulate in f32"
        return EpilogueChain((Epilogue(0, None, result, why=why),), f"the op accumulates in {result.dtype}")
    forms = [Epilogue(0, "none", result, ops=())]
    chain: list[tuple[ir.Operation, int]] = []
    value, shape, stop, earlier = matmul.results[0], result.shape, "the chain ends", None
    while len(forms) <= limit:
        expanded = any(op.name == EXPAND for op, _ in chain)
        user, stop = _elementwise_user(value, shape, expanded)
        if user is not None and user[0].name == GENERIC:
            earlier = _earlier_matmul(user[0], user[1], matmul)
            if earlier is not None:
                stop = (f"its user also reads the result of an earlier {earlier.name}, into whose dispatch IREE fuses it "
                        "(Llama's SwiGLU product goes with the gate matmul, IREE 3.13 --compile-to=flow)")
                break
        if user is None:
            break
        chain.append(user)
        value = user[0].results[0]
        shape = tensor_facts(value.type).shape
        if user[0].name == GENERIC:  # a reshape alone is no way of replacing the matmul
            forms.append(_recognise(chain))
            if forms[-1].transposes:
                stop = "the transpose to heads ends the chain"
                break
    # IREE moves an expand_shape past the elementwise ops into the matmul's dispatch and
    # leaves it before the next op: a transposing reader after it runs in a dispatch of its own
    # (BERT's QKV projections and their bias-adding transposes, IREE 3.13 --compile-to=flow).
    expanded = any(op.name == EXPAND for op, _ in chain)
    widens = [u.owner.operation for u in value.uses if u.owner.operation.name == GENERIC and _only_widens(u.owner.operation)]
    return EpilogueChain(tuple(forms), stop, None if expanded or widens or earlier else fused_consumer(_past_unit_reshapes(value)))


def _elementwise_user(value: ir.Value, shape: tuple, expanded: bool) -> tuple[tuple[ir.Operation, int] | None, str]:
    """(the op that is the one user of `value`, the operand it reads it as), or why not: an
    elementwise generic, a `tensor.collapse_shape` that only drops unit dims (IREE's form of
    a batch-1 batch_matmul followed by 2-D elementwise ops), or one static
    `tensor.expand_shape` of the 2-D product (a 3-D `x @ W`: [b*s, n] back to [b, s, n])."""
    from iree.compiler import ir

    uses, owners = list(value.uses), readers(value)
    if not owners:
        return None, "the result has no user"
    if len(owners) != 1:
        return None, f"the result has {len(owners)} users (IREE keeps it in memory)"
    owner = owners[0]
    if owner.name == COLLAPSE and [d for d in shape if d != 1] == list(tensor_facts(owner.results[0].type).shape):
        return (owner, 0), ""
    if owner.name == EXPAND:
        return _expand_user(owner, shape, expanded)
    if owner.name != GENERIC:
        return None, f"its user is {owner.name}"
    inputs = len(owner.operands) - len(owner.results)
    index = min(u.operand_number for u in uses)
    maps = [map_dims(a) for a in ir.ArrayAttr(owner.attributes["indexing_maps"])]
    identity = tuple(range(len(shape)))
    iterators = [str(a) for a in ir.ArrayAttr(owner.attributes["iterator_types"])]
    if len(owner.results) != 1 or index >= inputs:
        return None, "its user is a linalg.generic with several results, or writes into it"
    if expanded and _to_heads(maps, index, inputs, iterators, shape):
        return (owner, index), ""
    if any("parallel" not in t for t in iterators) or maps[index] != identity or maps[-1] != identity:
        return None, "its user is a linalg.generic that is not elementwise on it (a reduction, transpose or broadcast)"
    if tensor_facts(owner.results[0].type).shape != shape:
        return None, "its user changes the shape"
    if _only_widens(owner):
        return None, "its user only widens it (extf), which IREE clones into its readers' dispatches"
    return (owner, index), ""


# The transposes to heads of [*rows, h, d] (rows: [b, s] or [s]) the kernels store, by the rank of
# the expanded value: the chain operand's map (its dims as the output's loops) and the bias [h, d]'s.
def _heads_maps(rank: int) -> dict[tuple[int, ...], tuple[str, tuple[int, int]]]:
    lead = tuple(range(rank - 3))
    b = len(lead)
    return {
        lead + (b + 1, b, b + 2): ("bias_heads", (b, b + 2)),  # [b, s, h, d] -> [b, h, s, d]
        lead + (b + 2, b, b + 1): ("bias_heads_t", (b, b + 1)),  # [b, s, h, d] -> [b, h, d, s]
    }


def _to_heads(maps: list, index: int, inputs: int, iterators: list[str], shape: tuple) -> bool:
    """Whether a generic reads the chain value transposed (any permutation) into an output it
    writes whole, with one other input: a transpose to heads with its bias add, for _recognise
    to judge (another permutation, another body: refused there, with the reason)."""
    rank = len(shape)
    permuted = maps[index] is not None and sorted(maps[index]) == list(range(rank)) and maps[index] != tuple(range(rank))
    return rank in (3, 4) and inputs == 2 and permuted and maps[-1] == tuple(range(rank)) and all("parallel" in t for t in iterators)


def _past_unit_reshapes(value: ir.Value) -> ir.Value:
    """The value after reshapes that only add or drop unit dims, its one user each: IREE folds
    them away, so the reader after them fuses into the producer's dispatch as if they were not
    there (Llama's P.V batch_matmul, expanded [16, 512, 128] -> [16, 1, 512, 128], then
    transposed and rounded: one dispatch, IREE 3.13 --compile-to=flow)."""
    for _ in range(4):
        users = readers(value)
        if len(users) != 1:
            return value
        user = users[0]
        if user.name not in (COLLAPSE, EXPAND):
            return value
        before = [d for d in tensor_facts(value.type).shape if d != 1]
        if before != [d for d in tensor_facts(user.results[0].type).shape if d != 1]:
            return value
        value = user.results[0]
    return value


def _earlier_matmul(user: ir.Operation, index: int, matmul: ir.Operation) -> ir.Operation | None:
    """A matmul before `matmul` in its block whose result `user` alone reads (through a chain of
    one-input generics and reshapes, each value read once): IREE fuses such a product of two
    matmuls' results into the dispatch of the one that comes first."""
    for i in range(len(user.operands) - len(user.results)):
        if i == index:
            continue
        value, steps = user.operands[i], 0
        while steps < 6 and _read_once(value) and op_name(value.owner) in (GENERIC, COLLAPSE, EXPAND):
            owner = value.owner
            if len(owner.operands) - len(owner.results) not in (0, 1):
                break
            value, steps = owner.operands[0], steps + 1
        owner = value.owner
        if op_name(owner) in ("linalg.matmul", "linalg.batch_matmul") and _read_once(value) and owner.operation.block == matmul.block:
            if owner.operation.is_before_in_block(matmul):
                return owner.operation
    return None


def _read_once(value: ir.Value) -> bool:
    """Whether one op reads `value` (one Python object per access: compare the operations)."""
    owners: list = []
    for use in value.uses:
        if not any(use.owner.operation == o for o in owners):
            owners.append(use.owner.operation)
    return len(owners) == 1


def _only_widens(op: ir.Operation) -> bool:
    """A generic whose body is one arith.extf: IREE clones it into the dispatches of its readers
    (BERT's extf before a LayerNorm runs in the norm's reduction dispatch, IREE 3.13
    --compile-to=flow), so it is no op of the matmul's dispatch."""
    names = [o.operation.name for o in op.regions[0].blocks[0].operations]
    return names == ["arith.extf", "linalg.yield"]


def _expand_user(owner: ir.Operation, shape: tuple, expanded: bool) -> tuple[tuple[ir.Operation, int] | None, str]:
    """The expand_shape of the [m, n] product as a chain step, or why not."""
    if expanded:
        return None, "its user is a second tensor.expand_shape"
    if len(shape) != 2:
        return None, f"its user is a tensor.expand_shape of a {len(shape)}-D value (the kernels' epilogues reshape a 2-D product only)"
    if None in shape or None in tensor_facts(owner.results[0].type).shape:
        return None, "its user is a tensor.expand_shape with dynamic sizes"
    return (owner, 0), ""


def reassociation(op: ir.Operation) -> tuple[tuple[int, ...], ...]:
    """A collapse_shape's or expand_shape's reassociation, as index groups."""
    from iree.compiler import ir

    return tuple(tuple(ir.IntegerAttr(i).value for i in ir.ArrayAttr(g)) for g in ir.ArrayAttr(op.attributes["reassociation"]))


# ------------------------------------------------------------------- the expression


class NotEpilogue(Exception):
    """A body op or operand no epilogue has, with the reason in words."""


# Expressions are tuples: ("sym", name), ("const", value, dtype, inverse), ("sum", terms),
# ("prod", factors), ("fn", name, arg). Sums and products are flat and sorted, so that every
# order and grouping of the same formula has one form.


def _const(value: float, dtype: str, inverse: bool = False) -> tuple:
    return ("const", value, dtype, inverse)


def _flat(kind: str, parts: tuple) -> tuple:
    out = []
    for p in parts:
        out.extend(p[1] if p[0] == kind else (p,))
    if kind == "prod":  # x * 1 is x exactly
        out = [p for p in out if not (p[0] == "const" and p[1] == 1.0 and not p[3])]
    if len(out) == 1:
        return out[0]
    return (kind, tuple(sorted(out, key=repr)))


def _add(*parts: tuple) -> tuple:
    return _flat("sum", parts)


def _mul(*parts: tuple) -> tuple:
    return _flat("prod", parts)


def _neg(x: tuple) -> tuple:
    return _mul(_const(-1.0, "any"), x)


def _div(x: tuple, y: tuple) -> tuple:
    if y[0] == "const" and not y[3]:
        return _mul(x, _const(y[1], y[2], inverse=True))
    return _mul(x, ("fn", "recip", y))


ACC, BIAS, RESIDUAL = ("sym", "acc"), ("sym", "bias"), ("sym", "residual")
WILD = ("wild",)  # a constant the kernel takes as an argument (gelu_c, alpha)


def _formulas() -> dict[str, tuple]:
    x = _add(ACC, BIAS)
    half, one = _const(0.5, "k"), _const(1.0, "k")
    return {
        "none": ACC,
        "bias": x,
        "bias_gelu_erf": _mul(half, x, _add(one, ("fn", "erf", _mul(x, _const(SQRT1_2, "k"))))),
        "bias_gelu_tanh": _mul(half, x, _add(one, ("fn", "tanh", _mul(WILD, _add(x, _mul(_const(GELU_CUBE, "k"), x, x, x)))))),
        "bias_relu": ("fn", "relu", x),
        "bias_silu": _mul(x, ("fn", "recip", _add(one, ("fn", "exp", _neg(x))))),
        "residual": _add(ACC, RESIDUAL),
        "bias_residual": _add(ACC, BIAS, RESIDUAL),
        "scale": _mul(WILD, ACC),
        # GELU where the exporter folded a zero bias away (GPT-2's c_fc from random weights).
        "gelu_erf": _mul(half, ACC, _add(one, ("fn", "erf", _mul(ACC, _const(SQRT1_2, "k"))))),
        "gelu_tanh": _mul(half, ACC, _add(one, ("fn", "tanh", _mul(WILD, _add(ACC, _mul(_const(GELU_CUBE, "k"), ACC, ACC, ACC)))))),
        # SwiGLU as IREE fuses it into the gate matmul's dispatch: silu(x Wg) * up, up = x Wu read
        # whole (the `residual` role: an [m, n] tensor of the result's type).
        "silu_mul": _mul(ACC, ("fn", "recip", _add(one, ("fn", "exp", _neg(ACC)))), RESIDUAL),
    }


FORMULAS = _formulas()


def _round(value: float, dtype: str) -> float:
    """`value` rounded to nearest even in `dtype` (f32, f16, bf16)."""
    if dtype == "f16":
        try:
            return struct.unpack("<e", struct.pack("<e", value))[0]
        except OverflowError:
            return float("inf")
    f32 = struct.unpack("<f", struct.pack("<f", value))[0]
    if dtype != "bf16":
        return f32
    bits = struct.unpack("<I", struct.pack("<f", f32))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _same(model: tuple, formula: tuple, captured: list) -> bool:
    """Whether the model's expression is the formula (constants by _const_matches; a WILD
    constant captured)."""
    if formula == WILD:
        if model[0] != "const":
            return False
        captured.append(1.0 / model[1] if model[3] else model[1])
        return True
    if formula[0] == "const":
        return model[0] == "const" and _const_matches(model, formula[1])
    if model[0] != formula[0]:
        return False
    if formula[0] == "sym":
        return model == formula
    if formula[0] == "fn":
        return model[1] == formula[1] and _same(model[2], formula[2], captured)
    return _same_parts(list(model[1]), list(formula[1]), captured)


def _same_parts(model: list, formula: list, captured: list) -> bool:
    """Multiset matching of a sum's terms or a product's factors (small: backtracking)."""
    if len(model) != len(formula):
        return False
    if not formula:
        return True
    head, rest = formula[0], formula[1:]
    for i, part in enumerate(model):
        mark = len(captured)
        if _same(part, head, captured) and _same_parts(model[:i] + model[i + 1:], rest, captured):
            return True
        del captured[mark:]
    return False


def _const_matches(model: tuple, kernel: float) -> bool:
    """The model's constant is the kernel's rounded to the model's type (for `x / c`: c is
    1 / the kernel's constant, rounded)."""
    _, value, dtype, inverse = model
    if dtype == "any":  # a sign: -x
        return value == kernel
    want = 1.0 / kernel if inverse else kernel
    return value == _round(want, dtype if dtype in ("f16", "bf16") else "f32")


# ------------------------------------------------------------------- reading the bodies


# select(compare, a, b) as max(x, 0), by where x and the zero stand in the compare and which
# value the select takes when it holds: predicate -> whether NaN stays NaN (as in the kernel).
_RELU_SELECTS = {
    ("x0", "x"): {"ugt": True, "uge": True, "ogt": False, "oge": False},  # x > 0 ? x : 0
    ("0x", "x"): {"ult": True, "ule": True, "olt": False, "ole": False},  # 0 < x ? x : 0
    ("x0", "0"): {"olt": True, "ole": True, "ult": False, "ule": False},  # x < 0 ? 0 : x
    ("0x", "0"): {"ogt": True, "oge": True, "ugt": False, "uge": False},  # 0 > x ? 0 : x
}


# Ops whose result is one of their operands (or its negation): no rounding.
_EXACT = ("arith.select", "arith.maximumf", "arith.maxnumf", "arith.negf")


@dataclass
class _Reader:
    """Reads covered generics' bodies into one expression, noting roundings and ops."""

    result_dtype: str
    rounds: int = 0
    ops: list[str] = dataclasses.field(default_factory=list)

    def body(self, op: ir.Operation, chain: int, incoming: tuple, inputs: dict[int, tuple]) -> tuple:
        """The generic's yielded value: its chain operand is `incoming`, its others `inputs`."""
        block = op.regions[0].blocks[0]
        n_in = len(op.operands) - len(op.results)
        values = {arg: None if i >= n_in else incoming if i == chain else inputs[i] for i, arg in enumerate(block.arguments)}
        for inner in block.operations:
            inner = inner.operation
            if inner.name == "linalg.yield":
                return self.value(inner.operands[0], values)
            if inner.name != "arith.constant":  # a constant is read where it is used
                values[inner.results[0]] = self.op(inner, [self.value(v, values) for v in inner.operands])
        raise NotEpilogue("a body without linalg.yield")

    def value(self, v: ir.Value, values: dict) -> tuple:
        if v in values:
            if values[v] is None:  # the output (None in `values`): no epilogue reads it
                raise NotEpilogue("the body reads its output")
            return values[v]
        owner = v.owner
        if op_name(owner) == "arith.constant":
            return self.constant(owner.operation)
        raise NotEpilogue(f"the body uses a value from outside ({op_name(owner)})")

    def constant(self, op: ir.Operation) -> tuple:
        from iree.compiler import ir

        attr = op.attributes["value"]
        if isinstance(attr, ir.FloatAttr):
            return _const(attr.value, str(attr.type))
        if isinstance(attr, ir.IntegerAttr):
            return ("int", attr.value)
        raise NotEpilogue(f"a constant {attr}")

    def typed(self, op: ir.Operation) -> str:
        """The op's result type: f32, or the result's (then one of the model's own roundings,
        unless the op is exact)."""
        dtype = str(op.results[0].type)
        if dtype not in ("f32", self.result_dtype):
            raise NotEpilogue(f"{op.name} computes in {dtype}, neither f32 nor the result's {self.result_dtype}")
        if dtype != "f32" and op.name not in _EXACT:
            self.rounds += 1
        return dtype

    def op(self, op: ir.Operation, args: list[tuple]) -> tuple:
        name = op.name
        self.ops.append(name.split(".")[-1])
        if name == "arith.extf":  # exact
            return args[0]
        if name == "arith.cmpf":
            return ("cmp", _predicate_name(str(op.attributes["predicate"])), args[0], args[1])
        dtype = self.typed(op)
        unary = {"math.erf": "erf", "math.tanh": "tanh", "math.exp": "exp"}
        if name == "arith.truncf":
            return args[0]
        if name in unary:
            return ("fn", unary[name], args[0])
        if name == "arith.addf":
            return _add(args[0], args[1])
        if name == "arith.subf":
            return _add(args[0], _neg(args[1]))
        if name == "arith.mulf":
            return _mul(args[0], args[1])
        if name == "arith.divf":
            return _div(args[0], args[1])
        if name == "arith.negf":
            return _neg(args[0])
        if name == "math.sqrt" and args[0][0] == "const" and not args[0][3]:  # torch-mlir's GELU: x / sqrt(2)
            return _const(_round(math.sqrt(args[0][1]), dtype), dtype)
        if name in ("math.fpowi", "math.powf") and _is_three(args[1]):
            return _mul(args[0], args[0], args[0])
        if name in ("arith.maximumf", "arith.maxnumf"):  # maximumf propagates NaN, maxnumf gives the other
            x = args[1] if _is_zero(args[0]) else args[0]
            if not (_is_zero(args[0]) or _is_zero(args[1])):
                raise NotEpilogue(f"{name} of two values, not max(x, 0)")
            return _relu(x, name == "arith.maximumf", name)
        if name == "arith.select":
            return _select(*args)
        raise NotEpilogue(f"{name} is in no epilogue")


def _select(cond: tuple, a: tuple, b: tuple) -> tuple:
    """select(cond, a, b) as max(x, 0), or why it is not."""
    if cond[0] != "cmp":
        raise NotEpilogue("a select on something else than a compare")
    _, predicate, left, right = cond
    where = "x0" if _is_zero(right) else "0x" if _is_zero(left) else None
    x = left if where == "x0" else right
    takes = "x" if (a == x and _is_zero(b)) else "0" if (_is_zero(a) and b == x) else None
    nan_stays = _RELU_SELECTS.get((where, takes), {}).get(predicate) if where and takes else None
    if nan_stays is None:
        raise NotEpilogue(f"a select by cmpf {predicate} that is not max(x, 0)")
    return _relu(x, nan_stays, f"a select by cmpf {predicate}")


def _relu(x: tuple, nan_stays: bool, how: str) -> tuple:
    if not nan_stays:
        raise NotEpilogue(f"ReLU by {how} gives 0 for NaN, the kernel NaN")
    return ("fn", "relu", x)


def _predicate_name(attr_text: str) -> str:
    names = ["false", "oeq", "ogt", "oge", "olt", "ole", "one", "ord", "ueq", "ugt", "uge", "ult", "ule", "une", "uno", "true"]
    text = attr_text.split(":")[0].strip()
    return names[int(text)] if text.isdigit() else text


def _is_zero(x: tuple) -> bool:
    return x[0] == "const" and x[1] == 0.0 and not x[3]


def _is_three(x: tuple) -> bool:
    return (x[0] == "int" and x[1] == 3) or (x[0] == "const" and x[1] == 3.0 and not x[3])


def _recognise(ops: list[tuple[ir.Operation, int]]) -> Epilogue:
    """The matmul and `ops` (its chain, in order, the last a generic) as one epilogue, or why not."""
    from iree.compiler import ir

    last = ops[-1][0]
    result = tensor_facts(last.results[0].type)
    chain = tuple(index for _, index in reversed(ops))
    reader = _Reader(result.dtype)
    expr, found, groups = ACC, {}, None
    try:
        for step, (op, index) in enumerate(ops):
            if op.name == COLLAPSE:  # unit dims dropped: the values are the same
                continue
            if op.name == EXPAND:  # the same values, as [.., n] (or n split: [.., h, d])
                groups = reassociation(op)
                continue
            inputs = {}
            maps = [map_dims(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
            rank = len(tensor_facts(op.results[0].type).shape)
            if maps[index] != tuple(range(rank)):  # the transpose to heads (_to_heads): the last op
                heads = _heads_step(op, index, maps, groups, chain[: len(ops) - 1 - step], result, found)
                return _heads_named(len(ops), reader.body(op, index, expr, {1 - index: ("sym", "bias")}), result, chain, found,
                                    reader, groups, heads)
            # A bias [n] broadcast along rows is one dim of the op: n not split by the expand.
            n_whole = groups is None or len(groups[-1]) == 1
            for i in range(len(op.operands) - len(op.results)):
                if i == index:
                    continue
                # Its path from the last covered generic: the chain back to this one, then i.
                path = chain[: len(ops) - 1 - step] + (i,)
                inputs[i] = _side_input(op.operands[i], maps[i], rank, path, result, found, n_whole)
            expr = reader.body(op, index, expr, inputs)
    except NotEpilogue as exc:
        transposes = last.name == GENERIC and _reads_permuted(last, ops[-1][1])
        return Epilogue(len(ops), None, result, chain, why=str(exc), groups=groups, transposes=transposes)
    return dataclasses.replace(_named(len(ops), expr, result, chain, found, reader), groups=groups)


def generic_epilogue(op: ir.Operation, index: int, side: dict[int, tuple[str, TensorFacts]]) -> Epilogue:
    """What one generic computes of the product it reads as its operand `index`, as an epilogue
    of the family (covering that one op), its other inputs in the roles `side` gives (operand ->
    (role, facts)). For a kind whose product the generic reads through a map of its own (a patch
    conv's transpose to rows): the kind checks the maps, this reads the body."""
    result = tensor_facts(op.results[0].type)
    reader = _Reader(result.dtype)
    found = {role: ((i,), facts) for i, (role, facts) in side.items()}
    try:
        expr = reader.body(op, index, ACC, {i: ("sym", role) for i, (role, _) in side.items()})
    except NotEpilogue as exc:
        return Epilogue(1, None, result, (index,), why=str(exc))
    return _named(1, expr, result, (index,), found, reader)


def _reads_permuted(op: ir.Operation, index: int) -> bool:
    from iree.compiler import ir

    dims = map_dims(ir.ArrayAttr(op.attributes["indexing_maps"])[index])
    return dims != tuple(range(len(tensor_facts(op.results[0].type).shape)))


def _heads_step(op: ir.Operation, index: int, maps: list, groups: tuple | None, path: tuple, result: TensorFacts, found: dict) -> str:
    """The heads epilogue a transposing generic after the expand stores (noting its bias [h, d]
    in `found`), or NotEpilogue with why not."""
    shape = tensor_facts(op.operands[index].type).shape
    rank = len(shape)
    if groups is None or groups[-1] != (rank - 2, rank - 1) or len(groups) != 2:
        raise NotEpilogue(f"a transpose of {shape}, which is not the product expanded to [b, s, h, d] (n split into heads)")
    known = _heads_maps(rank)
    if maps[index] not in known:
        raise NotEpilogue(f"a transpose to heads reading its input by {maps[index]}; the heads kernels write [b, h, s, d] "
                          "(bias_heads) or [b, h, d, s] (bias_heads_t)")
    name, bias_dims = known[maps[index]]
    bias = tensor_facts(op.operands[1 - index].type)
    if maps[1 - index] != bias_dims or bias.shape != shape[-2:]:
        raise NotEpilogue(f"a transpose to heads whose other input {bias.text} is read by {maps[1 - index]}, not a bias [h, d] "
                          f"{shape[-2:]} over the heads")
    if bias.dtype != result.dtype:
        raise NotEpilogue(f"the bias is {bias.text}, the result {result.dtype} (the kernel reads it in the result's type)")
    if "bias" in found:  # the kernel adds one bias, the transposing generic's: an earlier one would be lost
        raise NotEpilogue(f"a bias added before the transpose to heads and another ({bias.text}) read by it")
    found["bias"] = (path + (1 - index,), bias)
    return name


def _heads_named(covers: int, expr: tuple, result: TensorFacts, chain: tuple, found: dict, reader: _Reader,
                 groups: tuple, heads: str) -> Epilogue:
    """The chain ending in a transpose to heads as `heads` where it computes the bias add."""
    form = _named(covers, expr, result, chain, found, reader)
    if form.name != "bias":
        why = form.why or f"the ops ({', '.join(form.ops)}) compute {form.name}"
        return Epilogue(covers, None, result, chain, ops=form.ops, groups=groups, transposes=True,
                        why=f"a transpose to heads: only its bias add has heads kernels ({heads}); {why}")
    return dataclasses.replace(form, name=heads, groups=groups, transposes=True)


def _side_input(value: ir.Value, dims: tuple | None, rank: int, path: tuple, result: TensorFacts, found: dict, n_whole: bool) -> tuple:
    """A generic's other input as `bias` or `residual` (noting its path), or why neither. A
    residual is read whole and shaped as the last covered op's result (the kernel reads it as
    it writes that result)."""
    facts = tensor_facts(value.type)
    producer = op_name(value.owner)
    if producer in ("linalg.matmul", "linalg.batch_matmul"):  # its own chain may end in the same op
        raise NotEpilogue(f"an input {facts.text} that is another matmul's result ({producer})")
    if dims == (rank - 1,) and len(facts.shape) == 1:
        if not n_whole:
            raise NotEpilogue(f"an input {facts.text} broadcast along the last dim after an expand_shape that splits n, a bias over part of n")
        role = "bias"
    elif dims == tuple(range(rank)) and facts.shape == result.shape:
        role = "residual"
    elif dims is not None and len(dims) == 1:
        raise NotEpilogue(f"an input {facts.text} broadcast along dimension {dims[0]}, not a bias [n] (broadcast along the rows)")
    else:
        raise NotEpilogue(f"an input {facts.text} read by {dims}, neither a bias [n] nor a residual read whole")
    if role in found:
        raise NotEpilogue(f"a second {role} input ({facts.text})")
    if facts.dtype != result.dtype:
        raise NotEpilogue(f"the {role} is {facts.text}, the result {result.dtype} (the kernel reads it in the result's type)")
    found[role] = (path, facts)
    return ("sym", role)


def _named(covers: int, expr: tuple, result: TensorFacts, chain: tuple, found: dict, reader: _Reader) -> Epilogue:
    ops = tuple(reader.ops)
    rounds = max(0, reader.rounds - 1)  # the last op's rounding is the kernel's own
    for name, formula in FORMULAS.items():
        captured: list = []
        if _same(expr, formula, captured):
            if not all(_used(formula, role) for role in found):
                continue
            return Epilogue(
                covers, name, result, chain, found.get("bias"), found.get("residual"),
                captured[0] if captured else None, rounds, ops,
            )
    return Epilogue(covers, None, result, chain, ops=ops, why=f"the ops ({', '.join(ops)}) compute {_show(expr)}, which is no epilogue of the family")


def _used(formula: tuple, role: str) -> bool:
    return ("sym", role) in _walk(formula)


def _walk(expr: tuple):
    yield expr
    if expr[0] in ("sum", "prod"):
        for part in expr[1]:
            yield from _walk(part)
    elif expr[0] == "fn":
        yield from _walk(expr[2])


def _show(expr: tuple) -> str:
    """An expression in words (for reasons)."""
    kind = expr[0]
    if kind == "sym":
        return expr[1]
    if kind == "const":
        return f"(1/{expr[1]:g})" if expr[3] else f"{expr[1]:g}"
    if kind == "fn":
        return f"{expr[1]}({_show(expr[2])})"
    if kind in ("sum", "prod"):
        return "(" + (" + " if kind == "sum" else " * ").join(_show(p) for p in expr[1]) + ")"
    return str(expr)


# ------------------------------------------------------------------- kernels with an epilogue

# What each epilogue reads beyond A and B (buffers, in the kernel's order) and the scalar it takes.
READS = {
    "bias": ("bias",), "bias_gelu_erf": ("bias",), "bias_gelu_tanh": ("bias",), "bias_relu": ("bias",),
    "bias_silu": ("bias",), "residual": ("residual",), "bias_residual": ("bias", "residual"), "silu_mul": ("residual",),
}
SCALAR = {"bias_gelu_tanh": "gelu_c", "gelu_tanh": "gelu_c", "scale": "alpha"}
# The heads epilogues: bias [heads, d] (as the model holds it), C [nb, heads, seq, d] or
# [nb, heads, d, seq], and the i32 scalars nb and seq (C's dims no input has; the call passes them).
HEADS = {"bias_heads": ("heads", "seq", "d"), "bias_heads_t": ("heads", "d", "seq")}
HEADS_SCALARS = ("nb", "seq")


@dataclass(frozen=True)
class EpilogueLayout:
    """A matmul kernel's epilogue (replace_when's `epilogue`), its extra buffers in the roles
    READS names (bias [n], residual [.., m, n], both of the result's type) and its scalar."""

    name: str
    buffers: tuple[Buffer, ...] = ()
    scalar: str | None = None


def split_epilogue(kernel: Kernel, where: str) -> tuple[Kernel, EpilogueLayout]:
    """The kernel as a plain matmul (its epilogue's buffers and scalar set aside) and its
    epilogue; a ManifestError where its params cannot be that epilogue's: after A and B, one
    buffer per role READS names, of the result's type, then one f32 scalar without a value where
    SCALAR names one."""
    name = kernel.replaces.epilogue if kernel.replaces is not None else "none"
    if name == "none":
        return kernel, EpilogueLayout(name)
    if name in HEADS:
        return _split_heads(kernel, name, where)
    inputs = [b for b in kernel.buffers if b.is_argument]
    results = [b for b in kernel.buffers if b.is_result]
    roles = READS.get(name, ())
    extra = tuple(inputs[2:2 + len(roles)])
    result = results[0] if len(results) == 1 else None
    shapes_ok = result is not None and len(extra) == len(roles) and all(
        b.type.dtype == result.type.dtype and (b.type.shape == result.type.shape[-1:] if role == "bias" else b.type.shape == result.type.shape)
        for role, b in zip(roles, extra)
    )
    expect(
        shapes_ok and result.access == "out",
        f"its epilogue {name} reads {', '.join(roles) or 'nothing'} after A and B "
        f"(bias [n], residual shaped as the result, both of the result's type) and writes a new result (out)",
        where,
    )
    scalars = [s for s in kernel.function_arguments if isinstance(s, Scalar)]
    wanted = SCALAR.get(name)
    expect(
        [s.name for s in scalars] == ([wanted] if wanted else []) and all(s.dtype == "f32" for s in scalars),
        f"its epilogue {name} takes " + (f"one f32 scalar {wanted} without a value" if wanted else "no scalar argument"),
        where,
    )
    aside = {b.name for b in extra} | {s.name for s in scalars}
    plain = dataclasses.replace(kernel, params=tuple(p for p in kernel.params if p.name not in aside))
    return plain, EpilogueLayout(name, extra, wanted)


def _split_heads(kernel: Kernel, name: str, where: str) -> tuple[Kernel, EpilogueLayout]:
    """split_epilogue of a heads kernel: after A and B a bias [heads, d], a result of rank 4, and
    the i32 scalars nb and seq without values, in that order."""
    inputs = [b for b in kernel.buffers if b.is_argument]
    results = [b for b in kernel.buffers if b.is_result]
    ok = len(inputs) >= 3 and len(results) == 1 and results[0].access == "out" and len(results[0].type.shape) == 4
    bias = inputs[2] if ok else None
    expect(
        ok and len(bias.type.shape) == 2 and bias.type.dtype == results[0].type.dtype,
        f"its epilogue {name} reads a bias [heads, d] of the result's type after A and B and writes a new result "
        "[nb, heads, seq, d] (or [nb, heads, d, seq]) (out)",
        where,
    )
    # The result's dims by name, as the heads layout orders them (a [nb, heads, seq, d] result
    # declared bias_heads_t would pass the sizes wherever seq == d, and be stored transposed).
    expect(
        results[0].type.shape[1:] == HEADS[name],
        f"its epilogue {name} writes [nb, {', '.join(HEADS[name])}], not {results[0].type}",
        where,
    )
    scalars = [s for s in kernel.function_arguments if isinstance(s, Scalar)]
    expect(
        tuple(s.name for s in scalars) == HEADS_SCALARS and all(s.dtype == "i32" for s in scalars),
        f"its epilogue {name} takes the i32 scalars {' and '.join(HEADS_SCALARS)} without values (the result's batch and rows)",
        where,
    )
    aside = {bias.name} | set(HEADS_SCALARS) | set(bias.type.symbols)  # heads and d: only the bias's dims
    plain = dataclasses.replace(kernel, params=tuple(p for p in kernel.params if p.name not in aside))
    return plain, EpilogueLayout(name, (bias,))


def with_chain(facts: OpFacts, op: ir.Operation) -> OpFacts:
    """A matmul's facts with its chain of elementwise users (the kind's facts' `chain` field)."""
    return dataclasses.replace(facts, detail=dataclasses.replace(facts.detail, chain=read_chain(op)))


def chosen(op: OpFacts, layout: Layout) -> Epilogue | str:
    """The prefix of the op's chain (its facts' `chain`) the kernel replaces (its epilogue,
    into its result's type), or why none."""
    ending = layout.epilogue or EpilogueLayout("none")
    return op.detail.chain.choose(ending.name, layout.result.type.dtype)


def left_unfused(op: OpFacts, form: Epilogue) -> str | None:
    """Why replacing the matmul with `form` would cost a dispatch: the elementwise ops after
    the ones the kernel takes, which IREE fuses into the matmul's dispatch, would run as a
    dispatch of their own (issue 25: a replaced model never has more IREE dispatches)."""
    # A transpose to heads runs in a dispatch of its own in IREE: stopping before it costs nothing.
    whole = [f for f in op.detail.chain.forms if not f.transposes or f is form][-1]
    if whole.covers <= form.covers:
        if whole.covers == form.covers and op.detail.chain.fused_next:
            return (
                f"epilogue: the op after the ones the kernel takes, {op.detail.chain.fused_next} (not elementwise on the "
                "matmul's result: a transpose or broadcast), is fused by IREE into the matmul's dispatch and would run "
                "as a dispatch of its own"
            )
        return None
    left = whole.covers - form.covers
    return (
        f"epilogue: the kernel takes the matmul{f' and {form.covers} op(s) after it' if form.covers else ''}; the "
        f"{left} elementwise op(s) after those, which IREE fuses into the matmul's dispatch, would run as a dispatch "
        f"of their own ({', '.join(whole.ops[len(form.ops):]) or 'they'}; the longest epilogue found: "
        f"{op.detail.chain.longest.name} over {op.detail.chain.longest.covers} op(s))"
    )


def covered(op: OpFacts, layout: Layout, *, as_kernel: bool = False) -> OpFacts:
    """The op as the kernel replaces it with its epilogue: the epilogue's inputs after A and B,
    the last covered op's result; `as_kernel`: the result and a residual collapsed back to the
    product's [m, n] where the chain expands it (sizes are checked on these)."""
    form = chosen(op, layout)
    if isinstance(form, str) or form.covers == 0:
        return op
    inputs, result = form.inputs, form.result
    if as_kernel and form.name in HEADS:  # C [nb, heads, ..]; at batch 1 the op's has no unit batch dim
        result = TensorFacts(result.dtype, (1,) * (4 - len(result.shape)) + result.shape)
    elif as_kernel and form.groups is not None:
        inputs = tuple(_collapse(t, form.groups) if t.shape == result.shape else t for t in inputs)
        result = _collapse(result, form.groups)
    return dataclasses.replace(op, inputs=op.inputs + inputs, result=result)


def _collapse(t: TensorFacts, groups: tuple[tuple[int, ...], ...]) -> TensorFacts:
    return TensorFacts(t.dtype, tuple(math.prod(t.shape[d] for d in g) for g in groups))


def epilogue_call(op: OpFacts, layout: Layout, call: Call) -> Call:
    """The matmul's call (`call`, from the matmul) from the last covered op: its operands read
    back through the chain, then the epilogue's bias / residual and its constant; marked there."""
    form = chosen(op, layout)
    if isinstance(form, str) or form.covers == 0:
        return call
    through = tuple(
        dataclasses.replace(a, path=form.chain + a.path) if isinstance(a, Operand) else a for a in call.arguments
    )
    # The result (and a residual, shaped as it) as the kernel's: collapsed by the chain's
    # expand_shape where it has one; else reshaped as the matmul's result is, unless the chain
    # already dropped the unit dims (a batch-1 batch_matmul's collapse).
    if form.name in HEADS:  # C [nb, heads, ..]: the op's [heads, ..] at batch 1 with a unit dim added
        result = Reshape(((0, 1), (2,), (3,))) if len(form.result.shape) == 3 else None
        nb, seq = form.heads_sizes
        arguments = through[:2] + (Operand(form.bias[0]), Constant("i32", str(nb)), Constant("i32", str(seq)))
        return dataclasses.replace(call, arguments=arguments, result=result, marked=form.covers)
    if form.groups is not None:
        result = Reshape(form.groups)
    else:
        result = None if len(form.result.shape) == len(layout.result.type.shape) else call.result
    extra = tuple(Operand(x[0], reshape) for x, reshape in ((form.bias, None), (form.residual, result)) if x is not None)
    constant = (Constant("f32", form.constant_text),) if form.constant is not None else ()
    return dataclasses.replace(call, arguments=through[:2] + extra + through[2:] + constant, result=result, marked=form.covers)
