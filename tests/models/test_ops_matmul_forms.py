"""Matmuls as exporters give them, through real iree-import-onnx and iree-compile to the matching
stage, against the library (kernels/matmul): which entry each form gets, and why the others are
kept. The forms: tests/data/matmul_forms/make_model.py."""

from __future__ import annotations

import pytest
from conftest import (
    HAVE_IREE_COMPILE,
    REPO,
    choose_config,
    f32_matmul_entry,
    iree_dispatches,
    library_matmul_kernels,
    make_matmul_form,
    needs_iree_compile,
    only,
    ops_at_matching_stage,
)

from kitdispatch import BuildOptions
from kitdispatch.models.compare import compare_model
from kitdispatch.models.ops.base import Operand, Reshape
from kitdispatch.models.pipeline import build_model
from kitdispatch.models.replace import decide

M, K, N, BATCH = 128, 256, 384, 6  # make_model.py's defaults
DROP_BATCH = Reshape(((0, 1), (2,)))


def _decision(tmp_path, form, dtype="f16", *sizes, tf32=False):
    model = tmp_path / f"{form}.onnx"
    make_matmul_form(model, form, "--dtype", dtype, *sizes)
    return only(decide(ops_at_matching_stage(model, tmp_path), library_matmul_kernels(), tf32=tf32))


def _suffix(*shape):
    config = choose_config(*shape)
    return f"_{config}" if config else ""


@needs_iree_compile
@pytest.mark.parametrize(
    "form, op, kernel, marked",
    [
        ("plain", "linalg.matmul", "matmul_nn_f16_none" + _suffix(M, N, K), 1),
        ("wt", "linalg.matmul", "matmul_nt_f16_none" + _suffix(M, N, K), 1),
        ("gemm_tb", "linalg.matmul", "matmul_nt_f16_none" + _suffix(M, N, K), 1),
        # A collapsed by IREE, the result expanded before the truncf: the f16 entry with the expand and the truncf
        ("linear3d", "linalg.matmul", "matmul_nt_f16_none" + _suffix(BATCH * M, N, K), 2),
        ("bcast", "linalg.matmul", "matmul_nn_f16_none" + _suffix(BATCH * M, N, K), 2),  # B broadcast: A collapsed, expanded back
        ("batch1", "linalg.batch_matmul", "matmul_nn_f16_none" + _suffix(M, N, K), 2),  # with the collapse and the truncf
        ("bmm", "linalg.batch_matmul", "bmm_nn_f16_none" + _suffix(M, N, K, "f16", BATCH), 1),
        ("bmm4d", "linalg.batch_matmul", "bmm_nn_f16_none" + _suffix(M, N, K, "f16", BATCH), 1),  # [2,3,...] folded to 6
        ("qkt", "linalg.batch_matmul", "bmm_nt_f16_none" + _suffix(M, N, K, "f16", BATCH), 1),  # K read through its transpose
    ],
)
def test_each_f16_form_gets_its_entry(tmp_path, form, op, kernel, marked):
    """IREE gives an f16 MatMul as f16 x f16 -> f32 and a truncf after it: where the truncf
    follows it, the f16-result entry replaces both (its "none" epilogue rounds the f32 sum once
    to f16, as the truncf does; `marked` counts the ops after the matmul it replaces)."""
    d = _decision(tmp_path, form)
    assert d.kernel is not None and d.kernel.name == kernel, d.reasons
    assert d.op.kind == op and d.call.marked == marked
    chain = (0,) * marked  # the operands are read back from the last op replaced
    if form == "batch1":  # the 2-D kernel, through reshapes that drop the unit batch dim
        assert d.call.variant == "_batch1"
        assert all(a == Operand(chain + (i,), DROP_BATCH) for i, a in enumerate(d.call.operands))
    if form in ("linear3d", "bcast"):  # the kernel's [m, n] result expanded back to the truncf's [batch, m, n]
        assert d.call.result == Reshape(((0, 1), (2,)))
    if form == "qkt":  # K [2,3,n,k] itself (the transpose's input), collapsed to [6,n,k] for bmm_nt's w
        assert d.call.operands == (Operand(chain + (0,)), Operand(chain + (1, 0, 0), Reshape(((0, 1), (2,), (3,)))))
        assert d.to_json()["b_through_transpose"] == [1, 0, 0]


