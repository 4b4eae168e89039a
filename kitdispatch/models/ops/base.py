"""What every replaceable op kind provides, and the helpers the kinds share.

An op kind (one module of this package, registered in `__init__.py`) knows four things of
its IREE op: the facts read from IREE's IR (`facts`), what params a kernel must have to stand
in for it (`contract`), whether a kernel computes exactly what one op computes (`mismatch`,
with the reason when it does not) and how the transform spec calls the kernel in the op's
place (`replacement`, `adapter`). replace.py and pipeline.py ask the registry and name no kind.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Protocol, TYPE_CHECKING

from kitdispatch.describe.kernel import Buffer, Kernel, value_out_of_range
from kitdispatch.describe.model_record import ModelTensor
from kitdispatch.errors import ManifestError
from kitdispatch.models.ops._bias import BiasProgram

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations


# A ranked tensor type (MLIR's element type name, sizes with None for dynamic): the model
# record's class, which the run side reads too; an op's tensors are the same record.
TensorFacts = ModelTensor


class KindFacts(Protocol):
    """What one op computes beyond its tensors' types, as its kind reads it."""

    @property
    def summary(self) -> str | None:  # shown in braces after the op's name in reports; None: nothing
        ...

    def to_json(self) -> dict:  # merged into the op's entry of the report
        ...


@dataclass(frozen=True)
class OpFacts:
    """One op of a replaceable kind, as IREE parsed it."""

    kind: str
    function: str  # the model function that holds it
    location: str
    inputs: tuple[TensorFacts, ...]  # the op's `ins` (as the kernel reads them)
    init: TensorFacts  # its `outs`
    result: TensorFacts
    detail: KindFacts  # the kind's own facts (a softmax's dimension, a generic's body, ...)

    def describe(self) -> str:
        types = ", ".join(t.text for t in self.inputs)
        body = f" {{{self.detail.summary}}}" if self.detail.summary is not None else ""
        return f"{self.kind}{body} ({types}) -> {self.result.text} in @{self.function} at {self.location}"

    def to_json(self) -> dict:
        return {
            "op": self.kind,
            "function": self.function,
            "location": self.location,
            "inputs": [t.to_json() for t in self.inputs],
            "result": self.result.to_json(),
            **self.detail.to_json(),
        }


@dataclass(frozen=True)
class Layout:
    """A kernel's buffers in the op's roles: inputs in op operand order, then the result."""

    inputs: tuple[Buffer, ...]
    result: Buffer
    accumulates: bool  # the result is an inout buffer that starts as the op's `outs`
    pattern: object | None = None  # the kind's own part of the contract (a generic's pattern)
    epilogue: object | None = None  # a matmul kernel's epilogue (epilogue.py's EpilogueLayout)


@dataclass(frozen=True)
class Preparation:
    """An iree-opt pass pipeline a kind needs run on the model before its ops are read."""

    pipeline: str
    pass_name: str  # for the model record's `matched_after`
    what: str  # in words, for the error when it fails


@dataclass(frozen=True)
class Reshape:
    """How one of the op's tensors becomes a kernel buffer (and the kernel's result the op's):
    a reassociation. Where the kernel's rank is lower, kernel dim i is the op dims `groups[i]`
    collapsed (a [b, h, s, c] softmax input as [b*h*s, c]: ((0, 1, 2), (3,))); where it is
    higher, op dim i is the kernel dims `groups[i]`, all but one of them unit dims ([8, s, d]
    as [1, 8, s, d]: ((0, 1), (2,), (3,))). Expanding a dynamic op dim takes its size from
    the op tensor itself, or for the result from argument `sizes_from` (of the result's shape)."""

    groups: tuple[tuple[int, ...], ...]
    sizes_from: int | None = None
    # The kernel's shape, where an expansion splits an op dim into several that are not unit
    # dims (a packed QKV projection [b, s, 3*h*d] as [b, s, 3, h, d]); its split dims are static.
    shape: tuple[int | None, ...] | None = None

    def collapses(self, rank: int) -> bool:
        """Whether an op tensor of `rank` dims is collapsed (else: expanded)."""
        return rank != len(self.groups)


