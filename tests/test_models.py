"""Kit kernels inside models: which ops match (replace.py), and whole builds with the real
iree-compile / iree-opt (models.py). GPU tests (compare) are marked and skip without a GPU."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO, SAMPLES, json_paths, json_replaced_at, json_values, needs_iree_compile
from kitdispatch import Buffer, Kernel, KitError, ManifestError, Scalar, TensorType
from kitdispatch.describe.index_expr import IndexExpr
from kitdispatch.describe.manifest import parse_manifest
from kitdispatch.models.replace import check_kernel, decide, read_ops

SOFTMAX_CU = REPO / "kernels" / "softmax" / "softmax.cu"
MATMUL_CU = REPO / "kernels" / "matmul" / "matmul.cu"


def softmax_kernel(dtype="f32", cols="cols", **replace_when) -> Kernel:
    return Kernel.create(
        "row_softmax", SOFTMAX_CU,
        [Buffer("x", "in", TensorType(dtype, ("rows", cols))), Buffer("out", "out", TensorType(dtype, ("rows", cols))),
         Scalar("rows", "i32"), Scalar("cols", "i32", None if cols == "cols" else IndexExpr.parse(cols, "cols"))],
        workgroup_size=[256], workgroup_count=["ceildiv(rows, 32) + 1024"],
        replaces=_replaces("linalg.softmax", **replace_when),
    )


def matmul_kernel(a="f16[m,k]", b="f16[k,n]", c="f32[m,n]", access="out", kind="linalg.matmul", **replace_when) -> Kernel:
    return Kernel.create(
        "matmul_f16", MATMUL_CU,
        [Buffer("a", "in", TensorType.parse(a, "a")), Buffer("b", "in", TensorType.parse(b, "b")),
         Buffer("c", access, TensorType.parse(c, "c")), Scalar("m", "i32"), Scalar("n", "i32"), Scalar("k", "i32")],
        workgroup_size=[128], workgroup_count=["ceildiv(n, 64)", "ceildiv(m, 64)"],
        replaces=_replaces(kind, **replace_when),
    )


def _replaces(kind, **when):
    from kitdispatch import Replaces

    return Replaces.create([kind], **when)


def ops_of(mlir: str, kinds=("linalg.softmax", "linalg.matmul", "linalg.batch_matmul")):
    from iree.compiler import ir

    module = ir.Module.parse(mlir, ir.Context())
    return [facts for _, facts in read_ops(module, kinds)]


def softmax_model(shape="512x1000", dtype="f32", dim=1) -> str:
    t = f"tensor<{shape}x{dtype}>"
    dynamic = [i for i, d in enumerate(shape.split("x")) if d == "?"]
    dims = "".join(f"  %c{i} = arith.constant {i} : index\n  %d{i} = tensor.dim %x, %c{i} : {t}\n" for i in dynamic)
    return f"""
func.func @forward(%x: {t}) -> {t} {{
{dims}  %e = tensor.empty({", ".join(f"%d{i}" for i in dynamic)}) : {t}
  %s = linalg.softmax dimension({dim}) ins(%x : {t}) outs(%e : {t}) -> {t}
  return %s : {t}
}}"""


def matmul_model(m=512, k=256, n=1000, init="0.0", dtype="f16", transpose_b=False) -> str:
    a, c = f"tensor<{m}x{k}x{dtype}>", f"tensor<{m}x{n}xf32>"
    b = f"tensor<{n}x{k}x{dtype}>" if transpose_b else f"tensor<{k}x{n}x{dtype}>"
    maps = (
        " indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d1, d2)>, "
        "affine_map<(d0, d1, d2) -> (d0, d1)>]"
        if transpose_b else ""
    )
    acc = (
        f"%e = tensor.empty() : {c}\n  %acc = linalg.fill ins(%cst : f32) outs(%e : {c}) -> {c}"
        if init is not None else f"%acc = tensor.empty() : {c}"
    )
    return f"""
