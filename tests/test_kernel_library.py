"""The kit's kernel library (kernels/) and every sample build for real, and every function they
generate has a numpy reference; the tensor-core kernels (matmul, attention) are checked on the
GPU over many shapes, and their sm_90a code is checked for Hopper's instructions."""

import importlib.util
import inspect
import runpy
from pathlib import Path

import numpy as np
import pytest

from kitdispatch import BuildOptions, load_manifest
from kitdispatch import build
from kitdispatch.describe.manifest import MANIFEST_NAME

from conftest import HAVE_IREE_COMPILE, MATMUL_SUBSET, REPO, buildable, needs_iree_compile

MANIFEST_DIRS = sorted(
    p.parent for root in ("kernels", "samples") for p in (REPO / root).glob(f"*/{MANIFEST_NAME}")
)
IDS = [str(d.relative_to(REPO)) for d in MANIFEST_DIRS]


def _reference_module(folder: Path):
    spec = load_manifest(folder)
    assert spec.test.reference is not None, f"{folder}: [test] names no reference"
    path = spec.source_path(spec.test.reference)
    module_spec = importlib.util.spec_from_file_location(f"reference_{folder.name}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return spec, module


def test_the_library_has_every_family():
    families = {d.name for d in MANIFEST_DIRS if d.parent.name == "kernels"}
    assert {"elementwise", "reduction", "argmax", "softmax", "transpose", "matmul"} <= families


@pytest.mark.parametrize("folder", MANIFEST_DIRS, ids=IDS)
def test_every_function_has_a_reference(folder):
    spec, reference = _reference_module(folder)
    for sig in spec.signatures:
        ref = getattr(reference, sig.name, None)
        assert callable(ref), f"{folder.name}/reference.py has no function {sig.name!r}"
        params = inspect.signature(ref).parameters
        assert len(params) == len(sig.args), f"{sig.name}: {len(params)} parameters, the function takes {len(sig.args)}"


def test_the_f32_attention_manifest_is_what_its_generator_writes():
    gen = runpy.run_path(str(REPO / "kernels" / "attention_f32" / "gen_manifest.py"))
    f16_text = (REPO / "kernels" / "attention" / MANIFEST_NAME).read_text()
    committed = (REPO / "kernels" / "attention_f32" / MANIFEST_NAME).read_text()
    assert committed == gen["manifest_text"](f16_text), "kernels/attention_f32/kitdispatch.toml differs: run its gen_manifest.py"
    f16 = {k.name for k in load_manifest(REPO / "kernels" / "attention").kernels if k.name.endswith("_f16")}
    f32 = {k.name for k in load_manifest(REPO / "kernels" / "attention_f32").kernels}
    assert f32 == {name.removesuffix("_f16") + "_f32" for name in f16}


def test_the_matmul_subset_names_real_entries():
    assert len(buildable(REPO / "kernels" / "matmul").kernels) == len(MATMUL_SUBSET)


@needs_iree_compile
@pytest.mark.parametrize("folder", MANIFEST_DIRS, ids=IDS)
def test_builds_for_sm_80(folder, tmp_path):
    result = build(buildable(folder), BuildOptions.create("sm_80"), tmp_path)
    assert result.vmfb is not None and result.vmfb.is_file() and result.vmfb.stat().st_size > 0


# --------------------------------------------------------------- tensor-core kernels (GPU)

HOPPER_ARCHS = "sm_90a,sm_80"  # the architectures kernels/matmul and kernels/attention ship for
TENSOR_CORE_FAMILIES = ("matmul", "attention", "attention_f32")  # attention_f32: CUDA cores, but cp.async (sm_80)


@pytest.fixture(scope="session")
def tensor_core_builds(tmp_path_factory, prebuilt_dir):
    """kernels/matmul, kernels/attention and kernels/attention_f32 built for sm_90a + sm_80 (or the prebuilt copies)."""
    if prebuilt_dir is not None:
        return {name: prebuilt_dir / name for name in TENSOR_CORE_FAMILIES}
    if not HAVE_IREE_COMPILE:
        pytest.skip("neither iree-compile nor KITDISPATCH_PREBUILT is available")
    from kitdispatch import build_all

    out = tmp_path_factory.mktemp("tensor_core")
    projects = [buildable(REPO / "kernels" / "matmul"), REPO / "kernels" / "attention", REPO / "kernels" / "attention_f32"]
    build_all(projects, BuildOptions.create(HOPPER_ARCHS), out)
    return {name: out / name for name in TENSOR_CORE_FAMILIES}


def _module(builds, name):
    from kitdispatch import load_module

    return load_module(builds[name] / f"{name}.vmfb")


def _rel_err(got, ref):
    got = np.asarray(got, dtype=np.float64)
    assert not np.isnan(got).any(), "NaN in the result: an element was not written, or the input was refused"
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


# Relative L2 error allowed by result type: f32 accumulation, then one rounding to the result.
RESULT_TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.5e-2}
MATMUL_FUNCTIONS = {
    "matmul_f16": ("f16", "f32"), "matmul_bf16": ("bf16", "f32"), "matmul_f16_f16": ("f16", "f16"),
    "matmul_bf16_bf16": ("bf16", "bf16"), "matmul_f16_bf16": ("f16", "bf16"), "matmul_bf16_f16": ("bf16", "f16"),
}
# (m, n, k): n and k multiples of 8 take the TMA + wgmma path on sm_90a, the others the
# mma.sync path everywhere; partial 128 x 256 tiles in every direction; k from 1 to 1000.
MATMUL_SHAPES = [(256, 512, 64), (300, 1000, 264), (1, 8, 8), (129, 264, 8), (257, 129, 77), (33, 50, 16),
                 (5, 7, 3), (1, 1, 1), (1000, 1000, 1000)]