@dataclass(frozen=True)
class Permuted:
    """An op tensor read as a kernel buffer through a copy: expanded to `shape` by `split` (a
    reassociation of the op tensor's dims), its dims permuted (dim i of the copy is dim
    `permutation[i]` of the expanded tensor), then collapsed by `merge`. An image [c, h, w] as
    the rows of its non-overlapping patches. IREE runs the copy as a transpose dispatch of its
    own; the shapes are static."""

    split: tuple[tuple[int, ...], ...]
    shape: tuple[int, ...]
    permutation: tuple[int, ...]
    merge: tuple[tuple[int, ...], ...]

    @property
    def permuted_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[i] for i in self.permutation)

    @property
    def merged_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(self.permuted_shape[i] for i in group) for group in self.merge)


@dataclass(frozen=True)
class Operand:
    """A tensor the kernel reads, found from the marked op: (i,) is its operand i, (i, j)
    operand j of the producer of its operand i, and so on up the producers; a last step
    CAPTURED, the tensor the body of the op reached reads by its one tensor.extract."""

    path: tuple[int, ...]
    reshape: Reshape | None = None
    tensor: TensorFacts | None = None  # its type, where it is not the op's input of its place (attention's layouts)
    bias: BiasProgram | None = None  # passed as the [b, t] bias this program computes from it (attention's key padding)
    permuted: Permuted | None = None  # read through a copy that reorders its elements (a patch conv's image)


@dataclass(frozen=True)
class Constant:
    """A 32-bit scalar argument the op fixes (a GELU's constant, a norm's eps), as MLIR."""

    type: str  # "f32", "i32"
    value: str  # the literal: "0.797884583"


# An operand path's last step that is no operand: the one tensor a `tensor.extract` in the body
# of the op reached reads, defined outside it (attention's key-padding flags at batch 1).
CAPTURED = -1


@dataclass(frozen=True)
class Call:
    """How the spec calls the kernel in one op's place. `arguments` in the kernel function's
    argument order. `marked`: the op replaced, 0 for the op the kind read (its anchor), N for
    N steps down the chain of single users of its result 0 (an epilogue after a matmul); the
    ops between, and the producers the operand paths pass, die with it. Where an argument is a
    Constant or anything is reshaped, the spec calls an adapter of the op's types (`variant`
    names it in reports)."""

    arguments: tuple[Operand | Constant, ...]
    result: Reshape | None = None
    marked: int = 0
    variant: str = ""
    # The kernel reads the op beyond the form it names (a kernel for shared K/V heads given one
    # per query head): chosen only where no kernel replacing as many ops reads the op as it is.
    fallback: bool = False

    @property
    def needs_adapter(self) -> bool:
        return self.result is not None or any(
            isinstance(a, Constant) or a.reshape is not None or a.bias is not None or a.permuted is not None for a in self.arguments
        )

    @property
    def operands(self) -> tuple[Operand, ...]:
        return tuple(a for a in self.arguments if isinstance(a, Operand))


def plain_call(count: int) -> Call:
    """The op's first `count` operands, as they are."""
    return Call(tuple(Operand((i,)) for i in range(count)))


