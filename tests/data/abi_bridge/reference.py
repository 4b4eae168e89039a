"""numpy references for abi_bridge, in the kernels' precision."""

import ml_dtypes
import numpy as np

BIG = 2**40 + 3
AFFINE = np.dtype([("scale", "<f4"), ("shift", "<i4"), ("offset", "<f8")])


def add_i64(offset, x):
    return x + np.int64(offset) + np.int64(BIG)


def xor_u64(x, mask):
    return x ^ np.uint64(mask)


def axpb_f64(a, x):
    return np.float64(a) * x + np.float64(-0.1)


def affine(x, p):
    scale, shift, offset = np.frombuffer(p, AFFINE)[0].item()
    return ((x * np.float32(scale) + np.float32(shift)).astype(np.float64) + offset).astype(np.float32)


def narrow(x, s, t, u):
    return (x * np.int32(s) + np.int32(t) + np.int32(u)).astype(np.int32)


def fp8_ops(x, y):
    out = (np.float32(2.0) * x.astype(np.float32)).astype(ml_dtypes.float8_e4m3fn)
    return out, y.astype(np.float32)
