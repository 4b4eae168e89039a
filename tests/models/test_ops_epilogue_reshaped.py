"""Epilogues of a 3-D `x @ W` (models/ops/epilogue.py): IREE reads it as a collapse of x, a 2-D
matmul and an expand_shape of its result, and its dispatch formation moves the expand past the
elementwise ops into the matmul's dispatch (BERT b8s512, IREE 3.13 --compile-to=flow: the QKV
matmul with its truncf, the output and FFN matmuls with truncf, bias, GELU and residual). The
chain is read through the expand; the kernel takes its result and residual collapsed."""

from __future__ import annotations

import functools
import json
import re

import pytest
from conftest import (
    HAVE_IREE_COMPILE,
    REPO,
    chain_of,
    onnx_build_with_baseline,
    prebuilt_or_fixture,
)

needs_iree = pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")


def expanded(shape: str, groups: str, body: str, *, side: str = "", side_map: str = "", args: str = "%in: f32", out: str = "f16",
             after: str = "") -> str:
    """A [64, 256] f32 product expanded to `shape` ([...]: sizes, `?` dynamic), then one
    elementwise generic of `body` over the expanded value (and `side`: extra `ins`)."""
    dims = shape.strip("[]").split(", ")
    rank = len(dims)
    loops = ", ".join(f"d{i}" for i in range(rank))
    t = "x".join(dims)
    dynamic = "?" in dims
    sizes = ", ".join("%b" if d == "?" else d for d in dims)
    ins = ", ".join(["%e"] + [s.split(":")[0].strip() for s in side.split(",") if s])
    types = ", ".join([f"tensor<{t}xf32>"] + [s.split(":")[1].strip() for s in side.split(",") if s])
    maps = ", ".join([f"affine_map<({loops}) -> ({loops})>"] + ([side_map] if side_map else []) + [f"affine_map<({loops}) -> ({loops})>"])
    empty = "tensor.empty(%b)" if dynamic else "tensor.empty()"
    extra = "".join(f", {s.strip()}" for s in side.split(",") if s)
    return f"""
func.func @f(%lhs: tensor<64x128xf16>, %w: tensor<128x256xf16>, %b: index{extra}) -> tensor<{t}x{out}> {{
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<64x256xf32>
  %f = linalg.fill ins(%zero : f32) outs(%empty : tensor<64x256xf32>) -> tensor<64x256xf32>
  %mm = linalg.matmul ins(%lhs, %w : tensor<64x128xf16>, tensor<128x256xf16>) outs(%f : tensor<64x256xf32>) -> tensor<64x256xf32>
  %e = tensor.expand_shape %mm {groups} output_shape [{sizes}] : tensor<64x256xf32> into tensor<{t}xf32>
  %o = {empty} : tensor<{t}x{out}>
  %r = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{", ".join(['"parallel"'] * rank)}]}}
      ins({ins} : {types}) outs(%o : tensor<{t}x{out}>) {{
  ^bb0({args}, %out: {out}):
{body}
  }} -> tensor<{t}x{out}>
{after}  return %r : tensor<{t}x{out}>
}}"""


TRUNC = "    %y = arith.truncf %in : f32 to f16\n    linalg.yield %y : f16"
BIAS_RESIDUAL = """    %t = arith.truncf %in : f32 to f16
    %x = arith.addf %t, %bias : f16
    %y = arith.addf %x, %res : f16
    linalg.yield %y : f16"""


def test_bias_and_residual_after_the_expand():
    """BERT's output projection: the 3-D bias + residual generic reads the expanded product; the
    kernel's result and residual are that generic's [2, 32, 256], collapsed by ((0, 1), (2,))."""
    chain = chain_of(expanded("[2, 32, 256]", "[[0, 1], [2]]", BIAS_RESIDUAL, side="%bv: tensor<256xf16>, %rv: tensor<2x32x256xf16>",
                              side_map="affine_map<(d0, d1, d2) -> (d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>",
                              args="%in: f32, %bias: f16, %res: f16"))
    form = chain.forms[-1]
    assert (form.name, form.covers, form.groups) == ("bias_residual", 2, ((0, 1), (2,))), form.why
    assert form.result.shape == (2, 32, 256) and form.bias[1].shape == (256,) and form.residual[1].shape == (2, 32, 256)
    assert form.chain == (0, 0)  # the generic's operand 0 (the expand), its operand 0 (the matmul)


