"""The epilogue of a matmul (models/ops/epilogue.py): the ops after it, read from real imported
ONNX models at the matching stage, and near misses with their reasons."""

from __future__ import annotations

import json
import re

import pytest
from conftest import (
    HAVE_IREE_COMPILE, KERNEL_TOML, REPO, SOFTMAX_CU, chain_of, matmul_kernel, matmul_model, onnx_build_with_baseline, only, ops_of,
    prebuilt_or_fixture, replaces_of,
)

needs_iree = pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")


@pytest.fixture(scope="session")
def staged(tmp_path_factory):
    """kind, dtype -> the model at the matching stage (each built once)."""
    pytest.importorskip("onnx")
    if not HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    from models.epilogue_models import at_matching_stage, epilogue_onnx

    tmp, cache = tmp_path_factory.mktemp("epilogue"), {}

    def get(kind: str, dtype: str = "f32") -> str:
        if (kind, dtype) not in cache:
            model = epilogue_onnx(tmp / f"{kind}_{dtype}.onnx", kind, dtype)
            cache[kind, dtype] = at_matching_stage(model, tmp)
        return cache[kind, dtype]

    return get


# kind, dtype -> epilogue, generics covered, bias path, residual path, constant, model roundings
HITS = [
    ("bias", "f32", "bias", 1, (1,), None, None, 0),
    ("bias_first", "f32", "bias", 1, (0,), None, None, 0),
    ("gemm", "f32", "bias", 1, (1,), None, None, 0),
    ("gelu", "f32", "bias_gelu_erf", 1, (1,), None, None, 0),
    ("gelu_erf_decomposed", "f32", "bias_gelu_erf", 1, (1,), None, None, 0),
    ("gelu_tanh", "f32", "bias_gelu_tanh", 1, (1,), None, "0.797724009", 0),
    ("gelu_tanh_decomposed", "f32", "bias_gelu_tanh", 1, (1,), None, "0.797884583", 0),
    ("relu", "f32", "bias_relu", 1, (1,), None, None, 0),
    ("silu", "f32", "bias_silu", 1, (1,), None, None, 0),
    ("residual", "f32", "residual", 1, None, (1,), None, 0),
    ("bias_residual", "f32", "bias_residual", 1, (1,), (2,), None, 0),
    ("scale", "f32", "scale", 1, None, None, "0.125", 0),
    ("scale_div", "f32", "scale", 1, None, None, "0.125", 0),
    # f16 exports: the matmul's f32 result is rounded to f16 (its own generic), the rest in f16.
    ("none", "f16", "none", 1, None, None, None, 0),
    ("bias", "f16", "bias", 2, (1,), None, None, 1),
    ("bias_2d", "f16", "bias", 2, (1,), None, None, 1),  # a [1, n] bias: IREE collapses it to [n]
    ("gelu", "f16", "bias_gelu_erf", 2, (1,), None, None, 7),
    ("gelu_tanh", "f16", "bias_gelu_tanh", 2, (1,), None, "0.797851562", 9),
    ("relu", "f16", "bias_relu", 2, (1,), None, None, 1),
    ("silu", "f16", "bias_silu", 2, (1,), None, None, 5),
    ("bias_residual", "f16", "bias_residual", 2, (1,), (2,), None, 2),
    ("scale", "f16", "scale", 1, None, None, "0.125", 1),
    ("bmm_scale", "f16", "scale", 1, None, None, "0.125", 1),  # a batch_matmul / 8: attention's scores
    # GELU on the product itself (an export that folded a zero bias away, GPT-2's c_fc)
    ("gelu_nobias", "f32", "gelu_erf", 1, None, None, None, 0),
    ("gelu_tanh_nobias", "f32", "gelu_tanh", 1, None, None, "0.797724009", 0),
    ("gelu_tanh_nobias", "f16", "gelu_tanh", 1, None, None, "0.797851562", 8),  # the truncf in the same generic
    # torch's batch-1 Linear: a batch_matmul of batch 1, its unit dim collapsed, then the 2-D ops.
    ("batch1_bias_residual", "f16", "bias_residual", 3, (1,), (2,), None, 2),
]


