"""numpy references of the fused attention kernels, in float64, rounded once to the input type."""

import numpy as np


def _attention(q, k, v, causal, scale=None, bias=None, masked=None):
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    qk = q64 @ np.swapaxes(k64, -1, -2)
    scores = qk * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    below = np.tril(np.ones(scores.shape[-2:], dtype=bool))
    if bias is not None:  # key padding: a biased key's score as the model's chain computes it, in q's type
        e = q.dtype.type
        add = np.where(below, bias[:, None, None, :], e(masked)) if causal else bias[:, None, None, :]
        biased = ((qk.astype(e) * e(scale)).astype(e) + add.astype(e)).astype(e).astype(np.float64)
        scores = np.where(add != 0, biased, scores)
    elif causal:  # query i sees keys 0..i (PyTorch's is_causal)
        scores = np.where(below, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return (weights @ v64).astype(q.dtype)


def attention_f16(q, k, v):
    return _attention(q, k, v, causal=False)


def attention_causal_f16(q, k, v):
    return _attention(q, k, v, causal=True)


def attention_bf16(q, k, v):
    return _attention(q, k, v, causal=False)


def attention_causal_bf16(q, k, v):
    return _attention(q, k, v, causal=True)


def _bhsd(x):  # [b, s, h, d] -> [b, h, s, d]
    return np.swapaxes(x, 1, 2)


def _bshd_variant(q, k, v, scale, causal):
    return _bhsd(_attention(_bhsd(q), _bhsd(k), _bhsd(v), causal, float(scale)))


def _kt_variant(q, kt, v, scale, causal):
    return _bhsd(_attention(q, np.swapaxes(kt, -1, -2), v, causal, float(scale)))


def attention_bshd_f16(q, k, v, scale):
    return _bshd_variant(q, k, v, scale, causal=False)


def attention_causal_bshd_f16(q, k, v, scale):
    return _bshd_variant(q, k, v, scale, causal=True)


def attention_kt_f16(q, kt, v, scale):
    return _kt_variant(q, kt, v, scale, causal=False)


def attention_causal_kt_f16(q, kt, v, scale):
    return _kt_variant(q, kt, v, scale, causal=True)


attention_bshd_bf16, attention_causal_bshd_bf16 = attention_bshd_f16, attention_causal_bshd_f16


def _qkv_variant(qkv, scale, causal):  # qkv [b, s, 3, h, d] -> o [b, s, h, d]
    return _bshd_variant(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], scale, causal)


def attention_qkv_f16(qkv, scale):
    return _qkv_variant(qkv, scale, causal=False)


def attention_causal_qkv_f16(qkv, scale):
    return _qkv_variant(qkv, scale, causal=True)


attention_qkv_bf16, attention_causal_qkv_bf16 = attention_qkv_f16, attention_causal_qkv_f16
attention_kt_bf16, attention_causal_kt_bf16 = attention_kt_f16, attention_causal_kt_f16


def _gqa_variant(q, k, v, scale, causal, bias=None, masked=None):
    """q [b, h, s, d], k [b, g, s, d], v [b, s, g, d] -> o [b, s, h, d]; query head i reads K/V head i // (h // g)."""
    group = q.shape[1] // v.shape[2]
    k_heads = np.repeat(k, group, axis=1)
    v_heads = np.repeat(np.swapaxes(v, 1, 2), group, axis=1)
    return _bhsd(_attention(q, k_heads, v_heads, causal, float(scale), bias, None if masked is None else float(masked)))


def attention_gqa_f16(q, k, v, scale):
    return _gqa_variant(q, k, v, scale, causal=False)


def attention_causal_gqa_f16(q, k, v, scale):
    return _gqa_variant(q, k, v, scale, causal=True)


attention_gqa_bf16, attention_causal_gqa_bf16 = attention_gqa_f16, attention_causal_gqa_f16


def attention_gqa_bshd_f16(q, k, v, scale):  # k [b, s, g, d]
    return _gqa_variant(q, _bhsd(k), v, scale, causal=False)


def attention_causal_gqa_bshd_f16(q, k, v, scale):
    return _gqa_variant(q, _bhsd(k), v, scale, causal=True)


attention_gqa_bshd_bf16, attention_causal_gqa_bshd_bf16 = attention_gqa_bshd_f16, attention_causal_gqa_bshd_f16


def attention_cross_f16(q, k, v, scale):  # q [b, h, s, d], k and v [b, h, t, d]
    return _attention(q, k, v, False, float(scale))


attention_cross_bf16 = attention_cross_f16


def attention_gqa_bhsd_f16(q, k, v, scale):  # q, o [b, h, s, d]; k, v [b, g, s, d]
    return _bhsd(_gqa_variant(q, k, _bhsd(v), scale, causal=False))


def attention_causal_gqa_bhsd_f16(q, k, v, scale):
    return _bhsd(_gqa_variant(q, k, _bhsd(v), scale, causal=True))


attention_gqa_bhsd_bf16, attention_causal_gqa_bhsd_bf16 = attention_gqa_bhsd_f16, attention_causal_gqa_bhsd_f16


def attention_cross_pad_f16(q, k, v, bias, scale, masked):  # k, v [b, h, t, d]; bias [b, t]
    return _attention(q, k, v, False, float(scale), bias, float(masked))


attention_cross_pad_bf16 = attention_cross_pad_f16


def _pad_variant(q, k, v, bias, scale, masked, causal, order):
    """Key padding; order: "" (all [b, h, s, d]), "kt" (K^T, O [b, s, h, d]) or "bshd"."""
    if order == "bshd":
        q, k, v = _bhsd(q), _bhsd(k), _bhsd(v)
    elif order == "kt":
        k = np.swapaxes(k, -1, -2)
    o = _attention(q, k, v, causal, float(scale), bias, float(masked))
    return o if order == "" else _bhsd(o)


def _pad_entry(causal, order):
    """One _pad entry's reference, taking exactly the entry's arguments."""
    def reference(q, k, v, bias, scale, masked):
        return _pad_variant(q, k, v, bias, scale, masked, causal, order)

    return reference


def _pad_entries():
    entries = {}
    for causal in (False, True):
        for order in ("", "kt", "bshd"):
            for dtype in ("f16", "bf16"):
                name = f"attention{'_causal' if causal else ''}_pad{'_' + order if order else ''}_{dtype}"
                entries[name] = _pad_entry(causal, order)
    return entries


globals().update(_pad_entries())


def attention_causal_pad_gqa_f16(q, k, v, bias, scale, masked):
    return _gqa_variant(q, k, v, scale, True, bias, masked)


def attention_causal_pad_gqa_bshd_f16(q, k, v, bias, scale, masked):  # k [b, s, g, d]
    return _gqa_variant(q, _bhsd(k), v, scale, True, bias, masked)


attention_causal_pad_gqa_bf16, attention_causal_pad_gqa_bshd_bf16 = attention_causal_pad_gqa_f16, attention_causal_pad_gqa_bshd_f16
