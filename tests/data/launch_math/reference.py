import numpy as np


def layernorm_forward(inp, weight, bias):
    x = inp.astype(np.float64)
    mean = x.mean(axis=-1)
    rstd = 1.0 / np.sqrt(((x - mean[..., None]) ** 2).mean(axis=-1) + 1e-5)
    out = (x - mean[..., None]) * rstd[..., None] * weight + bias
    return out.astype(np.float32), mean.astype(np.float32), rstd.astype(np.float32)


def scale_grid_stride(x):
    blocks = min(-(-x.shape[0] // 256), 64)
    return (x * np.float32(2.0)).astype(np.float32), np.array([blocks], np.int32)
