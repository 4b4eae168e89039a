"""numpy references for `kitdispatch test` (float64 inside, float32 out)."""

import numpy as np


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def bias_gelu(h, bias):
    return _gelu((h + bias).astype(np.float64)).astype(np.float32)


def row_softmax(x):
    return _softmax(x.astype(np.float64)).astype(np.float32)


def mlp(x, w, b):
    h = x.astype(np.float64) @ w.astype(np.float64) + b
    return _softmax(_gelu(h)).astype(np.float32)
