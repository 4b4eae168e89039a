"""layer_norm and rms_norm (models/ops/norm.py): the norms real ONNX models reach IREE's global
optimization with, matched against the library's kernels/norm, and the near misses with their
reasons. Each model is written by tests/data/norms/make_model.py, imported by iree-import-onnx,
brought to global optimization by iree-compile and fused by IREE's elementwise fusion, as the
model build does."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, needs_iree_compile, ops_of, only

from kitdispatch import Buffer, Kernel, ManifestError, Scalar, TensorType, load_manifest
from kitdispatch.models.ops.base import Constant, Operand, Reshape
from kitdispatch.models.ops.generic import FUSION_PIPELINE
from kitdispatch.models.replace import check_kernel, decide

NORMS = ("layer_norm", "rms_norm")
MAKE_MODEL = REPO / "tests" / "data" / "norms" / "make_model.py"
NORM_CU = REPO / "kernels" / "norm" / "norm.cu"
ROWS = Reshape(((0, 1), (2,)))  # x [batch, seq, hidden] as the kernel's [rows, cols]


def library_norms() -> list[Kernel]:
    return list(load_manifest(REPO / "kernels" / "norm").kernels)


def norm_stage(tmp_path, *args) -> str:
    """The model make_model.py writes with `args`, as the norms are matched: imported, at global
    optimization, after IREE's elementwise fusion."""
    pytest.importorskip("onnx")
    from kitdispatch.iree.tools import find_tool
    from kitdispatch.models.pipeline import STAGE, import_model

    onnx_model, stage, fused = tmp_path / "m.onnx", tmp_path / "m.stage.mlir", tmp_path / "m.fused.mlir"
    subprocess.run([sys.executable, str(MAKE_MODEL), str(onnx_model), *map(str, args)], check=True, timeout=120)
    imported = import_model(onnx_model, tmp_path / "m.mlir")
    subprocess.run([find_tool("iree-compile"), str(imported), "--iree-hal-target-device=cuda", "--iree-cuda-target=sm_89",
                    f"--compile-to={STAGE}", "-o", str(stage)], check=True, timeout=300)
    subprocess.run([find_tool("iree-opt"), str(stage), f"--pass-pipeline={FUSION_PIPELINE}", "-o", str(fused)], check=True, timeout=300)
    return fused.read_text()


def decisions(text: str, kernels=None):
    return decide(ops_of(text, NORMS), kernels or library_norms())


# --------------------------------------------------------------------- recognized


@needs_iree_compile
@pytest.mark.parametrize(
    "args, kernel, x_path, others, round_first",
    [
        (["--form", "layernorm"], "layer_norm_f32", (0, 0), [(2,), (3,)], "0"),
        (["--form", "layernorm", "--f16"], "layer_norm_f16", (0, 0, 0), [(2,), (3,)], "1"),
        (["--form", "layernorm", "--f16", "--no-bias"], "layer_norm_nobias_f16", (0, 0, 0), [(2,)], "1"),
        (["--form", "decomposed"], "layer_norm_f32", (0, 0), [(2,), (3,)], "0"),
        (["--form", "decomposed", "--no-weight", "--no-bias"], "layer_norm_plain_f32", (0, 0), [], "0"),
        (["--form", "decomposed", "--no-weight"], "layer_norm_bias_f32", (0, 0), [(2,)], "0"),
        (["--form", "rms", "--eps", "1e-6"], "rms_norm_f32", (0,), [(2,)], "0"),
        (["--form", "rms", "--f16", "--eps", "1e-6"], "rms_norm_f16", (0, 0, 0), [(1,)], "1"),
        (["--form", "rms", "--f16", "--no-weight"], "rms_norm_plain_f16", (0, 0), [], "0"),
        (["--form", "layernorm", "--f16", "--residual"], "layer_norm_f16", (0, 0, 0), [(2,), (3,)], "1"),
        (["--form", "rms", "--f16", "--residual"], "rms_norm_f16", (0, 0, 0), [(1,)], "1"),
    ],
    ids=["onnx-f32", "onnx-f16", "onnx-f16-nobias", "decomposed-f32", "decomposed-plain", "decomposed-bias-alone", "rms-f32", "rms-llama-f16", "rms-f16-plain",
         "onnx-f16-after-residual", "rms-f16-after-residual"],
)
def test_norms_as_exporters_write_them_take_the_library_kernel(tmp_path, args, kernel, x_path, others, round_first):
    """ONNX LayerNormalization (opset 17), the decomposed LayerNorm and Llama's RMSNorm, f32 and
    f16: one op each, the generic that ends the norm, called with x (through the extf of an f16
    model), weight and bias, the op's eps and where it rounds. After a residual Add (whose sum
    has other users, so IREE keeps it apart) x is the Add's result."""
    d = only(decisions(norm_stage(tmp_path, *args)))
    assert d.kernel is not None and d.kernel.name == kernel, d.reasons
    eps = "1e-06" if "1e-6" in args else "1e-05"
    assert d.call.arguments == (
        Operand(x_path, ROWS), *[Operand(p) for p in others], Constant("f32", repr(float(np.float32(eps)))),
        Constant("i32", round_first),
    )
    assert d.call.result == ROWS
    assert d.op.result.shape == (2, 16, 256) and d.op.detail.problem is None


