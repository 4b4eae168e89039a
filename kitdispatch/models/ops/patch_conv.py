"""patch_conv: a convolution whose stride is its kernel size, without padding or dilation, which
cuts an image into non-overlapping patches (the patch embedding of ViT and the vision
transformers after it): x [n, c, h, w] * W [f, c, kh, kw] -> [n, f, h/kh, w/kw]. That is a matmul
of the patch matrix P [n*oh*ow, c*kh*kw] (row (n, oh, ow), column (c, i, j)) and W read as
[f, c*kh*kw] (B transposed, as nn.Linear's weight).

IREE's global optimization leaves it as a linalg.generic of seven loops (six at batch 1, the
unit batch dim folded) accumulating into a zero fill, its result read by one generic that adds
the bias and transposes it to [n, oh, ow, f] (ONNX Conv then flatten(2).transpose(1, 2), as HF
ViT writes it; IREE fuses that generic into the conv's dispatch). The kit replaces the two with
a matmul kernel of B [n,k] whose epilogue is what that generic computes (a bias add, or only
the rounding: matmul kernels declaring `patch_conv` with epilogue `bias` or `none`): the
adapter copies x into P (an expand_shape, a transpose IREE runs as a dispatch of its own, a
collapse_shape), reads W as [f, c*kh*kw] (a collapse, no copy), and the kernel's [n*oh*ow, f]
rows are the generic's [n, oh, ow, f]. A conv whose result is read otherwise (as an image
[n, f, oh, ow], by a second reader) is kept, with the reason.

Only convolutions of exactly that form are this kind's: any other conv generic (overlapping
windows, padding, dilation) stays linalg.generic's, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses
from dataclasses import dataclass

from kitdispatch.describe.kernel import Kernel
from kitdispatch.models.ops import epilogue
from kitdispatch.models.ops.base import (
    Call,
    Layout,
    OpFacts,
    OpKind,
    Operand,
    Permuted,
    Reshape,
    TensorFacts,
    destination_facts,
    expect,
    init_operand,
    kernel_buffers,
    map_dims,
    pairs_mismatch,
    readers,
    tensor_facts,
)
from kitdispatch.models.ops.generic import Generic
from kitdispatch.models.ops.matmul import init_source

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

GENERIC = "linalg.generic"
# The epilogues the consumer may compute: those that read nothing but a bias [f] (the patch rows'
# columns) and take no scalar.
EPILOGUES = ("none", "bias")


@dataclass(frozen=True)
class Patches:
    """The conv's sizes: x [n, c, h, w] ([c, h, w] at batch 1), W [f, c, kh, kw], patches oh x ow."""

    batched: bool
    n: int
    c: int
    f: int
    kh: int
    kw: int
    oh: int
    ow: int

    @property
    def rows(self) -> int:
        return self.n * self.oh * self.ow

    @property
    def cols(self) -> int:
        return self.c * self.kh * self.kw

    def image_as_rows(self) -> Permuted:
        """x as P [n*oh*ow, c*kh*kw]: [n, c, oh, kh, ow, kw] -> [n, oh, ow, c, kh, kw], merged."""
        if self.batched:
            return Permuted(((0,), (1,), (2, 3), (4, 5)), (self.n, self.c, self.oh, self.kh, self.ow, self.kw),
                            (0, 2, 4, 1, 3, 5), ((0, 1, 2), (3, 4, 5)))
        return Permuted(((0,), (1, 2), (3, 4)), (self.c, self.oh, self.kh, self.ow, self.kw), (1, 3, 0, 2, 4), ((0, 1), (2, 3, 4)))


@dataclass(frozen=True)
class PatchFacts:
    patches: Patches
    init_source: str
    rows: epilogue.Epilogue | None  # the consumer that writes the patch rows, as an epilogue (covers 1)
    problem: str | None  # why no kernel can replace it (the consumer, dynamic sizes), None: none

    @property
    def summary(self) -> str:
        p = self.patches
        after = f", epilogue {self.rows.name}" if self.rows is not None and self.rows.name else ""
        return f"patches {p.kh}x{p.kw} of {p.c} channel(s){after}"

    def to_json(self) -> dict:
        p = self.patches
        data = {"patch": [p.kh, p.kw], "init": self.init_source}
        if self.rows is not None:
            data.update(self.rows.to_json())
        if self.problem:
            data["problem"] = self.problem
        return data