@needs_iree_compile
@pytest.mark.parametrize(
    "form, kernel, tf32_kernel",
    [
        ("plain", f32_matmul_entry("matmul_nn_f32_none", M, N, K), f32_matmul_entry("matmul_nn_f32_tf32_none", M, N, K)),
        ("gemm_tb", f32_matmul_entry("matmul_nt_f32_none", M, N, K), f32_matmul_entry("matmul_nt_f32_tf32_none", M, N, K)),
        ("batch1", f32_matmul_entry("matmul_nn_f32_none", M, N, K), f32_matmul_entry("matmul_nn_f32_tf32_none", M, N, K)),
    ],
)
def test_f32_forms_get_3xtf32_and_tf32_only_when_asked(tmp_path, form, kernel, tf32_kernel):
    d = _decision(tmp_path, form, "f32")
    assert d.kernel.name == kernel and d.to_json()["arithmetic"] == "3xtf32"
    d = _decision(tmp_path, form, "f32", tf32=True)
    assert d.kernel.name == tf32_kernel and d.to_json()["arithmetic"] == "tf32"


@needs_iree_compile
@pytest.mark.parametrize("form, layout, n", [("bmm", "nn", N), ("bmm4d", "nn", N), ("qkt", "nt", N), ("bmm", "nn", 64)])
def test_f32_batch_matmuls_get_the_batched_f32_entries(tmp_path, form, layout, n):
    """An f32 batch_matmul of batch 6 (4-D folded; K read through its transpose; n = 64, attention's
    P V: 64-wide tiles): the bmm entry of the config choose_config_f32 picks for the whole batch,
    3xTF32 and TF32 when asked."""
    for tf32 in (False, True):
        d = _decision(tmp_path, form, "f32", "--n", n, tf32=tf32)
        family = f"bmm_{layout}_f32{'_tf32' if tf32 else ''}_none"
        assert d.kernel is not None and d.kernel.name == f32_matmul_entry(family, M, n, K, BATCH), d.reasons
        assert d.to_json()["arithmetic"] == ("tf32" if tf32 else "3xtf32") and d.call.marked == 0


LINEAR_TORCH = REPO / "tests" / "data" / "matmul_forms" / "linear_torch.mlir"


@needs_iree_compile
def test_nn_linear_as_torch_mlir_writes_it(tmp_path):
    """torch.aten.linear: 3-D f16 -> the nt entry on A collapsed, with the expand and the truncf
    after it (the f16 entry); f32 at batch 1 -> a
    batch_matmul whose B is W [384,1,256] transposed to [1,256,384], read as W [384,256] by the
    2-D nt entry (the transpose is not run)."""
    linear, batch1 = decide(ops_at_matching_stage(LINEAR_TORCH, tmp_path), library_matmul_kernels())
    assert linear.kernel.name == "matmul_nt_f16_none" + _suffix(128, N, K) and linear.call.marked == 2  # the expand, the truncf
    assert batch1.op.kind == "linalg.batch_matmul" and batch1.kernel.name == f32_matmul_entry("matmul_nt_f32_none", 128, N, K)
    assert batch1.call.operands == (Operand((0,), DROP_BATCH), Operand((1, 0), Reshape(((0,), (1, 2)))))
    assert batch1.op.inputs[1].shape == (N, 1, K) and batch1.call.variant == "_batch1"


# ------------------------------------------------------------------ whole builds (CPU side)

# form, dtype, tf32 -> the kit kernel in the .vmfb (default sizes)
BUILDS = {
    "nt": ("wt", "f16", False, "matmul_nt_f16_none" + _suffix(M, N, K)),
    "batch1": ("batch1", "f16", False, "matmul_nn_f16_none" + _suffix(M, N, K)),
    "bmm": ("bmm", "f16", False, "bmm_nn_f16_none" + _suffix(M, N, K, "f16", BATCH)),
    "qkt": ("qkt", "f16", False, "bmm_nt_f16_none" + _suffix(M, N, K, "f16", BATCH)),
    "f32": ("gemm_tb", "f32", False, f32_matmul_entry("matmul_nt_f32_none", M, N, K)),
    "tf32": ("gemm_tb", "f32", True, f32_matmul_entry("matmul_nt_f32_tf32_none", M, N, K)),
    "bmm_f32": ("bmm", "f32", False, f32_matmul_entry("bmm_nn_f32_none", M, N, K, BATCH)),
    "qkt_f32": ("qkt", "f32", False, f32_matmul_entry("bmm_nt_f32_none", M, N, K, BATCH)),
    "pv_f32": ("bmm", "f32", False, f32_matmul_entry("bmm_nn_f32_none", M, 64, K, BATCH)),  # 64-wide tiles
}
SIZES = {"pv_f32": ("--n", 64)}  # make_model.py's sizes where not its defaults


@needs_iree_compile
def test_build_model_of_torch_linear_runs_no_iree_matmul_or_transpose(tmp_path):
    built = build_model(None, LINEAR_TORCH, BuildOptions.create("sm_90"), tmp_path / "out")
    kernels = sorted(d.kernel.name for d in built.decisions if d.kernel is not None)
    assert kernels == sorted(["matmul_nt_f16_none" + _suffix(128, N, K), f32_matmul_entry("matmul_nt_f32_none", 128, N, K)])
    left = {kind: iree_dispatches(built.vmfb, kind) for kind in ("matmul", "batch_matmul", "transpose")}
    assert not any(left.values()), left


