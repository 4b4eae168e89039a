"""The transpose to attention heads as a matmul epilogue (models/ops/epilogue.py: bias_heads and
bias_heads_t; kernels/matmul/gemm.cuh's kBiasHeads, kBiasHeadsT). BERT's and ViT's Q, K and V
projections reach the kit as a matmul, an expand_shape of [b*s, h*d] to [b, s, h, d], the f16
rounding, and one generic that adds the bias [h, d] while transposing to [b, h, s, d] (Q, V) or
[b, h, d, s] (K^T); IREE runs that generic as an elementwise_transpose dispatch of its own. The
heads kernels store C there with the bias added, so the generic dies with the matmul."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import HAVE_IREE_COMPILE, REPO, chain_of, iree_own_dispatches, library_onnx_build, prebuilt_or_fixture, replaced_ops

needs_iree = pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")

LOOPS4 = "(d0, d1, d2, d3)"


def projected(out_shape: str, in_map: str, bias_map: str, *, body: str = "arith.addf", lead: str = "2, ", bias: str = "4x64") -> str:
    """A [64, 256] f32 product expanded to [{lead}32, 4, 64], rounded to f16, then one generic that
    reads it by `in_map` (at batch 1: [64, 4, 64]), combines it with a bias read by `bias_map` (`body`) and writes
    `out_shape` (an identity map)."""
    rank = 4 if lead else 3
    loops = LOOPS4 if lead else "(d0, d1, d2)"
    dims = f"[{lead}32, 4, 64]" if lead else "[64, 4, 64]"  # b * s = 64 rows
    t = "x".join(dims.strip("[]").split(", "))
    groups = "[[0, 1], [2, 3]]" if lead else "[[0], [1, 2]]"
    identity = f"affine_map<{loops} -> {loops}>"
    parallel = ", ".join(['"parallel"'] * rank)
    return f"""
func.func @f(%lhs: tensor<64x128xf16>, %w: tensor<128x256xf16>, %bv: tensor<{bias}xf16>) -> tensor<{out_shape}xf16> {{
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<64x256xf32>
  %f = linalg.fill ins(%zero : f32) outs(%empty : tensor<64x256xf32>) -> tensor<64x256xf32>
  %mm = linalg.matmul ins(%lhs, %w : tensor<64x128xf16>, tensor<128x256xf16>) outs(%f : tensor<64x256xf32>) -> tensor<64x256xf32>
  %e = tensor.expand_shape %mm {groups} output_shape {dims} : tensor<64x256xf32> into tensor<{t}xf32>
  %o = tensor.empty() : tensor<{t}xf16>
  %r = linalg.generic {{indexing_maps = [{identity}, {identity}], iterator_types = [{parallel}]}}
      ins(%e : tensor<{t}xf32>) outs(%o : tensor<{t}xf16>) {{
  ^bb0(%in: f32, %out: f16):
    %y = arith.truncf %in : f32 to f16
    linalg.yield %y : f16
  }} -> tensor<{t}xf16>
  %o2 = tensor.empty() : tensor<{out_shape}xf16>
  %h = linalg.generic {{indexing_maps = [affine_map<{loops} -> {in_map}>, affine_map<{loops} -> {bias_map}>, {identity}],
                       iterator_types = [{parallel}]}}
      ins(%r, %bv : tensor<{t}xf16>, tensor<{bias}xf16>) outs(%o2 : tensor<{out_shape}xf16>) {{
  ^bb0(%in: f16, %b: f16, %out: f16):
    %y = {body} %in, %b : f16
    linalg.yield %y : f16
  }} -> tensor<{out_shape}xf16>
  return %h : tensor<{out_shape}xf16>
}}"""


@pytest.mark.parametrize(
    "out_shape, in_map, bias_map, lead, name",
    [
        ("2x4x32x64", "(d0, d2, d1, d3)", "(d1, d3)", "2, ", "bias_heads"),  # Q, V: [b, h, s, d]
        ("2x4x64x32", "(d0, d3, d1, d2)", "(d1, d2)", "2, ", "bias_heads_t"),  # K^T: [b, h, d, s]
        ("4x64x64", "(d1, d0, d2)", "(d0, d2)", "", "bias_heads"),  # batch 1 (BERT b1s128): [h, s, d]
        ("4x64x64", "(d2, d0, d1)", "(d0, d1)", "", "bias_heads_t"),
    ],
    ids=["heads", "heads_t", "batch1-heads", "batch1-heads_t"],
)
def test_a_transposing_bias_add_is_the_heads_epilogue(out_shape, in_map, bias_map, lead, name):
    """The chain goes through the expand and the rounding into the transposing bias add and ends
    there; the bias is the generic's operand 1, [h, d] as the model holds it."""
    chain = chain_of(projected(out_shape, in_map, bias_map, lead=lead))
    form = chain.forms[-1]
    assert (form.name, form.covers, form.transposes) == (name, 3, True), form.why
    assert form.bias[0] == (1,) and form.bias[1].shape == (4, 64)
    assert form.rounds == 1  # the model rounds the product to f16 before its bias add; the kernel once, after
    assert form.heads_sizes == ((2, 32) if lead else (1, 64))
    assert chain.stop == "the transpose to heads ends the chain" and chain.summary == f"epilogue {name} over 3 op(s)"


