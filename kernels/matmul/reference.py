"""numpy references of the tensor-core matmuls: exact products, rounded once to the result type."""

import numpy as np

from ml_dtypes import bfloat16  # what the kit's runtime uses for bf16 arrays


def _matmul(a, b, out=np.float32):
    # float64 stands in for the exact sum; the kernel accumulates in f32 on the tensor cores.
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32).astype(out)


def matmul_f16(a, b):
    return _matmul(a, b)


def matmul_bf16(a, b):
    return _matmul(a, b)


def matmul_f16_f16(a, b):
    return _matmul(a, b, np.float16)


def matmul_bf16_bf16(a, b):
    return _matmul(a, b, bfloat16)


def matmul_f16_bf16(a, b):
    return _matmul(a, b, bfloat16)


def matmul_bf16_f16(a, b):
    return _matmul(a, b, np.float16)