func.func @forward(%a: {a}, %b: {b}) -> {c} {{
  %cst = arith.constant {init or 0.0} : f32
  {acc}
  %r = linalg.matmul{maps} ins(%a, %b : {a}, {b}) outs(%acc : {c}) -> {c}
  return %r : {c}
}}"""


def only(decisions):
    assert len(decisions) == 1
    return decisions[0]


# ----------------------------------------------------------------------------- matching


def test_softmax_hit():
    d = only(decide(ops_of(softmax_model()), [softmax_kernel()]))
    assert d.kernel is not None and d.operands == (0,)
    assert d.op.function == "forward" and d.op.result.shape == (512, 1000)


@pytest.mark.parametrize(
    "model, kernel, reason",
    [
        (softmax_model(dtype="f16"), softmax_kernel(), "element type: the op's input 0 is 512x1000xf16"),
        (softmax_model(shape="8x512x1000", dim=2), softmax_kernel(), "rank: the op's input 0 is 8x512x1000xf32 (3-D)"),
        (softmax_model(dim=0), softmax_kernel(), "the op normalizes dimension 0, the kernel dimension 1"),
        (softmax_model(), softmax_kernel(cols=1024), "dimension 1 of the op's input 0 (512x1000xf32) is 1000, the kernel's x needs 1024"),
        (softmax_model(), softmax_kernel(max_size={"cols": 512}), "cols = 1000 is over the kernel's maximum 512"),
        (softmax_model(shape="512x?"), softmax_kernel(multiple_of={"cols": 8}), "cols is dynamic in the model"),
    ],
    ids=["dtype", "rank", "reduction-dim", "static-shape", "max-size", "dynamic-vs-limit"],
)
def test_softmax_near_misses(model, kernel, reason):
    d = only(decide(ops_of(model), [kernel]))
    assert d.kernel is None
    assert reason in d.reasons[0], d.reasons


def test_softmax_dimension_constraint_and_dynamic_sizes():
    # A kernel that says it normalizes dimension 0 takes the op that does.
    assert only(decide(ops_of(softmax_model(dim=0)), [softmax_kernel(dimension=0)])).kernel is not None
    # Dynamic sizes are fine where no limit needs them: the wrapper reads them at run time.
    assert only(decide(ops_of(softmax_model(shape="?x?")), [softmax_kernel()])).kernel is not None


def test_matmul_hit_with_zero_fill():
    d = only(decide(ops_of(matmul_model()), [matmul_kernel(multiple_of={"k": 16})]))
    assert d.kernel is not None and d.operands == (0, 1)


@pytest.mark.parametrize(
    "model, kernel, reason",
    [
        (matmul_model(init="1.0"), matmul_kernel(), "accumulates into linalg.fill of 1.000000e+00 : f32, not a zero fill"),
        (matmul_model(init=None), matmul_kernel(), "accumulates into tensor.empty, not a zero fill"),
        (matmul_model(transpose_b=True), matmul_kernel(), "transposed, broadcast or cast"),
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
    assert d.kernel is not None and d.operands == (0, 1, 2)


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


def test_first_fitting_kernel_wins_and_every_misfit_says_why():
    kernels = [softmax_kernel(dtype="f16"), softmax_kernel(max_size={"cols": 4096})]
    kernels[1] = Kernel.create(
        "row_softmax", SOFTMAX_CU, kernels[1].params, workgroup_size=[256], workgroup_count=["ceildiv(rows, 32) + 1024"],
        function="softmax_big", replaces=kernels[1].replaces,
    )
    d = only(decide(ops_of(softmax_model()), kernels))
    assert d.kernel.function == "softmax_big"
    miss = only(decide(ops_of(softmax_model(dtype="f64")), kernels))
    assert len(miss.reasons) == 2


@pytest.mark.parametrize(
    "kernel, message",
    [
        (lambda: Kernel.create(
            "scale", SOFTMAX_CU, [Buffer("x", "in", TensorType("f32", ("n",))), Buffer("y", "out", TensorType("f32", ("n",))),
                                  Scalar("alpha", "f32")],
            workgroup_size=[64], workgroup_count=["ceildiv(n, 64)"], replaces=["linalg.softmax"]),
         "needs scalar argument(s) alpha, which linalg.softmax does not give"),
        (lambda: matmul_kernel(b="f16[n,k]"), "its shapes must read [m,k] x [k,n] -> [m,n]"),
        (lambda: softmax_kernel(dimension=2), "replace_when dimension 2 is not a dimension of its 2-D input"),
    ],
    ids=["scalar-argument", "transposed-kernel", "dimension-out-of-range"],
)
def test_kernels_that_cannot_stand_for_the_op(kernel, message):
    k = kernel()
    with pytest.raises(ManifestError) as err:
        check_kernel(k, k.replaces.ops[0])
    assert message in err.value.render()


# ----------------------------------------------------------------------- linalg.generic


ELEMENTWISE = REPO / "kernels" / "elementwise"


@functools.cache
def bias_gelu_kernel() -> Kernel:
    """The library's fused bias + tanh GELU, with its pattern (kernels/elementwise)."""
    from kitdispatch.describe.manifest import load_manifest

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
    assert d.kernel is not None and d.kernel.name == "bias_gelu" and d.operands == (0, 1)
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
    from kitdispatch.models.pipeline import format_report

    hit, miss = bias_gelu_model(), bias_gelu_model(beta="7.977240e-01").replace("@forward", "@other")
    decisions = decide(generics_of(hit + miss), [bias_gelu_kernel()])
    text = format_report("m.mlir", decisions)
    assert "1 of 2 candidate op(s) replaced" in text
    assert "kept      linalg.generic {addf, fpowi, mulf, addf, mulf, tanh, addf, mulf, mulf} (512x1024xf32, 1024xf32)" in text
    assert "in @other" in text and "constant 7.977240e-01 : f32" in text
    kept = [d.to_json() for d in decisions if d.kernel is None]
    assert kept[0]["body"] == "addf, fpowi, mulf, addf, mulf, tanh, addf, mulf, mulf" and "not the pattern" in kept[0]["reasons"][0]


def test_generic_limits_and_sizes_still_apply():
    from kitdispatch import Replaces

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
    from kitdispatch import Replaces

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
    assert d.kernel is not None and d.operands == (0, 1)  # x, then the accumulator it reads


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


# ----------------------------------------------------------------------------- manifest


KERNEL_TOML = """
[[kernels]]
name = "row_softmax"
source = "{src}"
workgroup_size = [256]
workgroup_count = ["ceildiv(rows, 32) + 1024"]
params = [
  {{ name = "x", in = "f32[rows,cols]" }},
  {{ name = "out", out = "f32[rows,cols]" }},
  {{ name = "rows", scalar = "i32" }},
  {{ name = "cols", scalar = "i32" }},
]
"""


def _manifest(extra: str):
    import tomllib

    data = tomllib.loads(KERNEL_TOML.format(src=SOFTMAX_CU) + extra)
    return parse_manifest(data, root=REPO, where="kitdispatch.toml")


def test_manifest_replaces_plain_and_with_limits():
    plain = _manifest('replaces = ["linalg.softmax"]').kernels[0].replaces
    assert plain.ops == ("linalg.softmax",) and plain.dimension is None
    limited = _manifest('replaces = ["linalg.softmax"]\nreplace_when = { max = { cols = 8192 }, multiple_of = { rows = 4 }, dimension = -1 }')
    r = limited.kernels[0].replaces
    assert r.max_size == (("cols", 8192),) and r.multiple_of == (("rows", 4),) and r.dimension == -1
    assert _manifest("").kernels[0].replaces is None
    generic = _manifest('replaces = ["linalg.generic"]\nreplace_when = { pattern = "p.mlir" }').kernels[0].replaces
    assert generic.pattern == REPO / "p.mlir"  # beside the manifest, as `source` is


