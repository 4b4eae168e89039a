"""The ops of an imported model a kernel may declare it `replaces`: the manifest's vocabulary.

The kinds themselves (facts, contract, match, call) live in kitdispatch/models/ops/, one module
each, registered in `OP_KINDS`; describe sits below models and does not import them, so the
names are listed here, and tests/models/test_registry.py checks this list against the registry.
"""

from __future__ import annotations

# In the registry's order. Most are IREE's op names; `layer_norm` and `rms_norm` are kinds that
# read a chain of linalg.generics (models/ops/norm.py), and `patch_conv` a convolution generic of
# non-overlapping patches with the generic after it (models/ops/patch_conv.py), ahead of
# linalg.generic, which reads them one by one.
REPLACEABLE_OPS = (
    "linalg.softmax", "linalg.matmul", "linalg.batch_matmul", "layer_norm", "rms_norm", "patch_conv", "linalg.generic",
    "iree_linalg_ext.attention",
)
# The ops a kernel matches through a pattern file (replace_when's `pattern`), and only they.
PATTERN_OPS = ("linalg.generic",)
# What an attention kernel may say of the mask it applies (replace_when's `mask`): "causal"
# (key j attends to query i where j <= i); "key_padding" (key j of batch row b attends where the
# [b, t] keep flags the kernel takes say so: a model's `attention_mask` input); "causal_key_padding"
# (both); without it, no mask (an op whose mask masks nothing).
ATTENTION_MASKS = ("causal", "key_padding", "causal_key_padding")
# The epilogues a matmul kernel may compute after the product (replace_when's `epilogue`; default
# "none"), in f32 on the f32 accumulator, then one rounding to the result type:
# kernels/matmul/README.md gives each formula, models/ops/epilogue.py recognises them in a model.
# bias_heads / bias_heads_t: the bias add stored transposed to attention heads ([b, h, s, d] /
# [b, h, d, s]: a Q/V or K projection and the transposing generic after it).
EPILOGUES = ("none", "bias", "bias_gelu_erf", "bias_gelu_tanh", "bias_relu", "bias_silu", "residual", "bias_residual", "scale",
             "gelu_erf", "gelu_tanh", "silu_mul", "bias_heads", "bias_heads_t")
# The ops whose kernels may declare an epilogue (a patch conv's: the generic after it, `none` or `bias`).
EPILOGUE_OPS = ("linalg.matmul", "linalg.batch_matmul", "patch_conv")
