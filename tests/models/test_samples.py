"""The model samples (ONNX, PyTorch, a Llama-style layer) built with the library's kernels."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest
from conftest import (
    ELEMENTWISE,
    MATMUL_CU,
    SAMPLES,
    cli_build,
    dispatch_calls,
    dump_module,
    f32_matmul_entry,
    iree_dispatches,
    make_llama_layer,
    make_sample_model,
    needs_iree_compile,
    report_sizes,
)

from kitdispatch import BuildOptions
from kitdispatch.cli import main
from kitdispatch.models.pipeline import build_model


@needs_iree_compile
def test_onnx_sample_builds_through_the_cli(tmp_path):
    pytest.importorskip("onnx")

    model = tmp_path / "model.onnx"
    subprocess.run([sys.executable, str(SAMPLES / "onnx_softmax" / "make_model.py"), str(model)], check=True, timeout=120)
    out, err = io.StringIO(), io.StringIO()
    rc = main(["build", str(SAMPLES / "onnx_softmax"), "--model", str(model), "--with-baseline", "--arch", "sm_90",
               "-o", str(tmp_path / "out"), "--json"], out, err)
    assert rc == 0, err.getvalue()
    data = json.loads(out.getvalue())
    matmul, replaced = data["replaced"]  # the f32 MatMul by the library's 3xTF32 entry, then the softmax
    assert matmul["kernel"] == f32_matmul_entry("matmul_nn_f32_none", *report_sizes(matmul)) and matmul["arithmetic"] == "3xtf32"
    assert replaced["op"] == "linalg.softmax" and replaced["kernel"] == "row_softmax"
    assert "model.imported.mlir" in replaced["location"]  # the importer's MLIR is kept beside the vmfb
    assert "row_softmax" in dump_module(tmp_path / "out" / "model.vmfb")
    assert not re.search(r"dispatch_\d+_softmax", (tmp_path / "out" / "model.vmfb").read_bytes().decode("latin-1"))


@needs_iree_compile
def test_onnx_matmul_sample_takes_the_library_matmul(tmp_path):
    """An f16 ONNX MatMul: IREE's importer accumulates it in f32 from a zero fill, which is
    with the truncf after it what the library's matmul_nn_f16_none entries compute (their "none"
    epilogue rounds once to f16); the library's own manifest is the project."""
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_matmul", model, "--rows", 256, "--features", 128, "--outputs", 512)
    rc, out, err = cli_build(MATMUL_CU.parent, model, tmp_path / "out", "--with-baseline")
    assert rc == 0, err
    [replaced] = json.loads(out)["replaced"]
    assert replaced["op"] == "linalg.matmul" and replaced["kernel"] == "matmul_nn_f16_none_t64x64" and replaced["init"] == "zero fill"
    assert replaced["inputs"] == [{"dtype": "f16", "shape": [256, 128]}, {"dtype": "f16", "shape": [128, 512]}]
    assert replaced["result"] == {"dtype": "f16", "shape": [256, 512]}  # the truncation after it, replaced with it
    vmfb, baseline = tmp_path / "out" / "model.vmfb", tmp_path / "out" / "model.baseline.vmfb"
    assert replaced["kernel"] in dump_module(vmfb) and replaced["kernel"] not in dump_module(baseline)
    assert iree_dispatches(baseline, "matmul") and not iree_dispatches(vmfb, "matmul")


@needs_iree_compile
def test_onnx_batched_weights_take_the_library_bmm(tmp_path):
    """`--batch 2 --batched-weights` makes the sample a linalg.batch_matmul: the bmm entry."""
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_matmul", model, "--features", 64, "--outputs", 128, "--batch", 2, "--batched-weights")
    rc, out, err = cli_build(MATMUL_CU.parent, model, tmp_path / "out", "--no-library")
    assert rc == 0, err
    [replaced] = json.loads(out)["replaced"]
    assert replaced["op"] == "linalg.batch_matmul" and replaced["kernel"].startswith("bmm_nn_f16_none")