class OpKind(ABC):
    """One replaceable op kind. Subclasses set `name` (IREE's op name) and implement the
    abstract methods; the defaults serve kinds whose ops take and give plain tensors."""

    name: str  # the key of the registry: IREE's op name, or the kind's own where it reads ops of another (`op`)
    # What runs on the model before its ops are read (IREE's elementwise fusion for generics).
    prepare: ClassVar[Preparation | None] = None
    # Named in the hint of a build that found no candidate (a kind most models hold, such as
    # linalg.generic, would be noise there).
    suggested: ClassVar[bool] = True
    # Whether its kernels name a pattern file (replace_when's `pattern`): describe/op_names.py's PATTERN_OPS.
    takes_pattern: ClassVar[bool] = False
    # Other IREE ops it reads as the anchor of a form spanning several ops (decomposed attention
    # ends in a matmul); such an op is read by its own kind too, and `claims` settles which wins.
    reads: ClassVar[tuple[str, ...]] = ()
    # Whether IREE fuses its ops with their neighbours inside a model otherwise than in a probe
    # of the op alone (a norm's reductions with the residual add before it and the cast after),
    # so that only the model itself tells whether the kernel saves time: tune then also times
    # the whole model with and without the replacement (models/probes.py, models/tune.py).
    timed_in_model: ClassVar[bool] = False

    def claims(self, op: ir.Operation) -> tuple:
        """The ops (ir.Operations, `op` among them) that a replacement of `op` removes: their
        own kinds' decisions give way to it."""
        return ()

    @property
    def op(self) -> str:
        """The IREE op this kind reads: its name, unless it says otherwise (a norm reads the
        linalg.generic that ends it)."""
        return self.name

    def candidate(self, op: ir.Operation) -> bool:
        """Whether an op of this kind is one a kernel could replace at all."""
        return takes_tensors(op)

    def covers(self, op: ir.Operation) -> list:
        """Other ops that this kind reads as part of `op` (a norm's reductions): no kind reads
        them as ops of their own."""
        return []

    @abstractmethod
    def facts(self, op: ir.Operation) -> OpFacts:
        """The op's facts, read from IREE's IR."""

    @abstractmethod
    def contract(self, kernel: Kernel, where: str) -> Layout:
        """The kernel's params in the op's roles; a ManifestError where they cannot compute
        this kind at all (a description problem, not a property of one op)."""

    @abstractmethod
    def semantic_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout) -> str | None:
        """Why the kernel computes something else than the op, beyond types and sizes."""

    def sizes_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout, sizes: dict[str, int | None]) -> str | None:
        """Types and sizes of the op's tensors against the kernel's buffers, then the limits
        of `replace_when`; fills `sizes` with the kernel's dimensions."""
        pairs = [(f"input {i}", t, b) for i, (t, b) in enumerate(zip(op.inputs, layout.inputs))]
        if layout.accumulates:
            pairs.append(("accumulator", op.init, layout.result))
        pairs.append(("result", op.result, layout.result))
        return pairs_mismatch(pairs, kernel, sizes)

    def mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout) -> str | None:
        """Why `kernel` does not compute exactly what `op` computes, or None when it does."""
        semantic = self.semantic_mismatch(op, kernel, layout)
        if semantic:
            return semantic
        sizes: dict[str, int | None] = {}
        return self.sizes_mismatch(op, kernel, layout, sizes) or value_out_of_range(kernel, sizes)

    def call(self, op: OpFacts, layout: Layout) -> Call:
        """How the spec calls the kernel in the op's place: its inputs, then the accumulator."""
        return plain_call(len(op.inputs) + layout.accumulates)

    def replaced(self, op: OpFacts, layout: Layout) -> OpFacts:
        """What the kernel replaces, as one op: the tensors its call reads (in its order) and the
        result of the op it marks. The op itself, unless the call reaches past it (a matmul's
        epilogue: the bias it adds, the f16 result of the last op it covers)."""
        return op


# ------------------------------------------------------------------- shared contract checks


def kernel_buffers(kernel: Kernel, kind: str, where: str) -> tuple[list[Buffer], Buffer]:
    """The kernel's argument buffers and its one result; every scalar must have a value."""
    scalar_args = [p.name for p in kernel.function_arguments if not isinstance(p, Buffer)]
    if scalar_args:
        raise ManifestError(
            f"its function needs scalar argument(s) {', '.join(scalar_args)}, which {kind} does not give",
            where=where,
            fix="give each such scalar a value (value = ...) or name it after a dimension",
        )
    results = [b for b in kernel.buffers if b.is_result]
    if len(results) != 1:
        raise ManifestError(
            f"it writes {len(results)} buffers; {kind} has one result", where=where, fix="replace ops with one kernel result"
        )
    return [b for b in kernel.buffers if b.is_argument], results[0]


def expect(ok: bool, what: str, where: str) -> None:
    if not ok:
        raise ManifestError(what, where=where, fix="fix the kernel's params, or remove this op from its replaces")


# ------------------------------------------------------------------- shared match checks


def type_mismatch(role: str, tensor: TensorFacts, buffer: Buffer, sizes: dict[str, int | None]) -> str | None:
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


def pairs_mismatch(pairs: list[tuple[str, TensorFacts, Buffer]], kernel: Kernel, sizes: dict[str, int | None]) -> str | None:
    """Each (role, the op's tensor, the kernel's buffer) by type_mismatch, then the kernel's limits."""
    for role, tensor, buffer in pairs:
        why = type_mismatch(role, tensor, buffer, sizes)
        if why:
            return why
    return limit_mismatch(kernel, sizes)


def limit_mismatch(kernel: Kernel, sizes: dict[str, int | None]) -> str | None:
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
    return condition_mismatch(kernel, sizes)


def condition_mismatch(kernel: Kernel, sizes: dict[str, int | None]) -> str | None:
    """replace_when's `when` over the op's sizes (a tile config's shape class)."""
    when = kernel.replaces.when
    if when is None:
        return None
    dynamic = [s for s in when.symbols if sizes.get(s) is None]
    if dynamic:
        return f"limit: {dynamic[0]} is dynamic in the model, and the condition {when.text!r} cannot be checked"
    given = ", ".join(f"{s} = {sizes[s]}" for s in when.symbols)
    try:
        holds = when.holds(sizes)
    except ZeroDivisionError:
        return f"limit: the condition {when.text!r} divides by zero for {given}"
    return None if holds else f"limit: the condition {when.text!r} is false for {given}"


