"""Which ops of an imported model a kit kernel may stand in for.

The model is read with IREE's own MLIR bindings (`iree.compiler.ir`) at the stage where the
transform spec runs (after global optimization, see models.py). Each op of a kind that some
kernel `replaces` is checked against that kernel: element types, ranks, static sizes, the
limits of `replace_when`, and what the op computes beyond its types (a softmax's dimension,
a matmul's plain operand maps and zero accumulator, a linalg.generic's whole structure against
the kernel's pattern file, an attention's operand maps, scale, mask and score body). An op is
replaced only where the kernel computes exactly what it computes; every other op of those kinds
gets the reason.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kitdispatch._files import read_regular_file
from kitdispatch.errors import ManifestError
from kitdispatch.describe.kernel import Buffer, Kernel, value_out_of_range
from kitdispatch.describe.module import ModuleSpec

# The discardable attribute that marks an op for the spec: its value is the wrapper to call.
MARK_ATTRIBUTE = "kitdispatch.replace"

# Plain operand maps of the named ops: anything else (transposed or broadcast operands, which
# newer linalg spells as `indexing_maps` on the same op) is not a plain matmul.
_PLAIN_MAPS = {
    "linalg.matmul": "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, "
    "affine_map<(d0, d1, d2) -> (d0, d1)>]",
    "linalg.batch_matmul": "[affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>, "
    "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>]",
}
_MATMUL_RANK = {"linalg.matmul": 2, "linalg.batch_matmul": 3}

ATTENTION = "iree_linalg_ext.attention"
# A kernel that replaces attention computes O = softmax(Q K^T * scale) V on Q, K, V, O of one
# layout [b, h, s, d] (row-major, one s for queries and keys), with scale = 1/sqrt(d) in f32
# and no mask: the contract of kernels/attention (attention.cu computes rsqrtf(float(d))).
ATTENTION_HEAD_DIMS = (64, 128)
ATTENTION_BATCH_DIMS = 2  # the kernel's b and h; an op with one batch dim runs as b = 1


@dataclass(frozen=True)
class TensorFacts:
    """A ranked tensor type: MLIR's element type name and sizes (None: dynamic)."""

    dtype: str
    shape: tuple[int | None, ...]

    @property
    def text(self) -> str:
        return "x".join(["?" if d is None else str(d) for d in self.shape] + [self.dtype])

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class OpFacts:
    """One op of a replaceable kind, as IREE parsed it."""

    kind: str
    function: str  # the model function that holds it
    location: str
    inputs: tuple[TensorFacts, ...]  # the op's `ins`
    init: TensorFacts  # its `outs`
    result: TensorFacts
    dimension: int | None = None  # softmax: the dimension it normalizes
    plain_maps: bool = True  # matmul: no transposed or broadcast operand
    init_source: str = ""  # what makes the `outs` operand ("zero fill", "linalg.fill of 1.0", ...)
    structure: "GenericStructure | None" = None  # linalg.generic: what its body computes, and how
    attention: "AttentionFacts | None" = None  # iree_linalg_ext.attention: maps, scale, mask, body

    @property
    def zero_init(self) -> bool:
        return self.init_source == "zero fill"

    def describe(self) -> str:
        types = ", ".join(t.text for t in self.inputs)
        body = f" {{{self.structure.summary}}}" if self.structure else ""
        return f"{self.kind}{body} ({types}) -> {self.result.text} in @{self.function} at {self.location}"

    def to_json(self) -> dict:
        return {
            "op": self.kind,
            "function": self.function,
            "location": self.location,
            "inputs": [t.to_json() for t in self.inputs],
            "result": self.result.to_json(),
            **({"dimension": self.dimension} if self.dimension is not None else {}),
            **({"init": self.init_source} if self.kind in _MATMUL_RANK else {}),
            **({"body": self.structure.summary} if self.structure else {}),
            **({"attention": self.attention.to_json()} if self.attention else {}),
        }


