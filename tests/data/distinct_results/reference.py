import numpy as np


def layernorm(inp, weight, bias):
    mean = inp.mean(axis=1)
    rstd = 1.0 / np.sqrt(inp.var(axis=1) + 1e-5)
    out = (inp - mean[:, None]) * rstd[:, None] * weight + bias
    return out.astype(np.float32), mean.astype(np.float32), rstd.astype(np.float32)


def three_of_one(x):
    return x + 1, x * 2, x - 3
