"""Which ops of an imported model a kit kernel may stand in for.

The model is read with IREE's own MLIR bindings (`iree.compiler.ir`) at the stage where the
transform spec runs (after global optimization, see models.py). Each op of a kind that some
kernel `replaces` is checked against that kernel: element types, ranks, static sizes, the
limits of `replace_when`, and what the op computes beyond its types (a softmax's dimension,
a matmul's plain operand maps and zero accumulator). An op is replaced only where the kernel
computes exactly what it computes; every other op of those kinds gets the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ManifestError
from .spec import Buffer, Kernel, ModuleSpec

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

    @property
    def zero_init(self) -> bool:
        return self.init_source == "zero fill"

    def describe(self) -> str:
        types = ", ".join(t.text for t in self.inputs)
        return f"{self.kind} ({types}) -> {self.result.text} in @{self.function} at {self.location}"

    def to_json(self) -> dict:
        return {
            "op": self.kind,
            "function": self.function,
            "location": self.location,
            "inputs": [t.to_json() for t in self.inputs],
            "result": self.result.to_json(),
            **({"dimension": self.dimension} if self.dimension is not None else {}),
            **({"init": self.init_source} if self.kind in _MATMUL_RANK else {}),
        }


@dataclass(frozen=True)
class Decision:
    """What happens to one op: the kernel that replaces it (None: kept), the op operands its
    function takes, and for every declared kernel that does not fit, why."""

    op: OpFacts
    kernel: Kernel | None
    operands: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()

    def to_json(self) -> dict:
        data = self.op.to_json()
        if self.kernel is not None:
            data["kernel"] = self.kernel.name
            data["kernel_entry"] = self.kernel.entry  # its export: the dispatch's name in profiles
            data["function_called"] = wrapper_name(self.kernel)
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
        if op.name in kinds:
            found.append((op, _facts(op)))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _facts(op) -> OpFacts:
    operands = [_tensor(v.type) for v in op.operands]
    attrs = op.attributes
    dimension = None
    if op.name == "linalg.softmax":
        from iree.compiler import ir

        dimension = ir.IntegerAttr(attrs["dimension"]).value
    plain = op.name not in _PLAIN_MAPS or (
        ("indexing_maps" not in attrs or str(attrs["indexing_maps"]) == _PLAIN_MAPS[op.name]) and "cast" not in attrs
    )
    return OpFacts(
        kind=op.name,
        function=_function_of(op),
        location=_location(op),
        inputs=tuple(operands[:-1]),  # every replaceable kind has one `outs` operand, the last
        init=operands[-1],
        result=_tensor(op.results[0].type),
        dimension=dimension,
        plain_maps=plain,
        init_source=_init_source(op.operands[-1]),
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
    name = getattr(owner, "name", "a function argument")
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


# ------------------------------------------------------------- what a kernel stands for


@dataclass(frozen=True)
class _Layout:
    """A kernel's buffers in the op's roles: inputs in op operand order, then the result."""

    inputs: tuple[Buffer, ...]
    result: Buffer
    accumulates: bool  # matmul: the result is an inout buffer that starts as the op's `outs`


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
    else:
        rank = _MATMUL_RANK[kind]
        wanted = 3 if accumulates else 2
        _expect(len(args) == wanted, f"it must take A and B{' and the accumulator' if accumulates else ''} in that order", where)
        a, b, c = args[0].type.shape, args[1].type.shape, result.type.shape
        batch = "[batch,m,k] x [batch,k,n] -> [batch,m,n]" if rank == 3 else "[m,k] x [k,n] -> [m,n]"
        ok = all(len(s) == rank for s in (a, b, c)) and a[-1] == b[-2] and a[-2] == c[-2] and b[-1] == c[-1]
        _expect(ok and (rank == 2 or a[0] == b[0] == c[0]), f"its shapes must read {batch} (same names where sizes agree)", where)
    return _Layout(tuple(args[:2]) if accumulates else tuple(args), result, accumulates)


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
                operands = tuple(range(len(op.inputs) + layout.accumulates))
                decisions.append(Decision(op, kernel, operands))
                break
            reasons.append(f"{kernel.name}: {why}")
        else:
            decisions.append(Decision(op, None, reasons=tuple(reasons)))
    return decisions


def mismatch(op: OpFacts, kernel: Kernel, layout: _Layout) -> str | None:
    """Why `kernel` does not compute exactly what `op` computes, or None when it does."""
    semantic = _semantic_mismatch(op, kernel, layout)
    if semantic:
        return semantic
    pairs = [(f"input {i}", t, b) for i, (t, b) in enumerate(zip(op.inputs, layout.inputs))]
    if layout.accumulates:
        pairs.append(("accumulator", op.init, layout.result))
    pairs.append(("result", op.result, layout.result))
    sizes: dict[str, int | None] = {}
    for role, tensor, buffer in pairs:
        why = _type_mismatch(role, tensor, buffer, sizes)
        if why:
            return why
    return _limit_mismatch(kernel, sizes)


def _semantic_mismatch(op: OpFacts, kernel: Kernel, layout: _Layout) -> str | None:
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
