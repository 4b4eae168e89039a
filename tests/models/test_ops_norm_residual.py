"""A norm of a residual sum, `LN(a + b)`, as exporters write a pre-LN block's second norm input
(issue 24/25: the build must never add a dispatch). IREE 3.13 runs the f16 add as an
elementwise dispatch of its own, the extf in the norm's reductions: replacing the norm leaves
the add as it was (measured here by building both)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import HAVE_IREE_COMPILE, REPO


def residual_norm_onnx(path, *, rows: int = 64, cols: int = 256):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(cols).astype(np.float16), name) for name in ("w", "b")]
    nodes = [helper.make_node("Add", ["a", "b_in"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "w", "b"], ["y"], axis=-1, epsilon=1e-5)]
    f16 = TensorProto.FLOAT16
    graph = helper.make_graph(nodes, "residual_norm", [helper.make_tensor_value_info(n, f16, [rows, cols]) for n in ("a", "b_in")],
                              [helper.make_tensor_value_info("y", f16, [rows, cols])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def dispatch_kinds(vmfb) -> list[tuple[str, str]]:
    return sorted(set(re.findall(r"async_dispatch_(\d+)_([a-z]+)", vmfb.read_bytes().decode("latin-1"))))


@pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")
def test_a_norm_of_a_residual_sum_adds_no_dispatch(tmp_path):
    pytest.importorskip("onnx")
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    model = residual_norm_onnx(tmp_path / "residual_norm.onnx")
    built = build_model(REPO / "kernels" / "norm", model, BuildOptions.create("sm_90a"), tmp_path / "out", library=False, with_baseline=True)
    report = json.loads(built.report.read_text())
    assert [(r["op"], r["kernel"]) for r in report["replaced"]] == [("layer_norm", "layer_norm_f16")]
    alone, mine = dispatch_kinds(built.baseline_vmfb), dispatch_kinds(built.vmfb)
    assert [k for _, k in alone] == ["elementwise", "reduction", "reduction"], alone  # the add alone, then the norm
    assert [k for _, k in mine] == ["elementwise"], mine  # the add, as it was
