import numpy as np


def layernorm(inp, weight, bias):
    x = inp.astype(np.float64)
    mean = x.mean(axis=1)
    rstd = 1.0 / np.sqrt(x.var(axis=1) + 1e-5)
    out = (x - mean[:, None]) * rstd[:, None] * weight + bias
    return out.astype(np.float32), mean.astype(np.float32), rstd.astype(np.float32)


def three_of_one(x):
    return x + 1, x * 2, x - 3
