"""Matmuls as exporters give them, through real iree-import-onnx and iree-compile to the matching
stage, against the library (kernels/matmul): which entry each form gets, and why the others are
kept. The forms: tests/data/matmul_forms/make_model.py."""

from __future__ import annotations

import pytest
from conftest import choose_config, library_matmul_kernels, make_matmul_form, needs_iree_compile, only, ops_at_matching_stage

from kitdispatch.models.ops.base import Operand, Reshape
from kitdispatch.models.replace import decide

pytestmark = needs_iree_compile

M, K, N, BATCH = 128, 256, 384, 6  # make_model.py's defaults
DROP_BATCH = Reshape(((0, 1), (2,)))


def _decision(tmp_path, form, dtype="f16", *, tf32=False):
    model = tmp_path / f"{form}.onnx"
    make_matmul_form(model, form, "--dtype", dtype)
    return only(decide(ops_at_matching_stage(model, tmp_path), library_matmul_kernels(), tf32=tf32))


def _suffix(*shape):
    config = choose_config(*shape)
    return f"_{config}" if config else ""


@pytest.mark.parametrize(
    "form, op, kernel",
    [
        ("plain", "linalg.matmul", "matmul_nn_f16_f32_none" + _suffix(M, N, K)),
        ("wt", "linalg.matmul", "matmul_nt_f16_f32_none" + _suffix(M, N, K)),
        ("gemm_tb", "linalg.matmul", "matmul_nt_f16_f32_none" + _suffix(M, N, K)),
        ("linear3d", "linalg.matmul", "matmul_nt_f16_f32_none" + _suffix(BATCH * M, N, K)),  # A collapsed by IREE
        ("bcast", "linalg.matmul", "matmul_nn_f16_f32_none" + _suffix(BATCH * M, N, K)),  # B broadcast: A collapsed
        ("batch1", "linalg.batch_matmul", "matmul_nn_f16_f32_none" + _suffix(M, N, K)),
        ("bmm", "linalg.batch_matmul", "bmm_nn_f16_f32_none" + _suffix(M, N, K, "f16", BATCH)),
        ("bmm4d", "linalg.batch_matmul", "bmm_nn_f16_f32_none" + _suffix(M, N, K, "f16", BATCH)),  # [2,3,...] folded to 6
    ],
)
def test_each_f16_form_gets_its_entry(tmp_path, form, op, kernel):
    """IREE gives an f16 MatMul as f16 x f16 -> f32 (a truncf after it): the f32-result entry."""
    d = _decision(tmp_path, form)
    assert d.op.kind == op and d.op.result.dtype == "f32"
    assert d.kernel is not None and d.kernel.name == kernel, d.reasons
    if form == "batch1":  # the 2-D kernel, through reshapes that drop the unit batch dim
        assert d.call.variant == "_batch1" and d.call.result == DROP_BATCH
        assert all(a == Operand((i,), DROP_BATCH) for i, a in enumerate(d.call.operands))


@pytest.mark.parametrize(
    "form, kernel, tf32_kernel",
    [
        ("plain", "matmul_nn_f32_none", "matmul_nn_f32_tf32_none"),
        ("gemm_tb", "matmul_nt_f32_none", "matmul_nt_f32_tf32_none"),
        ("batch1", "matmul_nn_f32_none", "matmul_nn_f32_tf32_none"),
    ],
)
def test_f32_forms_get_3xtf32_and_tf32_only_when_asked(tmp_path, form, kernel, tf32_kernel):
    d = _decision(tmp_path, form, "f32")
    assert d.kernel.name == kernel and d.to_json()["arithmetic"] == "3xtf32"
    d = _decision(tmp_path, form, "f32", tf32=True)
    assert d.kernel.name == tf32_kernel and d.to_json()["arithmetic"] == "tf32"


def test_an_f32_batch_matmul_is_kept_with_the_reasons(tmp_path):
    """The library has no batched f32 kernel: the 2-D ones take batch 1 only, the bmm ones f16/bf16."""
    d = _decision(tmp_path, "bmm", "f32")
    assert d.kernel is None
    assert f"matmul_nn_f32_none: batch: the op's batch is {BATCH}; the kernel is 2-D (it takes batch 1 only)" in d.reasons
    assert any(r.startswith("bmm_nn_f16_f32_none: element type") for r in d.reasons), d.reasons