@needs_iree
@pytest.mark.parametrize("kind, dtype, name, covers, bias, residual, constant, rounds", HITS, ids=[f"{h[0]}-{h[1]}" for h in HITS])
def test_epilogue_of_exported_model(staged, kind, dtype, name, covers, bias, residual, constant, rounds):
    chain = chain_of(staged(kind, dtype))
    best = chain.longest
    assert (best.name, best.covers) == (name, covers), [(f.name, f.why) for f in chain.forms]
    assert best.result.dtype == ("f16" if dtype == "f16" else "f32")
    assert len(best.result.shape) == (3 if kind.startswith("bmm") else 2)  # batch 1: the collapsed result
    assert (best.bias[0] if best.bias else None) == bias
    assert (best.residual[0] if best.residual else None) == residual
    assert (best.constant_text if best.constant is not None else None) == constant
    assert best.rounds == rounds
    assert chain.forms[0].name == "none" and chain.forms[0].result.dtype == "f32"  # the bare matmul
    assert best.chain == (0,) * covers if kind != "bias_first" else best.chain == (1,)


@needs_iree
def test_f16_prefixes_are_each_an_epilogue(staged):
    """An f16 bias + GELU: the bare matmul (f32), the matmul rounded to f16 (none), and the
    whole chain (bias_gelu_erf) are three ways of replacing it; `choose` takes the longest."""
    chain = chain_of(staged("gelu", "f16"))
    assert [(f.name, f.result.dtype) for f in chain.forms] == [("none", "f32"), ("none", "f16"), ("bias_gelu_erf", "f16")]
    assert chain.choose("none", "f16").covers == 1
    assert chain.choose("none", "f32").covers == 0
    assert chain.choose("bias_gelu_erf", "f16").covers == 2
    assert "the kernel computes bias_gelu_tanh -> f16" in chain.choose("bias_gelu_tanh", "f16")


@needs_iree
def test_cast_to_f32_for_the_epilogue(staged):
    """MatMul in f16, Cast to f32, bias + GELU in f32, Cast back: the bias is f32 and the result
    f16; the kernel reads its bias in the result's type, so the chain stops at the rounding."""
    chain = chain_of(staged("gelu", "f16cast"))
    assert chain.longest.name == "none" and chain.longest.result.dtype == "f16"
    assert "the bias is 256xf32, the result f16" in chain.refused()


@needs_iree
@pytest.mark.parametrize(
    "kind, reason",
    [
        ("bias_column", "broadcast along dimension 0, not a bias [n]"),
        ("gelu_times_input", "* residual), which is no epilogue of the family"),
        ("relu_then_sin", "math.sin is in no epilogue"),
    ],
)
def test_exported_near_misses(staged, kind, reason):
    chain = chain_of(staged(kind))
    assert chain.longest.name == "none" and chain.longest.covers == 0
    assert reason in chain.refused(), chain.refused()


# Near misses written as IREE leaves them after elementwise fusion: one generic after the matmul.
def fused(body: str, *, extra_in: str = "", extra_map: str = "", bias_dtype: str = "f32", out: str = "f32", args: str = "%in: f32, %b: f32") -> str:
    return f"""
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @f(%lhs: tensor<64x128xf32>, %w: tensor<128x256xf32>, %bias: tensor<256x{bias_dtype}>{extra_in}) -> tensor<64x256x{out}> {{
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<64x256xf32>
  %f = linalg.fill ins(%zero : f32) outs(%empty : tensor<64x256xf32>) -> tensor<64x256xf32>
  %mm = linalg.matmul ins(%lhs, %w : tensor<64x128xf32>, tensor<128x256xf32>) outs(%f : tensor<64x256xf32>) -> tensor<64x256xf32>
  %o = tensor.empty() : tensor<64x256x{out}>
  %r = linalg.generic {{indexing_maps = [#id, #row{extra_map}, #id], iterator_types = ["parallel", "parallel"]}}
      ins(%mm, %bias : tensor<64x256xf32>, tensor<256x{bias_dtype}>) outs(%o : tensor<64x256x{out}>) {{
  ^bb0({args}, %out: {out}):
{body}
  }} -> tensor<64x256x{out}>
  return %r : tensor<64x256x{out}>
}}"""


RELU = """    %x = arith.addf %in, %b : f32
    %c0 = arith.constant 0.0 : f32
    %p = arith.cmpf {pred}, %x, %c0 : f32
    %y = arith.select %p, %x, %c0 : f32
    linalg.yield %y : f32"""

