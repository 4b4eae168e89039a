"""SwiGLU (Llama's MLP: silu(x Wg) * (x Wu)) replaced by the GEMM family's silu_mul epilogue.

IREE 3.13 (--compile-to=flow, the Llama export of /work/hf/x2 and the models here) fuses the
product into the dispatch of whichever of the two matmuls comes first in the block, with that
matmul's rounding to f16; the other matmul's dispatch holds its own rounding alone. The gate
first (as exporters write it): its kernel takes the product (silu_mul, reading the up
projection's f16 result), the up's kernel its rounding. The up first: the product is the up's
`acc * silu(gate)`, which no kernel computes, so the up stays IREE's (with the product fused)
and the gate's kernel takes its rounding alone."""

from __future__ import annotations

import functools
import json
import re

import pytest
from conftest import (
    HAVE_IREE_COMPILE,
    REPO,
    chains_of,
    onnx_build_with_baseline,
    prebuilt_or_fixture,
)

MATMUL = REPO / "kernels" / "matmul"


def dispatch_kinds(vmfb) -> list[tuple[str, str]]:
    """IREE's own dispatches of a module: (number, kind), one per executable."""
    return sorted(set(re.findall(r"async_dispatch_(\d+)_([a-z]+)", vmfb.read_bytes().decode("latin-1"))))


def _build(tmp_path_factory, up_first: bool):
    from models.epilogue_models import swiglu_onnx

    return onnx_build_with_baseline(tmp_path_factory, MATMUL, functools.partial(swiglu_onnx, up_first=up_first), "swiglu")


@pytest.fixture(scope="module")
def swiglu_build(tmp_path_factory):
    return _build(tmp_path_factory, up_first=False)


def test_gate_takes_the_swiglu_product(swiglu_build):
    report = json.loads(swiglu_build.report.read_text())
    got = [(r["kernel"], r.get("epilogue"), r.get("epilogue_ops_after")) for r in report["replaced"]]
    assert got == [
        ("matmul_nn_f16_silu_mul_t64x64", "silu_mul", 2),  # the gate's truncf and the product
        ("matmul_nn_f16_none_t64x64", "none", 1),  # the up's truncf
        ("matmul_nn_f16_none_t64x64", "none", 1),  # the down projection
    ], got
    gate = report["replaced"][0]  # A, Wg, then up's f16 result [m, n]
    assert [t["shape"] for t in gate["inputs"]] == [[64, 128], [128, 256], [64, 256]]
    assert gate["result"] == {"dtype": "f16", "shape": [64, 256]} and gate["epilogue_ops"][-1] == "mulf"
    assert report["not_replaced"] == []


def test_swiglu_build_leaves_iree_no_dispatch(swiglu_build):
    """IREE alone: three matmul dispatches (the product in the gate's); replaced: none left."""
    assert [k for _, k in dispatch_kinds(swiglu_build.baseline_vmfb)] == ["matmul"] * 3
    assert dispatch_kinds(swiglu_build.vmfb) == []


@pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")
def test_up_first_keeps_the_up_with_the_product(tmp_path_factory):
    built = _build(tmp_path_factory, up_first=True)
    report = json.loads(built.report.read_text())
    assert [(r["kernel"], r.get("epilogue_ops_after")) for r in report["replaced"]] == [
        ("matmul_nn_f16_none_t64x64", 1), ("matmul_nn_f16_none_t64x64", 1),
    ]
    kept = [k for k in report["not_replaced"] if k["op"] == "linalg.matmul"]
    assert len(kept) == 1 and kept[0]["epilogue_refused"].endswith("which is no epilogue of the family"), kept
    assert any("would run as a dispatch of their own" in r for r in kept[0]["reasons"])
    assert [k for _, k in dispatch_kinds(built.vmfb)] == ["matmul"]  # the up with the product, as IREE alone had it


@pytest.mark.gpu
def test_swiglu_agrees_with_iree_on_gpu(request, prebuilt_dir):
    """silu(x Wg) * (x Wu) then Wd in the kit's kernels agrees with IREE alone (f16 tolerance:
    the kernel computes the silu and the product in f32 and rounds once; IREE rounds the gate's
    sum to f16 first and computes in f16)."""
    from kitdispatch.models.compare import compare_model

    result = compare_model(prebuilt_or_fixture(request, prebuilt_dir, "epilogue_swiglu_model", "swiglu_build"))
    assert result.agree, result.worst
    assert any(n.startswith("matmul_nn_f16_silu_mul") for n in result.kernel_names), result.kernel_names


RESIDUAL_OF_AN_EARLIER_MATMUL = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @f(%x: tensor<64x64xf16>, %w1: tensor<64x64xf16>, %w2: tensor<64x64xf16>) -> tensor<64x64xf16> {
  %zero = arith.constant 0.0 : f32
  %e32 = tensor.empty() : tensor<64x64xf32>
  %e16 = tensor.empty() : tensor<64x64xf16>
  %f = linalg.fill ins(%zero : f32) outs(%e32 : tensor<64x64xf32>) -> tensor<64x64xf32>
  %m1 = linalg.matmul ins(%x, %w1 : tensor<64x64xf16>, tensor<64x64xf16>) outs(%f : tensor<64x64xf32>) -> tensor<64x64xf32>
  %h = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%m1 : tensor<64x64xf32>) outs(%e16 : tensor<64x64xf16>) {
  ^bb0(%in: f32, %out: f16):
    %t = arith.truncf %in : f32 to f16
    linalg.yield %t : f16
  } -> tensor<64x64xf16>
  %m2 = linalg.matmul ins(%h, %w2 : tensor<64x64xf16>, tensor<64x64xf16>) outs(%f : tensor<64x64xf32>) -> tensor<64x64xf32>
  %y = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]} ins(%m2, %h : tensor<64x64xf32>, tensor<64x64xf16>) outs(%e16 : tensor<64x64xf16>) {
  ^bb0(%in: f32, %r: f16, %out: f16):
    %t = arith.truncf %in : f32 to f16
    %s = arith.addf %t, %r : f16
    linalg.yield %s : f16
  } -> tensor<64x64xf16>
  return %y : tensor<64x64xf16>
}"""


def test_a_residual_that_an_earlier_matmul_makes_stays_in_the_later_chain():
    """h = x W1 (rounded), y = h W2 + h: h is read twice (by the second matmul too), so IREE
    cannot fuse the add into the first matmul's dispatch; the second matmul's chain keeps it
    (its residual epilogue), unlike SwiGLU's product, whose other operand is read once."""
    first, second = chains_of(RESIDUAL_OF_AN_EARLIER_MATMUL, ("linalg.matmul",))
    assert "2 users" in first.stop
    assert (second.longest.name, second.longest.covers) == ("residual", 1), [(f.name, f.why) for f in second.forms]