class PatchConv(OpKind):
    """The kind: its kernels are matmuls (A [m,k], W [n,k], an epilogue of EPILOGUES, a new
    result [m,n]); m, n and k are the patch rows, the filters and c*kh*kw."""

    name = "patch_conv"
    op = GENERIC
    prepare = Generic.prepare  # the consumer as IREE would fuse it (its bias add joined with the transpose)
    suggested = False

    def candidate(self, op: ir.Operation) -> bool:
        return read_patches(op) is not None

    def facts(self, op: ir.Operation) -> OpFacts:
        patches = read_patches(op)
        rows, problem = _rows_writer(op, patches)
        detail = PatchFacts(patches, init_source(init_operand(op)), rows, problem)
        return dataclasses.replace(destination_facts(op, detail), kind=self.name)

    def contract(self, kernel: Kernel, where: str) -> Layout:
        plain, ending = epilogue.split_epilogue(kernel, where)
        expect(ending.name in EPILOGUES, f"its epilogue {ending.name} is none a patch conv has ({', '.join(EPILOGUES)})", where)
        args, result = kernel_buffers(plain, self.name, where)
        expect(len(args) == 2 and result.access == "out", "it must take A and W and write a new result", where)
        a, w, c = args[0].type.shape, args[1].type.shape, result.type.shape
        expect(
            len(a) == len(w) == len(c) == 2 and a[0] == c[0] and w == (c[1], a[1]),
            "its shapes must read A [m,k] x W [n,k] -> [m,n] (the patch rows times the filters, read transposed)",
            where,
        )
        return Layout(tuple(args) + ending.buffers, result, accumulates=False, epilogue=ending)

    def semantic_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout) -> str | None:
        facts = op.detail
        if facts.problem:
            return facts.problem
        if facts.init_source != "zero fill":
            return f"the conv accumulates into {facts.init_source}, not a zero fill"
        if op.result.dtype != "f32":  # the conv's result is its accumulator; the kernels sum in f32
            return f"the conv accumulates in {op.result.dtype} (its result's type); the kernels accumulate in f32"
        if facts.rows.name != layout.epilogue.name:
            return f"the op after it computes the epilogue {facts.rows.name}; the kernel's is {layout.epilogue.name}"
        return None

    def sizes_mismatch(self, op: OpFacts, kernel: Kernel, layout: Layout, sizes: dict[str, int | None]) -> str | None:
        """The patch rows [m, k], W as [n, k], the bias [n] and the rows written [m, n]."""
        p, rows = op.detail.patches, op.detail.rows
        x, w = op.inputs
        pairs = [("patch rows", TensorFacts(x.dtype, (p.rows, p.cols)), layout.inputs[0]),
                 ("weight", TensorFacts(w.dtype, (p.f, p.cols)), layout.inputs[1])]
        pairs += [("bias", rows.bias[1], b) for b in layout.inputs[2:]]
        pairs.append(("result", TensorFacts(rows.result.dtype, (p.rows, p.f)), layout.result))
        return pairs_mismatch(pairs, kernel, sizes)

    def call(self, op: OpFacts, layout: Layout) -> Call:
        """From the consumer (the op the call marks): x through its copy into patch rows, W
        collapsed to [f, c*kh*kw], the bias; the kernel's rows expanded to the consumer's result."""
        p, rows = op.detail.patches, op.detail.rows
        product = rows.chain[0]  # the consumer's operand that is the conv's result
        arguments = [Operand((product, 0), permuted=p.image_as_rows()), Operand((product, 1), Reshape(((0,), (1, 2, 3))))]
        if rows.bias is not None:
            arguments.append(Operand(rows.bias[0]))
        rank = len(rows.result.shape)
        return Call(tuple(arguments), result=Reshape((tuple(range(rank - 1)), (rank - 1,))), marked=1, variant="_patches")

    def replaced(self, op: OpFacts, layout: Layout) -> OpFacts:
        """x, W and the bias the call reads, the consumer's [n, oh, ow, f] result."""
        rows = op.detail.rows
        return dataclasses.replace(op, inputs=op.inputs + rows.inputs, result=rows.result)


# ------------------------------------------------------------------- reading IREE's IR


