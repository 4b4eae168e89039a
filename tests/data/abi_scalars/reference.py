"""numpy references for abi_scalars: the same arithmetic, in the kernel's precision."""

import numpy as np

BIG = 2**40 + 3
HIGH = 0x4000000100000000


def add_i64(x, offset):
    return x + np.int64(offset) + np.int64(BIG)


def xor_u64(x, mask):
    return (x.view(np.uint64) ^ np.uint64(mask) ^ np.uint64(HIGH)).view(np.int64)


def axpb_f64(x, a):
    return (x.astype(np.float64) * np.float64(a) + 0.1).astype(np.float32)


def half_ops(x, scale, negate):
    scale = np.float32(np.float16(scale))
    v = x.astype(np.float32) * scale + np.float32(0.5)
    return (-v if negate else v).astype(np.float16)


def scale_float(x, a):
    return (np.float32(a) * x).astype(np.float32)