@pytest.mark.parametrize(
    "extra, message",
    [
        ('replaces = ["linalg.conv_2d"]', "kitdispatch cannot replace 'linalg.conv_2d'"),
        ('replaces = "linalg.softmax"', "replaces must be a non-empty list of op names"),
        ("replace_when = { max = { cols = 8 } }", "replace_when without replaces"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { max = { width = 8 } }', "replace_when uses 'width'"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { most = { cols = 8 } }', "unknown key 'most'"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { max = { cols = 0 } }', "max must map dimension names to positive integers"),
        ('replaces = ["linalg.generic"]', "a linalg.generic needs a pattern"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { pattern = "p.mlir" }', "and a pattern is for linalg.generic only"),
        ('replaces = ["linalg.generic"]\nreplace_when = { pattern = 3 }', "pattern 3 is not a file name"),
    ],
)
def test_manifest_replace_errors(extra, message):
    with pytest.raises(ManifestError) as err:
        _manifest(extra)
    assert message in err.value.render()


# ------------------------------------------------------------------------- whole builds


LINALG_MODEL = """
func.func @forward(%x: tensor<512x256xf32>, %w: tensor<256x1000xf32>) -> (tensor<512x1000xf32>, tensor<1000x512xf32>) {
  %cst = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<512x1000xf32>
  %f = linalg.fill ins(%cst : f32) outs(%e : tensor<512x1000xf32>) -> tensor<512x1000xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<512x256xf32>, tensor<256x1000xf32>) outs(%f : tensor<512x1000xf32>) -> tensor<512x1000xf32>
  %e2 = tensor.empty() : tensor<512x1000xf32>
  %sm = linalg.softmax dimension(1) ins(%mm : tensor<512x1000xf32>) outs(%e2 : tensor<512x1000xf32>) -> tensor<512x1000xf32>
  %e3 = tensor.empty() : tensor<1000x512xf32>
  %t = linalg.transpose ins(%sm : tensor<512x1000xf32>) outs(%e3 : tensor<1000x512xf32>) permutation = [1, 0]
  %e4 = tensor.empty() : tensor<1000x512xf32>
  %sm2 = linalg.softmax dimension(0) ins(%t : tensor<1000x512xf32>) outs(%e4 : tensor<1000x512xf32>) -> tensor<1000x512xf32>
  return %sm, %sm2 : tensor<512x1000xf32>, tensor<1000x512xf32>
}
"""


def _project(tmp_path, extra='replaces = ["linalg.softmax"]'):
    root = tmp_path / "project"
    root.mkdir()
    (root / "kitdispatch.toml").write_text(KERNEL_TOML.format(src=SOFTMAX_CU) + extra + "\n")
    return root


@pytest.fixture(scope="module")
def linalg_build(tmp_path_factory):
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    if not __import__("conftest").HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    tmp = tmp_path_factory.mktemp("linalg")
    model = tmp / "mm_softmax.mlir"
    model.write_text(LINALG_MODEL)
    out = tmp / "out"
    result = build_model(_project(tmp), model, BuildOptions.create("sm_90"), out, with_baseline=True)
    return result, model, out


def _dump(vmfb) -> str:
    from kitdispatch.iree.tools import find_tool

    return subprocess.run([find_tool("iree-dump-module"), str(vmfb)], capture_output=True, text=True, timeout=120, check=True).stdout


@needs_iree_compile
def test_build_replaces_the_matching_softmax_only(linalg_build):
    result, model, out = linalg_build
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["mm_softmax.vmfb", "mm_softmax.baseline.vmfb", "mm_softmax.spec.mlir", "mm_softmax.replace.json",
         "mm_softmax.replace.txt", "mm_softmax.model.json", "softmax.sm_90.fatbin"]
    )
    report = json.loads(result.report.read_text())
    [replaced] = report["replaced"]
    assert replaced["kernel"] == "row_softmax" and replaced["dimension"] == 1
    assert f'"{model}":8:' in replaced["location"] and replaced["inputs"] == [{"dtype": "f32", "shape": [512, 1000]}]
    [kept] = report["not_replaced"]
    assert kept["dimension"] == 0 and "the op normalizes dimension 0, the kernel dimension 1" in kept["reasons"][0]
    text = (out / "mm_softmax.replace.txt").read_text()
    assert "1 of 2 candidate op(s) replaced" in text and "kept" in text


@needs_iree_compile
def test_vmfb_dispatches_the_kernel_instead_of_iree_softmax(linalg_build):
    result, _, _ = linalg_build
    baseline, replaced = _dump(result.baseline_vmfb), _dump(result.vmfb)
    assert "row_softmax" in replaced and "row_softmax" not in baseline
    iree_softmax = re.compile(r"dispatch_\d+_softmax")
    # The baseline has IREE's two softmax dispatches; the replaced module keeps only the one
    # the kernel does not fit (dimension 0) and IREE's matmul.
    assert len(set(iree_softmax.findall(result.baseline_vmfb.read_bytes().decode("latin-1")))) == 2
    assert len(set(iree_softmax.findall(result.vmfb.read_bytes().decode("latin-1")))) == 1
    assert re.search(r"dispatch_\d+_matmul", replaced)


@needs_iree_compile
def test_kept_spec_reapplies_with_iree_tools(linalg_build, tmp_path):
    """The kept spec on its own, as its header says to apply it: iree-opt's transform
    interpreter on the marked global-optimization stage, then iree-compile from there."""
    from iree.compiler import ir

    from kitdispatch.iree.tools import find_tool
    from kitdispatch.models.pipeline import SPEC_PIPELINE

    result, model, out = linalg_build
    spec = result.spec.read_text()
    assert "transform.util.cast_and_call" in spec and "util.func private @kitdispatch_row_softmax" in spec
    target = ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_89"]
    stage, marked, replaced, vmfb = (tmp_path / n for n in ("stage.mlir", "marked.mlir", "replaced.mlir", "m.vmfb"))
    subprocess.run([find_tool("iree-compile"), str(model), *target, "--compile-to=global-optimization", "-o", str(stage)],
                   check=True, timeout=300)
    module = ir.Module.parse(stage.read_text(), ir.Context())
    ops = [op for op, facts in read_ops(module, ["linalg.softmax"]) if facts.detail.dimension == 1]
    ops[0].attributes["kitdispatch.replace"] = ir.StringAttr.get("kitdispatch_row_softmax", module.context)
    marked.write_text(str(module))
    subprocess.run([find_tool("iree-opt"), str(marked), f"--pass-pipeline={SPEC_PIPELINE.format(spec=result.spec)}",
                    "-o", str(replaced)], check=True, timeout=300)
    subprocess.run([find_tool("iree-compile"), str(replaced), *target, "--compile-from=global-optimization",
                    f"--iree-hal-executable-object-search-path={out}", "-o", str(vmfb)], check=True, timeout=300)
    assert "row_softmax" in _dump(vmfb)


@needs_iree_compile
def test_record_lists_functions_for_compare(linalg_build):
    record = json.loads(linalg_build[0].record.read_text())
    assert record["functions"] == [{"name": "forward", "inputs": [{"dtype": "f32", "shape": [512, 256]}, {"dtype": "f32", "shape": [256, 1000]}],
                                    "outputs": [{"dtype": "f32", "shape": [512, 1000]}, {"dtype": "f32", "shape": [1000, 512]}]}]
    assert record["iree_flags"] == ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_89"]  # IREE's defaults otherwise


@needs_iree_compile
def test_onnx_sample_builds_through_the_cli(tmp_path):
    pytest.importorskip("onnx")
    from kitdispatch.cli import main

    model = tmp_path / "model.onnx"
    subprocess.run([sys.executable, str(SAMPLES / "onnx_softmax" / "make_model.py"), str(model)], check=True, timeout=120)
    out, err = io.StringIO(), io.StringIO()
    rc = main(["build", str(SAMPLES / "onnx_softmax"), "--model", str(model), "--with-baseline", "--arch", "sm_90",
               "-o", str(tmp_path / "out"), "--json"], out, err)
    assert rc == 0, err.getvalue()
    data = json.loads(out.getvalue())
    [replaced] = data["replaced"]
    assert replaced["op"] == "linalg.softmax" and replaced["kernel"] == "row_softmax"
    assert "model.imported.mlir" in replaced["location"]  # the importer's MLIR is kept beside the vmfb
    assert "row_softmax" in _dump(tmp_path / "out" / "model.vmfb")
    assert not re.search(r"dispatch_\d+_softmax", (tmp_path / "out" / "model.vmfb").read_bytes().decode("latin-1"))


def make_sample_model(sample: str, path, *args) -> None:
    pytest.importorskip("onnx")
    subprocess.run([sys.executable, str(SAMPLES / sample / "make_model.py"), str(path), *map(str, args)], check=True, timeout=120)


def cli_build(project, model, out, *extra) -> tuple[int, str, str]:
    from kitdispatch.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    rc = main(["build", str(project), "--model", str(model), "--arch", "sm_90", "-o", str(out), "--json", *extra], stdout, stderr)
    return rc, stdout.getvalue(), stderr.getvalue()


def iree_dispatches(vmfb, kind: str) -> set[str]:
    """IREE's own dispatches named after an op kind (`..._dispatch_0_matmul_1024x...`)."""
    return set(re.findall(rf"dispatch_\d+_{kind}_\w+", vmfb.read_bytes().decode("latin-1")))


@needs_iree_compile
def test_onnx_matmul_sample_takes_the_library_matmul(tmp_path):
    """An f16 ONNX MatMul: IREE's importer accumulates it in f32 from a zero fill, which is
    what the library's matmul_f16 computes; the library's own manifest is the project."""
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_matmul", model, "--rows", 256, "--features", 128, "--outputs", 512)
    rc, out, err = cli_build(MATMUL_CU.parent, model, tmp_path / "out", "--with-baseline")
    assert rc == 0, err
    [replaced] = json.loads(out)["replaced"]
    assert replaced["op"] == "linalg.matmul" and replaced["kernel"] == "matmul_f16" and replaced["init"] == "zero fill"
    assert replaced["inputs"] == [{"dtype": "f16", "shape": [256, 128]}, {"dtype": "f16", "shape": [128, 512]}]
    assert replaced["result"] == {"dtype": "f32", "shape": [256, 512]}  # the f16 truncation after it stays IREE's
    vmfb, baseline = tmp_path / "out" / "model.vmfb", tmp_path / "out" / "model.baseline.vmfb"
    assert "matmul_f16" in _dump(vmfb) and "matmul_f16" not in _dump(baseline)
    assert iree_dispatches(baseline, "matmul") and not iree_dispatches(vmfb, "matmul")


@needs_iree_compile
@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch", 2, "--batched-weights"],
         "linalg.batch_matmul x1, linalg.fill x1, linalg.generic x1); no kernel of the project declares linalg.batch_matmul"),
    ],
    ids=["batch-matmul-no-kernel"],
)
def test_onnx_matmuls_the_library_matmul_does_not_take(tmp_path, args, message):
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_matmul", model, "--features", 64, "--outputs", 128, *args)
    rc, _, err = cli_build(MATMUL_CU.parent, model, tmp_path / "out")
    assert rc == 1 and message in err, err
    assert not (tmp_path / "out").exists()


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
    fusion, which matches the library's pattern; the fused op is gone from the module."""
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_bias_gelu", model, "--rows", 64, "--features", 64, "--hidden", 256)
    rc, out, err = cli_build(ELEMENTWISE, model, tmp_path / "out", "--with-baseline")
    assert rc == 0, err
    data = json.loads(out)
    [replaced] = data["replaced"]
    assert replaced["op"] == "linalg.generic" and replaced["kernel"] == "bias_gelu"
    assert replaced["inputs"] == [{"dtype": "f32", "shape": [64, 256]}, {"dtype": "f32", "shape": [256]}]
    record = json.loads((tmp_path / "out" / "model.model.json").read_text())
    assert record["matched_after"] == ["global-optimization", "iree-dispatch-creation-elementwise-op-fusion"]
    assert 'ops{["linalg.generic"]}' in (tmp_path / "out" / "model.spec.mlir").read_text()
    vmfb, baseline = tmp_path / "out" / "model.vmfb", tmp_path / "out" / "model.baseline.vmfb"
    assert "bias_gelu" in _dump(vmfb) and "bias_gelu" not in _dump(baseline)
    # IREE fuses the bias and GELU into its matmul's one dispatch; the replaced module runs its
    # plain matmul, then the kernel (the build itself checked that the marked op is gone).
    dispatch_calls = lambda v: _dump(v).count("vm.call.variadic @hal.command_buffer.dispatch")  # noqa: E731
    assert (dispatch_calls(baseline), dispatch_calls(vmfb)) == (1, 2)


