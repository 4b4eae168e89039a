"""linalg.generic by pattern (models/ops/generic.py): the whole structure against the pattern file."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from conftest import (
    ELEMENTWISE,
    SOFTMAX_CU,
    only,
    ops_of,
)

from kitdispatch import Buffer, Kernel, ManifestError, Replaces, Scalar, TensorType
from kitdispatch.describe.manifest import load_manifest
from kitdispatch.models.pipeline import format_report
from kitdispatch.models.replace import check_kernel, decide


@functools.cache
def bias_gelu_kernel() -> Kernel:
    """The library's fused bias + tanh GELU, with its pattern (kernels/elementwise)."""
    return next(k for k in load_manifest(ELEMENTWISE).kernels if k.name == "bias_gelu")


def bias_gelu_model(
    rows=512, cols=1024, *, beta="0.797884583", tanh="math.tanh", bias_map="(d1)", dtype="f32", rank=2,
    add="%in, %b", beta_argument=False, constants_inside=False,
) -> str:
    """A model whose one linalg.generic is gelu(x + bias) as IREE's elementwise fusion gives it,
    with one thing changed at a time for the near misses."""
    dims = ["d0", "d1", "d2"][:rank]
    sizes = [4, rows, cols][-rank:]
    x = f"tensor<{'x'.join(map(str, sizes))}x{dtype}>"
    bias_size = sizes[dims.index(bias_map.strip("()"))]
    bias = f"tensor<{bias_size}x{dtype}>"
    maps = f"affine_map<({', '.join(dims)}) -> ({', '.join(dims)})>"
    constants = (
        f"%three = arith.constant 3 : i64\n  %k = arith.constant 4.471500e-02 : {dtype}\n"
        + ("" if beta_argument else f"  %beta = arith.constant {beta} : {dtype}\n")
        + f"  %one = arith.constant 1.000000e+00 : {dtype}\n  %half = arith.constant 5.000000e-01 : {dtype}\n"
    )
    extra_arg = f", %beta: {dtype}" if beta_argument else ""
    return f"""
func.func @forward(%x: {x}, %bias: {bias}{extra_arg}) -> {x} {{
  {"" if constants_inside else constants}
  %e = tensor.empty() : {x}
  %r = linalg.generic {{indexing_maps = [{maps}, affine_map<({', '.join(dims)}) -> {bias_map}>, {maps}],
      iterator_types = [{', '.join(['"parallel"'] * rank)}]}} ins(%x, %bias : {x}, {bias}) outs(%e : {x}) {{
  ^bb0(%in: {dtype}, %b: {dtype}, %o: {dtype}):
    {constants if constants_inside else ""}
    %y = arith.addf {add} : {dtype}
    %y3 = math.fpowi %y, %three : {dtype}, i64
    %t0 = arith.mulf %y3, %k : {dtype}
    %t1 = arith.addf %y, %t0 : {dtype}
    %t2 = arith.mulf %t1, %beta : {dtype}
    %t3 = {tanh} %t2 : {dtype}
    %t4 = arith.addf %t3, %one : {dtype}
    %t5 = arith.mulf %t4, %half : {dtype}
    %g = arith.mulf %y, %t5 : {dtype}
    linalg.yield %g : {dtype}
  }} -> {x}
  return %r : {x}
}}"""


def generics_of(mlir: str):
    return ops_of(mlir, ("linalg.generic",))


@pytest.mark.parametrize("constants_inside", [False, True], ids=["hoisted-constants", "constants-in-body"])
def test_generic_hit_by_pattern(constants_inside):
    d = only(decide(generics_of(bias_gelu_model(constants_inside=constants_inside)), [bias_gelu_kernel()]))
    assert d.kernel is not None and d.kernel.name == "bias_gelu" and d.paths == ((0,), (1,))
    assert d.op.detail.summary == "addf, fpowi, mulf, addf, mulf, tanh, addf, mulf, mulf"
    assert d.to_json()["body"] == d.op.detail.summary


@pytest.mark.parametrize(
    "model, reason",
    [
        (bias_gelu_model(beta="7.977240e-01"),
         "body op 4 (arith.mulf): operands (op 3, constant 7.977240e-01 : f32), the pattern's (op 3, constant 0.797884583 : f32)"),
        (bias_gelu_model(tanh="math.erf"), "body op 5: the op has math.erf, the pattern math.tanh"),
        (bias_gelu_model(add="%b, %in"), "body op 0 (arith.addf): operands (input 1, input 0), the pattern's (input 0, input 1)"),
        (bias_gelu_model(bias_map="(d0)"),
         "indexing map of operand 1: the op's is affine_map<(d0, d1) -> (d0)>, the pattern's affine_map<(d0, d1) -> (d1)>"),
        (bias_gelu_model(rank=3, bias_map="(d2)"), "iterator types: the op's are [parallel, parallel, parallel]"),
        (bias_gelu_model(dtype="f16"), "body argument types: the op's are (f16, f16, f16), the pattern's (f32, f32, f32)"),
        (bias_gelu_model(beta_argument=True), "a value from outside the op (a function argument)"),
    ],
    ids=["constant", "body-op", "operand-order", "indexing-map", "rank", "dtype", "captured-value"],
)
def test_generic_near_misses(model, reason):
    d = only(decide(generics_of(model), [bias_gelu_kernel()]))
    assert d.kernel is None
    assert reason in d.reasons[0], d.reasons
    assert d.reasons[0].startswith("bias_gelu: not the pattern bias_gelu.pattern.mlir: ")


