"""linalg.batch_matmul (models/ops/batch_matmul.py)."""

from __future__ import annotations

from conftest import (
    matmul_kernel,
    only,
    ops_of,
)

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