@pytest.mark.parametrize(
    "out_shape, in_map, bias_map, body, bias, reason",
    [
        ("32x2x4x64", "(d1, d0, d2, d3)", "(d2, d3)", "arith.addf", "4x64", "reading its input by (1, 0, 2, 3)"),
        ("2x64x4x32", "(d0, d3, d2, d1)", "(d2, d1)", "arith.addf", "4x64", "reading its input by (0, 3, 2, 1)"),
        ("2x4x32x64", "(d0, d2, d1, d3)", "(d1, d3)", "arith.mulf", "4x64", "only its bias add has heads kernels"),
        ("2x4x32x64", "(d0, d2, d1, d3)", "(d2, d3)", "arith.addf", "32x64", "not a bias [h, d]"),
    ],
    ids=["batch-and-seq-swapped", "d-and-h-swapped", "not-an-add", "bias-over-seq"],
)
def test_near_misses_keep_the_bare_matmul_with_the_reason(out_shape, in_map, bias_map, body, bias, reason):
    """Another permutation, another body, another bias: no heads epilogue, the reason said; the
    rounding before it is still the kernel's (the `none` prefix), and stopping there costs no
    fusion (IREE runs the transpose alone)."""
    from kitdispatch.models.ops.epilogue import left_unfused

    chain = chain_of(projected(out_shape, in_map, bias_map, body=body, bias=bias))
    last = chain.forms[-1]
    assert last.name is None and last.transposes and reason in last.why, last.why
    assert (chain.longest.name, chain.longest.covers) == ("none", 2)
    facts = type("Facts", (), {"detail": type("Detail", (), {"chain": chain})()})()
    assert left_unfused(facts, chain.longest) is None


def bias_then_heads(heads_body: str) -> str:
    """A [64, 256] product, rounded to f16 with a bias [256] added, expanded to [2, 32, 4, 64],
    then a generic that reads it to heads [2, 4, 32, 64] with a [4, 64] input and `heads_body`."""
    return f"""
func.func @f(%lhs: tensor<64x128xf16>, %w: tensor<128x256xf16>, %b1: tensor<256xf16>, %bv: tensor<4x64xf16>) -> tensor<2x4x32x64xf16> {{
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<64x256xf32>
  %f = linalg.fill ins(%zero : f32) outs(%empty : tensor<64x256xf32>) -> tensor<64x256xf32>
  %mm = linalg.matmul ins(%lhs, %w : tensor<64x128xf16>, tensor<128x256xf16>) outs(%f : tensor<64x256xf32>) -> tensor<64x256xf32>
  %o1 = tensor.empty() : tensor<64x256xf16>
  %r = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>],
                       iterator_types = ["parallel", "parallel"]}}
      ins(%mm, %b1 : tensor<64x256xf32>, tensor<256xf16>) outs(%o1 : tensor<64x256xf16>) {{
  ^bb0(%in: f32, %b: f16, %out: f16):
    %t = arith.truncf %in : f32 to f16
    %y = arith.addf %t, %b : f16
    linalg.yield %y : f16
  }} -> tensor<64x256xf16>
  %e = tensor.expand_shape %r [[0, 1], [2, 3]] output_shape [2, 32, 4, 64] : tensor<64x256xf16> into tensor<2x32x4x64xf16>
  %o2 = tensor.empty() : tensor<2x4x32x64xf16>
  %h = linalg.generic {{indexing_maps = [affine_map<{LOOPS4} -> (d0, d2, d1, d3)>, affine_map<{LOOPS4} -> (d1, d3)>,
                                        affine_map<{LOOPS4} -> {LOOPS4}>],
                       iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%e, %bv : tensor<2x32x4x64xf16>, tensor<4x64xf16>) outs(%o2 : tensor<2x4x32x64xf16>) {{
  ^bb0(%in: f16, %b: f16, %out: f16):
    {heads_body}
  }} -> tensor<2x4x32x64xf16>
  return %h : tensor<2x4x32x64xf16>
}}"""