def read_patches(op: ir.Operation) -> Patches | None:
    """The sizes of a patch conv generic, None where `op` is not one: two inputs x and W, one
    result; loops (n,) f, oh, ow parallel and c, i, j reductions; x read at (n,) c, oh*kh + i,
    ow*kw + j with (kh, kw) W's window, W at f, c, i, j, the result written at (n,) f, oh, ow;
    the body a sum of products (through extf); static sizes with h = oh*kh and w = ow*kw."""
    from iree.compiler import ir

    if op.name != GENERIC or len(op.results) != 1 or len(op.operands) != 3:
        return None
    iterators = ["reduction" in str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    attrs = list(ir.ArrayAttr(op.attributes["indexing_maps"]))
    x, w, out = (tensor_facts(v.type) for v in op.operands)
    out_dims, w_dims = map_dims(attrs[2]), map_dims(attrs[1])
    if out_dims is None or w_dims is None or len(w_dims) != 4 or len(out_dims) not in (3, 4) or len(x.shape) != len(out_dims):
        return None
    batched = len(out_dims) == 4
    f, oh, ow = out_dims[-3:]
    c, i, j = w_dims[1:]
    if w_dims[0] != f or len(iterators) != len(out_dims) + 3 or sorted(out_dims + w_dims[1:]) != list(range(len(iterators))):
        return None
    if any(iterators[d] for d in out_dims) or not all(iterators[d] for d in (c, i, j)):
        return None
    if None in x.shape + w.shape + out.shape or not _sum_of_products(op):
        return None
    kh, kw = w.shape[2:]
    x_reads = [_linear(e) for e in ir.AffineMapAttr(attrs[0]).value.results]
    wanted = ([{out_dims[0]: 1}] if batched else []) + [{c: 1}, {oh: kh, i: 1}, {ow: kw, j: 1}]
    if x_reads != wanted:
        return None
    n = out.shape[0] if batched else 1
    sizes = Patches(batched, n, w.shape[1], w.shape[0], kh, kw, out.shape[-2], out.shape[-1])
    image = ((n,) if batched else ()) + (sizes.c, sizes.oh * kh, sizes.ow * kw)
    if x.shape != image or out.shape != ((n,) if batched else ()) + (sizes.f, sizes.oh, sizes.ow):
        return None  # rows or columns of the image past the last patch (a conv that drops them)
    return sizes


def _linear(e: ir.AffineExpr) -> dict[int, int] | None:
    """An affine expression as {loop dim: coefficient}; None where it is not a plain sum of
    dims times constants (an offset, a modulo)."""
    from iree.compiler import ir

    if isinstance(e, ir.AffineDimExpr):
        return {e.position: 1}
    if isinstance(e, ir.AffineAddExpr):
        lhs, rhs = _linear(e.lhs), _linear(e.rhs)
        if lhs is None or rhs is None or set(lhs) & set(rhs):
            return None
        return {**lhs, **rhs}
    if isinstance(e, ir.AffineMulExpr):
        for term, factor in ((e.lhs, e.rhs), (e.rhs, e.lhs)):
            inner = _linear(term)
            if inner is not None and isinstance(factor, ir.AffineConstantExpr):
                return {d: k * factor.value for d, k in inner.items()}
    return None


def _sum_of_products(op: ir.Operation) -> bool:
    """Whether the body yields out + in0 * in1 (each input through an extf or not), in floats."""
    block = op.regions[0].blocks[0]
    x, w, out = block.arguments
    values = {x: "x", w: "w", out: "out"}
    for inner in block.operations:
        inner = inner.operation
        args = [values.get(v) for v in inner.operands]
        if inner.name == "arith.extf" and args in (["x"], ["w"]):
            values[inner.results[0]] = args[0]
        elif inner.name == "arith.mulf" and sorted(args) == ["w", "x"]:
            values[inner.results[0]] = "product"
        elif inner.name == "arith.addf" and sorted(args, key=str) == ["out", "product"]:
            values[inner.results[0]] = "sum"
        elif inner.name == "linalg.yield":
            return args == ["sum"]
        else:
            return False
    return False


def _rows_writer(op: ir.Operation, p: Patches) -> tuple[epilogue.Epilogue | None, str | None]:
    """The conv's one reader as the epilogue that writes the patch rows [(n,) oh, ow, f], or why
    there is none: a generic of parallel loops reading the conv's result transposed, its other
    inputs a bias [f] each read along f, writing its result whole."""
    from iree.compiler import ir

    users = readers(op.results[0])
    if len(users) != 1:
        return None, f"its result has {len(users)} readers; the kernel writes the patch rows [n, oh, ow, f] for one"
    user = users[0]
    if user.name != GENERIC or any("reduction" in str(a) for a in ir.ArrayAttr(user.attributes["iterator_types"])):
        return None, f"its result is read by {user.name}, not by a generic that transposes it to patch rows [n, oh, ow, f]"
    inputs = len(user.operands) - len(user.results)
    product = [k for k in range(inputs) if user.operands[k] == op.results[0]]
    maps = [map_dims(a) for a in ir.ArrayAttr(user.attributes["indexing_maps"])]
    rank = len(tensor_facts(op.results[0].type).shape)
    rows_map = (0, rank - 1) + tuple(range(1, rank - 1)) if p.batched else (rank - 1,) + tuple(range(rank - 1))
    if len(user.results) != 1 or len(product) != 1 or maps[inputs] != tuple(range(rank)) or maps[product[0]] != rows_map:
        return None, (f"its result is read as an image (by {maps[product[0]] if len(product) == 1 else 'several operands'}), "
                      "not transposed to patch rows [n, oh, ow, f]; the kernel writes those rows")
    side = {}
    for k in range(inputs):
        if k == product[0]:
            continue
        facts = tensor_facts(user.operands[k].type)
        if maps[k] != (rank - 1,) or facts.shape != (p.f,) or "bias" in [role for role, _ in side.values()]:
            return None, f"the transposing generic reads {facts.text} by {maps[k]}, not one bias [{p.f}] along the filters"
        if facts.dtype != tensor_facts(user.results[0].type).dtype:
            return None, f"the bias is {facts.text}, the result {tensor_facts(user.results[0].type).dtype} (the kernel reads it in the result's type)"
        side[k] = ("bias", facts)
    rows = epilogue.generic_epilogue(user, product[0], side)
    if rows.name not in EPILOGUES:
        why = rows.why or f"it computes the epilogue {rows.name}"
        return rows, f"the generic after it is no bias add: {why}"
    return rows, None


KIND = PatchConv()
