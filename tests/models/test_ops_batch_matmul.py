"""linalg.batch_matmul (models/ops/batch_matmul.py)."""

from __future__ import annotations

import dataclasses

from conftest import (
    matmul_kernel,
    only,
    ops_of,
)

from kitdispatch.models.ops.base import Operand, Reshape
from kitdispatch.models.replace import decide


def test_batch_matmul_hit():
    t = lambda s: f"tensor<{s}>"  # noqa: E731
    model = f"""
func.func @f(%a: {t('4x64x32xf16')}, %b: {t('4x32x48xf16')}) -> {t('4x64x48xf32')} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {t('4x64x48xf32')}
  %acc = linalg.fill ins(%z : f32) outs(%e : {t('4x64x48xf32')}) -> {t('4x64x48xf32')}
  %r = linalg.batch_matmul ins(%a, %b : {t('4x64x32xf16')}, {t('4x32x48xf16')}) outs(%acc : {t('4x64x48xf32')}) -> {t('4x64x48xf32')}
  return %r : {t('4x64x48xf32')}
}}"""
    kernel = matmul_kernel("f16[batch,m,k]", "f16[batch,k,n]", "f32[batch,m,n]", kind="linalg.batch_matmul")
    assert only(decide(ops_of(model), [kernel])).kernel is not None
    # The plain matmul kernel does not take it: it declares linalg.matmul only.
    assert decide(ops_of(model), [matmul_kernel()])[0].kernel is None


def _batch_matmul(batch, *, transpose_b=False, dtype="f16"):
    a, c = f"tensor<{batch}x64x32x{dtype}>", f"tensor<{batch}x64x48xf32>"
    b = f"tensor<{batch}x48x32x{dtype}>" if transpose_b else f"tensor<{batch}x32x48x{dtype}>"
    maps = (
        " indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d2, d3)>, "
        "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>]" if transpose_b else ""
    )
    return f"""
func.func @f(%a: {a}, %b: {b}) -> {c} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {c}
  %acc = linalg.fill ins(%z : f32) outs(%e : {c}) -> {c}
  %r = linalg.batch_matmul{maps} ins(%a, %b : {a}, {b}) outs(%acc : {c}) -> {c}
  return %r : {c}
}}"""


def _kernel(a, b, c, kinds=("linalg.matmul", "linalg.batch_matmul")):
    from kitdispatch import Replaces

    kernel = matmul_kernel(a, b, c)
    return dataclasses.replace(kernel, replaces=Replaces.create(list(kinds)))


TWO_D = _kernel("f16[m,k]", "f16[k,n]", "f32[m,n]")
BMM_NT = _kernel("f16[batch,m,k]", "f16[batch,n,k]", "f32[batch,m,n]", ("linalg.batch_matmul",))
DROP_BATCH = Reshape(((0, 1), (2,)))


def test_batch_1_runs_the_2d_kernel_through_reshapes():
    d = only(decide(ops_of(_batch_matmul(1)), [TWO_D]))
    assert d.kernel is TWO_D and d.call.variant == "_batch1" and d.call.result == DROP_BATCH
    assert d.call.operands == (Operand((0,), DROP_BATCH), Operand((1,), DROP_BATCH))


def test_any_other_batch_is_not_for_the_2d_kernel():
    d = only(decide(ops_of(_batch_matmul(6)), [TWO_D]))
    assert d.reasons == ("matmul_f16: batch: the op's batch is 6; the kernel is 2-D (it takes batch 1 only)",)


def test_batch_matmul_reading_b_transposed_takes_the_bmm_nt_kernel():
    d = only(decide(ops_of(_batch_matmul(6, transpose_b=True)), [TWO_D, BMM_NT]))
    assert d.kernel is BMM_NT and d.call.result is None and d.op.detail.b_layout == "nt"
    assert d.reasons == () and d.call.operands == (Operand((0,)), Operand((1,)))
    kept = only(decide(ops_of(_batch_matmul(6)), [BMM_NT]))
    assert "the op reads B [k,n]; the kernel's b is B transposed, W [n,k]" in kept.reasons[0]


def test_a_batch_matmul_with_an_accumulator_is_kept():
    model = _batch_matmul(1).replace("arith.constant 0.0 : f32", "arith.constant 2.0 : f32")
    d = only(decide(ops_of(model), [TWO_D]))
    assert "the op accumulates into linalg.fill of 2.000000e+00 : f32, not a zero fill" in d.reasons[0]


