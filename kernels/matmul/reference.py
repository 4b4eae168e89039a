"""numpy references of the tensor-core matmuls: exact products, f32 result."""

import numpy as np


def _matmul(a, b):
    # float64 stands in for the exact sum; the kernel accumulates in f32 on the tensor cores.
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def matmul_f16(a, b):
    return _matmul(a, b)


def matmul_bf16(a, b):
    return _matmul(a, b)