def test_report_lists_every_generic_kept_with_its_reason():
    hit, miss = bias_gelu_model(), bias_gelu_model(beta="7.977240e-01").replace("@forward", "@other")
    decisions = decide(generics_of(hit + miss), [bias_gelu_kernel()])
    text = format_report("m.mlir", decisions)
    assert "1 of 2 candidate op(s) replaced" in text
    assert "kept      linalg.generic {addf, fpowi, mulf, addf, mulf, tanh, addf, mulf, mulf} (512x1024xf32, 1024xf32)" in text
    assert "in @other" in text and "constant 7.977240e-01 : f32" in text
    kept = [d.to_json() for d in decisions if d.kernel is None]
    assert kept[0]["body"] == "addf, fpowi, mulf, addf, mulf, tanh, addf, mulf, mulf" and "not the pattern" in kept[0]["reasons"][0]


def test_generic_limits_and_sizes_still_apply():
    kernel = bias_gelu_kernel()
    limited = dataclasses.replace(
        kernel, replaces=Replaces.create(["linalg.generic"], pattern=kernel.replaces.pattern, max_size={"cols": 512})
    )
    d = only(decide(generics_of(bias_gelu_model()), [limited]))
    assert d.kernel is None and "cols = 1024 is over the kernel's maximum 512" in d.reasons[0]


ACCUMULATE_PATTERN = """
func.func @acc(%x: tensor<?xf32>, %acc: tensor<?xf32>) -> tensor<?xf32> {
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]}
      ins(%x : tensor<?xf32>) outs(%acc : tensor<?xf32>) {
  ^bb0(%in: f32, %out: f32):
    %s = arith.addf %out, %in : f32
    linalg.yield %s : f32
  } -> tensor<?xf32>
  return %r : tensor<?xf32>
}"""


def accumulate_kernel(pattern, access="inout", dtype="f32", inputs=1) -> Kernel:
    params = [Buffer(f"x{i}", "in", TensorType(dtype, ("n",))) for i in range(inputs)]
    return Kernel.create(
        "accumulate", SOFTMAX_CU, [*params, Buffer("acc", access, TensorType(dtype, ("n",))), Scalar("n", "i32")],
        workgroup_size=[256], workgroup_count=["ceildiv(n, 256)"],
        replaces=Replaces.create(["linalg.generic"], pattern=pattern),
    )


def test_generic_that_reads_its_output_takes_an_inout_kernel(tmp_path):
    pattern = tmp_path / "acc.mlir"
    pattern.write_text(ACCUMULATE_PATTERN)
    model = ACCUMULATE_PATTERN.replace("?", "4096").replace("@acc", "@forward")
    d = only(decide(generics_of(model), [accumulate_kernel(pattern)]))
    assert d.kernel is not None and d.paths == ((0,), (1,))  # x, then the accumulator it reads


@pytest.mark.parametrize(
    "pattern, kernel, message",
    [
        (ACCUMULATE_PATTERN + ACCUMULATE_PATTERN.replace("@acc", "@acc2"), {}, "the pattern holds 2 linalg.generic ops, not one"),
        ("func.func @f() {\n  return\n}", {}, "the pattern holds 0 linalg.generic ops, not one"),
        ("func.func @f( {", {}, "the pattern is not valid MLIR"),
        (None, {}, "cannot read the pattern"),
        (ACCUMULATE_PATTERN.replace("%acc: tensor<?xf32>)", "%acc: tensor<?xf32>, %scale: f32)").replace("%out, %in", "%out, %scale"),
         {}, "the pattern's body uses a value from outside the op (a function argument)"),
        (ACCUMULATE_PATTERN.replace("%s = arith.addf %out, %in : f32", "%c = arith.constant true\n    %s = scf.if %c -> f32 {\n"
                                    "      scf.yield %in : f32\n    } else {\n      scf.yield %out : f32\n    }"),
         {}, "the pattern's body holds scf.if (with regions), which kitdispatch cannot compare"),
        (ACCUMULATE_PATTERN, {"access": "out"}, "its result inout: the pattern reads its output"),
        (ACCUMULATE_PATTERN, {"inputs": 2}, "its buffers must be the 1 input(s) of the pattern (p.mlir) in order"),
        (ACCUMULATE_PATTERN, {"dtype": "f16"}, "operand 0 of the pattern is ?xf32, the kernel's x0 is f16[n]"),
    ],
    ids=["two-generics", "no-generic", "not-mlir", "missing", "captured-value", "nested-region", "out-for-inout", "input-count",
         "dtype"],
)
def test_patterns_and_kernels_that_cannot_go_together(tmp_path, pattern, kernel, message):
    path = tmp_path / "p.mlir"
    if pattern is not None:
        path.write_text(pattern)
    k = accumulate_kernel(path, **kernel)
    with pytest.raises(ManifestError) as err:
        check_kernel(k, "linalg.generic")
    assert message in err.value.render()


def test_ops_without_a_tensor_result_are_not_candidates():
    """What IREE makes of ONNX's Reciprocal: a generic with no `outs` and no result (only a
    cf.assert). No kernel can stand in for it, and reading it must not fail."""
    mlir = """
func.func @f(%x: tensor<64xf32>) -> tensor<64xf32> {
  %zero = arith.constant 0.0 : f32
  linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%x : tensor<64xf32>) {
  ^bb0(%in: f32):
    %c = arith.cmpf one, %in, %zero : f32
    cf.assert %c, "zero"
    linalg.yield
  }
  %e = tensor.empty() : tensor<64xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> ()>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%x, %zero : tensor<64xf32>, f32) outs(%e : tensor<64xf32>) {
  ^bb0(%in: f32, %s: f32, %out: f32):
    %r = arith.addf %in, %s : f32
    linalg.yield %r : f32
  } -> tensor<64xf32>
  return %y : tensor<64xf32>
}"""
    assert ops_of(mlir, ("linalg.generic",)) == []  # neither: no result; a scalar (f32) operand