RELU_LT = """    %x = arith.addf %in, %b : f32
    %c0 = arith.constant 0.0 : f32
    %p = arith.cmpf {pred}, %x, %c0 : f32
    %y = arith.select %p, %c0, %x : f32
    linalg.yield %y : f32"""

GELU = """    %x = arith.addf %in, %b : f32
    %c = arith.constant {c} : f32
    %h = arith.constant 0.5 : f32
    %one = arith.constant 1.0 : f32
    %s = arith.mulf %x, %c : f32
    %e = math.erf %s : f32
    %a = arith.addf %e, %one : f32
    %m = arith.mulf %x, %a : f32
    %y = arith.mulf %m, %h : f32
    linalg.yield %y : f32"""


@pytest.mark.parametrize(
    "mlir, name, reason",
    [
        (fused(RELU.format(pred="ugt")), "bias_relu", None),
        (fused(RELU.format(pred="uge")), "bias_relu", None),
        (fused(RELU.format(pred="ogt")), None, "ReLU by a select by cmpf ogt gives 0 for NaN, the kernel NaN"),
        (fused(RELU_LT.format(pred="olt")), "bias_relu", None),
        (fused(RELU_LT.format(pred="ult")), None, "ReLU by a select by cmpf ult gives 0 for NaN, the kernel NaN"),
        (fused(RELU_LT.format(pred="ogt")), None, "a select by cmpf ogt that is not max(x, 0)"),
        (fused("    %x = arith.addf %in, %b : f32\n    %c0 = arith.constant 0.0 : f32\n    %y = arith.maxnumf %x, %c0 : f32\n    linalg.yield %y : f32"),
         None, "ReLU by arith.maxnumf gives 0 for NaN"),
        (fused("    %x = arith.addf %in, %b : f32\n    %c0 = arith.constant 0.0 : f32\n    %y = arith.maximumf %x, %c0 : f32\n    linalg.yield %y : f32"),
         "bias_relu", None),
        (fused(GELU.format(c="0.707106769")), "bias_gelu_erf", None),
        (fused(GELU.format(c="0.7")), None, "which is no epilogue of the family"),
        (fused("    %x = arith.addf %in, %b : f32\n    %y = arith.addf %x, %out : f32\n    linalg.yield %y : f32"), None, "the body reads its output"),
        (fused("    %x = arith.addf %in, %b : f32\n    %y = arith.mulf %x, %x : f32\n    linalg.yield %y : f32"), None, "which is no epilogue"),
        (fused("    %x = arith.addf %in, %b : f32\n    %y = arith.subf %x, %b : f32\n    linalg.yield %y : f32"), None, "which is no epilogue"),
        # f16 math in an f32 graph: a rounding the kernel does not do, to a type it does not write.
        (fused("    %t = arith.truncf %in : f32 to f16\n    %bt = arith.truncf %b : f32 to f16\n    %x = arith.addf %t, %bt : f16\n"
               "    %y = arith.extf %x : f16 to f32\n    linalg.yield %y : f32"), None, "arith.truncf computes in f16, neither f32 nor the result's f32"),
        # The bias in f16, the result f32: the kernel reads its bias in the result's type.
        (fused("    %x = arith.extf %b : f16 to f32\n    %y = arith.addf %in, %x : f32\n    linalg.yield %y : f32",
               bias_dtype="f16", args="%in: f32, %b: f16"), None, "the bias is 256xf16, the result f32"),
    ],
    ids=["relu-ugt", "relu-uge", "relu-ogt", "relu-lt-olt", "relu-lt-ult", "select-not-relu", "relu-maxnumf", "relu-maximumf", "gelu-mul-constant", "gelu-wrong-constant",
         "reads-output", "square", "sub-bias", "f16-in-f32-graph", "f16-bias-f32-result"],
)
def test_fused_forms(mlir, name, reason):
    chain = chain_of(mlir)
    last = chain.forms[-1]
    assert last.covers == 1
    assert last.name == name, last.why
    if reason:
        assert reason in last.why, last.why