@needs_iree_compile
def test_the_library_matmul_takes_any_m_n_k(tmp_path):
    """Edges are handled in the kernel (partial tiles), so an odd shape is replaced too."""
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_matmul", model, "--rows", 1000, "--features", 72, "--outputs", 200)
    rc, out, err = cli_build(MATMUL_CU.parent, model, tmp_path / "out")
    assert rc == 0, err
    [replaced] = json.loads(out)["replaced"]
    assert replaced["inputs"] == [{"dtype": "f16", "shape": [1000, 72]}, {"dtype": "f16", "shape": [72, 200]}]


@needs_iree_compile
def test_batch_folded_into_rows_is_still_a_matmul(tmp_path):
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_matmul", model, "--batch", 4, "--rows", 32, "--features", 64, "--outputs", 128)
    rc, out, err = cli_build(MATMUL_CU.parent, model, tmp_path / "out")
    assert rc == 0, err
    [replaced] = json.loads(out)["replaced"]
    assert replaced["inputs"][0] == {"dtype": "f16", "shape": [128, 64]}  # IREE collapsed [4, 32, 64]


@needs_iree_compile
def test_onnx_bias_gelu_sample_takes_the_library_bias_gelu(tmp_path):
    """ONNX's decomposed GELU and the bias Add become one generic after IREE's elementwise
    fusion, which matches the elementwise project's pattern; the fused op is gone from the
    module. With the whole library, the f32 matmul's epilogue kernel takes the generic with it."""
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_bias_gelu", model, "--rows", 64, "--features", 64, "--hidden", 256)
    rc, out, err = cli_build(ELEMENTWISE, model, tmp_path / "out", "--with-baseline", "--no-library")
    assert rc == 0, err
    data = json.loads(out)
    [replaced] = data["replaced"]
    assert replaced["op"] == "linalg.generic" and replaced["kernel"] == "bias_gelu"
    assert replaced["inputs"] == [{"dtype": "f32", "shape": [64, 256]}, {"dtype": "f32", "shape": [256]}]
    record = json.loads((tmp_path / "out" / "model.model.json").read_text())
    assert record["matched_after"] == ["global-optimization", "iree-dispatch-creation-elementwise-op-fusion"]
    assert 'match attributes{kitdispatch.replace = "kitdispatch_bias_gelu"}' in (tmp_path / "out" / "model.spec.mlir").read_text()
    vmfb, baseline = tmp_path / "out" / "model.vmfb", tmp_path / "out" / "model.baseline.vmfb"
    assert "bias_gelu" in dump_module(vmfb) and "bias_gelu" not in dump_module(baseline)
    # IREE fuses the bias and GELU into its matmul's one dispatch; the replaced module runs IREE's
    # matmul, then the kernel (the build itself checked that the marked op is gone).
    assert (dispatch_calls(baseline), dispatch_calls(vmfb)) == (1, 2)
    # The whole library: the matmul with its bias + GELU in one kit kernel, one dispatch as IREE's.
    rc, out, err = cli_build(ELEMENTWISE, model, tmp_path / "all", "--with-baseline")
    assert rc == 0, err
    [whole] = json.loads(out)["replaced"]
    assert whole["kernel"] == f32_matmul_entry("matmul_nn_f32_bias_gelu_tanh", *report_sizes(whole))
    assert whole["epilogue_replaced"]["ops_after"] == 1
    assert dispatch_calls(tmp_path / "all" / "model.vmfb") == 1


@needs_iree_compile
def test_onnx_gelu_op_differs_in_a_constant(tmp_path):
    """Opset 20's Gelu, as IREE's importer lowers it, uses 0.797724 for sqrt(2/pi): not the
    function the kernel computes, so nothing is replaced and the error says which constant."""
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_bias_gelu", model, "--rows", 64, "--features", 64, "--hidden", 256, "--gelu-op")
    rc, _, err = cli_build(ELEMENTWISE, model, tmp_path / "out", "--no-library")  # the library would take the matmul
    assert rc == 1
    assert "body op 4 (arith.mulf): operands (op 3, constant 7.977240e-01 : f32), the pattern's (op 3, constant 0.797884583 : f32)" in err