@needs_iree_compile
def test_rms_norm_of_an_f16_model_ends_with_its_weight(tmp_path):
    """Llama's f16 RMSNorm: IREE keeps the multiply by the weight apart from the normalizing
    generic (which holds the Reciprocal's assert); the anchor is the multiply, the last op, and
    the chain holds both, the `mean + eps` generic and the sum (the extf x is read through)."""
    [facts] = ops_of(norm_stage(tmp_path, "--form", "rms", "--f16"), NORMS)
    assert facts.kind == "rms_norm" and facts.detail.ops == 4 and facts.detail.round_first
    assert facts.inputs[0].dtype == "f16" and facts.result.dtype == "f16"


@needs_iree_compile
def test_a_norm_covers_its_generics_and_is_read_before_linalg_generic(tmp_path):
    """With pattern kernels around (`linalg.generic` read too), the generic that ends the norm
    is the norm's, and its reductions and the generic between are no ops of their own; the
    residual Add before it and the extf it reads x through (which may have other users) are."""
    found = ops_of(norm_stage(tmp_path, "--form", "layernorm", "--f16", "--residual"), ("layer_norm", "linalg.generic"))
    assert [(f.kind, f.detail.summary) for f in found] == [
        ("linalg.generic", "addf"), ("linalg.generic", "extf"), ("layer_norm", "eps 1e-05, weight, bias; 4 generics"),
    ]


@needs_iree_compile
def test_llama_layer_norm_in_f32_is_replaced_and_its_other_generics_are_no_norms(tmp_path):
    """The Llama-style block of tests/data/llama_layer (RMSNorm by Sqrt and Reciprocal, SwiGLU,
    a residual Add): its one norm, and none of its other generics."""
    from conftest import make_llama_layer
    from kitdispatch.iree.tools import find_tool
    from kitdispatch.models.pipeline import STAGE, import_model

    make_llama_layer(tmp_path / "layer.onnx")
    imported = import_model(tmp_path / "layer.onnx", tmp_path / "layer.mlir")
    stage, fused = tmp_path / "stage.mlir", tmp_path / "fused.mlir"
    subprocess.run([find_tool("iree-compile"), str(imported), "--iree-hal-target-device=cuda", "--iree-cuda-target=sm_89",
                    f"--compile-to={STAGE}", "-o", str(stage)], check=True, timeout=300)
    subprocess.run([find_tool("iree-opt"), str(stage), f"--pass-pipeline={FUSION_PIPELINE}", "-o", str(fused)], check=True, timeout=300)
    d = only(decisions(fused.read_text()))
    assert d.kernel is not None and d.kernel.name == "rms_norm_f32", d.reasons


# --------------------------------------------------------------------- near misses


@needs_iree_compile
@pytest.mark.parametrize(
    "args, reason",
    [
        (["--form", "decomposed", "--axis", "1"], "it normalizes over dim(s) 1 of 2x16x256xf32; the kernel over the last dim (2)"),
        (["--form", "layernorm", "--axis", "1"], "it normalizes over dim(s) 1, 2 of 2x16x256xf32"),
        (["--form", "decomposed", "--mean-output"], "has a user outside it: tensor.expand_shape"),
        (["--form", "rms", "--f16", "--mean-output"], "has a user outside it: tensor.expand_shape"),
        (["--form", "decomposed", "--f16"], "it sums in f16; the kernel computes its statistics in f32"),
    ],
    ids=["other-dim", "onnx-two-dims", "mean-used-outside", "rms-mean-used-outside", "f16-statistics"],
)
def test_norm_near_misses_are_kept_with_the_reason(tmp_path, args, reason):
    d = only(decisions(norm_stage(tmp_path, *args)))
    assert d.kernel is None
    assert all(reason in r for r in d.reasons), d.reasons