def test_expand_into_heads_then_a_transposing_reader():
    """BERT's QKV: expand to heads, truncf, then a transposing bias add, which IREE leaves in a
    dispatch of its own after the expand (not fused: no fused_next)."""
    transposing = """  %o2 = tensor.empty() : tensor<2x4x32x64xf16>
  %t2 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d2, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%r : tensor<2x32x4x64xf16>) outs(%o2 : tensor<2x4x32x64xf16>) {
  ^bb0(%in: f16, %out: f16):
    linalg.yield %in : f16
  } -> tensor<2x4x32x64xf16>
  "test.use"(%t2) : (tensor<2x4x32x64xf16>) -> ()
"""
    chain = chain_of(expanded("[2, 32, 4, 64]", "[[0, 1], [2, 3]]", TRUNC, after=transposing))
    form = chain.forms[-1]
    assert (form.name, form.covers, form.groups, chain.fused_next) == ("none", 2, ((0, 1), (2, 3)), None)


def test_a_bias_over_part_of_n_is_no_bias():
    """After an expand that splits n into heads, a bias read along the last dim is [d], not [n]."""
    body = "    %t = arith.truncf %in : f32 to f16\n    %y = arith.addf %t, %bias : f16\n    linalg.yield %y : f16"
    chain = chain_of(expanded("[2, 32, 4, 64]", "[[0, 1], [2, 3]]", body, side="%bv: tensor<64xf16>",
                              side_map="affine_map<(d0, d1, d2, d3) -> (d3)>", args="%in: f32, %bias: f16"))
    form = chain.forms[-1]
    assert form.name is None and "a bias over part of n" in form.why, form.why


def test_a_dynamic_expand_ends_the_chain():
    """A dynamic batch: the kernel's rows would be a product of sizes the call cannot restore."""
    mlir = (expanded("[?, 32, 256]", "[[0, 1], [2]]", TRUNC)
            .replace("%lhs: tensor<64x128xf16>", "%lhs: tensor<?x128xf16>").replace("tensor<64x128xf16>, tensor<128x256xf16>", "tensor<?x128xf16>, tensor<128x256xf16>")
            .replace("%empty = tensor.empty() : tensor<64x256xf32>", "%c0 = arith.constant 0 : index\n  %m = tensor.dim %lhs, %c0 : tensor<?x128xf16>\n"
                     "  %empty = tensor.empty(%m) : tensor<?x256xf32>")
            .replace("tensor<64x256xf32>", "tensor<?x256xf32>"))
    chain = chain_of(mlir)
    assert len(chain.forms) == 1 and "dynamic sizes" in chain.stop, chain.stop


def test_a_widening_cast_ends_the_chain():
    """An extf alone (BERT's cast of the residual sum before its LayerNorm): IREE clones it into
    the norm's dispatches, so the matmul's chain ends before it."""
    body = "    %y = arith.extf %in : f32 to f64\n    linalg.yield %y : f64"
    chain = chain_of(expanded("[2, 32, 256]", "[[0, 1], [2]]", body, out="f64"))
    assert len(chain.forms) == 1 and "widens" in chain.stop, chain.stop


# ------------------------------------------------------------------- built with the real tools

MATMUL, NORM = REPO / "kernels" / "matmul", REPO / "kernels" / "norm"


def iree_own_dispatches(vmfb) -> list[str]:
    """IREE's own dispatch kinds in a module, without their numbers."""
    names = set(re.findall(r"\$async_dispatch_\d+_[a-z_]+?(?=_\d|_f|_i|$)", vmfb.read_bytes().decode("latin-1")))
    return sorted({re.sub(r"^\$async_dispatch_\d+_", "", n) for n in names})


def _build(tmp_path_factory, head_bias: str):
    from models.epilogue_models import post_ln_layer_onnx

    make = functools.partial(post_ln_layer_onnx, head_bias=head_bias)
    return onnx_build_with_baseline(tmp_path_factory, [MATMUL, NORM], make, f"post_ln_{head_bias}")


@pytest.fixture(scope="module")
def post_ln_build(tmp_path_factory):
    return _build(tmp_path_factory, "split")


def _replaced(built) -> list[tuple]:
    report = json.loads(built.report.read_text())
    return [(r["op"], r.get("epilogue"), r.get("epilogue_ops_after"), r["inputs"][0]["dtype"]) for r in report["replaced"]]