def _numpy_dtype(name):
    from kitdispatch.run.device import numpy_dtype

    return numpy_dtype(name)


@pytest.mark.gpu
@pytest.mark.parametrize("function", sorted(MATMUL_FUNCTIONS))
@pytest.mark.parametrize("shape", MATMUL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matmul_any_shape(tensor_core_builds, function, shape):
    m, n, k = shape
    in_type, out_type = MATMUL_FUNCTIONS[function]
    rng = np.random.default_rng(m * 1000003 + n * 1009 + k)
    a = rng.standard_normal((m, k)).astype(_numpy_dtype(in_type))
    b = rng.standard_normal((k, n)).astype(_numpy_dtype(in_type))
    got = _module(tensor_core_builds, "matmul").call(function, a, b)
    assert got.shape == (m, n) and got.dtype == _numpy_dtype(out_type)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert _rel_err(got, ref) <= RESULT_TOL[out_type]


# The 128 x 64 tiles with K split over a 2-CTA cluster (configs.py rule 2): partial tiles, a k
# with one 64-wide slice (the second CTA of each split gets none), k % 8 != 0 (mma.sync path,
# split 0 does all of k), and a model shape; bias and residual on the NN entry.
SPLIT2_FUNCTIONS = ("matmul_nt_f16_f32_none_t128x64_k2", "matmul_nn_bf16_bias_residual_t128x64_k2")
SPLIT2_SHAPES = [(300, 1000, 264), (257, 200, 64), (130, 136, 77), (128, 768, 768)]


@pytest.mark.gpu
@pytest.mark.parametrize("function", SPLIT2_FUNCTIONS)
@pytest.mark.parametrize("shape", SPLIT2_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_split_k2_entries(tensor_core_builds, function, shape):
    _check_nt_none_or_nn_bias_residual(tensor_core_builds, function, shape)


# The 64-row tiles (configs.py rules 0a, 0b): one consumer warpgroup; t64x64_k4 sums its 4
# partials through the per-SM slots. Partial 64-row tiles, a split with empty shares, k % 8 != 0
# (mma.sync), the model shapes they are chosen for.
T64_FUNCTIONS = ("matmul_nt_f16_f32_none_t64x64", "matmul_nn_bf16_bias_residual_t64x64_k4")
T64_SHAPES = [(300, 1000, 264), (70, 264, 1544), (130, 136, 77), (128, 768, 768), (128, 768, 3072)]


@pytest.mark.gpu
@pytest.mark.parametrize("function", T64_FUNCTIONS)
@pytest.mark.parametrize("shape", T64_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_64_row_entries(tensor_core_builds, function, shape):
    _check_nt_none_or_nn_bias_residual(tensor_core_builds, function, shape)


# The heads entries (bias add stored as attention heads: [nb, heads, seq, d], K^T [nb, heads, d, seq]):
# BERT's and ViT's shapes, odd m, d % 8 != 0 (no 16-byte stores), k % 8 != 0 (the mma.sync path).
HEADS_FUNCTIONS = ("matmul_nn_f16_bias_heads_t64x64", "matmul_nt_bf16_bias_heads_t_t128x128")
HEADS_SHAPES = [(1, 128, 12, 64, 768), (8, 197, 12, 64, 768), (3, 101, 5, 24, 264), (3, 77, 6, 20, 100)]


@pytest.mark.gpu
@pytest.mark.parametrize("function", HEADS_FUNCTIONS)
@pytest.mark.parametrize("shape", HEADS_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_heads_entries(tensor_core_builds, function, shape):
    nb, seq, heads, d, k = shape
    nt, dtype = "_nt_" in function, ("bf16" if "bf16" in function else "f16")
    rng = np.random.default_rng(seq * 7 + d + k)
    a = rng.standard_normal((nb * seq, k)).astype(_numpy_dtype(dtype))
    b = (rng.standard_normal((heads * d, k) if nt else (k, heads * d)) / np.sqrt(k)).astype(_numpy_dtype(dtype))
    bias = rng.standard_normal((heads, d)).astype(_numpy_dtype(dtype))
    got = _module(tensor_core_builds, "matmul").call(function, a, b, bias, nb, seq)
    flat = (a.astype(np.float64) @ (b.astype(np.float64).T if nt else b.astype(np.float64)) + bias.astype(np.float64).reshape(-1))
    ref = flat.reshape(nb, seq, heads, d).transpose((0, 2, 3, 1) if function.endswith("heads_t_t128x128") else (0, 2, 1, 3))
    assert got.shape == ref.shape
    assert _rel_err(got, ref) <= RESULT_TOL[dtype]


def _check_nt_none_or_nn_bias_residual(tensor_core_builds, function, shape):
    m, n, k = shape
    nt = "_nt_" in function
    in_type, out_type = ("f16", "f32") if nt else ("bf16", "bf16")
    rng = np.random.default_rng(m * 7 + n * 13 + k)
    a = rng.standard_normal((m, k)).astype(_numpy_dtype(in_type))
    b = rng.standard_normal((n, k) if nt else (k, n)).astype(_numpy_dtype(in_type))
    ref = a.astype(np.float64) @ (b.astype(np.float64).T if nt else b.astype(np.float64))
    args = [a, b]
    if not nt:
        bias = rng.standard_normal(n).astype(_numpy_dtype(out_type))
        residual = rng.standard_normal((m, n)).astype(_numpy_dtype(out_type))
        args += [bias, residual]
        ref = ref + bias.astype(np.float64) + residual.astype(np.float64)
    got = _module(tensor_core_builds, "matmul").call(function, *args)
    assert got.shape == (m, n) and got.dtype == _numpy_dtype(out_type)
    assert _rel_err(got, ref) <= RESULT_TOL[out_type]


def _attention_reference(q, k, v, causal, scale=None):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scores = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        s = q.shape[-2]
        scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v


def _attention_module(builds, dtype):
    """kernels/attention (f16, bf16) or kernels/attention_f32."""
    return _module(builds, "attention_f32" if dtype == "f32" else "attention")


F32_HEAD_DIMS = 64  # kernels/attention_f32 has code for head dims up to 64


def _dtype_cases(shapes):
    """(dtype, shape) for each dtype whose kernels have code for the shape's head dim (its last)."""
    fits = {"f16": lambda d: d in (64, 80, 96, 128), "bf16": lambda d: d in (64, 80, 96, 128), "f32": lambda d: d <= F32_HEAD_DIMS}
    return [pytest.param(dtype, shape, id=f"{dtype}-{'x'.join(map(str, shape))}")
            for shape in shapes for dtype in ("f16", "bf16", "f32") if fits[dtype](shape[-1])]


def _scale_of(dtype, d):
    """The scale models give the _kt, _bshd, ... entries: 1/sqrt(d) in the model's type (f16 for 16-bit models)."""
    return float(np.float32(1 / np.sqrt(d))) if dtype == "f32" else float(np.float16(1 / np.sqrt(d)))


# (b, h, s, d): partial 128-row query blocks and key tiles, one token, both head dims.
# f32 (64-row blocks): head dims 64, 32 and 1, a 1000-token causal run.
ATTENTION_SHAPES = [(1, 2, 128, 64), (2, 3, 257, 128), (1, 1, 1, 64), (2, 2, 300, 64), (1, 2, 1000, 128), (1, 2, 200, 96), (2, 1, 129, 80),
                    (2, 3, 65, 32), (1, 2, 1000, 64), (1, 1, 7, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype, shape", _dtype_cases(ATTENTION_SHAPES))
def test_attention_shapes(tensor_core_builds, dtype, causal, shape):
    rng = np.random.default_rng(sum(shape))
    q, k, v = (rng.standard_normal(shape).astype(_numpy_dtype(dtype)) for _ in range(3))
    function = f"attention{'_causal' if causal else ''}_{dtype}"
    got = _attention_module(tensor_core_builds, dtype).call(function, q, k, v)
    assert _rel_err(got, _attention_reference(q, k, v, causal)) <= RESULT_TOL[dtype]


# (b, h, s, d): s = 197 (ViT) leaves K^T's rows unaligned, which the _kt entries read element-wise;
# on sm_90a _bshd takes the wgmma + TMA path from 257 tokens (300, 520), _kt where s is a multiple
# of 8 (128, 520, 384: d 64 and 128, partial tiles).
LAYOUT_SHAPES = [(1, 12, 128, 64), (2, 3, 197, 64), (2, 2, 300, 128), (1, 1, 1, 64), (1, 4, 197, 80), (2, 2, 130, 96),
                 (2, 3, 300, 64), (1, 2, 520, 64), (2, 2, 384, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", ["bshd", "kt", "qkv"])
@pytest.mark.parametrize("dtype, shape", _dtype_cases(LAYOUT_SHAPES))
def test_attention_layout_variants(tensor_core_builds, dtype, causal, variant, shape):
    """_bshd: Q, K, V, O [b, s, h, d]; _kt: Q, V [b, h, s, d], K^T [b, h, d, s], O [b, s, h, d];
    _qkv: one packed qkv [b, s, 3, h, d] (GPT-2's projection), O [b, s, h, d]; the scale an
    argument (here 1/sqrt(d) in the model's type: f16 for 16-bit models)."""
    rng = np.random.default_rng(sum(shape))
    q, k, v = (rng.standard_normal(shape).astype(_numpy_dtype(dtype)) for _ in range(3))  # [b, h, s, d]
    function = f"attention{'_causal' if causal else ''}_{variant}_{dtype}"
    scale = _scale_of(dtype, shape[-1])
    expected = np.swapaxes(_attention_reference(q, k, v, causal, scale), 1, 2)  # [b, s, h, d]
    if variant == "bshd":
        args = [np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in (q, k, v)]
    elif variant == "qkv":
        args = [np.ascontiguousarray(np.stack([np.swapaxes(x, 1, 2) for x in (q, k, v)], axis=2))]
    else:
        args = [q, np.ascontiguousarray(np.swapaxes(k, -1, -2)), v]
    got = _attention_module(tensor_core_builds, dtype).call(function, *args, np.float32(scale))
    assert got.shape == expected.shape
    assert _rel_err(got, expected) <= RESULT_TOL[dtype]


# (b, h, g, s, d): K/V heads shared by 2 or 4 query heads, MQA, Llama's d = 128; from 257 tokens
# the wgmma + TMA path on sm_90a.
GQA_SHAPES = [(1, 16, 4, 128, 128), (2, 8, 2, 197, 64), (1, 4, 1, 300, 96), (2, 8, 2, 300, 64), (1, 8, 2, 384, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", ["gqa", "gqa_bshd"])
@pytest.mark.parametrize("dtype, shape", _dtype_cases(GQA_SHAPES))
def test_attention_gqa(tensor_core_builds, dtype, causal, variant, shape):
    """Q [b, h, s, d], K [b, g, s, d] (_gqa) or [b, s, g, d] (_gqa_bshd), V [b, s, g, d], O [b, s, h, d]:
    query head i reads K/V head i // (h // g)."""
    b, h, g, s, d = shape
    rng = np.random.default_rng(sum(shape))
    make = lambda *dims: rng.standard_normal(dims).astype(_numpy_dtype(dtype))
    q, k, v = make(b, h, s, d), make(b, g, s, d), make(b, g, s, d)
    scale = _scale_of(dtype, d)
    k_heads, v_heads = (np.repeat(x, h // g, axis=1) for x in (k, v))
    expected = np.swapaxes(_attention_reference(q, k_heads, v_heads, causal, scale), 1, 2)
    k_arg = k if variant == "gqa" else np.ascontiguousarray(np.swapaxes(k, 1, 2))
    function = f"attention{'_causal' if causal else ''}_{variant}_{dtype}"
    got = _attention_module(tensor_core_builds, dtype).call(function, q, k_arg, np.ascontiguousarray(np.swapaxes(v, 1, 2)), np.float32(scale))
    assert _rel_err(got, expected) <= RESULT_TOL[dtype]


# (b, h, s, t, d): fewer and more keys than queries, partial tiles, one key, d = 96 padded.
CROSS_SHAPES = [(1, 2, 128, 77, 64), (2, 3, 100, 300, 128), (1, 1, 5, 1, 64), (1, 2, 197, 64, 96), (1, 2, 100, 150, 48)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, shape", _dtype_cases(CROSS_SHAPES))
def test_attention_cross(tensor_core_builds, dtype, shape):
    """Q [b, h, s, d] against K and V [b, h, t, d]: t keys for s queries, the scale an argument."""
    b, h, s, t, d = shape
    rng = np.random.default_rng(sum(shape))
    make = lambda *dims: rng.standard_normal(dims).astype(_numpy_dtype(dtype))
    q, k, v = make(b, h, s, d), make(b, h, t, d), make(b, h, t, d)
    scale = _scale_of(dtype, d)
    got = _attention_module(tensor_core_builds, dtype).call(f"attention_cross_{dtype}", q, k, v, np.float32(scale))
    assert _rel_err(got, _attention_reference(q, k, v, False, scale)) <= RESULT_TOL[dtype]


# (b, h, g, s, d) and the padding of the last batch row: none, right, left (a causal row's own
# keys all padded), every key (a fully padded row), random holes; g: K/V heads (GQA entries).
PAD_SHAPES = [(2, 3, 3, 300, 64), (2, 2, 2, 197, 128), (2, 4, 2, 130, 96), (2, 2, 1, 150, 48)]
PADDINGS = ["none", "right", "left", "full", "holes"]


LOWEST = {"f16": -65504.0, "bf16": -65504.0, "f32": float(np.finfo(np.float32).min)}  # what HF's masks add (f16's lowest in 16-bit models)


def _padding_bias(b: int, s: int, padding: str, dtype: str) -> np.ndarray:
    """[b, s] of the attention dtype: 0 where a key attends, the lowest (HF's mask) where it is padded."""
    keep = np.ones((b, s), bool)
    keep[-1] = {"none": keep[-1], "right": np.arange(s) < s - 37, "left": np.arange(s) >= 50, "full": False,
                "holes": np.random.default_rng(s).random(s) > 0.3}[padding]
    return np.where(keep, 0.0, LOWEST[dtype]).astype(_numpy_dtype(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["pad", "causal_pad", "pad_kt", "causal_pad_kt", "pad_bshd", "causal_pad_bshd", "causal_pad_gqa",
                                     "causal_pad_gqa_bshd"])
@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("dtype, shape", _dtype_cases(PAD_SHAPES))
def test_attention_key_padding(tensor_core_builds, dtype, variant, padding, shape):
    """The _pad entries against kernels/attention/reference.py (a biased key's score rounded,
    scaled and biased in the dtype, as a model's chain computes it): a fully padded row gets
    the softmax over every key's biased score, not NaN; a causal row whose keys are all padded
    (left padding) runs over every key."""
    b, h, g, s, d = shape
    reference = runpy.run_path(str(REPO / "kernels" / ("attention_f32" if dtype == "f32" else "attention") / "reference.py"))
    function = f"attention_{variant}_{dtype}"
    rng = np.random.default_rng(sum(shape))
    make = lambda *dims: rng.standard_normal(dims).astype(_numpy_dtype(dtype))
    grouped = "gqa" in variant
    q = make(b, h, s, d)
    layouts = {"kt": ((b, h, d, s), (b, h, s, d)), "bshd": ((b, s, h, d), (b, s, h, d))}
    if grouped:
        k_shape, v_shape = ((b, s, g, d) if variant.endswith("bshd") else (b, g, s, d)), (b, s, g, d)
    else:
        k_shape, v_shape = layouts.get(variant.rsplit("_", 1)[-1], ((b, h, s, d), (b, h, s, d)))
    if variant.endswith("bshd") and not grouped:
        q = make(b, s, h, d)
    k, v = make(*k_shape), make(*v_shape)
    bias = _padding_bias(b, s, padding, dtype)
    scale, masked = np.float32(_scale_of(dtype, d)), np.float32(LOWEST[dtype])
    expected = reference[function](q, k, v, bias, scale, masked)
    got = _attention_module(tensor_core_builds, dtype).call(function, q, k, v, bias, scale, masked)
    assert got.shape == expected.shape
    assert _rel_err(got, expected.astype(np.float64)) <= RESULT_TOL[dtype]


@pytest.mark.gpu
def test_attention_refuses_other_head_dims_loudly(tensor_core_builds):
    q = np.ones((1, 1, 10, 72), np.float16)  # 64, 80, 96 and 128 have code
    got = _module(tensor_core_builds, "attention").call("attention_f16", q, q, q)
    assert np.isnan(got.astype(np.float32)).all()
    q32 = np.ones((1, 1, 10, 72), np.float32)  # attention_f32: head dims up to 64
    assert np.isnan(_module(tensor_core_builds, "attention_f32").call("attention_f32", q32, q32, q32)).all()


# ------------------------------------------------------------ what each architecture gets


@pytest.mark.parametrize("family", ["matmul", "attention"])
def test_sm90a_code_uses_wgmma_and_the_copy_engine_and_sm80_code_does_not(family):
    """The sm_90a path is really compiled in (not just the mma.sync fallback): its PTX has
    wgmma, TMA tensor copies with device-built tensor maps and mbarriers; sm_80's has none."""
    from kitdispatch.compile.archs import Arch
    from kitdispatch.compile.compilers import CompileOptions, get_compiler

    compiler = get_compiler("nvrtc")
    source = REPO / "kernels" / family / f"{family}.cu"
    hopper = compiler.compile(source, Arch.parse("sm_90a"), "ptx", CompileOptions()).data.decode()
    ampere = compiler.compile(source, Arch.parse("sm_80"), "ptx", CompileOptions()).data.decode()
    for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor", "tensormap.replace", "mbarrier.try_wait", "setmaxnreg"):
        assert instruction in hopper, f"{family} sm_90a PTX lacks {instruction}"
        assert instruction not in ampere, f"{family} sm_80 PTX has {instruction}"
    assert "mma.sync.aligned.m16n8k16" in ampere


# --------------------------------------------------------------- norms (GPU)


@pytest.fixture(scope="session")
def norm_build(tmp_path_factory, prebuilt_dir):
    """kernels/norm built for sm_80 + sm_90 (or the prebuilt copy, OUT/norm)."""
    from conftest import prebuilt_or_build

    return prebuilt_or_build(REPO / "kernels" / "norm", tmp_path_factory, prebuilt_dir)


# (rows, cols): a warp per row (more than 384 rows) with 16-byte accesses, element by element
# (cols not a multiple of 8); the block per row: rows up to 1024 columns from few rows, cached
# up to 8192 columns, passes over memory beyond; tiny rows; and model-sized rows of many
# rows (3000 x 768 to 300 x 8192), kept from round 34's kernel (0a577e5, reverted).
NORM_SHAPES = [(1000, 1000), (777, 1001), (400, 64), (67, 1000), (5, 1001), (300, 64), (3, 4096), (7, 2050), (2, 8192),
               (3, 10000), (2, 12289), (1, 1), (3000, 768), (2500, 1001), (1200, 2048), (600, 4096), (300, 8192)]
NORM_FUNCTIONS = [f"{base}_{dtype}" for dtype in ("f16", "bf16", "f32")
                  for base in ("layer_norm", "layer_norm_nobias", "layer_norm_bias", "layer_norm_plain", "rms_norm", "rms_norm_plain")]


@pytest.mark.gpu
@pytest.mark.parametrize("function", NORM_FUNCTIONS)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("round_first", [0, 1])
def test_norm_shapes(norm_build, function, shape, round_first):
    """Every norm entry against kernels/norm/reference.py on every path of norm.cu, with x's
    rows off their mean (LayerNorm's two-pass variance) and weight and bias away from 1 and 0."""
    from kitdispatch import load_module

    _, reference = _reference_module(REPO / "kernels" / "norm")
    rows, cols = shape
    dtype = function.rsplit("_", 1)[1]
    rng = np.random.default_rng(rows * 7919 + cols)
    x = (3.0 + rng.standard_normal((rows, cols))).astype(_numpy_dtype(dtype))
    affine = {"layer_norm": 2, "layer_norm_nobias": 1, "layer_norm_bias": 1, "rms_norm": 1}.get(function.rsplit("_", 1)[0], 0)
    params = [(1 + 0.5 * rng.standard_normal(cols)).astype(_numpy_dtype(dtype)) for _ in range(affine)]
    module = load_module(norm_build / "norm.vmfb")
    got = module.call(function, x, *params, 1e-5, round_first)
    want = getattr(reference, function)(x, *params, 1e-5, round_first)
    assert got.shape == (rows, cols) and got.dtype == x.dtype
    assert _rel_err(got, want.astype(np.float64)) <= RESULT_TOL[dtype]