@needs_iree_compile
def test_a_norm_with_a_bias_and_no_weight_is_not_taken_by_a_weight_only_kernel(tmp_path):
    """A LayerNorm whose weight of ones IREE folded away (GPT-2 exported from its initial
    weights) applies a bias alone; the library's weight-only kernel took it, the bias passed as
    its weight (measured on an H100: outputs off by 4.8, caught by compare and tune)."""
    text = norm_stage(tmp_path, "--form", "decomposed", "--no-weight")
    weight_only = norm_kernel("layer_norm", "f32", weight=True)
    d = only(decisions(text, [weight_only]))
    assert d.kernel is None and "the op applies bias, the kernel weight" in d.reasons[0], d.reasons
    d = only(decisions(text, [norm_kernel("layer_norm", "f32", weight=True, bias=True)]))
    assert d.kernel is None and "the op applies bias, the kernel weight and bias" in d.reasons[0], d.reasons
    assert only(decisions(text, [norm_kernel("layer_norm", "f32", weight=False)])).kernel is None
    d = only(decisions(text, [norm_kernel("layer_norm", "f32", weight=False, bias=True)]))
    assert d.kernel is not None and d.kernel.name == "layer_norm_f32", d.reasons  # its one buffer named bias: a bias


@needs_iree_compile
def test_a_mean_of_another_divisor_is_kept(tmp_path):
    """The same chain with the variance divided by 255 (the unbiased variance) is no LayerNorm."""
    text = norm_stage(tmp_path, "--form", "layernorm")
    assert text.count("2.560000e+02 : f32") == 1  # one constant, hoisted, read by both means
    d = only(decisions(text.replace("2.560000e+02 : f32", "2.550000e+02 : f32")))
    assert d.kernel is None and "a mean divides by 2.550000e+02 : f32, and the last dim of 2x16x256xf32 has 256" in d.reasons[0]


@needs_iree_compile
def test_a_kernel_of_a_fixed_eps_or_other_affine_takes_only_its_own(tmp_path):
    text = norm_stage(tmp_path, "--form", "rms", "--eps", "1e-6")
    fixed = norm_kernel("rms_norm", "f32", weight=True, eps=1e-5)
    d = only(decisions(text, [fixed]))
    assert d.kernel is None and "the op's eps is 9.99999997E-7 : f32, the kernel's is fixed at 1e-05" in d.reasons[0]
    assert only(decisions(text, [norm_kernel("rms_norm", "f32", weight=True, eps=1e-6)])).kernel is not None
    d = only(decisions(text, [norm_kernel("rms_norm", "f32", weight=False)]))
    assert d.kernel is None and "the op applies weight, the kernel neither weight nor bias" in d.reasons[0]
    d = only(decisions(text, [norm_kernel("rms_norm", "f16", weight=True)]))
    assert d.kernel is None and "element type: the op's x is 32x256xf32, the kernel's x is f16[rows,cols]" in d.reasons[0]


@needs_iree_compile
def test_a_kernel_that_does_not_round_first_takes_no_f16_op_that_does(tmp_path):
    text = norm_stage(tmp_path, "--form", "rms", "--f16")
    d = only(decisions(text, [norm_kernel("rms_norm", "f16", weight=True, round_first=None)]))
    assert d.kernel is None and "the op rounds to f16 before its weight and bias, and the kernel does not" in d.reasons[0]


# --------------------------------------------------------------------- kernel contract


def norm_kernel(kind: str, dtype: str, *, weight: bool, bias: bool = False, eps: float | None = None,
                round_first: float | None | str = "arg", extra: tuple = ()) -> Kernel:
    params = [Buffer("x", "in", TensorType(dtype, ("rows", "cols")))]
    params += [Buffer(n, "in", TensorType(dtype, ("cols",))) for n, on in (("weight", weight), ("bias", bias)) if on]
    params += [Buffer("out", "out", TensorType(dtype, ("rows", "cols"))), Scalar("eps", "f32", eps)]
    if round_first is not None:
        params.append(Scalar("round_first", "i32", None if round_first == "arg" else round_first))
    params += [*extra, Scalar("rows", "i32"), Scalar("cols", "i32")]
    return Kernel.create(f"{kind}_{dtype}", NORM_CU, params, workgroup_size=[256], workgroup_count=["rows"], replaces=[kind])


@pytest.mark.parametrize(
    "kernel, message",
    [
        (norm_kernel("rms_norm", "f16", weight=True, extra=(Scalar("alpha", "f32"),)), "needs scalar argument alpha"),
        (norm_kernel("rms_norm", "f16", weight=True, bias=True), "its buffers must be x, then weight where it applies them"),
        (Kernel.create("k", NORM_CU, [Buffer("x", "in", TensorType("f16", ("rows", "cols"))), Buffer("out", "out", TensorType("f16", ("rows", "cols"))),
                                      Scalar("rows", "i32"), Scalar("cols", "i32")], workgroup_size=[256], workgroup_count=["rows"],
                       replaces=["layer_norm"]), "it must take eps as an f32 scalar"),
        (Kernel.create("k", NORM_CU, [Buffer("x", "in", TensorType("f16", ("rows", "cols"))), Buffer("out", "out", TensorType("f32", ("rows", "cols"))),
                                      Scalar("eps", "f32"), Scalar("rows", "i32"), Scalar("cols", "i32")], workgroup_size=[256],
                       workgroup_count=["rows"], replaces=["layer_norm"]), "x and its result must be one type [rows, cols]"),
    ],
    ids=["unknown-scalar", "rms-with-bias", "no-eps", "other-result-type"],
)
def test_norm_kernel_contract_errors(kernel, message):
    with pytest.raises(ManifestError) as err:
        check_kernel(kernel, kernel.replaces.ops[0])
    assert message in err.value.render()


