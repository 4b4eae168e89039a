"""The attention forms tests/models/test_attention_forms.py compares with IREE alone on the GPU,
and tools/prebuild.py builds for a GPU machine without iree-compile (OUT/attention_forms_<id>):
id -> (maker: make_<kind>.py, its arguments, the library kernel that must run)."""

GPU_CASES = {
    "sdpa-is-causal": ("sdpa", ["--mask", "causal"], "attention_causal_f16"),
    "sdpa-all-true": ("sdpa", ["--mask", "all-true"], "attention_f16"),
    "sdpa-arange-d128": ("sdpa", ["--mask", "arange-causal", "--head-dim", "128"], "attention_causal_f16"),
    # SDPA's enable_gqa: K and V broadcast to the query heads before the op, read before it
    "sdpa-gqa-causal": ("sdpa", ["--kv-heads", "2"], "attention_causal_gqa_bhsd_f16"),
    "sdpa-gqa-b1-d128": ("sdpa", ["--kv-heads", "2", "--batch", "1", "--mask", "none", "--head-dim", "128"], "attention_gqa_bhsd_f16"),
    "sdpa-mqa-causal": ("sdpa", ["--kv-heads", "1"], "attention_causal_gqa_bhsd_f16"),
    "onnx-causal": ("onnx", ["--f16", "--mask", "causal"], "attention_causal_f16"),
    "onnx-where-causal": ("onnx", ["--f16", "--mask", "causal-where"], "attention_causal_f16"),
    "onnx-flat-300": ("onnx", ["--f16", "--form", "flat", "--mask", "zero", "--seq", "300"], "attention_f16"),
    "onnx-layer-softmax-rows": ("onnx", ["--form", "layer", "--head-dim", "128"], "row_softmax"),  # f32, d 128: no f32 attention kernel
    # f32 (kernels/attention_f32): the chain with O's transpose back to [b, s, h, d]; partial 64-row blocks
    "onnx-f32-causal-197": ("onnx", ["--mask", "causal", "--seq", "197"], "attention_causal_f32"),
    "onnx-f32-layer-where-add": ("onnx", ["--form", "layer", "--mask", "where-add"], "attention_bshd_f32"),
    "onnx-f32-split-causal": ("onnx", ["--form", "split", "--mask", "where-add-causal"], "attention_causal_qkv_f32"),
    "onnx-f32-layer-keypad-flags": ("onnx", ["--form", "layer", "--mask", "keypad-gather"], "attention_pad_kt_f32"),
    "onnx-f32-gqa-bhsd-d32": ("onnx", ["--kv-heads", "2", "--mask", "causal", "--head-dim", "32"], "attention_causal_gqa_bhsd_f32"),
    "onnx-layer-kt": ("onnx", ["--f16", "--form", "layer", "--mask", "where-add"], "attention_kt_f16"),
    "onnx-layer-kt-causal-197": ("onnx", ["--f16", "--form", "layer", "--mask", "where-add-causal", "--seq", "197"],
                                 "attention_causal_kt_f16"),
    "onnx-layer-gqa-d128": ("onnx", ["--f16", "--form", "layer", "--kv-heads", "2", "--batch", "1", "--mask", "where-add-causal",
                                     "--head-dim", "128"],
                            "attention_causal_gqa_bshd_f16"),
    # GQA at batch > 1: repeat_kv's broadcast [b, g, r] collapsed into b*h (3 query heads a K/V head; key padding too)
    "onnx-layer-gqa-b3": ("onnx", ["--f16", "--form", "layer", "--kv-heads", "2", "--heads", "6", "--batch", "3",
                                   "--mask", "where-add-causal", "--seq", "197"],
                          "attention_causal_gqa_bshd_f16"),
    "onnx-layer-gqa-b2-keypad": ("onnx", ["--f16", "--form", "layer", "--kv-heads", "2", "--batch", "2",
                                          "--mask", "keypad-causal-gather", "--head-dim", "128"],
                                 "attention_causal_pad_gqa_bshd_f16"),
    # MQA (one K/V head): K, V [b, s, d] broadcast; at b = 1 P V a 2-D matmul of every head's rows by one V
    # GQA unprojected at batch > 1: K and V [b, g, s, d] read before the broadcast, O [b, h, s, d] (the _gqa_bhsd entries)
    "onnx-gqa-b2-bhsd": ("onnx", ["--f16", "--kv-heads", "2", "--mask", "causal"], "attention_causal_gqa_bhsd_f16"),
    "onnx-gqa-b1-bhsd": ("onnx", ["--f16", "--kv-heads", "2", "--batch", "1", "--mask", "causal"], "attention_causal_gqa_bhsd_f16"),
    "onnx-gqa-b3-bhsd-197": ("onnx", ["--f16", "--kv-heads", "2", "--heads", "6", "--batch", "3", "--mask", "zero", "--seq", "197"],
                             "attention_gqa_bhsd_f16"),  # 3 query heads a K/V head
    "onnx-mqa-b2-bhsd": ("onnx", ["--f16", "--kv-heads", "1", "--batch", "2", "--mask", "causal"], "attention_causal_gqa_bhsd_f16"),
    "onnx-layer-mqa-b2": ("onnx", ["--f16", "--form", "layer", "--kv-heads", "1", "--batch", "2", "--mask", "where-add-causal"],
                          "attention_causal_gqa_f16"),
    "onnx-layer-mqa-b1-300": ("onnx", ["--f16", "--form", "layer", "--kv-heads", "1", "--batch", "1", "--mask", "where-add-causal",
                                       "--seq", "300", "--head-dim", "128"],
                              "attention_causal_gqa_f16"),
    "onnx-layer-d96-197": ("onnx", ["--f16", "--form", "layer", "--head-dim", "96", "--seq", "197"], "attention_kt_f16"),
    "onnx-cross-77": ("onnx", ["--f16", "--kv-seq", "77"], "attention_cross_f16"),
    "onnx-split-causal": ("onnx", ["--f16", "--form", "split", "--mask", "where-add-causal"], "attention_causal_qkv_f16"),
    # GPT-2's block (make_gpt2.py: Gemm with bias, Split): Q, K, V read in place from the packed projection
    "gpt2-packed": ("gpt2", [], "attention_causal_qkv_f16"),
    "gpt2-packed-b1-s300": ("gpt2", ["--batch", "1", "--seq", "300"], "attention_causal_qkv_f16"),  # the sm_90a path
    # key padding from an `attention_mask` input (tests/models/test_attention_keypad.py runs padding patterns)
    "onnx-keypad-heads": ("onnx", ["--f16", "--mask", "keypad"], "attention_pad_f16"),
    "onnx-keypad-inf-300": ("onnx", ["--f16", "--mask", "keypad-inf", "--seq", "300"], "attention_pad_f16"),
    "onnx-keypad-layer-flags": ("onnx", ["--f16", "--form", "layer", "--mask", "keypad-gather"], "attention_pad_kt_f16"),
    "onnx-keypad-causal-flags-197": ("onnx", ["--f16", "--mask", "keypad-causal-gather", "--seq", "197"], "attention_causal_pad_f16"),
    "onnx-keypad-cross-77": ("onnx", ["--f16", "--kv-seq", "77", "--mask", "keypad"], "attention_cross_pad_f16"),  # [b, t] on t keys
    "onnx-keypad-split-causal-flags": ("onnx", ["--f16", "--form", "split", "--mask", "keypad-causal-gather"],
                                       "attention_causal_pad_kt_f16"),
    # masks whose ops IREE fuses into the scores' generic: the kernel gets the bias they compute from [b, t]
    "onnx-keypad-additive-fused": ("onnx", ["--f16", "--mask", "keypad-additive"], "attention_pad_f16"),  # (1 - m) * lowest
    "onnx-keypad-causal-fused-197": ("onnx", ["--f16", "--mask", "keypad-causal", "--seq", "197"], "attention_causal_pad_f16"),
    "onnx-f32-keypad-fused": ("onnx", ["--mask", "keypad"], "attention_pad_f32"),  # the int64 mask's compare and Where
    "onnx-f32-layer-keypad-additive-fused": ("onnx", ["--form", "layer", "--mask", "keypad-additive"], "attention_pad_kt_f32"),
    # transformers' torchscript exports: the flags anded with a compare of aranges (q >= 0; causal k <= q)
    "onnx-keypad-arange-layer": ("onnx", ["--f16", "--form", "layer", "--mask", "keypad-arange-gather"], "attention_pad_kt_f16"),
    "onnx-f32-keypad-arange-causal-split": ("onnx", ["--form", "split", "--mask", "keypad-arange-causal-gather"],
                                            "attention_causal_pad_kt_f32"),
    # batch 1: the mask [t] read per key (the kernel's [1, t]); the flags through the gather IREE fuses into the scores' generic
    "onnx-keypad-b1-additive": ("onnx", ["--f16", "--mask", "keypad", "--batch", "1"], "attention_pad_f16"),
    "onnx-keypad-b1-layer-causal-gathered": ("onnx", ["--f16", "--form", "layer", "--mask", "keypad-causal-gather", "--batch", "1"],
                                             "attention_causal_pad_kt_f16"),
    # torch's SDPA as the dynamo exporter writes it (transformers' default attention): Q and K^T scaled by
    # d^-1/4 each, the softmax's result through where(isnan(p), 0, p)
    "onnx-sdpa-dynamo-layer-causal-197": ("onnx", ["--f16", "--form", "layer", "--scale", "sqrt-qk", "--nan-guard",
                                                   "--mask", "where-add-causal", "--seq", "197"], "attention_causal_kt_f16"),
    "onnx-sdpa-dynamo-split-b1": ("onnx", ["--f16", "--form", "split", "--scale", "sqrt-qk", "--nan-guard", "--mask",
                                           "where-add-causal", "--batch", "1"], "attention_causal_gqa_f16"),  # g = h
    "onnx-f32-sdpa-dynamo-keypad": ("onnx", ["--form", "layer", "--scale", "sqrt-qk", "--nan-guard", "--mask", "keypad-gather"],
                                    "attention_pad_kt_f32"),
}
ARCHS = "sm_90a,sm_80"  # the attention kernels' build (kernels/attention/kitdispatch.toml)


def model_name(kind: str) -> str:
    return "attn.mlir" if kind == "sdpa" else "attn.onnx"