def test_chain_stops_at_a_second_user():
    """The matmul's result also returned: IREE keeps it in memory, so the chain is empty."""
    chain = chain_of(fused(RELU.format(pred="ugt")).replace("return %r :", "return %mm :"))
    assert len(chain.forms) == 1 and "2 users" in chain.stop


# ------------------------------------------------------------------- matching (models/ops/matmul.py)

# The GEMM family's manifest: kernels/matmul/kitdispatch.toml (gemm.toml before the family joined the library).
GEMM = next(p for p in (REPO / "kernels" / "matmul" / "gemm.toml", REPO / "kernels" / "matmul") if p.exists())


def family(name: str) -> str:
    """A family entry's name without its tile config (the config is chosen per shape)."""
    return re.sub(r"_t(128|64)x\w+$", "", name)


@pytest.fixture(scope="module")
def gemm_kernels():
    from kitdispatch.describe.manifest import load_manifest
    from kitdispatch.models.replace import replacing_kernels

    return replacing_kernels(load_manifest(GEMM))


def decided(mlir: str, kernels):
    from kitdispatch.models.replace import decide

    return only(decide(ops_of(mlir, ("linalg.matmul",)), kernels))


# kind -> kernel, ops replaced after the matmul, arguments from the marked op
F16_MATCHES = [
    ("none", "matmul_nn_f16_none", 1, [(0, 0), (0, 1)]),
    ("bias", "matmul_nn_f16_bias", 2, [(0, 0, 0), (0, 0, 1), (1,)]),
    ("gelu", "matmul_nn_f16_bias_gelu_erf", 2, [(0, 0, 0), (0, 0, 1), (1,)]),
    ("gelu_tanh", "matmul_nn_f16_bias_gelu_tanh", 2, [(0, 0, 0), (0, 0, 1), (1,), ("f32", "0.797851562")]),
    ("relu", "matmul_nn_f16_bias_relu", 2, [(0, 0, 0), (0, 0, 1), (1,)]),
    ("silu", "matmul_nn_f16_bias_silu", 2, [(0, 0, 0), (0, 0, 1), (1,)]),
    ("bias_residual", "matmul_nn_f16_bias_residual", 2, [(0, 0, 0), (0, 0, 1), (1,), (2,)]),
    ("scale", "matmul_nn_f16_scale", 1, [(0, 0), (0, 1), ("f32", "0.125")]),
]


def _arguments(call):
    from kitdispatch.models.ops.base import Constant

    return [(a.type, a.value) if isinstance(a, Constant) else a.path for a in call.arguments]


@needs_iree
@pytest.mark.parametrize("kind, kernel, marked, arguments", F16_MATCHES, ids=[m[0] for m in F16_MATCHES])
def test_f16_matmul_replaced_with_its_epilogue(staged, gemm_kernels, kind, kernel, marked, arguments):
    d = decided(staged(kind, "f16"), gemm_kernels)
    assert d.kernel is not None and family(d.kernel.name) == kernel
    assert d.call.marked == marked
    assert _arguments(d.call) == arguments
    report = d.to_json()
    assert report["epilogue"] == d.kernel.replaces.epilogue and report["epilogue_ops_after"] == marked
    assert report["epilogue_replaced"] == {"epilogue": d.kernel.replaces.epilogue, "ops_after": marked}


@needs_iree
def test_a_matmul_whose_epilogue_no_kernel_computes_is_kept(staged, gemm_kernels):
    """No epilogue computes GELU times another tensor. matmul_nn_f16_none could take the matmul
    and its rounding to f16, but the bias, GELU and product, which IREE fuses into the matmul's
    dispatch, would then run as a dispatch of their own: kept, saying so (issue 25: a replaced
    model never has more IREE dispatches than IREE alone)."""
    d = decided(staged("gelu_times_input", "f16"), gemm_kernels)
    assert d.kernel is None
    why = next(r for r in d.reasons if "matmul_nn_f16_none" in r.split(": ")[0])  # kernels failing alike are named together
    assert "which IREE fuses into the matmul's dispatch, would run as a dispatch of their own" in why, why


@needs_iree
def test_batch_matmul_replaced_with_its_scale(staged, gemm_kernels):
    from kitdispatch.models.replace import decide

    d = only(decide(ops_of(staged("bmm_scale", "f16"), ("linalg.batch_matmul",)), gemm_kernels))
    assert family(d.kernel.name) == "bmm_nn_f16_scale" and d.call.marked == 1
    assert _arguments(d.call) == [(0, 0), (0, 1), ("f32", "0.125")]