@needs_iree_compile
def test_onnx_gelu_op_differs_in_a_constant(tmp_path):
    """Opset 20's Gelu, as IREE's importer lowers it, uses 0.797724 for sqrt(2/pi): not the
    function the kernel computes, so nothing is replaced and the error says which constant."""
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_bias_gelu", model, "--rows", 64, "--features", 64, "--hidden", 256, "--gelu-op")
    rc, _, err = cli_build(ELEMENTWISE, model, tmp_path / "out")
    assert rc == 1
    assert "body op 4 (arith.mulf): operands (op 3, constant 7.977240e-01 : f32), the pattern's (op 3, constant 0.797884583 : f32)" in err


# ------------------------------------------------------------------------------ errors


@needs_iree_compile
def test_no_match_is_an_error_listing_the_candidates(tmp_path):
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    model = tmp_path / "m.mlir"
    model.write_text(softmax_model(dtype="f16"))
    out = tmp_path / "out"
    with pytest.raises(KitError) as err:
        build_model(_project(tmp_path), model, BuildOptions.create("sm_90"), out)
    text = err.value.render()
    assert "no op of" in text and "linalg.softmax (512x1000xf16)" in text and "element type" in text
    assert not out.exists()  # nothing half-written


@needs_iree_compile
def test_model_without_candidates_lists_its_ops(tmp_path):
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    model = tmp_path / "m.mlir"
    model.write_text(matmul_model(dtype="f32"))
    with pytest.raises(KitError) as err:
        build_model(_project(tmp_path), model, BuildOptions.create("sm_90"), tmp_path / "out")
    assert "has no linalg.softmax" in err.value.render() and "linalg.matmul x1" in err.value.render()