def test_3d_linears_replaced_with_their_epilogues(post_ln_build):
    """Every matmul with what IREE fuses into its dispatch, every LayerNorm (the second and third
    reading x, the residual sum of an f16 epilogue, through its extf: x is f16)."""
    assert _replaced(post_ln_build) == [
        ("layer_norm", None, None, "f16"),
        ("linalg.matmul", "bias_heads", 3, "f16"),  # the expand into heads, the truncf, the transposing bias add
        ("linalg.matmul", "bias_residual", 3, "f16"),  # the expand, the truncf, the bias + residual generic
        ("layer_norm", None, None, "f16"),
        ("linalg.matmul", "bias_gelu_erf", 3, "f16"),
        ("linalg.matmul", "bias_residual", 3, "f16"),
        ("layer_norm", None, None, "f16"),
    ]
    report = json.loads(post_ln_build.report.read_text())
    residual = report["replaced"][2]
    assert [t["shape"] for t in residual["inputs"]] == [[64, 128], [128, 128], [128], [2, 32, 128]]
    assert residual["result"] == {"dtype": "f16", "shape": [2, 32, 128]}
    spec = post_ln_build.spec.read_text()  # the residual reaches the kernel collapsed to [m, n]
    assert "tensor.collapse_shape %x3 [[0, 1], [2]] : tensor<2x32x128xf16> into tensor<64x128xf16>" in spec


def test_3d_layer_leaves_iree_only_what_it_ran_alone(post_ln_build):
    """IREE alone: 4 matmul dispatches (with their epilogues), 4 norm reductions, the transposing
    bias add of q. Replaced: none of them (q's transposing bias add is the bias_heads epilogue)."""
    alone, mine = iree_own_dispatches(post_ln_build.baseline_vmfb), iree_own_dispatches(post_ln_build.vmfb)
    assert "matmul" in alone and "reduction" in alone and "elementwise_transpose" in alone, alone
    assert mine == [], mine


@needs_iree
def test_an_op_after_a_second_expand_stays_iree_s(tmp_path_factory):
    """q = Reshape(h Wq) + bq[d]: IREE expands the product to [b, s, n], rounds it, expands again
    to heads and adds the per-head bias in a dispatch of its own (not the matmul's); the kernel
    takes the matmul and the rounding, the add stays IREE's as it was."""
    built = _build(tmp_path_factory, "per_head")
    assert _replaced(built)[1] == ("linalg.matmul", "none", 2, "f16")
    alone, mine = iree_own_dispatches(built.baseline_vmfb), iree_own_dispatches(built.vmfb)
    assert mine == ["elementwise"] and "elementwise" in alone, (mine, alone)


@pytest.mark.gpu
def test_3d_layer_agrees_with_iree_on_gpu(request, prebuilt_dir):
    """The post-LN layer with its matmuls, epilogues and norms in the kit's kernels agrees with
    IREE alone (f16 tolerance), and the kit's kernels ran."""
    from kitdispatch.models.compare import compare_model

    result = compare_model(prebuilt_or_fixture(request, prebuilt_dir, "epilogue_post_ln_model", "post_ln_build"))
    assert result.agree, result.worst
    assert any(n.startswith("matmul_nn_f16_bias_residual") for n in result.kernel_names), result.kernel_names
    assert any(n.startswith("layer_norm_f16") for n in result.kernel_names), result.kernel_names


def test_a_reader_past_unit_dims_is_fused():
    """Llama's P.V: a batch_matmul [16, 512, 128], expanded to [16, 1, 512, 128] (a unit dim),
    then transposed and rounded. IREE folds the unit dim and fuses the transposing truncf into
    the batch_matmul's dispatch, so the kernel may not leave it alone (fused_next)."""
    mlir = """
func.func @f(%p: tensor<16x512x512xf16>, %v: tensor<16x512x128xf16>) -> tensor<1x512x16x128xf16> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<16x512x128xf32>
  %f = linalg.fill ins(%zero : f32) outs(%empty : tensor<16x512x128xf32>) -> tensor<16x512x128xf32>
  %mm = linalg.batch_matmul ins(%p, %v : tensor<16x512x512xf16>, tensor<16x512x128xf16>) outs(%f : tensor<16x512x128xf32>) -> tensor<16x512x128xf32>
  %e = tensor.expand_shape %mm [[0], [1, 2], [3]] output_shape [16, 1, 512, 128] : tensor<16x512x128xf32> into tensor<16x1x512x128xf32>
  %o = tensor.empty() : tensor<1x512x16x128xf16>
  %t = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d2, d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>],
                       iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%e : tensor<16x1x512x128xf32>) outs(%o : tensor<1x512x16x128xf16>) {
  ^bb0(%in: f32, %out: f16):
    %y = arith.truncf %in : f32 to f16
    linalg.yield %y : f16
  } -> tensor<1x512x16x128xf16>
  return %t : tensor<1x512x16x128xf16>
}"""
    chain = chain_of(mlir, ("linalg.batch_matmul",))
    assert len(chain.forms) == 1 and chain.fused_next == "linalg.generic {truncf}", (chain.stop, chain.fused_next)
