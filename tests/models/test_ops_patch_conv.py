"""A convolution of non-overlapping patches (models/ops/patch_conv.py): ViT's patch embedding as
IREE's global optimization leaves it (a conv generic into a zero fill, then the generic that
adds the bias and transposes to patch rows), replaced by a library matmul of W [n,k] with the
`bias` epilogue (or `none`), the image copied into patch rows by the adapter."""

from __future__ import annotations

import functools

import pytest
from conftest import (
    HAVE_IREE_COMPILE, f32_matmul_entry, iree_own_dispatches, library_matmul_kernels, library_onnx_build, only, ops_of, prebuilt_or_fixture, replaced_ops,
)

needs_iree = pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")


def conv_model(*, batch: int | None = 2, c: int = 3, image: int = 64, patch: int = 16, stride: int | None = None, f: int = 128,
               dtype: str = "f16", rows: str = "bias", offset: str = "") -> str:
    """The conv generic as IREE leaves it (`batch` None: the unit batch dim folded, 6 loops) and
    its reader: `rows` "bias" (bias add, rounding and transpose to [b, oh, ow, f]), "none" (the
    rounding and transpose), "image" (a bias add read as [b, f, oh, ow]) or "two" (the bias
    form plus the conv returned too)."""
    stride = stride or patch
    side = (image - patch) // stride + 1
    lead, n = ("d0, ", 1) if batch else ("", 0)
    loops = ", ".join(f"d{i}" for i in range(n + 6))
    fd, oh, ow, cd, i, j = (f"d{n + k}" for k in range(6))
    x_map = f"({lead}{cd}, {oh} * {stride} + {i}{offset}, {ow} * {stride} + {j})"
    b = f"{batch}x" if batch else ""
    acc = "f32"
    x_t, w_t = f"tensor<{b}{c}x{image}x{image}x{dtype}>", f"tensor<{f}x{c}x{patch}x{patch}x{dtype}>"
    out_t = f"tensor<{b}{f}x{side}x{side}x{acc}>"
    rows_t = f"tensor<{b}{side}x{side}x{f}x{dtype}>"
    ext = dtype != "f32"
    widen = "%xe = arith.extf %in : {0} to f32\n    %we = arith.extf %w : {0} to f32\n    ".format(dtype) if ext else ""
    xv, wv = ("%xe", "%we") if ext else ("%in", "%w")
    r = 4 if batch else 3
    rl = ", ".join(f"d{k}" for k in range(r))
    read_rows = "(d0, d3, d1, d2)" if batch else "(d2, d0, d1)"
    identity = f"({rl})"
    parallel = ", ".join(['"parallel"'] * r)
    if rows == "image":
        read_rows, rows_t = identity, f"tensor<{b}{f}x{side}x{side}x{dtype}>"
    bias_in = rows != "none"
    bias_map = f"(d{1 if rows == 'image' and batch else 0 if rows == 'image' else r - 1})"
    body = (f"%bw = arith.extf %bb : {dtype} to f32\n    %s = arith.addf %a, %bw : f32\n    %y = arith.truncf %s : f32 to {dtype}"
            if bias_in and ext else "%y = arith.addf %a, %bb : f32" if bias_in else f"%y = arith.truncf %a : f32 to {dtype}")
    results = f"{rows_t}, {out_t}" if rows == "two" else rows_t
    returned = "%rows, %conv" if rows == "two" else "%rows"
    return f"""
func.func @f(%x: {x_t}, %wt: {w_t}, %bias: tensor<{f}x{dtype}>) -> ({results}) {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : {out_t}
  %fill = linalg.fill ins(%zero : f32) outs(%e : {out_t}) -> {out_t}
  %conv = linalg.generic {{indexing_maps = [affine_map<({loops}) -> {x_map}>, affine_map<({loops}) -> ({fd}, {cd}, {i}, {j})>,
                                           affine_map<({loops}) -> ({lead}{fd}, {oh}, {ow})>],
      iterator_types = [{', '.join(['"parallel"'] * (n + 3) + ['"reduction"'] * 3)}]}}
      ins(%x, %wt : {x_t}, {w_t}) outs(%fill : {out_t}) {{
  ^bb0(%in: {dtype}, %w: {dtype}, %out: f32):
    {widen}%p = arith.mulf {xv}, {wv} : f32
    %s = arith.addf %out, %p : f32
    linalg.yield %s : f32
  }} -> {out_t}
  %e2 = tensor.empty() : {rows_t}
  %rows = linalg.generic {{indexing_maps = [affine_map<({rl}) -> {read_rows}>, {f"affine_map<({rl}) -> {bias_map}>, " if bias_in else ""}affine_map<({rl}) -> {identity}>],
      iterator_types = [{parallel}]}}
      ins(%conv{", %bias" if bias_in else ""} : {out_t}{f", tensor<{f}x{dtype}>" if bias_in else ""}) outs(%e2 : {rows_t}) {{
  ^bb0(%a: f32, {"%bb: " + dtype + ", " if bias_in else ""}%o: {dtype}):
    {body}
    linalg.yield %y : {dtype}
  }} -> {rows_t}
  return {returned} : {results}
}}"""


