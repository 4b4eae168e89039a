"""numpy references of the norms (float64 statistics, results in x's type). `round_first`
rounds the normalized value to x's type, then each product and sum with weight and bias, as
f16/bf16 arithmetic does; otherwise weight and bias apply in float64 and the result is rounded once."""

import numpy as np


def _finish(x, normed, weight, bias, round_first):
    dtype = x.dtype
    if round_first:
        y = normed.astype(dtype).astype(np.float64)
        if weight is not None:
            y = (y * weight.astype(np.float64)).astype(dtype).astype(np.float64)
        if bias is not None:
            y = (y + bias.astype(np.float64)).astype(dtype).astype(np.float64)
        return y.astype(dtype)
    y = normed
    if weight is not None:
        y = y * weight.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)
    return y.astype(dtype)


def layer(x, weight, bias, eps, round_first):
    v = x.astype(np.float64)
    centered = v - v.mean(axis=-1, keepdims=True)
    normed = centered / np.sqrt((centered * centered).mean(axis=-1, keepdims=True) + np.float32(eps))
    return _finish(x, normed, weight, bias, round_first)


def rms(x, weight, eps, round_first):
    v = x.astype(np.float64)
    normed = v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + np.float32(eps))
    return _finish(x, normed, weight, None, round_first)


def _entries():
    for dtype in ("f16", "bf16", "f32"):
        globals()[f"layer_norm_{dtype}"] = lambda x, weight, bias, eps, round_first: layer(x, weight, bias, eps, round_first)
        globals()[f"layer_norm_nobias_{dtype}"] = lambda x, weight, eps, round_first: layer(x, weight, None, eps, round_first)
        globals()[f"layer_norm_bias_{dtype}"] = lambda x, bias, eps, round_first: layer(x, None, bias, eps, round_first)
        globals()[f"layer_norm_plain_{dtype}"] = lambda x, eps, round_first: layer(x, None, None, eps, round_first)
        globals()[f"rms_norm_{dtype}"] = lambda x, weight, eps, round_first: rms(x, weight, eps, round_first)
        globals()[f"rms_norm_plain_{dtype}"] = lambda x, eps, round_first: rms(x, None, eps, round_first)


_entries()
