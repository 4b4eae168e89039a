"""linalg.matmul: C = A B ([m,k] x [k,n] -> [m,n]) or, with indexing maps reading B transposed,
C = A W^T (W [n,k]: nn.Linear's weight, as IREE's global optimization leaves `A @ W^T`), into a
zero fill unless the kernel accumulates (its result inout, taking the op's `outs`). A kernel
whose B is [k,n] takes the first, one whose B is [n,k] the second. batch_matmul.py is the same
contract with a leading batch dim; a batch_matmul of batch 1 also runs a 2-D kernel, through a
reshape that drops the unit batch dim."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass

from kitdispatch.describe.kernel import Kernel
from kitdispatch.models.ops import epilogue
from kitdispatch.models.ops.base import (
    Call,
    Layout,
    OpFacts,
    OpKind,
    Operand,
    Reshape,
    TensorFacts,
    destination_facts,
    expect,
    init_operand,
    kernel_buffers,
    op_name,
    tensor_facts,
)
from kitdispatch.models.ops.generic import Generic, plain_transpose

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

# How B is read: [k,n] ("nn") or [n,k] ("nt", C = A W^T), as the kernels' entry names say.
B_LAYOUTS = {"nn": "B [k,n]", "nt": "B transposed, W [n,k]"}


@dataclass(frozen=True)
class BSource:
    """Where the kernel reads B when the op's B is a transpose of the last two dims (a plain
    transpose generic, IREE's Q K^T), maybe collapsed (`tensor.collapse_shape` of the leading
    dims, the 4-D [b,h,n,k] K of attention as [b*h,k,n]): the transpose's input, as W [.., n, k].
    Also the batch-1 nn.Linear of torch exports, whose [n,k] weight IREE expands to [n,1,k] and
    transposes to [1,k,n]: `flat`, W read as [n,k] by a 2-D kernel only."""

    path: tuple[int, ...]  # Operand.path from the matmul
    reshape: Reshape | None  # the collapse, now of the transpose's input
    view: TensorFacts  # that input as the op's B would be, W [.., n, k] (the op's inputs hold it as it is)
    flat: bool = False  # unit dims moved by the transpose: `reshape` makes it [n,k] for a 2-D kernel


@dataclass(frozen=True)
class MatmulFacts:
    b_layout: str | None  # "nn" or "nt"; None: other maps (broadcast, A transposed) or a cast
    maps: str  # the op's indexing maps as IREE prints them ("plain" where it has none)
    init_source: str  # what makes the `outs` operand ("zero fill", "linalg.fill of 1.0", ...)
    b_source: BSource | None = None  # B read through its transpose (then b_layout is "nt")
    chain: epilogue.EpilogueChain | None = None  # the elementwise ops after it (epilogue.with_chain)

    @property
    def summary(self) -> str | None:
        return self.chain.summary if self.chain else None

    @property
    def zero_init(self) -> bool:
        return self.init_source == "zero fill"

    def to_json(self) -> dict:
        through = {"b_through_transpose": list(self.b_source.path)} if self.b_source else {}
        chain = self.chain.to_json() if self.chain else {}
        return {"init": self.init_source, "b_layout": self.b_layout, **through, **chain}


class Matmul(OpKind):
    """A named matmul op of `rank`-D operands. Its `indexing_maps` (newer linalg spells
    transposed and broadcast operands on the same op) must be the plain ones or the ones
    reading B transposed (`maps`: layout -> IREE's text of them); anything else is not a
    matmul a kernel computes."""

    # IREE's elementwise fusion first: the generics after a matmul are then those IREE would
    # fuse into its dispatch, which a kernel's epilogue replaces with it.
    prepare = Generic.prepare

    def __init__(self, name: str, rank: int, maps: dict[str, str], shapes: str) -> None:
        self.name, self.rank, self.maps, self.shapes = name, rank, maps, shapes

    def facts(self, op: ir.Operation) -> OpFacts:
        attrs = op.attributes
        maps = str(attrs["indexing_maps"]) if "indexing_maps" in attrs else self.maps["nn"]
        layout = next((name for name, text in self.maps.items() if text == maps), None)
        if "cast" in attrs:  # a cast on the operands (linalg's `cast` attribute): not a plain product
            layout = None
        shown = "plain" if "indexing_maps" not in attrs else maps
        facts = destination_facts(op, MatmulFacts(layout, shown, init_source(init_operand(op))))
        through = _transposed_b(op.operands[1]) if layout == "nn" else None
        if through is not None:
            source, w = through
            detail = MatmulFacts("nt", shown, facts.detail.init_source, source)
            facts = OpFacts(facts.kind, facts.function, facts.location, (facts.inputs[0], w, *facts.inputs[2:]), facts.init, facts.result, detail)
        return epilogue.with_chain(facts, op)

    def contract(self, kernel: Kernel, where: str) -> Layout:
        """A, B (or W), [the accumulator]; the kernel's rank is the op's, or 2 for a batched op
        (its batch-1 ops run the 2-D kernel)."""
        kernel, ending = epilogue.split_epilogue(kernel, where)
        args, result = kernel_buffers(kernel, self.name, where)
        accumulates = result.access == "inout"
        wanted = 3 if accumulates else 2
        expect(len(args) == wanted, f"it must take A and B{' and the accumulator' if accumulates else ''} in that order", where)
        a, b, c = args[0].type.shape, args[1].type.shape, result.type.shape
        if ending.name in epilogue.HEADS:  # C [nb, heads, seq, d]: m and n are A's and B's
            plain = len(a) == len(b) == 2 and not accumulates
            n = b[-1] if plain and b[0] == a[-1] else b[0]  # B [k,n], else W [n,k]
            layout = _b_layout(a, b, (a[0], n)) if plain else None
            expect(layout is not None, f"its epilogue {ending.name} takes A [m,k] and B [k,n] (or W [n,k]), 2-D, and a new result", where)
            return Layout(tuple(args[:2]) + ending.buffers, result, accumulates, pattern=layout, epilogue=ending)
        rank = len(c)
        ok = rank in {self.rank, 2} and all(len(s) == rank for s in (a, b, c)) and a[-2] == c[-2]
        layout = _b_layout(a, b, c) if ok else None
        expect(
            layout is not None and (rank == 2 or a[0] == b[0] == c[0]),
            f"its shapes must read {self.shapes} (same names where sizes agree; B may be [n,k]: C = A W^T)",
            where,
        )
        return Layout(tuple(args[:2]) + ending.buffers, result, accumulates, pattern=layout, epilogue=ending)

    def semantic_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout) -> str | None:
        facts = op.detail
        if facts.b_layout is None:
            return f"the op's operands are broadcast, cast or transposed in a way no kernel reads (indexing maps {facts.maps})"
        if facts.b_layout != layout.pattern:
            return f"the op reads {B_LAYOUTS[facts.b_layout]}; the kernel's {layout.inputs[1].name} is {B_LAYOUTS[layout.pattern]}"
        if not layout.accumulates and not facts.zero_init:
            return f"the op accumulates into {facts.init_source}, not a zero fill, and the kernel does not accumulate"
        if self._drops_batch(layout) and op.result.shape[0] != 1:
            given = "dynamic" if op.result.shape[0] is None else str(op.result.shape[0])
            return f"batch: the op's batch is {given}; the kernel is 2-D (it takes batch 1 only)"
        if self._drops_batch(layout) and layout.accumulates:
            return "batch: a batched op's accumulator does not reach a 2-D kernel that accumulates (only a zero-filled result)"
        if facts.b_source is not None and facts.b_source.flat and not self._drops_batch(layout):
            return "B is a weight [n,k] transposed with its unit batch dim moved; a 2-D kernel reads it, a batched one does not"
        form = epilogue.chosen(op, layout)
        same_inputs = all(t.dtype == b.type.dtype for t, b in zip(op.inputs, layout.inputs))  # else: the types' reason
        if isinstance(form, str):
            return form if same_inputs else None
        return epilogue.left_unfused(op, form)

    def sizes_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout, sizes: dict[str, int | None]) -> str | None:
        """As for any op, B as the op reads it where it comes through a transpose; a batch-1 op
        against a 2-D kernel without its unit batch dim."""
        op = epilogue.covered(op, layout, as_kernel=True)
        b = op.detail.b_source
        if b is not None:
            op = OpFacts(op.kind, op.function, op.location, (op.inputs[0], b.view, *op.inputs[2:]), op.init, op.result, op.detail)
        if self._drops_batch(layout):  # tensors of the op's rank (an epilogue's bias, or a chain that collapsed, not)
            drop = lambda t: TensorFacts(t.dtype, t.shape[1:]) if len(t.shape) == self.rank else t  # noqa: E731
            op = OpFacts(op.kind, op.function, op.location, tuple(map(drop, op.inputs)), drop(op.init), drop(op.result), op.detail)
        return super().sizes_mismatch(op, kernel, layout, sizes)

    def call(self, op: OpFacts, layout: Layout) -> Call:
        """A and B (B through its transpose where the facts found one) and the accumulator; a
        batch-1 op through reshapes that drop its batch dim."""
        count = len(op.inputs) + layout.accumulates
        drop = Reshape(((0, 1), (2,))) if self._drops_batch(layout) else None
        operands = [Operand((i,), drop) for i in range(count)]
        b = op.detail.b_source
        if b is not None:
            operands[1] = Operand(b.path, b.reshape if b.flat else _then(b.reshape, drop))
        return epilogue.epilogue_call(op, layout, Call(tuple(operands), result=drop, variant="_batch1" if drop else ""))

    def replaced(self, op: OpFacts, layout: Layout) -> OpFacts:
        return epilogue.covered(op, layout)

    def _drops_batch(self, layout: Layout) -> bool:
        return len(layout.inputs[0].type.shape) < self.rank  # A's rank (a heads kernel's C is 4-D)


def _transposed_b(b: ir.Value) -> tuple[BSource, TensorFacts] | None:
    """B as a transpose of the last two dims of a tensor W [.., n, k] (maybe collapsed after):
    where to read W and its facts as the op's B would be [.., n, k]; None where B is not that."""
    from iree.compiler import ir

    path, groups, owner = (1,), None, b.owner
    if op_name(owner) == "tensor.collapse_shape":
        groups = tuple(tuple(ir.IntegerAttr(i).value for i in g) for g in ir.ArrayAttr(owner.attributes["reassociation"]))
        rank = sum(map(len, groups))
        if groups[-2:] != ((rank - 2,), (rank - 1,)):  # n and k must stay dims of their own
            return None
        path, owner = path + (0,), owner.operands[0].owner
    permutation = plain_transpose(owner)
    if permutation is None or len(permutation) < 2:
        return None
    rank, w = len(permutation), tensor_facts(owner.operands[0].type)
    if permutation == (*range(rank - 2), rank - 1, rank - 2):
        view = TensorFacts(w.dtype, tuple(_product([w.shape[i] for i in g]) for g in groups)) if groups else w
        return BSource(path + (0,), Reshape(groups) if groups else None, view), w
    return _flat_weight(path + (0,), permutation, w, tensor_facts(owner.results[0].type)) if groups is None else None


def _flat_weight(path: tuple[int, ...], permutation: tuple[int, ...], w: TensorFacts, b: TensorFacts) -> tuple[BSource, TensorFacts] | None:
    """B [1,..,1,k,n] made by transposing W whose dims, unit dims aside, are [n, k] (torch's
    batch-1 nn.Linear: W [n,1,k] to [1,k,n]): W as [n,k] (a collapse), else None."""
    rank = len(permutation)
    if any(size != 1 for size in b.shape[:-2]):
        return None
    kept = [j for j in range(rank) if w.shape[j] != 1 or permutation[j] >= rank - 2]
    if [permutation[j] for j in kept] != [rank - 1, rank - 2]:
        return None
    n_at = kept[0]
    groups = (tuple(range(n_at + 1)), tuple(range(n_at + 1, rank)))
    view = TensorFacts(w.dtype, (1,) * (rank - 2) + (b.shape[-1], b.shape[-2]))
    return BSource(path, Reshape(groups), view, flat=True), w


def _product(sizes: list[int | None]) -> int | None:
    total = 1
    for size in sizes:
        if size is None:
            return None
        total *= size
    return total


def _then(first: Reshape | None, second: Reshape | None) -> Reshape | None:
    """Collapse `first` (the source's dims into the op's), then `second` (the op's into the
    kernel's), as one collapse of the source."""
    if first is None or second is None:
        return first or second
    return Reshape(tuple(tuple(d for j in group for d in first.groups[j]) for group in second.groups))


def _b_layout(a: tuple, b: tuple, c: tuple) -> str | None:
    """"nn" where B is [..., k, n], "nt" where it is [..., n, k], by the kernel's names."""
    k, n = a[-1], c[-1]
    if b[-2:] == (k, n):
        return "nn"
    return "nt" if b[-2:] == (n, k) else None


def init_source(value: ir.Value) -> str:
    """'zero fill' when the value is all zeros by construction: a linalg.fill of a zero
    constant, or a zero splat constant; else what makes it."""
    owner = value.owner
    name = op_name(owner)
    if name == "linalg.fill":
        scalar = owner.operands[0].owner
        if getattr(scalar, "name", None) == "arith.constant":
            return "zero fill" if _is_zero(scalar.attributes["value"]) else f"linalg.fill of {scalar.attributes['value']}"
        return "linalg.fill of a computed value"
    if name == "arith.constant" and _is_zero(owner.attributes["value"]):
        return "zero fill"
    return name


def _is_zero(attr: ir.Attribute) -> bool:
    from iree.compiler import ir

    if isinstance(attr, ir.DenseElementsAttr):
        return attr.is_splat and _is_zero(attr.get_splat_value())
    return isinstance(attr, (ir.FloatAttr, ir.IntegerAttr)) and attr.value == 0


KIND = Matmul(
    "linalg.matmul",
    rank=2,
    maps={
        "nn": "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>]",
        "nt": "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>]",
    },
    shapes="[m,k] x [k,n] -> [m,n]",
)