def patch_ops(mlir: str):
    return ops_of(mlir, ("patch_conv", "linalg.generic"))


# ------------------------------------------------------------------- reading the conv


@pytest.mark.parametrize("batch", [2, None], ids=["batched", "batch1-folded"])
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_a_patch_conv_and_its_rows_are_one_matmul(batch, dtype):
    """The conv is read as patches kh x kw of c channels; its reader as the `bias` epilogue over
    the transpose to rows; the library's NT matmul with that epilogue replaces the two, with the
    config choose_config picks for m = b*oh*ow, n = f, k = c*kh*kw (128 x 128 x 768 at batch 2)."""
    [op] = [o for o in patch_ops(conv_model(batch=batch, dtype=dtype)) if o.kind == "patch_conv"]
    p = op.detail.patches
    assert (p.kh, p.kw, p.c, p.f, p.oh, p.ow, p.batched) == (16, 16, 3, 128, 4, 4, batch is not None)
    assert op.detail.rows.name == "bias" and op.detail.problem is None
    assert op.describe().startswith("patch_conv {patches 16x16 of 3 channel(s), epilogue bias}")
    from kitdispatch.models.replace import decide

    d = only(decide([op], library_matmul_kernels()))
    assert d.kernel is not None, d.reasons
    want = "f32" if dtype == "f32" else dtype
    assert d.kernel.name.startswith(f"matmul_nt_{want}_bias"), d.kernel.name
    assert d.call.marked == 1 and d.call.variant == "_patches"
    assert d.op.result.shape == ((2,) if batch else ()) + (4, 4, 128)
    assert [a.path for a in d.call.operands] == [(0, 0), (0, 1), (1,)]
    assert d.call.arguments[0].permuted.merged_shape == ((2 if batch else 1) * 16, 768)


def test_the_rounding_alone_is_the_none_epilogue():
    [op] = [o for o in patch_ops(conv_model(rows="none")) if o.kind == "patch_conv"]
    assert op.detail.rows.name == "none"
    from kitdispatch.models.replace import decide

    d = only(decide([op], library_matmul_kernels()))
    assert d.kernel is not None and d.kernel.name.startswith("matmul_nt_f16_none"), d.reasons
    assert len(d.call.arguments) == 2  # no bias


@pytest.mark.parametrize(
    "model, reason",
    [
        (conv_model(rows="image"), "its result is read as an image"),
        (conv_model(rows="two"), "its result has 2 readers"),
    ],
    ids=["read-as-image", "second-reader"],
)
def test_a_conv_not_read_as_patch_rows_is_kept_with_the_reason(model, reason):
    from kitdispatch.models.replace import decide

    [op] = [o for o in patch_ops(model) if o.kind == "patch_conv"]
    d = only(decide([op], library_matmul_kernels()))
    assert d.kernel is None and all(reason in r for r in d.reasons), d.reasons


