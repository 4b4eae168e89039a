"""Attention with a key-padding mask taken from a model input (models/ops/_masks.py `per_key`,
_decomposed.py, attention.py; kernels/attention's `_pad` entries): ONNX layers written as
transformers' masks reach them (tests/data/attention_forms/make_onnx.py `--mask keypad*`:
an `attention_mask` int64 [b, t] input, cast to bool, broadcast to [b, 1, 1, t]), brought to
IREE's global optimization by the real tools and decided against the whole library; builds
check the dispatches and the spec; GPU tests run padding patterns (a fully padded row among
them) against the ONNX model's reference evaluation and IREE alone."""

from __future__ import annotations

import runpy

import numpy as np
import pytest
from conftest import dispatch_calls, dump_module, iree_dispatches, needs_iree_compile

from kitdispatch import BuildOptions
from kitdispatch.models.pipeline import build_model
from models.test_attention_forms import ARCHS, FORMS, attention_decision, decisions_of, form_build, make_model

FLAGS = "key-padding flags [b, t] made by ops from an input of the model's function"
ADDITIVE = "an additive key-padding mask [b, t] made by ops from an input of the model's function"


@pytest.mark.parametrize(
    "args, kernel, form, what",
    [
        # the Where(keep, 0, lowest) fused into the cast of the input: the scores' generic adds an f16 [b, t]
        (["--mask", "keypad"], "attention_pad_f16", "key_padding", ADDITIVE),
        (["--mask", "keypad-inf"], "attention_pad_f16", "key_padding", ADDITIVE),
        # the flags through a Gather (HF BERT / GPT-2 exports): boolean [b, t] selected in the scores' generic
        (["--mask", "keypad-gather"], "attention_pad_f16", "key_padding", FLAGS),
        (["--form", "layer", "--mask", "keypad-gather"], "attention_pad_kt_f16", "key_padding", FLAGS),
        (["--form", "layer", "--mask", "keypad", "--seq", 197], "attention_pad_kt_f16", "key_padding", ADDITIVE),
        (["--mask", "keypad-causal-gather"], "attention_causal_pad_f16", "causal_key_padding", f"a causal boolean mask and {FLAGS}"),
        (["--kv-seq", 77, "--mask", "keypad"], "attention_cross_pad_f16", "key_padding", ADDITIVE),  # bias [b, t] on t keys
        (["--form", "split", "--mask", "keypad-causal-gather"], "attention_causal_pad_kt_f16", "causal_key_padding",
         f"a causal boolean mask and {FLAGS}"),
    ],
    ids=["additive", "additive-inf", "flags", "layer-flags", "layer-additive-197", "causal-flags", "cross-additive", "split-causal-flags"],
)
def test_key_padding_from_an_input_is_replaced_whole(tmp_path, args, kernel, form, what):
    decisions = decisions_of(make_model(tmp_path, "onnx", "attn.onnx", "--f16", *args), tmp_path)
    d = attention_decision(decisions)
    assert d.kernel is not None and d.kernel.name == kernel, d.reasons
    assert d.to_json()["attention"]["mask"] == {"form": form, "what": what}
    # the kernel reads the [b, t] tensor the scores' generic broadcasts: as it is, or (flags) through the adapter's select
    keep = d.op.detail.chain.keep
    keys = d.op.result.shape[1] if "layer" in args or "split" in args else d.op.inputs[1].shape[2]  # K [b, h, t, d]
    assert keep.tensor.shape == (2, keys)
    [bias] = [a for a in d.call.arguments if getattr(a, "path", None) == keep.path]
    assert (bias.where_false is not None) == (keep.tensor.dtype == "i1")
    # the scores' generic (the mask's broadcast), the softmax and the matmuls go with it
    others = [x for x in decisions if x is not d and x.op.kind in ("linalg.softmax", "linalg.batch_matmul")]
    assert others and all(x.kernel is None and f"which {kernel} replaces whole" in x.reasons[0] for x in others)


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--mask", "keypad-where-gather"], "key-padding flags applied as select(keep, scores, masked)"),
        (["--mask", "keypad-query"], "a mask broadcast over the queries or the keys"),
        # IREE fuses the mask's own ops (the cast's compare, 1 - m) into the scores' generic: no [b, t] tensor to hand over
        (["--mask", "keypad-causal"], "the mask is computed inside the scores' generic (arith.cmpi of its other inputs"),
        (["--mask", "keypad-additive"], "the mask is computed inside the scores' generic (arith.subf of its other inputs"),
    ],
    ids=["select-scores", "query-padding", "causal-fused", "additive-fused"],
)
def test_key_padding_near_misses_are_kept_with_the_reason(tmp_path, args, reason):
    d = attention_decision(decisions_of(make_model(tmp_path, "onnx", "attn.onnx", "--f16", *args), tmp_path))
    assert d.kernel is None
    assert all(reason in r for r in d.reasons), d.reasons


def test_f32_key_padding_reaches_the_f32_kernel(tmp_path):
    """An f32 model's boolean flags become the f32 bias the kernel adds (select(keep, 0, f32's lowest))."""
    d = attention_decision(decisions_of(make_model(tmp_path, "onnx", "attn.onnx", "--mask", "keypad-gather"), tmp_path))
    assert d.op.detail.mask_form == "key_padding"
    assert d.kernel is not None and d.kernel.name == "attention_pad_f32", d.reasons


# ----------------------------------------------------------------- builds (real iree-compile)


