"""compare.py: the replaced module against IREE's own build, and profiles. GPU tests are marked
and skip without a GPU."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from conftest import (
    ELEMENTWISE,
    HAVE_IREE_COMPILE,
    MATMUL_CU,
    SAMPLES,
    make_llama_layer,
    make_sample_model,
    needs_iree_compile,
)

from kitdispatch import BuildOptions
from kitdispatch.cli import main
from kitdispatch.models.compare import compare_model
from kitdispatch.models.pipeline import build_model


@pytest.mark.gpu
def test_compare_onnx_sample_on_gpu(tmp_path, prebuilt_dir):
    """The ONNX sample's softmax replaced by the library kernel agrees with IREE's own build."""
    built = prebuilt_dir / "onnx_softmax_model" if prebuilt_dir else None
    if built is None:
        pytest.importorskip("onnx")

        model = tmp_path / "model.onnx"
        subprocess.run([sys.executable, str(SAMPLES / "onnx_softmax" / "make_model.py"), str(model)], check=True, timeout=120)
        built = build_model(SAMPLES / "onnx_softmax", model, BuildOptions.create("sm_90"), tmp_path / "out", with_baseline=True).out_dir
    result = compare_model(built)
    assert result.agree, result.worst
    assert result.call_us["replaced"] > 0 and result.call_us["baseline"] > 0
    # The kit's build has its $async_transients twin, which the kit's prepared call takes; the baseline has none.
    assert set(result.prepared_us) == {"replaced", "baseline"}
    assert [n for n in result.notes if "$async_transients" in n] == [
        n for n in result.notes if n.startswith("the kit's prepared call of the replaced module runs matmul_softmax$async_transients")
    ] != []


@pytest.mark.gpu
@pytest.mark.parametrize("sample, project", [("onnx_matmul", MATMUL_CU.parent), ("onnx_bias_gelu", ELEMENTWISE)])
def test_compare_library_kernel_samples_on_gpu(tmp_path, prebuilt_dir, sample, project):
    """The library's matmul and bias_gelu in place of IREE's codegen agree with IREE's own build
    (f16 outputs within f16's tolerance, f32 within f32's)."""
    built = prebuilt_dir / f"{sample}_model" if prebuilt_dir else None
    if built is None:

        model = tmp_path / "model.onnx"
        make_sample_model(sample, model)
        built = build_model(project, model, BuildOptions.create("sm_90"), tmp_path / "out", with_baseline=True).out_dir
    result = compare_model(built)
    assert result.agree, result.worst
    kit, _ = result.replaced_dispatches()
    assert any(t.name in result.kernel_names for t in kit) or result.notes


@pytest.mark.gpu
def test_llama_layer_with_the_library_matmul_agrees_on_gpu(tmp_path, prebuilt_dir):
    """The f16 Llama-style layer with its three projections replaced agrees with IREE alone
    (prebuilt as `llama_layer_model` where the GPU machine has no iree-compile)."""
    built = prebuilt_dir / "llama_layer_model" if prebuilt_dir else None
    if built is None:

        if not HAVE_IREE_COMPILE:
            pytest.skip("iree-compile is not installed")
        model = tmp_path / "layer.onnx"
        make_llama_layer(model, "--f16")
        built = build_model(MATMUL_CU.parent, model, BuildOptions.create("sm_90"), tmp_path / "out", with_baseline=True).out_dir
    elif not built.is_dir():
        pytest.skip(f"{built} was not prebuilt")
    result = compare_model(built)
    assert result.agree, result.worst
    assert result.kernel_names and all(k.startswith("matmul_nn_f16_") for k in result.kernel_names), result.kernel_names


@needs_iree_compile
@pytest.mark.parametrize("device, message", [("local-task", "was compiled for IREE's cuda device and cannot run on 'local-task'"),
                                             ("bogus", "IREE's runtime has no device 'bogus'")])
def test_compare_on_a_device_that_cannot_run_the_model(linalg_build, device, message):
    """Without a GPU, `local-task` still opens: the module's load is what refuses, with exit 2."""
    _, _, out = linalg_build
    err = io.StringIO()
    assert main(["compare", str(out), "--device", device], io.StringIO(), err) == 2, err.getvalue()
    assert message in err.getvalue() and "internal error" not in err.getvalue()


@needs_iree_compile
def test_compare_of_a_build_without_a_baseline_is_bad_input(tmp_path):
    """Exit 2 with the fix, as load_module(baseline=True) refuses it (it was exit 1)."""
    from conftest import LINALG_MODEL, cpu_model_build

    model = tmp_path / "m.mlir"
    model.write_text(LINALG_MODEL)
    out = cpu_model_build(model, tmp_path / "out", baseline=False)
    err = io.StringIO()
    assert main(["compare", str(out)], io.StringIO(), err) == 2, err.getvalue()
    assert "has no baseline module" in err.getvalue() and "--with-baseline" in err.getvalue()