def test_a_conv_that_does_not_accumulate_in_f32_is_kept():
    """An f16 conv summing in f16 (no extf: its result, the accumulator, is f16): the kernels
    accumulate in f32, so they would round otherwise."""
    from kitdispatch.models.replace import decide

    f16_sum = conv_model(dtype="f16", rows="none")
    f16_sum = f16_sum.replace("%xe = arith.extf %in : f16 to f32\n    %we = arith.extf %w : f16 to f32\n    ", "")
    f16_sum = f16_sum.replace("%p = arith.mulf %xe, %we : f32", "%p = arith.mulf %in, %w : f16").replace("%s = arith.addf %out, %p : f32", "%s = arith.addf %out, %p : f16")
    f16_sum = f16_sum.replace("linalg.yield %s : f32", "linalg.yield %s : f16").replace("x4x4xf32>", "x4x4xf16>").replace("%zero = arith.constant 0.0 : f32", "%zero = arith.constant 0.0 : f16")
    f16_sum = f16_sum.replace("ins(%zero : f32)", "ins(%zero : f16)").replace("^bb0(%in: f16, %w: f16, %out: f32)", "^bb0(%in: f16, %w: f16, %out: f16)")
    f16_sum = f16_sum.replace("^bb0(%a: f32, %o: f16):\n    %y = arith.truncf %a : f32 to f16\n    linalg.yield %y : f16", "^bb0(%a: f16, %o: f16):\n    linalg.yield %a : f16")
    [op] = [o for o in patch_ops(f16_sum) if o.kind == "patch_conv"]
    d = only(decide([op], library_matmul_kernels()))
    assert d.kernel is None and any("the conv accumulates in f16 (its result's type)" in r for r in d.reasons), d.reasons


@pytest.mark.parametrize(
    "kwargs",
    [dict(stride=8), dict(image=72), dict(offset=" + 1", image=65)],
    ids=["overlapping-windows", "image-not-a-multiple", "offset"],
)
def test_other_convolutions_are_not_this_kind(kwargs):
    """Overlapping windows, rows past the last patch, an offset (a window shifted by one): no
    patch conv (the generic stays linalg.generic's, as before this kind)."""
    ops = patch_ops(conv_model(**kwargs))
    assert [o.kind for o in ops if o.kind == "patch_conv"] == []


def test_the_adapter_copies_the_image_into_patch_rows():
    """The spec's adapter: expand x [b, c, h, w] to [b, c, oh, kh, ow, kw], transpose to
    [b, oh, ow, c, kh, kw], collapse to [b*oh*ow, c*kh*kw]; W collapsed to [f, c*kh*kw]; the
    kernel's rows expanded back to [b, oh, ow, f]."""
    from kitdispatch.models.replace import decide
    from kitdispatch.models.spec import adapter_lines

    [op] = [o for o in patch_ops(conv_model()) if o.kind == "patch_conv"]
    lines = "\n".join(adapter_lines(only(decide([op], library_matmul_kernels())))["body"])
    assert "tensor.expand_shape %x0 [[0], [1], [2, 3], [4, 5]] output_shape [2, 3, 4, 16, 4, 16]" in lines
    assert "permutation = [0, 2, 4, 1, 3, 5]" in lines and "into tensor<32x768xf16>" in lines
    assert "tensor.collapse_shape %x1 [[0], [1, 2, 3]] : tensor<128x3x16x16xf16> into tensor<128x768xf16>" in lines
    assert "tensor.expand_shape" in lines.rsplit("util.call", 1)[1] and "into tensor<2x4x4x128xf16>" in lines


# ------------------------------------------------------------------- built with the real tools


@pytest.fixture(scope="module")
def patch_build(tmp_path_factory):
    from models.patch_models import patch_embedding_onnx

    return library_onnx_build(tmp_path_factory, "patch_embedding", patch_embedding_onnx)


