"""numpy references of the element-wise kernels (computed in float64, returned as float32)."""

import numpy as np


def _gelu(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def add(x, y):
    return x + y


def relu(x):
    return np.maximum(x, np.float32(0))


def gelu(x):
    return _gelu(x).astype(np.float32)


def scale_add(x, y, alpha):
    alpha = np.float64(np.float32(alpha))  # the kernel gets alpha as an f32 push constant
    return (alpha * x + y).astype(np.float32)


def bias_gelu(x, bias):
    return _gelu(x + bias).astype(np.float32)