# ------------------------------------------------------------------- reading IREE's IR


def takes_tensors(op: ir.Operation) -> bool:
    """Whether the op has the form every kernel function has: ranked tensors in, at least one
    ranked tensor out. Others compute nothing a kernel could return: IREE lowers an ONNX
    Reciprocal with a `linalg.generic` of no `outs` and no result around a `cf.assert`, and a
    generic may take a scalar `ins` operand."""
    from iree.compiler import ir

    def ranked(t: ir.Type) -> bool:
        try:
            ir.RankedTensorType(t)
        except ValueError:  # the cast refuses anything else
            return False
        return True

    values = [v.type for v in op.operands] + [r.type for r in op.results]
    return bool(op.results) and all(ranked(t) for t in values)


def tensor_facts(t: ir.Type) -> TensorFacts:
    from iree.compiler import ir

    ranked = ir.RankedTensorType(t)
    shape = tuple(None if ranked.is_dynamic_dim(i) else ranked.get_dim_size(i) for i in range(ranked.rank))
    return TensorFacts(str(ranked.element_type), shape)


def split_operands(op: ir.Operation) -> tuple[tuple[TensorFacts, ...], TensorFacts, TensorFacts]:
    """(ins, the first outs, the first result) of a destination-style op: `ins`, then one `outs` per result."""
    operands = [tensor_facts(v.type) for v in op.operands]
    split = len(operands) - max(1, len(op.results))
    return tuple(operands[:split]), operands[split], tensor_facts(op.results[0].type)


def init_operand(op: ir.Operation):
    """The op's first `outs` operand (a value)."""
    return op.operands[len(op.operands) - max(1, len(op.results))]


def op_name(owner: ir.Operation) -> str:
    """The name of the op that defines a value; a block's argument has none."""
    operation = getattr(owner, "operation", None)
    return operation.name if operation is not None else "a function argument"


def function_of(op: ir.Operation) -> str:
    parent = op.parent
    while parent is not None and "sym_name" not in parent.attributes:
        parent = parent.parent
    if parent is None:
        return "?"
    from iree.compiler import ir

    return ir.StringAttr(parent.attributes["sym_name"]).value


def location(op: ir.Operation) -> str:
    text = str(op.location)
    return text[4:-1] if text.startswith("loc(") and text.endswith(")") else text


def map_dims(attr: ir.Attribute) -> tuple[int, ...] | None:
    """An affine map's results as loop dims; None where one is not a plain dim."""
    from iree.compiler import ir

    results = ir.AffineMapAttr(attr).value.results
    if not all(isinstance(e, ir.AffineDimExpr) for e in results):  # results come downcast
        return None
    return tuple(e.position for e in results)


def destination_facts(op: ir.Operation, detail: KindFacts) -> OpFacts:
    """The facts of a destination-style op (`ins`, then one `outs` per result) with its kind's own."""
    inputs, init, result = split_operands(op)
    return OpFacts(op.name, function_of(op), location(op), inputs, init, result, detail)


def readers(value: ir.Value) -> list[ir.Operation]:
    """The distinct ops that read `value` (in MLIR's use-list order: latest use first). Ops compare and hash by the op they
    wrap; never key them by id(): each `.operation` is a new Python object, freed at once, so
    two readers can get the same recycled id and count as one (a silent miscount, seen as a
    softmax kept "for its one reader" that had two)."""
    seen: list[ir.Operation] = []
    for use in value.uses:
        if use.owner.operation not in seen:
            seen.append(use.owner.operation)
    return seen


def fused_consumer(value: ir.Value) -> str | None:
    """The op that reads `value` where it is its only reader and IREE's dispatch formation
    would fuse it into the producer's dispatch: a linalg.generic of parallel loops only (an
    elementwise op, a transpose or broadcast with a bias add); its body's ops, in words."""
    from iree.compiler import ir

    owners = readers(value)
    if len(owners) != 1:
        return None
    owner = owners[0]
    if owner.name != "linalg.generic" or not all("parallel" in str(a) for a in ir.ArrayAttr(owner.attributes["iterator_types"])):
        return None
    body = [o.operation.name.split(".")[-1] for o in owner.regions[0].blocks[0].operations if o.operation.name != "linalg.yield"]
    return f"linalg.generic {{{', '.join(body)}}}"