@pytest.mark.parametrize(
    "heads_body, reason",
    [
        ("linalg.yield %in : f16", "a bias added before the transpose to heads and another (4x64xf16)"),
        ("%y = arith.addf %in, %b : f16\n    linalg.yield %y : f16", "a bias added before the transpose to heads and another (4x64xf16)"),
    ],
    ids=["copy-only", "second-bias"],
)
def test_a_bias_added_before_the_transpose_is_not_lost(heads_body, reason):
    """A bias [n] added before the expand, then a transposing generic that reads a [h, d] tensor:
    the heads kernels add one bias, the transpose's, so this is no heads epilogue (the copy-only
    form was taken for one: the model's bias dropped and the unused [h, d] one added). The bias
    add before it is still the kernel's."""
    chain = chain_of(bias_then_heads(heads_body))
    last = chain.forms[-1]
    assert last.name is None and reason in last.why, last.why
    assert (chain.longest.name, chain.longest.covers) == ("bias", 1)


def test_a_heads_kernel_declares_its_result_in_the_layout_s_order():
    """A kernel declaring bias_heads_t whose result is [nb, heads, seq, d] (bias_heads' order) is
    refused when described: where seq == d its sizes would bind, and it would store the wrong layout."""
    from kitdispatch import Buffer, Kernel, Replaces, Scalar, TensorType
    from kitdispatch.errors import ManifestError
    from kitdispatch.models.replace import check_kernel

    def kernel(epilogue: str, out: tuple) -> Kernel:
        return Kernel.create(f"k_{epilogue}", "k.cu", [
            Buffer("a", "in", TensorType("f16", ("m", "k"))), Buffer("w", "in", TensorType("f16", ("k", "n"))),
            Buffer("bias", "in", TensorType("f16", ("heads", "d"))), Buffer("c", "out", TensorType("f16", out)),
            Scalar("nb", "i32"), Scalar("seq", "i32"), Scalar("m", "i32"), Scalar("n", "i32"), Scalar("k", "i32"),
        ], workgroup_size=[128], workgroup_count=["1"], replaces=Replaces.create(["linalg.matmul"], epilogue=epilogue))

    check_kernel(kernel("bias_heads_t", ("nb", "heads", "d", "seq")), "linalg.matmul")
    with pytest.raises(ManifestError, match=r"its epilogue bias_heads_t writes \[nb, heads, d, seq\]"):
        check_kernel(kernel("bias_heads_t", ("nb", "heads", "seq", "d")), "linalg.matmul")
    with pytest.raises(ManifestError, match=r"its epilogue bias_heads writes \[nb, heads, seq, d\]"):
        check_kernel(kernel("bias_heads", ("nb", "heads", "d", "seq")), "linalg.matmul")


# ------------------------------------------------------------------- the kernels' entries