@needs_iree_compile
def test_model_that_does_not_import(tmp_path):
    from kitdispatch.cli import main

    model = tmp_path / "broken.mlir"
    model.write_text("func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  return %y : tensor<4xf32>\n}\n")
    err = io.StringIO()
    rc = main(["build", str(_project(tmp_path)), "--model", str(model), "-o", str(tmp_path / "out")], io.StringIO(), err)
    assert rc == 1
    text = err.getvalue()
    assert "could not bring" in text and "re-run: " in text and "use of undeclared SSA value" in text
    assert "Traceback" not in text


def test_unknown_model_format(tmp_path):
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    model = tmp_path / "m.pt"
    model.write_bytes(b"x")
    with pytest.raises(KitError) as err:
        build_model(_project(tmp_path), model, BuildOptions.create("sm_90"), tmp_path / "out")
    assert "export_torch" in err.value.render()


def test_project_without_replaces(tmp_path):
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    with pytest.raises(ManifestError) as err:
        build_model(_project(tmp_path, extra=""), tmp_path / "m.mlir", BuildOptions.create("sm_90"), tmp_path / "out")
    assert "declares `replaces`" in err.value.render()


def test_with_baseline_needs_model(tmp_path):
    from kitdispatch.cli import main

    err = io.StringIO()
    assert main(["build", str(_project(tmp_path)), "--with-baseline", "-o", str(tmp_path / "o")], io.StringIO(), err) == 2
    assert "--with-baseline needs --model" in err.getvalue() and "usage:" in err.getvalue()
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_compare_onnx_sample_on_gpu(tmp_path, prebuilt_dir):
    """The ONNX sample's softmax replaced by the library kernel agrees with IREE's own build."""
    from kitdispatch.models.compare import compare_model

    built = prebuilt_dir / "onnx_softmax_model" if prebuilt_dir else None
    if built is None:
        pytest.importorskip("onnx")
        from kitdispatch import BuildOptions
        from kitdispatch.models.pipeline import build_model

        model = tmp_path / "model.onnx"
        subprocess.run([sys.executable, str(SAMPLES / "onnx_softmax" / "make_model.py"), str(model)], check=True, timeout=120)
        built = build_model(SAMPLES / "onnx_softmax", model, BuildOptions.create("sm_90"), tmp_path / "out", with_baseline=True).out_dir
    result = compare_model(built)
    assert result.agree, result.worst
    assert result.call_us["replaced"] > 0 and result.call_us["baseline"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("sample, project", [("onnx_matmul", MATMUL_CU.parent), ("onnx_bias_gelu", ELEMENTWISE)])
def test_compare_library_kernel_samples_on_gpu(tmp_path, prebuilt_dir, sample, project):
    """The library's matmul and bias_gelu in place of IREE's codegen agree with IREE's own build
    (f16 outputs within f16's tolerance, f32 within f32's)."""
    from kitdispatch.models.compare import compare_model

    built = prebuilt_dir / f"{sample}_model" if prebuilt_dir else None
    if built is None:
        from kitdispatch import BuildOptions
        from kitdispatch.models.pipeline import build_model

        model = tmp_path / "model.onnx"
        make_sample_model(sample, model)
        built = build_model(project, model, BuildOptions.create("sm_90"), tmp_path / "out", with_baseline=True).out_dir
    result = compare_model(built)
    assert result.agree, result.worst
    kit, _ = result.replaced_dispatches()
    assert any(t.name in result.kernel_names for t in kit) or result.notes


@needs_iree_compile
def test_torch_sample_exports_and_builds(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("iree.turbine")
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

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


# ------------------------------------------------------------ iree_linalg_ext.attention


ATTENTION = REPO / "kernels" / "attention"
_D = "affine_map<(d0, d1, d2, d3, d4) -> "
# Q (batch, m, k1), K (batch, k2, k1), V (batch, k2, n), scale (), O (batch, m, n): the layout
# of torch's SDPA as imported; IREE's global optimization reads V through a transpose instead.
PLAIN_V = "(d0, d4, d2)"


@functools.cache
def attention_kernels() -> tuple[Kernel, ...]:
    from kitdispatch.describe.manifest import load_manifest
    from kitdispatch.models.replace import replacing_kernels

    return replacing_kernels(load_manifest(ATTENTION))


def attention_model(
    batch=8, seq=256, seq_k=None, head=64, dtype="f16", scale="1.250000e-01 : f32", v_map=PLAIN_V, k_map="(d0, d4, d3)",
    v_transposed=False, mask=False, scale_argument=False, scores="%s",
) -> str:
    """One attention op in the form IREE's global optimization gives it, one thing changed at a
    time for the near misses. With `v_transposed`, V goes through IREE's plain transpose first."""
    seq_k = seq_k or seq
    q, kv, o = (f"tensor<{batch}x{s}x{head}x{dtype}>" for s in (seq, seq_k, seq))
    vt = f"tensor<{batch}x{head}x{seq_k}x{dtype}>"
    maskt = f"tensor<{batch}x{seq}x{seq_k}x{dtype}>"
    scale_type = scale.split(": ")[-1]
    args = f"%q: {q}, %k: {kv}, %v: {kv}" + (f", %mask: {maskt}" if mask else "") + (f", %scale: {scale_type}" if scale_argument else "")
    transpose = (
        f"""%vte = tensor.empty() : {vt}
  %vt = linalg.generic {{indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>],
      iterator_types = ["parallel", "parallel", "parallel"]}} ins(%v : {kv}) outs(%vte : {vt}) {{
  ^bb0(%in: {dtype}, %out: {dtype}):
    linalg.yield %in : {dtype}
  }} -> {vt}"""
        if v_transposed else ""
    )
    v, v_type = ("%vt", vt) if v_transposed else ("%v", kv)
    maps = [f"{_D}(d0, d1, d3)>", f"{_D}{k_map}>", f"{_D}{v_map}>", f"{_D}()>"] + ([f"{_D}(d0, d1, d4)>"] if mask else []) + [
        f"{_D}(d0, d1, d2)>"
    ]
    ins = f"%q, %k, {v}, %scale" + (", %mask" if mask else "")
    types = f"{q}, {kv}, {v_type}, {scale_type}" + (f", {maskt}" if mask else "")
    return f"""
func.func @forward({args}) -> {o} {{
  {"" if scale_argument else f"%scale = arith.constant {scale}"}
  {transpose}
  %e = tensor.empty() : {o}
  %r = iree_linalg_ext.attention <indexing_maps = [{", ".join(maps)}]> ins({ins} : {types}) outs(%e : {o}) {{
  ^bb0(%s: f32):
    iree_linalg_ext.yield {scores} : f32
  }} -> {o}
  return %r : {o}
}}"""


def attention_ops(mlir: str):
    return ops_of(mlir, ("iree_linalg_ext.attention",))


@pytest.mark.parametrize("v_transposed, v_map", [(True, "(d0, d2, d4)"), (False, PLAIN_V)], ids=["v-through-transpose", "plain-v"])
def test_attention_hit(v_transposed, v_map):
    d = decide(attention_ops(attention_model(v_transposed=v_transposed, v_map=v_map)), attention_kernels())[0]
    assert d.kernel is not None and d.kernel.name == "attention_f16" and d.operands == (0, 1, 2)
    assert d.through == ((2,) if v_transposed else ())  # the transpose's input is passed as V
    assert d.call.unit_dims == 1 and d.function == "kitdispatch_attention_f16_batch1"  # [8, s, d] runs as [1, 8, s, d]
    assert d.to_json()["attention"] == {"scale": "1.250000e-01 : f32", "mask": None, "v_through_transpose": v_transposed}


def test_attention_hits_bf16_head_dim_128_and_four_dims():
    d = decide(attention_ops(attention_model(head=128, dtype="bf16", scale="0.0883883461 : f32")), attention_kernels())[0]
    assert d.kernel.name == "attention_bf16"
    four = attention_model().replace("tensor<8x", "tensor<2x4x").replace("(d0, d1, d2, d3, d4) -> (d0,", "(d5, d0, d1, d2, d3, d4) -> (d5, d0,")
    four = four.replace("(d0, d1, d2, d3, d4) -> ()", "(d5, d0, d1, d2, d3, d4) -> ()")
    d = decide(attention_ops(four), attention_kernels())[0]
    assert d.kernel.name == "attention_f16" and d.call.unit_dims == 0 and d.function == "kitdispatch_attention_f16"  # [b, h, s, d] as the kernel: no adapter


@pytest.mark.parametrize(
    "model, reason",
    [
        (attention_model(dtype="f32"), "element type: the op's Q is 8x256x64xf32, the kernel's q is f16[b,h,s,d]"),
        (attention_model(head=96, scale="0.102062076 : f32"), "head dim 96: the kernel has code for 64 and 128 only"),
        (attention_model(seq=64, v_map="(d0, d2, d4)"),  # V stored transposed: square, so the types fit
         "operand maps: Q (d0, d1, d3) of 5 loops, K (d0, d4, d3) of 5 loops, V (d0, d2, d4) of 5 loops"),
        (attention_model(seq=64, k_map="(d0, d3, d4)"), "K (d0, d3, d4) of 5 loops"),
        (attention_model(scale="5.000000e-01 : f32"), "the op's scale is 5.000000e-01 : f32, the kernel's 1/sqrt(64) = 0.125 (f32)"),
        (attention_model(head=128, scale="8.837890e-02 : f16"), "the op's scale is 8.837890e-02 : f16, the kernel's 1/sqrt(128)"),
        (attention_model(scale_argument=True), "the op's scale is computed by a function argument, not a constant"),
        (attention_model(mask=True), "the op has a mask operand (made by a function argument), and the kernel takes no mask"),
        (attention_model(seq_k=128), "shape: s is 256 elsewhere but 128 in the op's K"),
        (attention_model(scores="%s2").replace("iree_linalg_ext.yield %s2", "%s2 = arith.mulf %s, %s : f32\n    iree_linalg_ext.yield %s2"),
         "the op's score region changes the scores"),
    ],
    ids=["dtype", "head-dim", "v-map", "k-map", "scale", "f16-scale", "scale-not-constant", "mask", "cross-attention", "score-region"],
)
def test_attention_near_misses(model, reason):
    d = only(decide(attention_ops(model), attention_kernels()))
    assert d.kernel is None
    assert reason in d.reasons[0], d.reasons
    assert len(d.reasons) == 2  # both library kernels say why


@needs_iree_compile
def test_attention_build_dispatches_the_library_kernel(tmp_path):
    """An imported attention (V plain, as torch's SDPA gives it): IREE's global optimization
    puts V through a transpose, the kernel reads V through it, and the module dispatches the
    library's attention in place of IREE's attention dispatch (and the transpose)."""
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    model = tmp_path / "attn.mlir"
    model.write_text(attention_model(batch=6, seq=300))
    result = build_model(ATTENTION, model, BuildOptions.create("sm_90a,sm_80"), tmp_path / "out", with_baseline=True)
    [replaced] = result.replaced
    assert replaced.kernel.name == "attention_f16" and replaced.through == (2,) and replaced.call.unit_dims == 1
    spec = result.spec.read_text()
    assert "transform.get_producer_of_operand %op[2]" in spec and "util.func private @kitdispatch_attention_f16_batch1" in spec
    assert "attention_f16" in _dump(result.vmfb) and "attention_f16" not in _dump(result.baseline_vmfb)
    assert iree_dispatches(result.baseline_vmfb, "attention") and not iree_dispatches(result.vmfb, "attention")
    assert not iree_dispatches(result.vmfb, "transpose")
    dispatch_calls = lambda v: _dump(v).count("vm.call.variadic @hal.command_buffer.dispatch")  # noqa: E731
    assert dispatch_calls(result.vmfb) == 1


@needs_iree_compile
def test_masked_attention_is_kept_with_its_reason(tmp_path):
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    model = tmp_path / "attn.mlir"
    model.write_text(attention_model(mask=True))
    with pytest.raises(KitError) as err:
        build_model(ATTENTION, model, BuildOptions.create("sm_90a,sm_80"), tmp_path / "out")
    assert "the op has a mask operand" in err.value.render()
    assert not (tmp_path / "out").exists()


@needs_iree_compile
def test_torch_attention_sample_exports_and_builds(tmp_path):
    """torch's SDPA through iree-turbine: the library attention replaces IREE's, V read through
    the transpose IREE's global optimization puts before the op."""
    pytest.importorskip("torch")
    pytest.importorskip("iree.turbine")
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    sys.modules.pop("model", None)  # torch_mlp's sample module has the same name
    sys.path.insert(0, str(SAMPLES / "torch_attention"))
    try:
        from model import export
    finally:
        sys.path.pop(0)
        sys.modules.pop("model", None)
    mlir = export(tmp_path / "attn.mlir", batch=2, heads=3, seq=300, head_dim=128)
    assert "torch.aten.scaled_dot_product_attention" in mlir.read_text()
    result = build_model(ATTENTION, mlir, BuildOptions.create("sm_90a,sm_80"), tmp_path / "out", with_baseline=True)
    [replaced] = result.replaced
    assert replaced.kernel.name == "attention_f16" and replaced.op.result.shape == (6, 300, 128)
    assert replaced.op.detail.scale_text == "0.0883883461 : f32" and replaced.through == (2,)
    assert iree_dispatches(result.baseline_vmfb, "attention") and not iree_dispatches(result.vmfb, "attention")


@needs_iree_compile
def test_a_model_build_never_overwrites_a_users_file_and_replaces_its_own(tmp_path):
    """Model builds publish under the same rules as module builds: a file of the user's in the
    way stops the build untouched; the kit's own files of an earlier build are replaced."""
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model
    from kitdispatch.models.record import read_model_record

    model = tmp_path / "mm_softmax.mlir"
    model.write_text(LINALG_MODEL)
    project = _project(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mm_softmax.spec.mlir").write_text("// my own spec\n")
    with pytest.raises(KitError, match="mm_softmax.spec.mlir exists and was not written by kitdispatch"):
        build_model(project, model, BuildOptions.create("sm_90"), out)
    assert (out / "mm_softmax.spec.mlir").read_text() == "// my own spec\n"
    assert sorted(p.name for p in out.iterdir()) == ["mm_softmax.spec.mlir"]
    (out / "mm_softmax.spec.mlir").unlink()
    first = build_model(project, model, BuildOptions.create("sm_90"), out)
    again = build_model(project, model, BuildOptions.create("sm_90"), out)
    assert again.vmfb == first.vmfb and read_model_record(out)[1].vmfb == "mm_softmax.vmfb"
    # A .vmfb replaced behind the record's back is refused by compare's reader.
    first.vmfb.write_bytes(first.vmfb.read_bytes() + b"\0")
    with pytest.raises(KitError, match="not the file its model record describes"):
        read_model_record(out)


# ------------------------------------------------ issue 21: faults a careless or hostile user brings

LLAMA = REPO / "tests" / "data" / "llama_layer" / "make_model.py"
ELEMENTWISE_PROJECT = REPO / "kernels" / "elementwise"


def make_llama_layer(path, *args) -> None:
    pytest.importorskip("onnx")
    subprocess.run([sys.executable, str(LLAMA), str(path), *map(str, args)], check=True, timeout=120)


@needs_iree_compile
@pytest.mark.parametrize("dtype_args", [(), ("--f16",)], ids=["f32", "f16"])
def test_llama_layer_with_elementwise_kernels_reports_instead_of_crashing(tmp_path, dtype_args):
    """A Llama-style layer (RMSNorm in Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul, SwiGLU, no biases)
    once ended in an IndexError: IREE lowers Reciprocal with a result-less linalg.generic around
    a cf.assert. Now every generic is checked against bias_gelu's pattern and the reasons listed."""
    model = tmp_path / "layer.onnx"
    make_llama_layer(model, *dtype_args)
    rc, out, err = cli_build(ELEMENTWISE_PROJECT, model, tmp_path / "out")
    assert rc == 1, err
    assert "internal error" not in err and "Traceback" not in err
    assert "no op of" in err and "can be replaced by a kernel of elementwise" in err
    assert "linalg.generic {negf, exp, addf, divf, mulf, mulf}" in err  # the SwiGLU's silu * up, with its reason
    assert "bias_gelu: not the pattern bias_gelu.pattern.mlir" in err
    assert not (tmp_path / "out").exists()


@needs_iree_compile
def test_llama_layer_matmuls_take_the_library_matmul(tmp_path):
    """The same f16 layer with kernels/matmul: its three projections are replaced."""
    model = tmp_path / "layer.onnx"
    make_llama_layer(model, "--f16")
    rc, out, err = cli_build(MATMUL_CU.parent, model, tmp_path / "out")
    assert rc == 0, err
    replaced = json.loads(out)["replaced"]
    assert [r["kernel"] for r in replaced] == ["matmul_f16"] * 3
    assert "matmul_f16" in _dump(tmp_path / "out" / "layer.vmfb")


@pytest.mark.gpu
def test_llama_layer_with_the_library_matmul_agrees_on_gpu(tmp_path, prebuilt_dir):
    """The f16 Llama-style layer with its three projections replaced agrees with IREE alone
    (prebuilt as `llama_layer_model` where the GPU machine has no iree-compile)."""
    from kitdispatch.models.compare import compare_model

    built = prebuilt_dir / "llama_layer_model" if prebuilt_dir else None
    if built is None:
        from kitdispatch import BuildOptions
        from kitdispatch.models.pipeline import build_model

        if not __import__("conftest").HAVE_IREE_COMPILE:
            pytest.skip("iree-compile is not installed")
        model = tmp_path / "layer.onnx"
        make_llama_layer(model, "--f16")
        built = build_model(MATMUL_CU.parent, model, BuildOptions.create("sm_90"), tmp_path / "out", with_baseline=True).out_dir
    elif not built.is_dir():
        pytest.skip(f"{built} was not prebuilt")
    result = compare_model(built)
    assert result.agree, result.worst
    assert result.kernel_names == ("matmul_f16",)


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


@pytest.mark.parametrize(
    "model, kernel, reason",
    [
        (softmax_model(shape="2x2147483648"), softmax_kernel(),
         "size: cols = 2147483648 does not fit the kernel's i32 parameter cols (-2147483648 to 2147483647)"),
        (softmax_model(shape="2147483648x2"), softmax_kernel(),
         "size: rows = 2147483648 does not fit the kernel's i32 parameter rows"),
        (matmul_model(m=16, k=4294967296, n=16), matmul_kernel(),
         "size: k = 4294967296 does not fit the kernel's i32 parameter k"),
    ],
    ids=["softmax-cols", "softmax-rows", "matmul-k"],
)
def test_model_sizes_beyond_the_kernels_index_parameters_are_kept(model, kernel, reason):
    """A dimension the kernel's `int` cannot hold would reach it wrapped: the op is kept, with
    the reason, instead of being replaced."""
    d = only(decide(ops_of(model), [kernel]))
    assert d.kernel is None
    assert reason in d.reasons[0], d.reasons


def test_model_sizes_through_a_value_expression_are_checked():
    """A scalar whose value is an expression over the sizes (`value = "rows * 2"`) is checked too."""
    kernel = Kernel.create(
        "row_softmax", SOFTMAX_CU,
        [Buffer("x", "in", TensorType("f32", ("rows", "cols"))), Buffer("out", "out", TensorType("f32", ("rows", "cols"))),
         Scalar("rows", "i32", IndexExpr.parse("rows * 2", "rows")), Scalar("cols", "i32")],
        workgroup_size=[256], workgroup_count=["ceildiv(rows, 32) + 1024"], replaces=_replaces("linalg.softmax"),
    )
    assert only(decide(ops_of(softmax_model(shape="1073741823x8")), [kernel])).kernel is not None
    d = only(decide(ops_of(softmax_model(shape="1073741824x8")), [kernel]))
    assert d.kernel is None and "size: rows = rows * 2 = 2147483648 does not fit" in d.reasons[0]


@needs_iree_compile
def test_model_and_output_paths_that_start_with_a_dash(tmp_path, monkeypatch):
    """`--model ./-m.mlir` and `-o=-out`: IREE's tools get them as paths, not as options."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-m.mlir").write_text(softmax_model())
    stdout, stderr = io.StringIO(), io.StringIO()
    from kitdispatch.cli import main

    rc = main(["build", str(_project(tmp_path)), "--model", "./-m.mlir", "--arch", "sm_90", "-o=-out", "--json"], stdout, stderr)
    out, err = stdout.getvalue(), stderr.getvalue()
    assert rc == 0, err
    assert (tmp_path / "-out" / "_m.vmfb").is_file()
    assert json.loads(out)["replaced"][0]["kernel"] == "row_softmax"


# A model record as build_model writes it, for the damaged-record tests (files made beside it).
MODEL_RECORD = {
    "schema": 1, "kitdispatch": "0.1.0", "model": "m.mlir", "project": "p", "vmfb": "m.vmfb", "baseline_vmfb": "m.baseline.vmfb",
    "spec": "m.spec.mlir", "archs": ["sm_90"], "codegen_target": "sm_89", "iree_compiler": "3.13", "iree_flags": [],
    "matched_after": ["global-optimization"],
    "functions": [{"name": "forward", "inputs": [{"dtype": "f32", "shape": [4, 8]}], "outputs": [{"dtype": "f32", "shape": [4, 8]}]}],
    "replaced": [{"op": "linalg.softmax", "location": "m.mlir:3:8", "kernel": "row_softmax", "kernel_entry": "row_softmax"}],
    "not_replaced": [], "kernel_executables": [], "files": {},
}


def _write_model_record(folder, record) -> None:
    from kitdispatch.describe.record import sha256

    folder.mkdir(exist_ok=True)
    for name in ("m.vmfb", "m.baseline.vmfb"):
        (folder / name).write_bytes(name.encode())
    if isinstance(record, dict) and isinstance(record.get("files"), dict) and not record["files"]:
        record = dict(record, files={n: sha256(n.encode()) for n in ("m.vmfb", "m.baseline.vmfb")})
    (folder / "m.model.json").write_text(json.dumps(record))


_JSON = json_values()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_model_records_with_wrong_json_types_are_damaged_records(tmp_path_factory, data):
    """Property: a model record with any one value swapped for another JSON value is read
    whole or refused as damaged (exit 2), never a TypeError inside compare."""
    from kitdispatch.models.record import read_model_record
    from kitdispatch.describe.record import DamagedRecord

    folder = tmp_path_factory.mktemp("record")
    path = data.draw(st.sampled_from(list(json_paths(MODEL_RECORD))))
    _write_model_record(folder, json_replaced_at(MODEL_RECORD, path, data.draw(_JSON)))
    try:
        read_model_record(folder)
    except DamagedRecord as exc:
        assert exc.exit_code == 2 and "model record" in exc.render()
    except KitError as exc:  # a well-typed record naming files that are not there, or not its own
        text = exc.render()
        assert any(m in text for m in ("is not the file its model record describes", "is not a file it lists",
                                       "which is not a file name of its folder")), text


@pytest.mark.parametrize(
    "record, message",
    [
        (dict(MODEL_RECORD, files=[]), "'files' is not a table of SHA-256s"),
        (dict(MODEL_RECORD, vmfb=5), "'vmfb' is not a file name"),
        (dict(MODEL_RECORD, functions=[{"name": "forward", "inputs": [{"dtype": "f32", "shape": "4x8"}], "outputs": []}]),
         "'functions' is not a list of signatures"),
        (dict(MODEL_RECORD, replaced=[{"op": 1}]), "'replaced' is not a list of replaced ops"),
        ("[" * 100000 + "]" * 100000, "cannot read the model record: RecursionError"),
    ],
    ids=["files", "vmfb", "functions", "replaced", "deep"],
)
@pytest.mark.parametrize("command", ["compare", "profile"])
def test_compare_and_profile_on_a_damaged_model_record(tmp_path, record, message, command):
    from kitdispatch.cli import main

    if isinstance(record, str):
        _write_model_record(tmp_path / "built", {})
        (tmp_path / "built" / "m.model.json").write_text(record)
    else:
        _write_model_record(tmp_path / "built", record)
    before = {p.name: p.read_bytes() for p in (tmp_path / "built").iterdir()}
    err = io.StringIO()
    assert main([command, str(tmp_path / "built")], io.StringIO(), err) == 2, err.getvalue()
    assert message in err.getvalue() and "Traceback" not in err.getvalue() and "internal error" not in err.getvalue()
    assert {p.name: p.read_bytes() for p in (tmp_path / "built").iterdir()} == before


@needs_iree_compile
@pytest.mark.parametrize("device, message", [("local-task", "was compiled for IREE's cuda device and cannot run on 'local-task'"),
                                             ("bogus", "IREE's runtime has no device 'bogus'")])
def test_compare_on_a_device_that_cannot_run_the_model(linalg_build, device, message):
    """Without a GPU, `local-task` still opens: the module's load is what refuses, with exit 2."""
    from kitdispatch.cli import main

    _, _, out = linalg_build
    err = io.StringIO()
    assert main(["compare", str(out), "--device", device], io.StringIO(), err) == 2, err.getvalue()
    assert message in err.getvalue() and "internal error" not in err.getvalue()
