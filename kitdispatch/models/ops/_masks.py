"""What an attention mask is, read from the ops that make it: no mask, causal, or another.

A mask reaches IREE's global optimization as a tensor: a constant (an ONNX initializer, a
splat), or built by `linalg.generic`s from `linalg.index` and a comparison (torch's
`is_causal=True` becomes `select(q >= k, 0, -inf)`), through reshapes and broadcasts. The
kit evaluates those ops with numpy over the mask's whole static shape (each value kept as an
array that broadcasts to its tensor, so a [b, h, s, s] causal mask costs an [s, s] array), so
what it calls causal is causal at every element, not by the look of the ops. Anything it cannot
evaluate (a function argument, an op it does not know, a dynamic size) is "another mask", with
what made it.

A key-padding mask (a model's `attention_mask` input [b, t], 1 = attend) needs no evaluation:
transformers broadcasts it over heads and queries, which IREE's elementwise fusion folds into
the map by which the scores' generic reads a [b, t] tensor, (d0, d3) of its loops [b, h, q, k]:
boolean flags that a select(keep, 0, lowest) in the generic turns into the additive mask (HF
BERT and GPT-2 exported by torch's dynamo exporter, IREE 3.13: the flags come out of a gather),
or the additive [b, t] mask itself (where IREE fuses that select into the flags' producer).
Whatever its values, a kernel that reads that same tensor per (batch, key) computes what the op
does (`per_key`; at batch 1, where IREE drops b, a [t] tensor read per key, as [1, t]); anded
with a causal constant [q, k] it is causal key padding. Where the flags
are anded inside the scores' generic with a boolean it computes from constants (torchscript
exports compare two aranges: q >= 0, k <= q), that boolean is evaluated there (`read_body_mask`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kitdispatch.models.ops.base import map_dims, op_name

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

NONE, CAUSAL, OTHER = "none", "causal", "other"
KEY_PADDING, CAUSAL_KEY_PADDING = "key_padding", "causal_key_padding"
MASK_FORMS = (NONE, CAUSAL, KEY_PADDING, CAUSAL_KEY_PADDING)  # what a kernel may declare in replace_when's `mask`
_WALK = 64  # producers made_by looks through
_MAX_ELEMENTS = 1 << 24  # a reshape materializes its input: larger masks are not evaluated
_INTS = {"i64": np.int64, "i32": np.int32}
# bf16 values are held in f32, which holds each exactly (numpy has no bf16).
_FLOATS = {"f16": np.float16, "bf16": np.float32, "f32": np.float32, "f64": np.float64}
_LOWEST = {"f16": float(np.finfo(np.float16).min), "bf16": -3.3895313892515355e38, "f32": float(np.finfo(np.float32).min),
           "f64": float(np.finfo(np.float64).min)}  # the masked value HF writes (torch.finfo(dtype).min)


@dataclass(frozen=True)
class MaskForm:
    """`form`: NONE (every key attends: all true, or an additive mask of zeros), CAUSAL (key
    j attends to query i where j <= i; masked: false, -inf or the type's lowest value), or
    OTHER; `text` says what made it (for the report)."""

    form: str
    text: str


class _Unreadable(Exception):
    """The mask's values cannot be evaluated here; the message says why."""


def read_mask(value: ir.Value, query_axis: int, key_axis: int) -> MaskForm:
    """The form of a mask tensor whose `query_axis` and `key_axis` index queries and keys;
    for an additive mask the values must be 0 or masked, for a boolean one true attends."""
    try:
        values = _evaluate(value)
        return _classify(values, _element(value.type), _shape(value.type), query_axis, key_axis)
    except _Unreadable as exc:
        return MaskForm(OTHER, f"a mask kitdispatch cannot read: {exc}")


def read_additive(value: ir.Value, query_axis: int, key_axis: int) -> MaskForm:
    """read_mask for a tensor added to the scores (decomposed attention): float values only."""
    if _element(value.type) == "i1":
        return MaskForm(OTHER, "a boolean tensor added to the scores")
    return read_mask(value, query_axis, key_axis)


def per_key(dims: tuple[int, ...] | None, loops: int) -> bool:
    """Whether a tensor read through `dims` (its axes' loops) in a generic of `loops` loops
    [b, h, q, k] holds one value per (batch, key): a [b, t] tensor read as (d0, d3); or one
    value per key, the same for every batch and head: a [t] tensor read as the keys' loop (d3,
    or d2 of [B, q, k], where b = 1 is dropped), which a kernel reads as [1, t]."""
    return loops == 4 and dims == (0, loops - 1) or loops in (3, 4) and dims == (loops - 1,)


def with_key_padding(form: MaskForm, value: ir.Value, computed: str | None = None) -> MaskForm:
    """`form` (of the rest of the mask) with the key-padding tensor `value` [b, t] (boolean
    flags anded with it, or an additive mask where `form` is NONE; `computed`: the additive
    mask is computed from it, so)."""
    if computed is not None:
        what = f"a key-padding mask {computed} from a [b, t] {_element(value.type)} tensor made by {made_by(value)}"
    else:
        kind = "key-padding flags" if _element(value.type) == "i1" else "an additive key-padding mask"
        what = f"{kind} [b, t] made by {made_by(value)}"
    if form.form == NONE:
        return MaskForm(KEY_PADDING, what)
    if form.form == CAUSAL:
        return MaskForm(CAUSAL_KEY_PADDING, f"a causal boolean mask and {what}")
    return MaskForm(OTHER, f"{form.text}, and {what}")


def made_by(value: ir.Value) -> str:
    """What makes a tensor, for the report: the model's inputs where it is computed from them."""
    seen, todo = 0, [value]
    while todo and seen < _WALK:
        owner = getattr(todo.pop().owner, "operation", None)
        seen += 1
        if owner is not None and owner.name == "hal.tensor.import":
            return "ops from an input of the model's function"
        if owner is not None:  # its operands, and what its body reads from outside (a gather's table)
            todo.extend(owner.operands)
            todo.extend(v for region in owner.regions for block in region.blocks for inner in block.operations for v in inner.operands)
    return op_name(value.owner)


def is_masked_value(value: float, dtype: str) -> bool:
    """Whether a score of `value` (of `dtype`) is masked out: -inf, or the type's lowest value."""
    return dtype in _LOWEST and (value == float("-inf") or value == _LOWEST[dtype])


def mask_ops(value: ir.Value) -> tuple:
    """The ops that make a mask for its one user: they go when that user goes."""
    owner = getattr(value.owner, "operation", None)
    if owner is None or owner.name not in _PRODUCERS or sum(1 for _ in value.uses) != 1:
        return ()
    inputs = owner.operands[:1] if owner.name != "linalg.generic" else owner.operands[: len(owner.operands) - len(owner.results)]
    return (owner,) + tuple(op for v in inputs for op in mask_ops(v))


def _classify(values: np.ndarray, dtype: str, shape: tuple[int, ...], q: int, k: int) -> MaskForm:
    if dtype == "i1":
        allowed = values.astype(bool)
    else:
        blocked = np.isneginf(values) | (values == _LOWEST[dtype])
        if not np.all(blocked | (values == 0)):
            return MaskForm(OTHER, "an additive mask of values other than 0 and -inf")
        allowed = values == 0
    for axis in range(len(shape)):  # the mask must not change along the batch and head axes
        if axis not in (q, k) and allowed.shape[axis] > 1:
            if not np.all(allowed == allowed.take([0], axis=axis)):
                return MaskForm(OTHER, f"{_kind(dtype)} mask that differs between batches or heads")
            allowed = allowed.take([0], axis=axis)
    grid = np.broadcast_to(allowed, tuple(1 if a not in (q, k) else shape[a] for a in range(len(shape))))
    grid = grid.reshape(shape[q], shape[k]) if q < k else grid.reshape(shape[k], shape[q]).T
    if grid.all():
        return MaskForm(NONE, f"{_kind(dtype)} mask that masks nothing")
    if shape[q] == shape[k] and np.array_equal(grid, np.tril(np.ones(grid.shape, bool))):
        return MaskForm(CAUSAL, f"a causal {_kind(dtype)[2:].strip()} mask")
    return MaskForm(OTHER, f"{_kind(dtype)} mask neither empty nor causal")


def _kind(dtype: str) -> str:
    return "a boolean" if dtype == "i1" else "an additive"


# ------------------------------------------------------------------------- evaluation


def _element(t: ir.Type) -> str:
    from iree.compiler import ir

    return str(ir.ShapedType(t).element_type)


def _shape(t: ir.Type) -> tuple[int, ...]:
    from iree.compiler import ir

    shaped = ir.ShapedType(t)
    if not shaped.has_static_shape:
        raise _Unreadable(f"its shape {t} is dynamic")
    return tuple(shaped.shape)


def _evaluate(value: ir.Value) -> np.ndarray:
    """The tensor's values, as an array of its rank that broadcasts to its shape."""
    owner = getattr(value.owner, "operation", None)
    if owner is None or owner.name == "hal.tensor.import":
        raise _Unreadable("an input of the model's function (known at run time only)")
    handler = _PRODUCERS.get(owner.name)
    if handler is None:
        raise _Unreadable(f"{owner.name}, which kitdispatch does not evaluate")
    values = handler(owner, value)
    if values.ndim != len(_shape(value.type)):
        raise _Unreadable(f"{owner.name} gave values of another rank")
    return values


def _dense(attr: ir.Attribute, t: ir.Type) -> np.ndarray:
    from iree.compiler import ir

    element = _element(t)
    dense = ir.DenseElementsAttr(attr)
    if element not in _FLOATS and element not in _INTS and element != "i1" or (element == "bf16" and not dense.is_splat):
        raise _Unreadable(f"a constant of {element}, which kitdispatch does not evaluate")
    rank = len(_shape(t))
    if dense.is_splat:
        return np.full((1,) * rank, _scalar(dense.get_splat_value()), dtype=bool if element == "i1" else {**_FLOATS, **_INTS}[element])
    return np.array(dense)  # integers: an arange's values (transformers' masks compare them)


def _scalar(attr: ir.Attribute) -> np.generic | bool:
    from iree.compiler import ir

    if isinstance(attr, ir.FloatAttr):
        return _FLOATS[str(attr.type)](ir.FloatAttr(attr).value) if str(attr.type) in _FLOATS else _raise(f"a {attr.type} constant")
    if isinstance(attr, ir.BoolAttr):
        return bool(ir.BoolAttr(attr).value)
    if isinstance(attr, ir.IntegerAttr):
        value = ir.IntegerAttr(attr).value
        return bool(value & 1) if str(attr.type) == "i1" else np.int64(value)
    raise _Unreadable(f"constant {attr}")


def _raise(what: str):
    raise _Unreadable(f"{what}, which kitdispatch does not evaluate")


def _constant(op: ir.Operation, value: ir.Value) -> np.ndarray:
    from iree.compiler import ir

    attr = op.attributes["value"]
    if isinstance(attr, ir.DenseElementsAttr):
        return _dense(attr, value.type)
    raise _Unreadable(f"constant {attr}")


def _fill(op: ir.Operation, value: ir.Value) -> np.ndarray:
    rank = len(_shape(value.type))
    return np.full((1,) * rank, _outside_scalar(op.operands[0]))


def _outside_scalar(value: ir.Value):
    owner = getattr(value.owner, "operation", None)
    if owner is None or owner.name != "arith.constant":
        raise _Unreadable(f"a scalar made by {op_name(value.owner)}")
    return _scalar(owner.attributes["value"])


def _reshape(op: ir.Operation, value: ir.Value) -> np.ndarray:
    source = op.operands[0]
    before, after = _shape(source.type), _shape(value.type)
    if int(np.prod(before)) > _MAX_ELEMENTS:
        raise _Unreadable(f"{op.name} of {int(np.prod(before))} elements, more than kitdispatch evaluates")
    return np.broadcast_to(_evaluate(source), before).reshape(after)


def _slice(op: ir.Operation, value: ir.Value) -> np.ndarray:
    """A static, rank-keeping tensor.extract_slice (a causal mask cut to the sequence)."""
    from iree.compiler import ir

    source = op.operands[0]
    if len(op.operands) != 1:
        raise _Unreadable("a tensor.extract_slice of dynamic offsets or sizes")
    before, after = _shape(source.type), _shape(value.type)
    offsets, sizes, strides = (list(ir.DenseI64ArrayAttr(op.attributes[k])) for k in ("static_offsets", "static_sizes", "static_strides"))
    if len(before) != len(after) or list(sizes) != list(after):
        raise _Unreadable("a tensor.extract_slice that drops dims")
    values = _evaluate(source)
    index = tuple(slice(None) if values.shape[i] == 1 else slice(o, o + n * s, s) for i, (o, n, s) in enumerate(zip(offsets, sizes, strides)))
    return values[index]


def _global(op: ir.Operation, value: ir.Value) -> np.ndarray:
    """A util.global.load of an immutable global whose initial value is in the model (IREE
    hoists constants so: an arange's positions); else the values live in a parameter archive,
    not in the model (what `iree-import-onnx --externalize-params` makes of initializers of
    `--num-elements-threshold` (default 100) elements or more, a constant mask among them)."""
    from iree.compiler import ir

    name = str(op.attributes["global"]) if "global" in op.attributes else "a global"
    initial = _global_initial_value(op, name) if "is_immutable" in op.attributes else None
    if isinstance(initial, ir.DenseElementsAttr):
        return _dense(initial, value.type)
    raise _Unreadable(f"the model's global {name}, whose values are not in the model (a parameter: import with "
                      "iree-import-onnx --num-elements-threshold above the mask's element count to keep it a constant)")


def _global_initial_value(load: ir.Operation, name: str) -> ir.Attribute | None:
    """The initial value of the util.global `name` (@symbol) of the module holding `load`."""
    from iree.compiler import ir

    module = load.operation  # Operations, not OpViews: an OpView's `.name` may be its symbol
    while module.parent is not None and module.name != "builtin.module":
        module = module.parent.operation
    for op in (o.operation for o in module.regions[0].blocks[0].operations):
        if op.name == "util.global" and f"@{ir.StringAttr(op.attributes['sym_name']).value}" == name:
            return op.attributes["initial_value"] if "initial_value" in op.attributes else None
    return None


def evaluates_to_arange(value: ir.Value) -> bool:
    """Whether a 1-D integer tensor holds 0, 1, ..., n - 1 (positions: IREE's form of a gather
    of every key, its indices a hoisted global)."""
    try:
        shape, values = _shape(value.type), _evaluate(value)
    except _Unreadable:
        return False
    return len(shape) == 1 and values.dtype.kind == "i" and np.array_equal(np.broadcast_to(values, shape), np.arange(shape[0]))


def _same(op: ir.Operation, value: ir.Value) -> np.ndarray:
    return _evaluate(op.operands[0])


def _generic(op: ir.Operation, value: ir.Value) -> np.ndarray:
    """A linalg.generic of plain projections (a broadcast, a transpose, elementwise ops, or a
    mask built from linalg.index and comparisons), evaluated over its loops."""
    from iree.compiler import ir

    maps = [map_dims(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    if None in maps:
        raise _Unreadable("a linalg.generic whose maps are not projections")
    iterators = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    if any("parallel" not in t for t in iterators):
        raise _Unreadable("a linalg.generic that reduces")
    loops = len(iterators)
    sizes: dict[int, int] = {}
    for operand, dims in zip(op.operands, maps):
        sizes.update(zip(dims, _shape(operand.type)))
    if len(sizes) != loops:
        raise _Unreadable("a linalg.generic with a loop no operand spans")
    block = op.regions[0].blocks[0]
    known: dict = {}
    for arg, operand, dims in zip(block.arguments, op.operands, maps):
        if any(True for _ in arg.uses):  # an unread `outs` (an empty tensor) is never evaluated
            known[arg] = _to_loops(_evaluate(operand), dims, loops)
    for inner in block.operations:
        if inner.name == "linalg.yield":
            result = list(op.results).index(value)
            out_dims = maps[len(op.operands) - len(op.results) + result]
            return _from_loops(_get(known, inner.operands[result]), out_dims, loops)
        known[inner.results[0]] = _body_op(inner, known, sizes, loops)
    raise _Unreadable("a linalg.generic without a yield")


def read_body_mask(op: ir.Operation, value: ir.Value) -> MaskForm:
    """The form of a boolean that `op`'s body (a generic of loops [.., q, k]) computes from
    inputs the kit can evaluate (transformers' arange compares, k <= q or q >= 0, anded by IREE's
    fusion into the select of the scores' generic), over the generic's loops."""
    from iree.compiler import ir

    try:
        maps = [map_dims(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
        if None in maps:
            raise _Unreadable("a linalg.generic whose maps are not projections")
        loops = len(maps[-1])
        sizes: dict[int, int] = {}
        for operand, dims in zip(op.operands, maps):
            sizes.update(zip(dims, _shape(operand.type)))
        block = op.regions[0].blocks[0]
        args, made = list(block.arguments), {r: inner for inner in block.operations for r in inner.results}
        known: dict = {}

        def fill(v: ir.Value) -> None:
            if v in known:
                return
            if v in args:
                index = args.index(v)
                known[v] = _to_loops(_evaluate(op.operands[index]), maps[index], loops)
            elif v in made:
                for operand in made[v].operands:
                    fill(operand)
                known[v] = _body_op(made[v], known, sizes, loops)

        fill(value)
        values = np.asarray(_get(known, value))  # an array over the loops, broadcasting to their sizes
        values = values.reshape((1,) * loops) if values.ndim == 0 else values
        return _classify(values, "i1", tuple(sizes[i] for i in range(loops)), loops - 2, loops - 1)
    except _Unreadable as exc:
        return MaskForm(OTHER, f"a mask kitdispatch cannot read: {exc}")


def _to_loops(values: np.ndarray, dims: tuple[int, ...], loops: int) -> np.ndarray:
    """An operand's array (its axes are loop dims `dims`) as an array over all loops."""
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    moved = values.transpose(order)
    shape = [1] * loops
    for i, axis in enumerate(sorted(dims)):
        shape[axis] = moved.shape[i]
    return moved.reshape(shape)


def _from_loops(values: np.ndarray, dims: tuple[int, ...], loops: int) -> np.ndarray:
    if sorted(dims) != list(range(loops)):
        raise _Unreadable("a linalg.generic whose result map is not a permutation")
    values = np.asarray(values)
    return (values.reshape((1,) * loops) if values.ndim == 0 else values).transpose(dims)


def _get(known: dict, v: ir.Value) -> np.ndarray | float | int | bool:
    if v in known:
        return known[v]
    return _outside_scalar(v)  # a constant hoisted out of the body


def _body_op(op: ir.Operation, known: dict, sizes: dict[int, int], loops: int):
    from iree.compiler import ir

    name = op.name
    if name == "linalg.index":
        dim = ir.IntegerAttr(op.attributes["dim"]).value
        shape = [1] * loops
        shape[dim] = sizes[dim]
        return np.arange(sizes[dim], dtype=np.int64).reshape(shape)
    if name == "arith.constant":
        return _scalar(op.attributes["value"])
    args = [_get(known, v) for v in op.operands]
    if name == "arith.cmpi":
        return _CMPI[ir.IntegerAttr(op.attributes["predicate"]).value](*args)
    if name == "arith.cmpf":
        predicate = ir.IntegerAttr(op.attributes["predicate"]).value
        if predicate not in _CMPF:
            raise _Unreadable(f"arith.cmpf predicate {predicate}")
        return _CMPF[predicate](*args)
    if name in _CASTS:
        return _CASTS[name](args[0], str(op.results[0].type))
    if name not in _ELEMENTWISE:
        raise _Unreadable(f"a linalg.generic with {name} in its body")
    return _ELEMENTWISE[name](*args)


def _float_cast(x: np.ndarray | float, t: str) -> np.ndarray:
    if t not in _FLOATS:
        raise _Unreadable(f"a cast to {t}")
    return np.asarray(x).astype(_FLOATS[t])


def _int_cast(x: np.ndarray | int, t: str) -> np.ndarray:
    return np.asarray(x).astype(bool) if t == "i1" else np.asarray(x).astype(np.int64)


_CMPI: dict[int, Callable] = {
    0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater, 5: np.greater_equal,
    # unsigned: the indices and sizes a mask compares are never negative
    6: np.less, 7: np.less_equal, 8: np.greater, 9: np.greater_equal,
}
_CMPF: dict[int, Callable] = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal, 13: np.not_equal}
_CASTS: dict[str, Callable] = {
    "arith.extf": _float_cast, "arith.truncf": _float_cast, "arith.sitofp": _float_cast, "arith.uitofp": _float_cast,
    "arith.extui": _int_cast, "arith.extsi": _int_cast, "arith.trunci": _int_cast,
    "arith.index_cast": _int_cast, "arith.index_castui": _int_cast,
}
_ELEMENTWISE: dict[str, Callable] = {
    "arith.select": np.where, "arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply,
    "arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply, "arith.divf": np.divide,
    "arith.negf": np.negative, "arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor,
    "arith.maximumf": np.maximum, "arith.minimumf": np.minimum, "arith.maxsi": np.maximum, "arith.minsi": np.minimum,
}
_PRODUCERS: dict[str, Callable] = {
    "arith.constant": _constant,
    "linalg.fill": _fill,
    "linalg.generic": _generic,
    "tensor.collapse_shape": _reshape,
    "tensor.expand_shape": _reshape,
    "tensor.cast": _same,
    "util.global.load": _global,
    "tensor.extract_slice": _slice,
    "iree_tensor_ext.compute_barrier.start": _same,
    "iree_tensor_ext.compute_barrier.end": _same,
}