def test_tf32_matmuls_are_compared_with_a_tolerance_that_fits_them():
    """A replaced f32 matmul in TF32 is off by ~1e-3 of the output's scale, also where an
    element cancels to near zero; f32's own tolerance would refuse it, 3xTF32's keeps f32's scale."""
    from kitdispatch.models.compare import check_agreement, loosest_arithmetic
    from kitdispatch.models.ops.base import TensorFacts
    from kitdispatch.describe.model_record import ModelFunction

    sig = ModelFunction("f", (TensorFacts("f32", (4,)),), (TensorFacts("f32", (4,)),))
    baseline = [np.array([100.0, -50.0, 0.001, 3.0], np.float32)]
    tf32 = [baseline[0] + np.float32(0.08)]  # 8e-4 of the largest magnitude
    assert not check_agreement(tf32, baseline, sig)[0]
    assert not check_agreement(tf32, baseline, sig, "3xtf32")[0]
    agree, _, tolerance, _ = check_agreement(tf32, baseline, sig, "tf32")
    assert agree and tolerance == "rtol 0.01, atol 0.01 x the output's largest magnitude (tf32 matmuls)"
    assert check_agreement([baseline[0] + np.float32(1e-4)], baseline, sig, "3xtf32")[0]
    assert loosest_arithmetic(["3xtf32", None, "tf32"]) == "tf32" and loosest_arithmetic([None]) is None


def test_integer_outputs_must_match_exactly_beside_float_ones():
    """An argmax or top-k index off by 5 (or a count 1000 vs 1009) once agreed within the float
    outputs' tolerance; the worst elements list only elements that disagree."""
    from kitdispatch.models.compare import check_agreement
    from kitdispatch.models.ops.base import TensorFacts
    from kitdispatch.describe.model_record import ModelFunction

    sig = ModelFunction("f", (TensorFacts("f16", (4, 8)),), (TensorFacts("f16", (4, 8)), TensorFacts("i64", (4,)), TensorFacts("i1", (4,))))
    probs = np.full((4, 8), 0.125, np.float16)
    idx, flags = np.array([3, 1, 1000, 7]), np.array([True, False, True, True])
    agree, _, tolerance, worst = check_agreement([probs, idx, flags], [probs, idx, flags], sig)
    assert agree and tolerance.endswith("; integer outputs exact"), tolerance
    off = idx.copy()
    off[2] = 1009
    agree, err, _, worst = check_agreement([probs, off, flags], [probs, idx, flags], sig)
    assert not agree and err == 9 and worst == ("output 1[2]: replaced 1009, baseline 1000",)
    agree, _, _, worst = check_agreement([probs, idx, ~flags], [probs, idx, flags], sig)
    assert not agree and len(worst) == 4


def test_whole_model_outputs_get_an_absolute_tolerance_scaled_by_their_spread():
    """Two f16 routes through a model differ near zero by the rounding of the terms that
    cancelled there (0.0059 on RMS-1 outputs, measured); an error of a few percent on some
    elements, or a wrong element, is still refused."""
    from kitdispatch.models.compare import check_agreement
    from kitdispatch.models.ops.base import TensorFacts
    from kitdispatch.describe.model_record import ModelFunction

    sig = ModelFunction("f", (TensorFacts("i64", (1, 8)),), (TensorFacts("f16", (64, 64)),))
    rng = np.random.default_rng(0)
    baseline = rng.standard_normal((64, 64)).astype(np.float16)
    baseline[3, 5] = np.float16(0.0003)
    rounded = baseline.copy()
    rounded[3, 5] = np.float16(0.0062)  # near zero, off by 0.0059
    agree, err, tolerance, _ = check_agreement([rounded], [baseline], sig)
    assert agree and err > 0.005, tolerance
    assert tolerance.startswith("rtol 0.01, atol 0.01 x the output's RMS")
    wrong_rows = baseline.copy()
    wrong_rows[:4] *= np.float16(1.03)
    assert not check_agreement([wrong_rows], [baseline], sig)[0]
    one_wrong = baseline.copy()
    one_wrong[10, 10] += np.float16(0.1)
    agree, _, _, worst = check_agreement([one_wrong], [baseline], sig)
    assert not agree and worst[0].startswith("output 0[10, 10]")
    small = (baseline * np.float16(0.02)).astype(np.float16)  # GPT-2's outputs: RMS 0.02, the type's atol stays
    assert check_agreement([small], [small], sig)[2] == "rtol 0.01, atol 0.001 (f16)"
