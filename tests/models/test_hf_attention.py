"""The attention of real HF exports (torch's dynamo exporter, and its torchscript one where named -ts-, f16 and f32,
random weights: the ONNX files
in /work/hf/x that benchmarks/investigations/export_hf_models.py writes), built with the whole
library: each model's attention is one library kernel, IREE's attention matmuls and softmax are
gone, and the module has no more dispatches than IREE alone. Skipped where the exports are not."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import dispatch_calls, dump_module, iree_dispatches, needs_iree_compile

from kitdispatch import BuildOptions
from kitdispatch.models.pipeline import build_model

EXPORTS = Path("/work/hf/x")
ARCHS = "sm_90a,sm_80"


def built_attention(tmp_path, model: str):
    """The export built with the whole library (and IREE alone), and its attention's decision."""
    onnx = EXPORTS / f"{model}.onnx"
    if not onnx.is_file():
        pytest.skip(f"{onnx} is not here (benchmarks/investigations/export_hf_models.py writes it)")
    result = build_model(None, onnx, BuildOptions.create(ARCHS), tmp_path / "out", with_baseline=True)
    [attention] = [d for d in result.decisions if d.op.kind == "iree_linalg_ext.attention"]
    return result, attention


@needs_iree_compile
@pytest.mark.parametrize(
    "model, kernel",
    [
        ("bert-f16-b1s128", "attention_kt_f16"),  # K^T from its projection, the dynamo exporter's all-true mask
        ("gpt2-f16-b1s128", "attention_causal_qkv_f16"),  # one QKV projection split (read packed, in place), its causal mask
        ("vit-f16-b1s128", "attention_kt_f16"),  # 197 tokens
        ("llama-f16-b1s128", "attention_causal_gqa_f16"),  # 16 query heads, 4 K/V heads, d = 128
        ("llama-f16-b2s128", "attention_causal_gqa_f16"),  # at batch 2 repeat_kv's broadcast is merged with the batch
        ("llama-mask-f16-b2s128", "attention_causal_pad_gqa_f16"),  # called with attention_mask (--attention-mask)
        ("bert-f32-b1s128", "attention_kt_f32"),  # f32 (--dtype f32): kernels/attention_f32
        ("gpt2-f32-b1s128", "attention_causal_qkv_f32"),
        ("bert-mask-f32-b2s128", "attention_pad_kt_f32"),  # f32 with attention_mask: flags through a gather
        ("gpt2-mask-f32-b2s128", "attention_causal_pad_kt_f32"),
        # the torchscript exporter (--torchscript --attention-mask, files renamed -mask-ts-): the flags anded in the
        # scores' generic with a compare of aranges, q >= 0 (BERT) or k <= q (GPT-2), which the kit evaluates
        ("bert-mask-ts-f16-b2s128", "attention_pad_kt_f16"),
        ("gpt2-mask-ts-f16-b2s128", "attention_causal_pad_kt_f16"),
        ("bert-mask-ts-f32-b2s128", "attention_pad_kt_f32"),
        ("gpt2-mask-ts-f32-b2s128", "attention_causal_pad_kt_f32"),
        # batch 1 with attention_mask: IREE fuses the mask's gather into the scores' generic (a tensor.extract of the
        # flags at a hoisted arange of positions); the kernel reads those flags as [1, t]
        ("bert-mask-f16-b1s128", "attention_pad_kt_f16"),
        ("gpt2-mask-f16-b1s128", "attention_causal_pad_kt_f16"),
        # transformers' default attention, SDPA (--attn sdpa, files -sdpa-): Q and K^T scaled by d^-1/4, the softmax's
        # result guarded by where(isnan(p), 0, p); at batch 1 GPT-2's K is [b, h, s, d], read by the GQA entry with g = h
        ("gpt2-sdpa-f16-b1s128", "attention_causal_gqa_f16"),
        ("gpt2-sdpa-f32-b1s128", "attention_causal_gqa_f32"),
        ("bert-sdpa-mask-f32-b2s128", "attention_pad_kt_f32"),
        ("gpt2-sdpa-mask-f32-b2s128", "attention_causal_pad_kt_f32"),
    ],
)
def test_hf_export_attention_is_one_kernel(tmp_path, model, kernel):
    result, attention = built_attention(tmp_path, model)
    assert attention.kernel is not None and attention.kernel.name == kernel, attention.reasons
    assert kernel in dump_module(result.vmfb)
    assert not iree_dispatches(result.vmfb, "softmax")
    if "_qkv" in kernel:  # GPT-2's Q, K, V slices are read in place, not copied out (there is no _pad_qkv entry)
        assert "slow_memcpy" not in result.vmfb.read_bytes().decode("latin-1")
    calls = [dispatch_calls(v) for v in (result.vmfb, result.baseline_vmfb)]
    assert calls[0] <= calls[1], calls


@needs_iree_compile
@pytest.mark.parametrize(
    "model, reason",
    [
        # f16 SDPA with attention_mask: a padded row may be all -inf in f16, where the guard writes 0 and the kernels NaN
        ("bert-sdpa-mask-f16-b2s128", "the mask adds -65504 in f16, where a score below -16 plus it rounds to -inf"),
        # BERT's SDPA at batch 1: Q, K and V [b, h, s, d], O [b, s, h, d]; no entry has that layout
        ("bert-sdpa-f16-b1s128", "layout: the op gives Q [b, h, s, d], K [b, h, s, d], V [b, h, s, d], O [b, s, h, d]"),
    ],
)
def test_hf_export_attention_kept_says_why(tmp_path, model, reason):
    """What the library does not replace yet is kept with the reason."""
    _, attention = built_attention(tmp_path, model)
    assert attention.kernel is None and any(reason in r for r in attention.reasons), attention.reasons
