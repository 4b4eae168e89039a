import numpy as np


# Named apart from the module's layernorm_forward so that `kitdispatch test` leaves it out: an
# f32 layernorm differs from this f64 one by more than the f32 tolerance where the output
# cancels to near 0. tests/emit/test_launch_math.py compares them with a tolerance of its own.
def layernorm(inp, weight, bias):
    x = inp.astype(np.float64)
    mean = x.mean(axis=-1)
    rstd = 1.0 / np.sqrt(((x - mean[..., None]) ** 2).mean(axis=-1) + 1e-5)
    out = (x - mean[..., None]) * rstd[..., None] * weight + bias
    return out.astype(np.float32), mean.astype(np.float32), rstd.astype(np.float32)


def scale_grid_stride(x):
    blocks = min(-(-x.shape[0] // 256), 64)
    return (x * np.float32(2.0)).astype(np.float32), np.array([blocks], np.int32)