@dataclass(frozen=True)
class Decision:
    """What happens to one op: the kernel that replaces it (None: kept), the op operands its
    function takes, and for every declared kernel that does not fit, why."""

    op: OpFacts
    kernel: Kernel | None
    operands: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()
    through: tuple[int, ...] = ()  # operands whose producer (a plain transpose) is skipped: its input is passed
    batch_dims: int | None = None  # attention: the op's batch dims, where fewer than the kernel's

    @property
    def function(self) -> str:
        """The `util.func` the spec calls in place of the op."""
        if self.batch_dims is not None:
            return f"{wrapper_name(self.kernel)}_batch{self.batch_dims}"
        return wrapper_name(self.kernel)

    @property
    def mark(self) -> str:
        """MARK_ATTRIBUTE's value: one per way of calling (function, skipped producers)."""
        return self.function + "".join(f"_through{i}" for i in self.through)

    def to_json(self) -> dict:
        data = self.op.to_json()
        if self.kernel is not None:
            data["kernel"] = self.kernel.name
            data["kernel_entry"] = self.kernel.entry  # its export: the dispatch's name in profiles
            data["function_called"] = self.function
        else:
            data["reasons"] = list(self.reasons)
        return data


def wrapper_name(kernel: Kernel) -> str:
    """The `util.func` the spec imports into the model (prefixed: model symbols stay free)."""
    return f"kitdispatch_{kernel.function}"


def replacing_kernels(spec: ModuleSpec) -> tuple[Kernel, ...]:
    kernels = tuple(k for k in spec.kernels if k.replaces is not None)
    if not kernels:
        raise ManifestError(
            f"no kernel of {spec.name} declares `replaces`",
            where=str(spec.root),
            fix='add replaces = ["linalg.softmax"] (or the op it stands in for) to the kernel in kitdispatch.toml',
        )
    for kernel in kernels:
        for kind in kernel.replaces.ops:
            check_kernel(kernel, kind)
    return kernels


# ------------------------------------------------------------------- reading the model


def read_ops(module, kinds: Sequence[str]) -> list[tuple[object, OpFacts]]:
    """Every op of `kinds` in the model (an `iree.compiler.ir.Module`), with its facts."""
    from iree.compiler import ir

    found: list[tuple[object, OpFacts]] = []

    def visit(op):
        if op.name in kinds and (op.name == ATTENTION or _takes_tensors(op)):  # attention: _attention_facts
            found.append((op, _facts(op)))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _takes_tensors(op) -> bool:
    """Whether the op has the form every kernel function has: ranked tensors in, at least one
    ranked tensor out. Others compute nothing a kernel could return: IREE lowers an ONNX
    Reciprocal with a `linalg.generic` of no `outs` and no result around a `cf.assert`, and a
    generic may take a scalar `ins` operand."""
    from iree.compiler import ir

    def ranked(t) -> bool:
        try:
            ir.RankedTensorType(t)
        except ValueError:  # the cast refuses anything else
            return False
        return True

    values = [v.type for v in op.operands] + [r.type for r in op.results]
    return bool(op.results) and all(ranked(t) for t in values)


def _facts(op) -> OpFacts:
    if op.name == ATTENTION:
        return _attention_facts(op)
    operands = [_tensor(v.type) for v in op.operands]
    attrs = op.attributes
    dimension = None
    if op.name == "linalg.softmax":
        from iree.compiler import ir

        dimension = ir.IntegerAttr(attrs["dimension"]).value
    plain = op.name not in _PLAIN_MAPS or (
        ("indexing_maps" not in attrs or str(attrs["indexing_maps"]) == _PLAIN_MAPS[op.name]) and "cast" not in attrs
    )
    split = len(operands) - max(1, len(op.results))  # `ins`, then one `outs` per result
    return OpFacts(
        kind=op.name,
        function=_function_of(op),
        location=_location(op),
        inputs=tuple(operands[:split]),
        init=operands[split],
        result=_tensor(op.results[0].type),
        dimension=dimension,
        plain_maps=plain,
        init_source=_init_source(op.operands[split]),
        structure=generic_structure(op) if op.name == "linalg.generic" else None,
    )


def _tensor(t) -> TensorFacts:
    from iree.compiler import ir

    ranked = ir.RankedTensorType(t)
    shape = tuple(None if ranked.is_dynamic_dim(i) else ranked.get_dim_size(i) for i in range(ranked.rank))
    return TensorFacts(str(ranked.element_type), shape)