@needs_iree_compile
@pytest.mark.parametrize(
    "args, kernel, selects",
    [
        (["--form", "layer", "--mask", "keypad-gather"], "attention_pad_kt_f16", True),
        (["--form", "split", "--mask", "keypad-causal-gather"], "attention_causal_pad_kt_f16", True),
        (["--mask", "keypad"], "attention_pad_f16", False),
        # f32 (kernels/attention_f32): the flags' bias made in f32, f32's lowest with no truncf
        (["--f32", "--form", "layer", "--mask", "keypad-gather"], "attention_pad_kt_f32", True),
    ],
    ids=["layer-flags", "split-causal-flags", "heads-additive", "f32-layer-flags"],
)
def test_key_padding_builds_to_the_kernel_and_no_iree_attention(tmp_path, args, kernel, selects):
    """The whole chain with its mask's broadcast (the scores' generic reading [b, t] per batch
    and key) becomes the one kernel: no IREE batch_matmul or softmax is left, nor an
    elementwise dispatch over the [b, h, s, s] scores, and the module has no more dispatches
    than IREE's own. Boolean flags reach the kernel as the bias their select adds, made in the
    adapter (a [b, t] generic IREE runs with the flags' producer)."""
    f32 = args[:1] == ["--f32"]
    model = make_model(tmp_path, "onnx", "attn.onnx", *(args[1:] if f32 else ["--f16", *args]))
    result = build_model(None, model, BuildOptions.create(ARCHS), tmp_path / "out", with_baseline=True)
    [attention] = [d for d in result.decisions if d.op.kind == "iree_linalg_ext.attention"]
    assert attention.kernel is not None and attention.kernel.name == kernel, attention.reasons
    assert kernel in dump_module(result.vmfb)
    assert not iree_dispatches(result.vmfb, "softmax") and not iree_dispatches(result.vmfb, "batch_matmul")
    assert not [x for x in iree_dispatches(result.vmfb, "elementwise") if "128x128" in x]
    assert iree_dispatches(result.baseline_vmfb, "softmax")
    assert dispatch_calls(result.vmfb) <= dispatch_calls(result.baseline_vmfb)
    spec = result.spec.read_text()
    lowest = "-3.4028234663852886e+38" if f32 else "-65504.0"
    assert ("arith.select %in" in spec and f"arith.constant {lowest} : f32" in spec) == selects  # the flags as their bias
    assert ("arith.truncf" not in spec) if f32 else True


# ----------------------------------------------------------------- GPU: padding patterns


_CASES = runpy.run_path(str(FORMS / "gpu_cases.py"))
KEYPAD_CASES = sorted(c for c in _CASES["GPU_CASES"] if "keypad" in c)


def padding_patterns(batch: int, keys: int, *, full: bool) -> list[np.ndarray]:
    """attention_mask [batch, keys] int64 patterns: right padding, left padding (a causal row
    whose own keys are all padded), random holes, and (`full`) a fully padded row."""
    rng = np.random.default_rng(0)
    right = np.ones((batch, keys), np.int64)
    right[0, keys - 37:] = 0
    left = np.ones((batch, keys), np.int64)
    left[-1, :50] = 0
    holes = (rng.random((batch, keys)) > 0.3).astype(np.int64)
    patterns = [right, left, holes]
    if full:
        padded = np.ones((batch, keys), np.int64)
        padded[-1] = 0
        patterns.append(padded)
    return patterns


@pytest.mark.gpu
@pytest.mark.parametrize("case", KEYPAD_CASES)
def test_key_padding_agrees_with_the_model_on_gpu(tmp_path, prebuilt_dir, case):
    """Each padding pattern through the kit's build agrees with the ONNX model's reference
    evaluation (onnx.reference) and with IREE alone, a fully padded row included (the model's
    softmax over every key's lowest-biased score, where the mask adds its dtype's lowest: not NaN);
    prebuilt as `attention_forms_<case>` (tools/prebuild.py) where the GPU machine has no iree-compile."""
    from onnx import load
    from onnx.reference import ReferenceEvaluator

    from kitdispatch import load_module
    from kitdispatch.describe.model_record import read_model_record
    from kitdispatch.models.compare import check_agreement
    from kitdispatch.run.device import numpy_dtype

    kind, args, kernel = _CASES["GPU_CASES"][case]
    built = form_build(tmp_path, prebuilt_dir, case)
    folder, record = read_model_record(built)
    sig = record.function(None)
    onnx_model = load(make_model(tmp_path, "onnx", "ref.onnx", *args))
    reference = ReferenceEvaluator(onnx_model)
    kit, iree = load_module(folder / record.vmfb), load_module(folder / record.baseline_vmfb)
    assert kernel in (folder / record.vmfb).read_bytes().decode("latin-1")  # the kit's kernels keep their names
    names = [i.name for i in onnx_model.graph.input]  # the function's inputs, in order: tensors, then attention_mask
    rng = np.random.default_rng(1)
    tensors = [rng.uniform(-2, 2, t.shape).astype(numpy_dtype(t.dtype)) for t in sig.inputs[:-1]]  # f16, or f32 (attention_f32)
    for mask in padding_patterns(*sig.inputs[-1].shape, full="keypad-inf" not in args):
        inputs = [*tensors, mask]
        got = np.asarray(kit.call(sig.name, *inputs))
        want = np.asarray(reference.run(None, dict(zip(names, inputs)))[0])
        alone = np.asarray(iree.call(sig.name, *inputs))
        assert np.isfinite(got).all()
        for other in (want, alone):
            agree, _, _, worst = check_agreement([got], [other], sig)
            assert agree, (mask.sum(axis=1), worst)