def test_heads_entries_and_their_reference():
    """24 heads entries (nn/nt, f16/bf16, the three configs BERT's and ViT's projections pick);
    the reference stores the bias epilogue's C [m, n] at [b, h, s, d] / [b, h, d, s]."""
    import importlib.util

    from kitdispatch import load_manifest

    names = [k.name for k in load_manifest(REPO / "kernels" / "matmul").kernels if "heads" in k.name]
    assert len(names) == 24 and "matmul_nn_f16_bias_heads_t64x64" in names and "matmul_nt_bf16_bias_heads_t" in names
    spec = importlib.util.spec_from_file_location("gemm_reference", REPO / "kernels" / "matmul" / "gemm_reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    rng = np.random.default_rng(0)
    nb, seq, heads, d, k = 3, 5, 2, 8, 16
    a = rng.standard_normal((nb * seq, k)).astype(np.float16)
    b = rng.standard_normal((k, heads * d)).astype(np.float16)
    bias = rng.standard_normal((heads, d)).astype(np.float16)
    flat = ref.matmul_nn_f16_bias(a, b, bias.reshape(-1)).reshape(nb, seq, heads, d)
    np.testing.assert_array_equal(ref.matmul_nn_f16_bias_heads_t64x64(a, b, bias, nb, seq), flat.transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(ref.matmul_nn_f16_bias_heads_t_t128x128(a, b, bias, nb, seq), flat.transpose(0, 2, 3, 1))


# ------------------------------------------------------------------- built with the real tools


@pytest.fixture(scope="module")
def heads_build(tmp_path_factory):
    from models.heads_models import heads_layer_onnx

    return library_onnx_build(tmp_path_factory, "heads_layer", heads_layer_onnx)


def test_projections_take_their_bias_and_transpose(heads_build):
    """Q and V by bias_heads, K (straight to K^T, perm [0, 2, 3, 1]) by bias_heads_t, each with
    its expand, rounding and transposing bias add; the bias [h, d] and the batch and seq constants
    reach the kernel; the attention reads what they write."""
    matmuls = [r for r in replaced_ops(heads_build) if r["op"] == "linalg.matmul"]
    assert [(r["kernel"], r["epilogue"], r["epilogue_ops_after"]) for r in matmuls] == [
        ("matmul_nn_f16_bias_heads_t64x64", "bias_heads", 3),
        ("matmul_nn_f16_bias_heads_t_t64x64", "bias_heads_t", 3),
        ("matmul_nn_f16_bias_heads_t64x64", "bias_heads", 3),
    ]
    assert [t["shape"] for t in matmuls[1]["inputs"]] == [[128, 256], [256, 256], [4, 64]]
    assert [r["result"]["shape"] for r in matmuls] == [[2, 4, 64, 64], [2, 4, 64, 64], [2, 4, 64, 64]]
    assert any(r["kernel"] == "attention_kt_f16" for r in replaced_ops(heads_build))
    report = heads_build.report.with_suffix(".txt").read_text()
    assert report.count("{epilogue bias_heads over 3 op(s)}") == 2 and report.count("{epilogue bias_heads_t over 3 op(s)}") == 1
    spec = heads_build.spec.read_text()
    assert "arith.constant 2 : i32" in spec and "arith.constant 64 : i32" in spec  # nb and seq


def test_no_transpose_dispatch_is_left(heads_build):
    """IREE alone runs the transposing bias adds as elementwise_transpose dispatches; with the
    heads kernels the module has none of IREE's dispatches left at all."""
    assert "elementwise_transpose" in iree_own_dispatches(heads_build.baseline_vmfb)
    assert iree_own_dispatches(heads_build.vmfb) == []


@needs_iree
@pytest.mark.parametrize(
    "perm, also_flat, epilogue, ends",
    [
        ("1203", False, "none", "the transpose to heads ends the chain"),  # [s, h, b, d]: no heads kernel
        ("0213", True, "bias", "the result has 2 users"),  # the un-transposed sum is read too
    ],
    ids=["another-permutation", "second-reader"],
)
def test_near_miss_projections_keep_today_s_path(tmp_path_factory, perm, also_flat, epilogue, ends):
    """The matmul is replaced as before (the bare product and its rounding, or its bias add
    where the sum has a second reader), the transpose stays IREE's, and the report says why."""
    from models.heads_models import projection_onnx

    make = functools.partial(projection_onnx, perm=perm, also_flat=also_flat, seq=64)
    built = library_onnx_build(tmp_path_factory, f"projection_{perm}", make, baseline=False)
    [matmul] = [r for r in replaced_ops(built) if r["op"] == "linalg.matmul"]
    assert matmul["epilogue_replaced"]["epilogue"] == epilogue and "heads" not in matmul["kernel"]
    assert matmul["epilogue_chain_ends"].startswith(ends)
    if perm == "1203":
        assert "a transpose to heads reading its input by (2, 0, 1, 3)" in matmul["epilogue_refused"]
    assert any(d.endswith("transpose") for d in iree_own_dispatches(built.vmfb))  # with the bias add, or alone


@pytest.mark.gpu
def test_heads_layer_agrees_with_iree_on_gpu(request, prebuilt_dir):
    """The attention block with its projections in the heads kernels agrees with IREE alone (f16
    tolerance), and the heads kernels ran."""
    from kitdispatch.models.compare import compare_model

    result = compare_model(prebuilt_or_fixture(request, prebuilt_dir, "epilogue_heads_model", "heads_build"))
    assert result.agree, result.worst
    assert {"matmul_nn_f16_bias_heads_t64x64", "matmul_nn_f16_bias_heads_t_t64x64"} <= set(result.kernel_names), result.kernel_names