@needs_iree
def test_f16_kernels_on_an_f32_model_say_why(staged, gemm_kernels):
    """An f32 model's matmul and GELU against the family's f16 kernels: kept, the inputs' types
    first (the epilogue's reason is for kernels that take the op's A and B)."""
    d = decided(staged("gelu", "f32"), [k for k in gemm_kernels if k.name.startswith("matmul_nn_f16")])
    assert d.kernel is None
    why = next(r for r in d.reasons if "matmul_nn_f16_bias_gelu_erf" in r)
    assert "element type: the op's input 0 is 64x128xf32, the kernel's a is f16[m,k]" in why


def test_epilogue_kernel_refuses_another_epilogue():
    """A bias kernel on a matmul + ReLU: the chain computes bias_relu, not bias."""
    from kitdispatch.models.replace import decide

    mlir = fused(RELU.format(pred="ugt"))
    kernel = _epilogue_kernel("bias", "f32")
    d = only(decide(ops_of(mlir, ("linalg.matmul",)), [kernel]))
    assert d.kernel is None
    assert "the kernel computes bias -> f32; the op and its users compute none -> f32 or bias_relu -> f32" in d.reasons[0]
    d = only(decide(ops_of(mlir, ("linalg.matmul",)), [kernel, _epilogue_kernel("bias_relu", "f32")]))
    assert d.kernel.name == "mm_bias_relu" and d.call.marked == 1


def _epilogue_kernel(epilogue: str, dtype: str, *, extra=(), scalars=()):
    from kitdispatch import Buffer, Kernel, Scalar
    from kitdispatch.describe.types import TensorType

    params = [Buffer("a", "in", TensorType.parse("f32[m,k]", "a")), Buffer("b", "in", TensorType.parse("f32[k,n]", "b"))]
    params += [Buffer(name, "in", TensorType.parse(t, name)) for name, t in extra or (("bias", f"{dtype}[n]"),)]
    params += [Buffer("c", "out", TensorType.parse(f"{dtype}[m,n]", "c"))]
    params += [Scalar(s, "f32") for s in scalars] + [Scalar(x, "i32") for x in "mnk"]
    return Kernel.create(
        f"mm_{epilogue}", "mm.cu", params, workgroup_size=[128], workgroup_count=["ceildiv(n, 64)", "ceildiv(m, 64)"],
        replaces=replaces_of("linalg.matmul", epilogue=epilogue),
    )


@pytest.mark.parametrize(
    "epilogue, extra, scalars, message",
    [
        ("bias", (("residual", "f32[m,n]"),), (), "its epilogue bias reads bias after A and B"),
        ("bias", (("bias", "f16[n]"),), (), "both of the result's type"),
        ("bias", (("bias", "f32[m]"),), (), "bias [n]"),
        ("bias_gelu_tanh", (), (), "takes one f32 scalar gelu_c without a value"),
        ("bias", (), ("alpha",), "its epilogue bias takes no scalar argument"),
    ],
    ids=["residual-for-bias", "bias-type", "bias-shape", "no-gelu_c", "extra-scalar"],
)
def test_epilogue_contract_errors(epilogue, extra, scalars, message):
    from kitdispatch import ManifestError
    from kitdispatch.models.replace import check_kernel

    with pytest.raises(ManifestError) as err:
        check_kernel(_epilogue_kernel(epilogue, "f32", extra=extra, scalars=scalars), "linalg.matmul")
    assert message in err.value.render()


@pytest.mark.parametrize(
    "when, message",
    [
        ('{ epilogue = "gelu" }', "unknown epilogue 'gelu'"),
        ("{ epilogue = 3 }", "unknown epilogue 3"),
    ],
)
def test_manifest_epilogue_errors(when, message):
    from kitdispatch import ManifestError

    with pytest.raises(ManifestError) as err:
        _gemm_entry(when)
    assert message in err.value.render() and "bias_gelu_tanh" in err.value.render()


def test_manifest_epilogue_only_for_matmuls():
    from kitdispatch import ManifestError

    with pytest.raises(ManifestError) as err:
        _gemm_entry('{ epilogue = "bias" }', op="linalg.softmax")
    assert "an epilogue is for linalg.matmul, linalg.batch_matmul and patch_conv only, not linalg.softmax" in err.value.render()


