"""linalg.matmul (models/ops/matmul.py): plain operands, zero fill or an accumulating kernel."""

from __future__ import annotations

import pytest
from conftest import (
    matmul_kernel,
    matmul_model,
    only,
    ops_of,
)

from kitdispatch.models.replace import decide


def test_matmul_hit_with_zero_fill():
    d = only(decide(ops_of(matmul_model()), [matmul_kernel(multiple_of={"k": 16})]))
    assert d.kernel is not None and d.paths == ((0,), (1,))


@pytest.mark.parametrize(
    "model, kernel, reason",
    [
        (matmul_model(init="1.0"), matmul_kernel(), "accumulates into linalg.fill of 1.000000e+00 : f32, not a zero fill"),
        (matmul_model(init=None), matmul_kernel(), "accumulates into tensor.empty, not a zero fill"),
        (matmul_model(transpose_b=True), matmul_kernel(), "the op reads B transposed, W [n,k]; the kernel's b is B [k,n]"),
        (matmul_model(k=250), matmul_kernel(multiple_of={"k": 16}), "k = 250 is not a multiple of 16"),
        (matmul_model(dtype="bf16"), matmul_kernel(), "element type: the op's input 0 is 512x250xbf16".replace("250", "256")),
    ],
    ids=["non-zero-accumulator", "undefined-accumulator", "transposed", "divisibility", "dtype"],
)
def test_matmul_near_misses(model, kernel, reason):
    d = only(decide(ops_of(model), [kernel]))
    assert d.kernel is None
    assert reason in d.reasons[0], d.reasons


def test_accumulating_kernel_takes_any_accumulator():
    d = only(decide(ops_of(matmul_model(init="1.0")), [matmul_kernel(access="inout")]))
    assert d.kernel is not None and d.paths == ((0,), (1,), (2,))


# ------------------------------------------------------------------ B transposed (A @ W^T)


def test_b_transposed_takes_the_nt_kernel_and_not_the_nn_one():
    """IREE 3.13 gives nn.Linear / Gemm transB=1 / MatMul of a transposed weight as a
    linalg.matmul whose indexing maps read B [n,k] (test_ops_matmul_forms.py: from ONNX)."""
    model = matmul_model(transpose_b=True)
    nt = matmul_kernel(b="f16[n,k]")
    d = only(decide(ops_of(model), [matmul_kernel(), nt]))
    assert d.kernel is nt and d.op.detail.b_layout == "nt"
    assert d.reasons == () and d.to_json()["b_layout"] == "nt"
    kept = only(decide(ops_of(model), [matmul_kernel()]))
    assert "the op reads B transposed, W [n,k]; the kernel's b is B [k,n]" in kept.reasons[0]
    kept = only(decide(ops_of(matmul_model()), [nt]))
    assert "the op reads B [k,n]; the kernel's b is B transposed, W [n,k]" in kept.reasons[0]


def _mapped_matmul(a_map: str, b_map: str, a: str, b: str) -> str:
    c = "tensor<64x48xf32>"
    return f"""
func.func @f(%a: tensor<{a}xf16>, %b: tensor<{b}xf16>) -> {c} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {c}
  %acc = linalg.fill ins(%z : f32) outs(%e : {c}) -> {c}
  %r = linalg.matmul indexing_maps = [affine_map<(d0, d1, d2) -> {a_map}>, affine_map<(d0, d1, d2) -> {b_map}>,
                                      affine_map<(d0, d1, d2) -> (d0, d1)>]
       ins(%a, %b : tensor<{a}xf16>, tensor<{b}xf16>) outs(%acc : {c}) -> {c}
  return %r : {c}
}}"""


@pytest.mark.parametrize(
    "model",
    [
        _mapped_matmul("(d2, d0)", "(d2, d1)", "32x64", "32x48"),  # A transposed
        _mapped_matmul("(d0, d2)", "(d2)", "64x32", "32"),  # B broadcast over n
    ],
    ids=["a-transposed", "b-broadcast"],
)
def test_maps_no_kernel_reads_are_kept(model):
    kernels = [matmul_kernel(), matmul_kernel(b="f16[n,k]")]
    d = only(decide(ops_of(model), kernels))
    [reason] = d.reasons  # both kernels, named together
    assert d.kernel is None and reason.startswith(
        "matmul_f16, matmul_f16: the op's operands are broadcast, cast or transposed in a way no kernel reads (indexing maps [affine_map"
    )


# ------------------------------------------------------------------ replace_when.when (per-shape configs)


def test_the_first_kernel_whose_condition_holds_wins():
    small = matmul_kernel(when="ceildiv(m, 128) * ceildiv(n, 128) <= 12 && k >= 768")
    deep = matmul_kernel(when="k >= 2048 || !(m > 64)")
    default = matmul_kernel()
    assert only(decide(ops_of(matmul_model(m=128, k=768, n=768)), [small, deep, default])).kernel is small
    assert only(decide(ops_of(matmul_model(m=1024, k=4096, n=768)), [small, deep, default])).kernel is deep
    d = only(decide(ops_of(matmul_model(m=1024, k=256, n=768)), [small, deep, default]))
    assert d.kernel is default and d.reasons == ()
    kept = only(decide(ops_of(matmul_model(m=1024, k=256, n=768)), [small]))
    assert kept.reasons == (
        "matmul_f16: limit: the condition 'ceildiv(m, 128) * ceildiv(n, 128) <= 12 && k >= 768' is false for m = 1024, n = 768, k = 256",
    )


def test_a_condition_over_a_dynamic_size_cannot_be_checked():
    model = matmul_model().replace("tensor<512x256xf16>", "tensor<?x256xf16>").replace("tensor<512x1000xf32>", "tensor<?x1000xf32>")
    model = model.replace("%e = tensor.empty() :", "%c0 = arith.constant 0 : index\n  %d = tensor.dim %a, %c0 : tensor<?x256xf16>\n  %e = tensor.empty(%d) :")
    d = only(decide(ops_of(model), [matmul_kernel(when="m <= 1024")]))
    assert d.reasons == ("matmul_f16: limit: m is dynamic in the model, and the condition 'm <= 1024' cannot be checked",)


def test_a_condition_that_divides_by_a_size_of_zero_says_so():
    d = only(decide(ops_of(matmul_model(m=512, k=256, n=1000)), [matmul_kernel(when="ceildiv(m, k - 256) > 1")]))
    assert "divides by zero for m = 512, k = 256" in d.reasons[0]


# ------------------------------------------------------------------ f32: 3xTF32, TF32 on request


def test_tf32_kernels_replace_only_when_the_build_asks():
    model = matmul_model(dtype="f32")
    tf32 = matmul_kernel("f32[m,k]", "f32[k,n]", arithmetic="tf32")
    three = matmul_kernel("f32[m,k]", "f32[k,n]", arithmetic="3xtf32")
    d = only(decide(ops_of(model), [tf32, three]))
    assert d.kernel is three and d.to_json()["arithmetic"] == "3xtf32"
    d = only(decide(ops_of(model), [tf32, three], tf32=True))
    assert d.kernel is tf32 and d.to_json()["arithmetic"] == "tf32"
    assert only(decide(ops_of(model), [tf32])).reasons == ()  # not a candidate: no reason to give