def _build(tmp_path, case, *, with_baseline=False):
    form, dtype, tf32, _ = BUILDS[case]
    model = tmp_path / f"{case}.onnx"
    make_matmul_form(model, form, "--dtype", dtype, *SIZES.get(case, ()))
    return build_model(None, model, BuildOptions.create("sm_90"), tmp_path / "out", tf32=tf32, with_baseline=with_baseline)


@needs_iree_compile
@pytest.mark.parametrize("case", sorted(BUILDS))
def test_build_model_replaces_each_form(tmp_path, case):
    """`build --model` with the library, real iree-compile: the kit's entry is in the .vmfb
    and IREE's own matmul dispatch is gone (Q K^T: the transpose too); the report names the
    arithmetic of f32 ones."""
    *_, kernel = BUILDS[case]
    built = _build(tmp_path, case)
    [replaced] = [d for d in built.decisions if d.op.kind in ("linalg.matmul", "linalg.batch_matmul")]
    assert replaced.kernel.name == kernel
    text = built.vmfb.read_bytes().decode("latin-1")
    assert kernel in text and not iree_dispatches(built.vmfb, "matmul") | iree_dispatches(built.vmfb, "batch_matmul")
    report = built.report.read_text()
    if case.startswith("qkt"):  # the kernel reads K as it is: IREE's transpose dispatch died with the op
        assert not iree_dispatches(built.vmfb, "transpose")
    assert ('"arithmetic": "tf32"' in report) == (case == "tf32")
    assert ('"arithmetic": "3xtf32"' in report) == (case in ("f32", "bmm_f32", "qkt_f32", "pv_f32"))


# ------------------------------------------------------------------ on the GPU, against IREE alone


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(BUILDS))
def test_each_form_agrees_with_iree_alone_on_gpu(tmp_path, prebuilt_dir, case):
    """The built model against its baseline (compare): f16 within f16's tolerance, f32 in
    3xTF32 within f32's scale, TF32 within its own (prebuilt as `matmul_CASE_model` where the
    GPU machine has no iree-compile: tools/prebuild.py)."""
    built = prebuilt_dir / f"matmul_{case}_model" if prebuilt_dir else None
    if built is None or not built.is_dir():
        if not HAVE_IREE_COMPILE:
            pytest.skip("iree-compile is not installed and the model was not prebuilt")
        built = _build(tmp_path, case, with_baseline=True).out_dir
    result = compare_model(built)
    assert result.agree, (result.tolerance, result.worst)
    assert result.kernel_names == (BUILDS[case][3],)


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")
def test_torch_linear_agrees_with_iree_alone_on_gpu(tmp_path):
    """Both functions of linear_torch.mlir (the f16 nt matmul; the f32 batch-1 one reading W flat)."""
    built = build_model(None, LINEAR_TORCH, BuildOptions.create("sm_90"), tmp_path / "out", with_baseline=True).out_dir
    for function in ("linear_f16", "linear_f32_batch1"):
        result = compare_model(built, function=function)
        assert result.agree, (function, result.tolerance, result.worst)


# ------------------------------------------------------------------ the 64-row tile configs
# M = 128 with N = 384: 12 tiles of 64 x 64. K = 256 gives t64x64 (the BUILDS above); K = 2048 the
# split t64x64_k4 (4 CTAs a tile in a cluster, partials summed through the per-SM slots).
DEEP_K = 2048


def _build_deep_k(tmp_path, *, with_baseline=False):
    model = tmp_path / "deep_k.onnx"
    make_matmul_form(model, "wt", "--dtype", "f16", "--k", DEEP_K)
    return build_model(None, model, BuildOptions.create("sm_90"), tmp_path / "out", with_baseline=with_baseline)


def test_small_m_shapes_get_the_64_row_configs():
    assert _suffix(M, N, K) == "_t64x64" and _suffix(M, N, DEEP_K) == "_t64x64_k4"


@needs_iree_compile
def test_build_model_replaces_a_deep_k_matmul_with_the_split_64_row_entry(tmp_path):
    built = _build_deep_k(tmp_path)
    [replaced] = [d for d in built.decisions if d.op.kind == "linalg.matmul"]
    assert replaced.kernel.name == "matmul_nt_f16_none_t64x64_k4", replaced.reasons
    assert "matmul_nt_f16_none_t64x64_k4" in built.vmfb.read_bytes().decode("latin-1")
    assert not iree_dispatches(built.vmfb, "matmul")


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")
def test_deep_k_split_64_row_entry_agrees_with_iree_alone_on_gpu(tmp_path):
    result = compare_model(_build_deep_k(tmp_path, with_baseline=True).out_dir)
    assert result.agree, (result.tolerance, result.worst)