def _through_transpose(perm: str, k_shape: str, kt_shape: str) -> str:
    """A batch_matmul whose B is a plain transpose generic of `k` (attention's Q K^T)."""
    c = "tensor<6x64x48xf32>"
    return f"""
func.func @f(%a: tensor<6x64x32xf16>, %k: tensor<{k_shape}xf16>) -> {c} {{
  %z = arith.constant 0.0 : f32
  %t0 = tensor.empty() : tensor<{kt_shape}xf16>
  %kt = linalg.generic {{indexing_maps = [affine_map<(d0, d1, d2) -> {perm}>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>],
                        iterator_types = ["parallel", "parallel", "parallel"]}}
        ins(%k : tensor<{k_shape}xf16>) outs(%t0 : tensor<{kt_shape}xf16>) {{
  ^bb0(%in: f16, %out: f16):
    linalg.yield %in : f16
  }} -> tensor<{kt_shape}xf16>
  %e = tensor.empty() : {c}
  %acc = linalg.fill ins(%z : f32) outs(%e : {c}) -> {c}
  %r = linalg.batch_matmul ins(%a, %kt : tensor<6x64x32xf16>, tensor<{kt_shape}xf16>) outs(%acc : {c}) -> {c}
  return %r : {c}
}}"""


BMM_NN = _kernel("f16[batch,m,k]", "f16[batch,k,n]", "f32[batch,m,n]", ("linalg.batch_matmul",))


def test_b_through_a_transpose_of_its_last_dims_is_read_as_it_is_stored():
    """K [6,48,32] transposed to [6,32,48] for the op: the nt kernel reads K itself (path (1, 0))."""
    d = only(decide(ops_of(_through_transpose("(d0, d2, d1)", "6x48x32", "6x32x48")), [BMM_NN, BMM_NT]))
    assert d.kernel is BMM_NT and d.call.operands == (Operand((0,)), Operand((1, 0)))
    assert d.op.inputs[1].shape == (6, 48, 32) and d.to_json()["b_through_transpose"] == [1, 0]


def test_a_transpose_of_other_dims_is_an_ordinary_b():
    """A transpose that swaps the batch dim is no W^T: B is the transposed tensor, [k,n] as usual."""
    model = _through_transpose("(d1, d0, d2)", "32x6x48", "6x32x48")
    d = only(decide(ops_of(model), [BMM_NT, BMM_NN]))
    assert d.kernel is BMM_NN and d.call.operands == (Operand((0,)), Operand((1,)))
    kept = only(decide(ops_of(model), [BMM_NT]))
    assert "the op reads B [k,n]; the kernel's b is B transposed, W [n,k]" in kept.reasons[0]


def _linear_batch1() -> str:
    """torch's batch-1 nn.Linear after IREE: W [48,1,32] (expanded [n,k]) transposed to [1,32,48]."""
    c = "tensor<1x64x48xf32>"
    return f"""
func.func @f(%a: tensor<1x64x32xf16>, %w: tensor<48x1x32xf16>) -> {c} {{
  %z = arith.constant 0.0 : f32
  %t0 = tensor.empty() : tensor<1x32x48xf16>
  %wt = linalg.generic {{indexing_maps = [affine_map<(d0, d1, d2) -> (d2, d0, d1)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>],
                        iterator_types = ["parallel", "parallel", "parallel"]}}
        ins(%w : tensor<48x1x32xf16>) outs(%t0 : tensor<1x32x48xf16>) {{
  ^bb0(%in: f16, %out: f16):
    linalg.yield %in : f16
  }} -> tensor<1x32x48xf16>
  %e = tensor.empty() : {c}
  %acc = linalg.fill ins(%z : f32) outs(%e : {c}) -> {c}
  %r = linalg.batch_matmul ins(%a, %wt : tensor<1x64x32xf16>, tensor<1x32x48xf16>) outs(%acc : {c}) -> {c}
  return %r : {c}
}}"""


def test_a_batch_1_linear_reads_its_weight_flat_with_the_2d_nt_kernel():
    two_d_nt = _kernel("f16[m,k]", "f16[n,k]", "f32[m,n]")
    d = only(decide(ops_of(_linear_batch1()), [BMM_NT, two_d_nt]))
    assert d.kernel is two_d_nt and d.call.operands == (Operand((0,), DROP_BATCH), Operand((1, 0), Reshape(((0,), (1, 2)))))
    kept = only(decide(ops_of(_linear_batch1()), [BMM_NT]))
    assert kept.reasons == (
        "matmul_f16: B is a weight [n,k] transposed with its unit batch dim moved; a 2-D kernel reads it, a batched one does not",
    )