def _init_source(value) -> str:
    """'zero fill' when the value is all zeros by construction: a linalg.fill of a zero
    constant, or a zero splat constant; else what makes it."""
    owner = value.owner
    name = _op_name(owner)
    if name == "linalg.fill":
        scalar = owner.operands[0].owner
        if getattr(scalar, "name", None) == "arith.constant":
            return "zero fill" if _is_zero(scalar.attributes["value"]) else f"linalg.fill of {scalar.attributes['value']}"
        return "linalg.fill of a computed value"
    if name == "arith.constant" and _is_zero(owner.attributes["value"]):
        return "zero fill"
    return name


def _is_zero(attr) -> bool:
    from iree.compiler import ir

    if isinstance(attr, ir.DenseElementsAttr):
        return attr.is_splat and _is_zero(attr.get_splat_value())
    return isinstance(attr, (ir.FloatAttr, ir.IntegerAttr)) and attr.value == 0


def _op_name(owner) -> str:
    """The name of the op that defines a value; a block's argument has none."""
    operation = getattr(owner, "operation", None)
    return operation.name if operation is not None else "a function argument"


def _function_of(op) -> str:
    parent = op.parent
    while parent is not None and "sym_name" not in parent.attributes:
        parent = parent.parent
    if parent is None:
        return "?"
    from iree.compiler import ir

    return ir.StringAttr(parent.attributes["sym_name"]).value


def _location(op) -> str:
    text = str(op.location)
    return text[4:-1] if text.startswith("loc(") and text.endswith(")") else text


# ----------------------------------------------------------------- iree_linalg_ext.attention


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

    def to_json(self) -> dict:
        return {"scale": self.scale_text, "mask": self.mask, "v_through_transpose": self.v_transposed}