def test_vit_patch_embedding_is_replaced(patch_build):
    """The ONNX Conv + Reshape + Transpose of a ViT export: replaced by the library's NT bias
    matmul; IREE's conv dispatch is gone, a transpose (the patch copy) in its place."""
    [conv] = [r for r in replaced_ops(patch_build) if r["op"] == "patch_conv"]
    assert conv["kernel"].startswith("matmul_nt_f16_bias") and conv["epilogue"] == "bias" and conv["patch"] == [16, 16]
    assert [t["shape"] for t in conv["inputs"]] == [[2, 3, 64, 64], [128, 3, 16, 16], [128]]
    assert "conv" in iree_own_dispatches(patch_build.baseline_vmfb)
    own = iree_own_dispatches(patch_build.vmfb)
    assert "conv" not in own and "transpose" in own, own


@needs_iree
@pytest.mark.parametrize(
    "kwargs, reason",
    [(dict(as_image=True), "its result is read as an image"), (dict(stride=8), None)],
    ids=["read-as-image", "overlapping"],
)
def test_near_miss_convs_stay_iree_s(tmp_path_factory, kwargs, reason):
    """The model alone has nothing else to replace: the build fails saying why, its report
    written, the conv kept (with the reason where it is a patch conv read otherwise)."""
    from kitdispatch.models.pipeline import ModelBuildFailed
    from models.patch_models import patch_embedding_onnx

    with pytest.raises(ModelBuildFailed) as failed:
        library_onnx_build(tmp_path_factory, "patch_near", functools.partial(patch_embedding_onnx, **kwargs), baseline=False)
    report = failed.value.report
    assert report["replaced"] == []
    kept = [k for k in report["not_replaced"] if k["op"] == "patch_conv"]
    if reason:
        assert len(kept) == 1 and any(reason in r for r in kept[0]["reasons"]), kept
    else:  # not a patch conv at all: its generic is linalg.generic's, as before the kind
        assert kept == []
        assert any(k["op"] == "linalg.generic" and [t["shape"] for t in k["inputs"]] == [[2, 3, 64, 64], [128, 3, 16, 16]]
                   for k in report["not_replaced"]), report["not_replaced"]


@pytest.fixture(scope="module")
def patch_f32_build(tmp_path_factory):
    from models.patch_models import patch_embedding_onnx

    return library_onnx_build(tmp_path_factory, "patch_embedding_f32", functools.partial(patch_embedding_onnx, dtype="f32", batch=1))


def test_an_f32_patch_embedding_at_batch_1_takes_the_3xtf32_entry(patch_f32_build):
    """Batch 1 (IREE folds the unit batch dim: six loops): the f32 bias entry, 3xTF32."""
    [conv] = [r for r in replaced_ops(patch_f32_build) if r["op"] == "patch_conv"]
    # 16 patches of 3 x 16 x 16 against 128 filters: C [16, 128], k 768
    assert conv["kernel"] == f32_matmul_entry("matmul_nt_f32_bias", 16, 128, 768) and conv["inputs"][0]["shape"] == [3, 64, 64]
    assert "conv" not in iree_own_dispatches(patch_f32_build.vmfb)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "prebuilt, fixture, kernel",
    [("patch_embedding_model", "patch_build", "matmul_nt_f16_bias"), ("patch_embedding_f32_model", "patch_f32_build", "matmul_nt_f32_bias")],
    ids=["f16-batch2", "f32-batch1"],
)
def test_patch_embedding_agrees_with_iree_on_gpu(request, prebuilt_dir, prebuilt, fixture, kernel):
    """The patch embedding through the kit's patch copy and matmul agrees with IREE alone (the
    dtype's tolerance), and the kernel ran."""
    from kitdispatch.models.compare import compare_model

    result = compare_model(prebuilt_or_fixture(request, prebuilt_dir, prebuilt, fixture))
    assert result.agree, result.worst
    assert any(k.startswith(kernel) for k in result.kernel_names), result.kernel_names