def test_the_library_norms_fit_the_contract_and_are_called_in_their_functions_order():
    for kernel in library_norms():
        layout = check_kernel(kernel, kernel.replaces.ops[0])
        assert layout.pattern[-2:] == ("eps", "round_first") and layout.pattern[:-2] == tuple(range(len(layout.inputs)))


# --------------------------------------------------------------------- on the GPU

# tools/prebuild.py builds these as OUT/norm_NAME_model for a GPU machine without iree-compile.
NORM_MODELS = {
    "layernorm_f16": ["--form", "layernorm", "--f16"],
    "layernorm_f32": ["--form", "layernorm"],
    "decomposed_f32": ["--form", "decomposed", "--no-bias"],
    "decomposed_bias_f32": ["--form", "decomposed", "--no-weight"],  # the bias alone: layer_norm_bias_f32
    "rms_f16": ["--form", "rms", "--f16", "--eps", "1e-6"],
    "rms_f32": ["--form", "rms"],
    "rms_f16_wide": ["--form", "rms", "--f16", "--batch", "2", "--seq", "64", "--hidden", "4096"],
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(NORM_MODELS))
def test_norm_models_agree_with_iree_alone_on_gpu(tmp_path, prebuilt_dir, name):
    """Each norm replaced by kernels/norm gives what IREE's own build gives (the dtype's tolerance)."""
    from kitdispatch import BuildOptions
    from kitdispatch.models.compare import compare_model
    from kitdispatch.models.pipeline import build_model

    built = prebuilt_dir / f"norm_{name}_model" if prebuilt_dir else None
    if built is None:
        pytest.importorskip("onnx")
        model = tmp_path / "model.onnx"
        subprocess.run([sys.executable, str(MAKE_MODEL), str(model), *NORM_MODELS[name]], check=True, timeout=120)
        built = build_model(REPO / "kernels" / "norm", model, BuildOptions.create("sm_90"), tmp_path / "out", with_baseline=True).out_dir
    elif not built.is_dir():
        pytest.skip(f"{built} was not prebuilt")
    result = compare_model(built)
    assert result.agree, result.worst
    assert len(result.kernel_names) == 1 and result.kernel_names[0].split("_")[0] in ("layer", "rms")


# --------------------------------------------------------------------- whole builds


def _iree_dispatches(vmfb) -> set[str]:
    """IREE's own dispatches in a module (`..._dispatch_3_elementwise_32x256_f16`), by kind and shape."""
    import re

    return set(re.findall(r"dispatch_\d+_([a-z_]+_\d[0-9x]*)_", vmfb.read_bytes().decode("latin-1")))


@needs_iree_compile
@pytest.mark.parametrize(
    "args, kernel, baseline, left",
    [
        (["--form", "rms", "--f16", "--residual"], "rms_norm_f16",
         {"elementwise_8192", "reduction_32x256", "elementwise_32", "elementwise_32x256"}, {"elementwise_8192"}),
        (["--form", "layernorm"], "layer_norm_f32", {"reduction_32x256"}, set()),
    ],
    ids=["rms-f16-after-residual", "layernorm-f32"],
)
def test_build_replaces_every_dispatch_of_the_norm(tmp_path, args, kernel, baseline, left):
    """`build --model` with kernels/norm: IREE's reductions and elementwise dispatches of the norm
    are gone (an f16 RMSNorm is four of IREE's dispatches, one kernel of the kit's), the
    residual Add before it stays IREE's, and the kernel is dispatched."""
    from conftest import dump_module
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    pytest.importorskip("onnx")
    model = tmp_path / "norm.onnx"
    subprocess.run([sys.executable, str(MAKE_MODEL), str(model), *args], check=True, timeout=120)
    built = build_model(REPO / "kernels" / "norm", model, BuildOptions.create("sm_90"), tmp_path / "out", library=False, with_baseline=True)
    [d] = built.replaced
    assert d.kernel.name == kernel and not [x for x in built.decisions if x.kernel is None]
    assert _iree_dispatches(built.baseline_vmfb) == baseline
    assert _iree_dispatches(built.vmfb) == left
    assert kernel in dump_module(built.vmfb)