def _attention_facts(op) -> OpFacts:
    """ins(Q, K, V, scale[, mask]) outs(O), with one indexing map per operand (the scale's `()`)."""
    from iree.compiler import ir

    maps = [_dims(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    masked = len(op.operands) == 6
    q, k, v = (op.operands[i] for i in range(3))
    v_map, v_value, transposed = maps[2], v, False
    permutation = _plain_transpose(v.owner)
    if permutation is not None and v_map is not None:
        v_map, v_value, transposed = tuple(v_map[p] for p in permutation), v.owner.operands[0], True
    scale = op.operands[3].owner
    constant = _op_name(scale) == "arith.constant" and isinstance(scale.attributes["value"], ir.FloatAttr)
    body = list(op.regions[0].blocks[0].operations)
    plain = len(body) == 1 and body[0].operation.name == "iree_linalg_ext.yield" and list(body[0].operands) == [
        op.regions[0].blocks[0].arguments[0]
    ]
    return OpFacts(
        kind=op.name,
        function=_function_of(op),
        location=_location(op),
        inputs=tuple(_tensor(x.type) for x in (q, k, v_value)),
        init=_tensor(op.operands[-1].type),
        result=_tensor(op.results[0].type),
        attention=AttentionFacts(
            maps=(maps[0], maps[1], v_map, maps[-1]),
            loops=ir.AffineMapAttr(ir.ArrayAttr(op.attributes["indexing_maps"])[0]).value.n_dims,
            v_transposed=transposed,
            scale=ir.FloatAttr(scale.attributes["value"]).value if constant else None,
            scale_text=str(scale.attributes["value"]) if constant else f"computed by {_op_name(scale)}",
            mask=_op_name(op.operands[4].owner) if masked else None,
            plain_scores=plain,
        ),
    )


def _dims(attr) -> tuple[int, ...] | None:
    """An affine map's results as loop dims; None where one is not a plain dim."""
    from iree.compiler import ir

    results = ir.AffineMapAttr(attr).value.results
    if not all(isinstance(e, ir.AffineDimExpr) for e in results):  # results come downcast
        return None
    return tuple(e.position for e in results)


def _plain_transpose(owner) -> tuple[int, ...] | None:
    """For a linalg.generic that only transposes its one input (identity output map, a
    permutation for the input, a body that yields the input element), the input map's dims:
    dim j of the input is dim permutation[j] of the output. None for anything else."""
    from iree.compiler import ir

    if _op_name(owner) != "linalg.generic" or len(owner.operands) != 2 or len(owner.results) != 1:
        return None
    s = generic_structure(owner)
    maps = [_dims(a) for a in ir.ArrayAttr(owner.attributes["indexing_maps"])]
    rank = len(s.iterator_types)
    if None in maps or maps[1] != tuple(range(rank)) or sorted(maps[0]) != list(range(rank)):
        return None
    if set(s.iterator_types) != {"parallel"} or [(b.name, b.operands) for b in s.body] != [("linalg.yield", ("input 0",))]:
        return None
    return maps[0]


# ------------------------------------------------------------------ linalg.generic


@dataclass(frozen=True)
class BodyOp:
    """One op of a generic's body. Operands are named for what they are: `input 0` / `output 0`
    (the body's arguments), `op 2` (the result of the body's third op), or `constant 3 : i64`
    (an arith.constant, inside the body or captured from outside: IREE hoists them)."""

    name: str
    operands: tuple[str, ...]
    attributes: tuple[tuple[str, str], ...]
    results: tuple[str, ...]  # their types


@dataclass(frozen=True)
class GenericStructure:
    """Everything a linalg.generic computes, apart from its tensors' types and sizes."""

    inputs: int
    outputs: int
    iterator_types: tuple[str, ...]
    indexing_maps: tuple[str, ...]
    arguments: tuple[str, ...]  # the body's argument types
    body: tuple[BodyOp, ...]

    @property
    def summary(self) -> str:
        return ", ".join(op.name.split(".")[-1] for op in self.body if op.name != "linalg.yield")

    @property
    def reads_output(self) -> bool:
        return any(f"output {i}" in op.operands for op in self.body for i in range(self.outputs))


_WITH_REGIONS = " (with regions)"


def generic_structure(op) -> GenericStructure:
    from iree.compiler import ir

    inputs = len(op.operands) - len(op.results)
    block = op.regions[0].blocks[0]
    names = {arg: f"input {i}" if i < inputs else f"output {i - inputs}" for i, arg in enumerate(block.arguments)}
    body = []
    for inner in block.operations:
        inner = inner.operation
        if inner.name == "arith.constant":
            continue  # a constant is named by its value where it is used
        for n, r in enumerate(inner.results):
            names[r] = f"op {len(body)}" + (f"#{n}" if n else "")
        body.append(
            BodyOp(
                inner.name + (_WITH_REGIONS if len(inner.regions) else ""),
                tuple(_operand_name(v, names) for v in inner.operands),
                tuple(sorted((k, str(inner.attributes[k])) for k in inner.attributes)),
                tuple(str(r.type) for r in inner.results),
            )
        )
    return GenericStructure(
        inputs=inputs,
        outputs=len(op.results),
        iterator_types=tuple(_iterator(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])),
        indexing_maps=tuple(str(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"])),
        arguments=tuple(str(a.type) for a in block.arguments),
        body=tuple(body),
    )


def _operand_name(value, names: dict) -> str:
    if value in names:
        return names[value]
    owner = value.owner
    if _op_name(owner) == "arith.constant":
        return f"constant {owner.operation.attributes['value']}"
    return f"a value from outside the op ({_op_name(owner)})"


def _iterator(attr) -> str:
    text = str(attr)  # #linalg.iterator_type<parallel>
    return text[text.index("<") + 1 : -1] if "<" in text else text


def structure_mismatch(op: GenericStructure, pattern: GenericStructure) -> str | None:
    """The first way `op` differs from `pattern`, in words; None when they are the same."""
    if (op.inputs, op.outputs) != (pattern.inputs, pattern.outputs):
        return f"the op has {op.inputs} input(s) and {op.outputs} output(s), the pattern {pattern.inputs} and {pattern.outputs}"
    if op.iterator_types != pattern.iterator_types:
        return f"iterator types: the op's are [{', '.join(op.iterator_types)}], the pattern's [{', '.join(pattern.iterator_types)}]"
    for i, (mine, theirs) in enumerate(zip(op.indexing_maps, pattern.indexing_maps)):
        if mine != theirs:
            return f"indexing map of operand {i}: the op's is {mine}, the pattern's {theirs}"
    if op.arguments != pattern.arguments:
        return f"body argument types: the op's are ({', '.join(op.arguments)}), the pattern's ({', '.join(pattern.arguments)})"
    for i, (mine, theirs) in enumerate(zip(op.body, pattern.body)):
        if mine.name != theirs.name:
            return f"body op {i}: the op has {mine.name}, the pattern {theirs.name}"
        if mine.operands != theirs.operands:
            return f"body op {i} ({mine.name}): operands ({', '.join(mine.operands)}), the pattern's ({', '.join(theirs.operands)})"
        if mine.attributes != theirs.attributes or mine.results != theirs.results:
            return f"body op {i} ({mine.name}): attributes or result types differ ({_op_text(mine)} vs the pattern's {_op_text(theirs)})"
    if len(op.body) != len(pattern.body):
        return f"the op's body has {len(op.body)} ops, the pattern's {len(pattern.body)}"
    return None


def _op_text(op: BodyOp) -> str:
    attrs = ", ".join(f"{k} = {v}" for k, v in op.attributes)
    return f"{{{attrs}}} -> ({', '.join(op.results)})"


@dataclass(frozen=True)
class Pattern:
    """A kernel's pattern file: the one linalg.generic it computes, and that op's tensor types."""

    path: Path
    structure: GenericStructure
    operands: tuple[TensorFacts, ...]  # ins, then the outs


def load_pattern(path: Path) -> Pattern:
    where = str(path)
    try:
        text = read_regular_file(path).decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"cannot read the pattern: {exc}", where=where, fix="point replace_when.pattern at an MLIR file") from None
    return _parse_pattern(path, text)


@functools.lru_cache(maxsize=64)
def _parse_pattern(path: Path, text: str) -> Pattern:
    from iree.compiler import ir

    where, fix = str(path), "write one func.func holding one linalg.generic (see kernels/elementwise/bias_gelu.pattern.mlir)"
    try:
        module = ir.Module.parse(text, ir.Context())
    except Exception as exc:  # MLIRError: the parser's diagnostics say where
        raise ManifestError(f"the pattern is not valid MLIR: {exc}", where=where, fix=fix) from None
    generics = []

    def visit(op):
        if op.name == "linalg.generic":
            generics.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if len(generics) != 1:
        raise ManifestError(f"the pattern holds {len(generics)} linalg.generic ops, not one", where=where, fix=fix)
    op = generics[0]
    if len(op.results) != 1:
        raise ManifestError("the pattern's generic must have one result, as the kernel writes one buffer", where=where, fix=fix)
    structure = generic_structure(op)
    outside = [o for b in structure.body for o in b.operands if o.startswith("a value from outside")]
    if outside:
        raise ManifestError(
            f"the pattern's body uses {outside[0]}, which no kernel argument carries", where=where,
            fix="use only the body's arguments and constants",
        )
    nested = [b.name for b in structure.body if b.name.endswith(_WITH_REGIONS)]
    if nested:  # their insides are not compared, so they could not tell two ops apart
        raise ManifestError(f"the pattern's body holds {nested[0]}, which kitdispatch cannot compare", where=where, fix=fix)
    try:
        operands = tuple(_tensor(v.type) for v in op.operands)
    except ValueError:
        raise ManifestError("the pattern's generic must work on ranked tensors", where=where, fix=fix) from None
    return Pattern(path, structure, operands)


# ------------------------------------------------------------- what a kernel stands for


@dataclass(frozen=True)
class _Layout:
    """A kernel's buffers in the op's roles: inputs in op operand order, then the result."""

    inputs: tuple[Buffer, ...]
    result: Buffer
    accumulates: bool  # the result is an inout buffer that starts as the op's `outs`
    pattern: Pattern | None = None  # linalg.generic: what the op must be


def check_kernel(kernel: Kernel, kind: str) -> _Layout:
    """The kernel's params must be able to compute `kind` at all; else a ManifestError
    (what is missing is a description problem, not a property of one op)."""
    where = f"kernel {kernel.name}: replaces {kind}"
    scalar_args = [p.name for p in kernel.function_arguments if not isinstance(p, Buffer)]
    if scalar_args:
        raise ManifestError(
            f"its function needs scalar argument(s) {', '.join(scalar_args)}, which {kind} does not give",
            where=where,
            fix="give each such scalar a value (value = ...) or name it after a dimension",
        )
    results = [b for b in kernel.buffers if b.is_result]
    args = [b for b in kernel.buffers if b.is_argument]
    if len(results) != 1:
        raise ManifestError(
            f"it writes {len(results)} buffers; {kind} has one result", where=where, fix="replace ops with one kernel result"
        )
    result = results[0]
    accumulates = result.access == "inout"
    if kind == "linalg.softmax":
        _expect(len(args) == 1 and not accumulates, "it must take one input tensor and write one new result", where)
        _expect(args[0].type.shape == result.type.shape, "its input and result must have the same shape", where)
        rank = len(result.type.shape)
        dim = kernel.replaces.dimension
        _expect(rank >= 1 and (dim is None or -rank <= dim < rank), f"replace_when dimension {dim} is not a dimension of its {rank}-D input", where)
    elif kind == ATTENTION:
        _expect(len(args) == 3 and not accumulates, "it must take Q, K and V in that order and write one new result O", where)
        shapes = {b.type.shape for b in args + [result]}
        dtypes = {b.type.dtype for b in args + [result]}
        _expect(
            len(shapes) == 1 and len(dtypes) == 1 and len(result.type.shape) == ATTENTION_BATCH_DIMS + 2,
            "Q, K, V and O must be one type [b, h, s, d] (same names, one element type)",
            where,
        )
    elif kind == "linalg.generic":
        pattern = load_pattern(kernel.replaces.pattern)
        return _Layout(tuple(args[:-1]) if accumulates else tuple(args), result, accumulates, _check_pattern(pattern, args, result, where))
    else:
        rank = _MATMUL_RANK[kind]
        wanted = 3 if accumulates else 2
        _expect(len(args) == wanted, f"it must take A and B{' and the accumulator' if accumulates else ''} in that order", where)
        a, b, c = args[0].type.shape, args[1].type.shape, result.type.shape
        batch = "[batch,m,k] x [batch,k,n] -> [batch,m,n]" if rank == 3 else "[m,k] x [k,n] -> [m,n]"
        ok = all(len(s) == rank for s in (a, b, c)) and a[-1] == b[-2] and a[-2] == c[-2] and b[-1] == c[-1]
        _expect(ok and (rank == 2 or a[0] == b[0] == c[0]), f"its shapes must read {batch} (same names where sizes agree)", where)
    return _Layout(tuple(args[:2]) if accumulates else tuple(args), result, accumulates)


def _check_pattern(pattern: Pattern, args: list[Buffer], result: Buffer, where: str) -> Pattern:
    """The kernel's buffers must be the pattern's operands: its inputs in order (then the
    output, inout, where the body reads it), of the same element types and ranks."""
    s = pattern.structure
    wanted = s.inputs + s.reads_output
    _expect(
        len(args) == wanted and (result.access == "inout") == s.reads_output and (not s.reads_output or args[-1] is result),
        f"its buffers must be the {s.inputs} input(s) of the pattern ({pattern.path.name}) in order, and its result "
        + ("inout: the pattern reads its output" if s.reads_output else "out: the pattern does not read its output"),
        where,
    )
    buffers = args[:s.inputs] + [result]
    for i, (tensor, buffer) in enumerate(zip(pattern.operands, buffers)):
        want = buffer.type
        _expect(
            tensor.dtype == want.dtype and len(tensor.shape) == len(want.shape),
            f"operand {i} of the pattern is {tensor.text}, the kernel's {buffer.name} is {want}",
            where,
        )
    return pattern


def _expect(ok: bool, what: str, where: str) -> None:
    if not ok:
        raise ManifestError(what, where=where, fix="fix the kernel's params, or remove this op from its replaces")


def decide(ops: Sequence[OpFacts], kernels: Sequence[Kernel]) -> list[Decision]:
    """Per op, the first kernel (in manifest order) that computes exactly what it computes."""
    decisions = []
    for op in ops:
        reasons = []
        for kernel in kernels:
            if op.kind not in kernel.replaces.ops:
                continue
            layout = check_kernel(kernel, op.kind)
            why = mismatch(op, kernel, layout)
            if why is None:
                decisions.append(_replacement(op, kernel, layout))
                break
            reasons.append(f"{kernel.name}: {why}")
        else:
            decisions.append(Decision(op, None, reasons=tuple(reasons)))
    return decisions


def _replacement(op: OpFacts, kernel: Kernel, layout: _Layout) -> Decision:
    operands = tuple(range(len(op.inputs) + layout.accumulates))
    if op.attention is None:
        return Decision(op, kernel, operands)
    batch = len(op.attention.maps[0]) - 2
    return Decision(
        op, kernel, operands, through=(2,) if op.attention.v_transposed else (),
        batch_dims=batch if batch < ATTENTION_BATCH_DIMS else None,
    )


def mismatch(op: OpFacts, kernel: Kernel, layout: _Layout) -> str | None:
    """Why `kernel` does not compute exactly what `op` computes, or None when it does."""
    semantic = _semantic_mismatch(op, kernel, layout)
    if semantic:
        return semantic
    sizes: dict[str, int | None] = {}
    if op.attention is not None:
        return _attention_mismatch(op, layout, sizes) or value_out_of_range(kernel, sizes)
    pairs = [(f"input {i}", t, b) for i, (t, b) in enumerate(zip(op.inputs, layout.inputs))]
    if layout.accumulates:
        pairs.append(("accumulator", op.init, layout.result))
    pairs.append(("result", op.result, layout.result))
    for role, tensor, buffer in pairs:
        why = _type_mismatch(role, tensor, buffer, sizes)
        if why:
            return why
    return _limit_mismatch(kernel, sizes) or value_out_of_range(kernel, sizes)


def _semantic_mismatch(op: OpFacts, kernel: Kernel, layout: _Layout) -> str | None:
    if op.attention is not None:
        return _attention_semantic_mismatch(op.attention)
    if op.kind == "linalg.generic":
        why = structure_mismatch(op.structure, layout.pattern.structure)
        return f"not the pattern {layout.pattern.path.name}: {why}" if why else None
    if op.kind == "linalg.softmax":
        rank = len(layout.result.type.shape)
        wanted = kernel.replaces.dimension if kernel.replaces.dimension is not None else rank - 1
        if len(op.result.shape) == rank and op.dimension != wanted % rank:
            return f"the op normalizes dimension {op.dimension}, the kernel dimension {wanted % rank}"
        return None
    if not op.plain_maps:
        return "the op's operands are transposed, broadcast or cast (not a plain matmul)"
    if not layout.accumulates and not op.zero_init:
        return f"the op accumulates into {op.init_source}, not a zero fill, and the kernel does not accumulate"
    return None


def _type_mismatch(role: str, tensor: TensorFacts, buffer: Buffer, sizes: dict[str, int | None]) -> str | None:
    want = buffer.type
    if tensor.dtype != want.dtype:
        return f"element type: the op's {role} is {tensor.text}, the kernel's {buffer.name} is {want}"
    if len(tensor.shape) != len(want.shape):
        return f"rank: the op's {role} is {tensor.text} ({len(tensor.shape)}-D), the kernel's {buffer.name} is {want} ({len(want.shape)}-D)"
    for axis, (size, dim) in enumerate(zip(tensor.shape, want.shape)):
        if isinstance(dim, int):
            if size != dim:
                given = "dynamic" if size is None else str(size)
                return f"shape: dimension {axis} of the op's {role} ({tensor.text}) is {given}, the kernel's {buffer.name} needs {dim}"
        elif dim in sizes and None not in (sizes[dim], size) and sizes[dim] != size:
            return f"shape: {dim} is {sizes[dim]} elsewhere but {size} in the op's {role} ({tensor.text})"
        elif sizes.get(dim) is None:
            sizes[dim] = size
    return None


def _limit_mismatch(kernel: Kernel, sizes: dict[str, int | None]) -> str | None:
    for symbol, divisor in kernel.replaces.multiple_of:
        size = sizes.get(symbol)
        if size is None:
            return f"limit: {symbol} is dynamic in the model, and must be a multiple of {divisor}, which cannot be checked"
        if size % divisor:
            return f"limit: {symbol} = {size} is not a multiple of {divisor}"
    for symbol, largest in kernel.replaces.max_size:
        size = sizes.get(symbol)
        if size is None:
            return f"limit: {symbol} is dynamic in the model, and must be at most {largest}, which cannot be checked"
        if size > largest:
            return f"limit: {symbol} = {size} is over the kernel's maximum {largest}"
    return None


# ------------------------------------------------------------- attention against the kernel

_ATTENTION_ROLES = ("Q", "K", "V", "O")


def _attention_semantic_mismatch(a: AttentionFacts) -> str | None:
    """The op must be plain attention in the kernel's layout: Q (batch, m, k1), K (batch, k2, k1),
    V (batch, k2, n), O (batch, m, n), with no mask and an unmodified score."""
    if a.mask is not None:
        return f"the op has a mask operand (made by {a.mask}), and the kernel takes no mask"
    if not a.plain_scores:
        return "the op's score region changes the scores, and the kernel uses them as they are"
    if not _kernel_layout(a):
        shown = ", ".join(f"{r} {_map_text(m, a.loops)}" for r, m in zip(_ATTENTION_ROLES, a.maps))
        return (
            f"operand maps: {shown}{' (V read through its transpose)' if a.v_transposed else ''}; the kernel reads "
            "Q (batch, m, k1), K (batch, k2, k1), V (batch, k2, n), O (batch, m, n) with one or two batch dims"
        )
    return None


def _kernel_layout(a: AttentionFacts) -> bool:
    q, k, v, o = a.maps
    if None in a.maps or not len(q) == len(k) == len(v) == len(o) or not 3 <= len(q) <= ATTENTION_BATCH_DIMS + 2:
        return False
    batch, m, k1, k2, n = q[:-2], q[-2], q[-1], k[-2], v[-1]
    return (
        k == batch + (k2, k1) and v == batch + (k2, n) and o == batch + (m, n)
        and len(set(batch + (m, k1, k2, n))) == len(batch) + 4 == a.loops
    )


def _map_text(dims: tuple[int, ...] | None, loops: int) -> str:
    return "(not a projection)" if dims is None else f"({', '.join(f'd{i}' for i in dims)}) of {loops} loops"


def _attention_mismatch(op: OpFacts, layout: _Layout, sizes: dict[str, int | None]) -> str | None:
    """Types and sizes in the kernel's [b, h, s, d] (an op with one batch dim runs as b = 1),
    the head dim, one static s for queries and keys, and the scale the kernel computes.
    Fills `sizes` with the kernel's dimensions."""
    tensors = list(op.inputs) + [op.result]
    pad = ATTENTION_BATCH_DIMS + 2 - len(op.result.shape)
    buffers = list(layout.inputs) + [layout.result]
    for role, tensor, buffer in zip(_ATTENTION_ROLES, tensors, buffers):
        if tensor.dtype != buffer.type.dtype:
            return f"element type: the op's {role} is {tensor.text}, the kernel's {buffer.name} is {buffer.type}"
        padded = TensorFacts(tensor.dtype, (1,) * pad + tensor.shape)
        why = _type_mismatch(role, padded, buffer, sizes)
        if why:
            return why
    unknown = [r for r, t in zip(_ATTENTION_ROLES, tensors) if None in t.shape[-2:]]
    if unknown:
        return f"shape: the sequence length or head dim of {unknown[0]} is dynamic, and the kernel's must be checked"
    head, seq_q, seq_k = op.inputs[0].shape[-1], op.inputs[0].shape[-2], op.inputs[1].shape[-2]
    if seq_q != seq_k:
        return f"shape: {seq_q} queries and {seq_k} keys; the kernel takes one sequence length for both"
    if head not in ATTENTION_HEAD_DIMS:
        return f"head dim {head}: the kernel has code for {' and '.join(map(str, ATTENTION_HEAD_DIMS))} only"
    return _scale_mismatch(op.attention, head)


def _scale_mismatch(a: AttentionFacts, head: int) -> str | None:
    import numpy as np

    wanted = np.float32(1.0 / np.sqrt(np.float64(head)))
    if a.scale is None:
        return f"the op's scale is {a.scale_text}, not a constant; the kernel's is 1/sqrt({head}) = {wanted}"
    if np.float32(a.scale) != wanted:
        return f"the op's scale is {a.scale_text}, the kernel's 1/sqrt({head}) = {wanted} (f32)"
    return None