@needs_iree_compile
def test_torch_sample_exports_and_builds(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("iree.turbine")

    sys.path.insert(0, str(SAMPLES / "torch_mlp"))
    try:
        from model import export
    finally:
        sys.path.pop(0)
    mlir = export(tmp_path / "mlp.mlir", batch=64)
    assert "torch.aten.softmax" in mlir.read_text()
    result = build_model(SAMPLES / "torch_mlp", mlir, BuildOptions.create("sm_90"), tmp_path / "out")
    [replaced] = result.replaced
    assert replaced.op.result.shape == (64, 1000) and replaced.kernel.name == "row_softmax"
    record = json.loads(result.record.read_text())
    assert record["functions"][0]["name"] == "main" and record["functions"][0]["inputs"] == [{"dtype": "f32", "shape": [64, 256]}]


@needs_iree_compile
@pytest.mark.parametrize("dtype_args", [(), ("--f16",)], ids=["f32", "f16"])
def test_llama_layer_with_elementwise_kernels_reports_instead_of_crashing(tmp_path, dtype_args):
    """A Llama-style layer (RMSNorm in Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul, SwiGLU, no biases)
    once ended in an IndexError: IREE lowers Reciprocal with a result-less linalg.generic around
    a cf.assert. Now every generic is checked against bias_gelu's pattern and the reasons listed."""
    model = tmp_path / "layer.onnx"
    make_llama_layer(model, *dtype_args)
    rc, out, err = cli_build(ELEMENTWISE, model, tmp_path / "out", "--no-library")
    assert rc == 1, err
    assert "internal error" not in err and "Traceback" not in err
    assert "no op of" in err and "can be replaced by a kernel of elementwise" in err
    assert "linalg.generic {negf, exp, addf, divf, mulf, mulf}" in err  # the SwiGLU's silu * up, with its reason
    assert "bias_gelu: not the pattern bias_gelu.pattern.mlir" in err
    assert json.loads(out)["replaced"] == [] and (tmp_path / "out" / "layer.replace.txt").is_file()  # the report, still


@needs_iree_compile
def test_llama_layer_matmuls_take_the_library_matmul(tmp_path):
    """The same f16 layer with kernels/matmul: the MLP's three matmuls are replaced. IREE fuses
    SwiGLU's silu(gate) * up into the gate matmul's dispatch (the earlier of the two): the gate
    takes it as its silu_mul epilogue (reading up's f16 result), the up projection its f16
    rounding alone, the down projection its residual add. IREE is left no matmul and no more
    elementwise dispatches than it ran alone."""
    model = tmp_path / "layer.onnx"
    make_llama_layer(model, "--f16")
    rc, out, err = cli_build(MATMUL_CU.parent, model, tmp_path / "out", "--with-baseline")
    assert rc == 0, err
    report = json.loads(out)
    kernels = [r["kernel"] for r in report["replaced"]]  # with its epilogue (the residual add, the f16 rounding)
    assert kernels == ["matmul_nn_f16_silu_mul_t64x64", "matmul_nn_f16_none_t64x64", "matmul_nn_f16_residual_t64x64"], kernels
    assert [k for k in report["not_replaced"] if k["op"] == "linalg.matmul"] == []
    assert all(k in dump_module(tmp_path / "out" / "layer.vmfb") for k in kernels)
    mine, alone = ({(n, kind) for n, kind in re.findall(r"async_dispatch_(\d+)_([a-z]+)", (tmp_path / "out" / f"layer.{v}vmfb").read_bytes().decode("latin-1"))}
                   for v in ("", "baseline."))
    assert "matmul" in {k for _, k in alone} and "matmul" not in {k for _, k in mine}, (mine, alone)
    assert len([d for d in mine if d[1] == "elementwise"]) <= len([d for d in alone if d[1] == "elementwise"]), (mine, alone)