def test_manifest_epilogue_default_and_value():
    assert _gemm_entry(None).kernels[0].replaces.epilogue == "none"
    assert _gemm_entry('{ epilogue = "bias_gelu_tanh" }').kernels[0].replaces.epilogue == "bias_gelu_tanh"


def _gemm_entry(when: str | None, op: str = "linalg.matmul"):
    import tomllib

    from kitdispatch.describe.manifest import parse_manifest

    text = KERNEL_TOML.format(src=SOFTMAX_CU) + f'replaces = ["{op}"]\n' + (f"replace_when = {when}\n" if when else "")
    return parse_manifest(tomllib.loads(text), root=REPO, where="kitdispatch.toml")


# ------------------------------------------------------------------- whole builds


def iree_own_dispatches(vmfb) -> list[str]:
    """IREE's own dispatches in a module (`FUNC$async_dispatch_N_KIND_SHAPE`; the kit's
    kernels keep their names)."""
    return sorted(set(re.findall(r"\$async_dispatch_\d+_\w+", vmfb.read_bytes().decode("latin-1"))))


def no_more_iree_dispatches(built) -> None:
    """Issue 25's goal: the replaced module has no more IREE dispatches, and no more IREE
    elementwise dispatches, than IREE alone."""
    mine, alone = iree_own_dispatches(built.vmfb), iree_own_dispatches(built.baseline_vmfb)
    assert len(mine) <= len(alone), (mine, alone)
    elementwise = [d for d in mine if "elementwise" in d]
    assert len(elementwise) <= len([d for d in alone if "elementwise" in d]), (mine, alone)


@pytest.fixture(scope="module")
def ffn_build(tmp_path_factory):
    """A BERT-style f16 FFN (bias + GELU, then bias + residual)."""
    from models.epilogue_models import ffn_onnx

    return onnx_build_with_baseline(tmp_path_factory, GEMM, ffn_onnx, "ffn")


@pytest.fixture(scope="module")
def mlp_build(tmp_path_factory):
    """An f16 MLP: bias + ReLU, bias + SiLU, a scale."""
    from models.epilogue_models import mlp_onnx

    return onnx_build_with_baseline(tmp_path_factory, GEMM, mlp_onnx, "mlp")


def test_ffn_matmuls_replaced_with_their_epilogues(ffn_build):
    report = json.loads(ffn_build.report.read_text())
    assert [(family(r["kernel"]), r["epilogue_replaced"]) for r in report["replaced"]] == [
        ("matmul_nn_f16_bias_gelu_erf", {"epilogue": "bias_gelu_erf", "ops_after": 2}),
        ("matmul_nn_f16_bias_residual", {"epilogue": "bias_residual", "ops_after": 2}),
    ]
    assert report["not_replaced"] == []
    first = report["replaced"][0]  # what the kernel reads and writes: A, B, the bias; the GELU's f16 result
    assert [t["shape"] for t in first["inputs"]] == [[64, 128], [128, 256], [256]] and first["result"] == {"dtype": "f16", "shape": [64, 256]}
    text = (ffn_build.out_dir / "ffn.replace.txt").read_text()
    assert "with the 2 op(s) after it (epilogue bias_gelu_erf)" in text


def test_ffn_build_leaves_iree_no_dispatch(ffn_build):
    """IREE alone compiles each matmul with its bias, GELU, residual and rounding into one
    dispatch; with the epilogues in the kernels nothing of the FFN is left to IREE."""
    alone = iree_own_dispatches(ffn_build.baseline_vmfb)
    assert len([d for d in alone if "matmul" in d]) == 2, alone
    assert iree_own_dispatches(ffn_build.vmfb) == []
    no_more_iree_dispatches(ffn_build)
    module = ffn_build.vmfb.read_bytes()  # iree-dump-module cuts long names
    assert all(r["kernel_entry"].encode() in module for r in json.loads(ffn_build.report.read_text())["replaced"])


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["ffn", "mlp"])
def test_epilogues_agree_with_iree_on_gpu(request, prebuilt_dir, tmp_path, name):
    """The FFN (bias + GELU, bias + residual) and the MLP (bias + ReLU, bias + SiLU, scale) with
    their matmuls and epilogues in the kit's kernels agree with IREE alone (f16 tolerance: the
    kernel rounds once where the model rounds after each op), and the kit's kernels ran.
    The FFN's input is drawn in [-1, 1): IREE alone rounds `h W2 + b2` to f16 before adding the
    residual x, and where x cancels it that rounding alone exceeds f16's tolerance (measured in
    numpy with inputs in [-2, 2): 6 to 11 of 8192 outputs; none in [-1, 1))."""
    import numpy as np

    from kitdispatch.models.compare import compare_model

    inputs = None
    if name == "ffn":
        inputs = tmp_path / "x.npz"
        np.savez(inputs, x=np.random.default_rng(0).uniform(-1, 1, (64, 128)).astype(np.float16))
    result = compare_model(prebuilt_or_fixture(request, prebuilt_dir, f"epilogue_{name}_model", f"{name}_build"), inputs=inputs)
    assert result.agree, result.worst
    assert all(n.startswith("matmul_nn_f16_") for n in result.kernel_names), result.kernel_names


@needs_iree
def test_generic_in_a_matmul_epilogue_is_not_replaced_on_its_own(staged):
    """The library's bias_gelu (a linalg.generic by pattern) fits the fused bias + GELU of an f32
    model, and so does a matmul kernel with that epilogue: the matmul's kernel takes both ops,
    the generic is kept out of its own replacement, saying by what."""
    from iree.compiler import ir

    from kitdispatch.describe.manifest import load_manifest
    from kitdispatch.models.replace import decide, read_ops, settle

    module = ir.Module.parse(staged("gelu_tanh_decomposed", "f32"), ir.Context())
    found = read_ops(module, ("linalg.matmul", "linalg.generic"))
    kernels = [_epilogue_kernel("bias_gelu_tanh", "f32", scalars=("gelu_c",)), *load_manifest(REPO / "kernels" / "elementwise").kernels]
    kernels = [k for k in kernels if k.replaces is not None]
    decisions = decide([f for _, f in found], kernels)
    assert {d.op.kind: d.kernel.name for d in decisions if d.kernel} == {"linalg.matmul": "mm_bias_gelu_tanh", "linalg.generic": "bias_gelu"}
    kept = settle(found, decisions)
    assert [d.kernel.name for d in kept if d.kernel] == ["mm_bias_gelu_tanh"]
    [generic] = [d for d in kept if d.op.kind == "linalg.generic" and d.op.detail.summary.startswith("addf, fpowi")]
    assert generic.kernel is None
    assert "part of the linalg.matmul at" in generic.reasons[0] and "which mm_bias_gelu_tanh replaces whole" in generic.reasons[0]


def test_mlp_matmuls_replaced_with_relu_silu_and_scale(mlp_build):
    report = json.loads(mlp_build.report.read_text())
    assert [(family(r["kernel"]), r["epilogue_replaced"]["ops_after"]) for r in report["replaced"]] == [
        ("matmul_nn_f16_bias_relu", 2), ("matmul_nn_f16_bias_silu", 2), ("matmul_nn_f16_scale", 1),
    ]
    assert iree_own_dispatches(mlp_build.vmfb) == []
    no_more_iree_dispatches(mlp_build)
    assert "\"epilogue_constant\": \"0.125\"" in json.dumps(report)


def test_a_matmul_accumulating_in_f16_is_kept():
    """A linalg.matmul with an f16 result accumulates in f16; the family accumulates in f32."""
    mlir = matmul_model(dtype="f16").replace("tensor<512x1000xf32>", "tensor<512x1000xf16>").replace("0.0 : f32", "0.0 : f16").replace(
        "ins(%cst : f32)", "ins(%cst : f16)")
    chain = chain_of(mlir)
    assert chain.longest.name is None and "accumulates in f16" in chain.longest.why
    kernel = matmul_kernel(c="f16[m,n]")
    d = only(decide_on(mlir, [kernel]))
    assert d.kernel is None and "the op accumulates in f16 (its result's type); the kernels accumulate in f32" in d.reasons[0]


def decide_on(mlir: str, kernels):
    from kitdispatch.models.replace import decide

    return decide(ops_of(mlir, ("linalg.matmul",)), kernels)
