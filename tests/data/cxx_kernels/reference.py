"""numpy references for cxx_kernels, in the kernels' float order."""

import numpy as np


def sgemm(alpha, A, B, beta, C):
    # The kernel accumulates k in order with fused multiply-adds: one rounding a step (the
    # product of two f32 is exact in f64).
    acc = np.zeros(C.shape, np.float32)
    for k in range(A.shape[1]):
        acc = (A[:, k : k + 1].astype(np.float64) * B[k : k + 1, :] + acc).astype(np.float32)
    return (np.float64(alpha) * acc + np.float64(beta) * C).astype(np.float32)


def shifted_axpy(offset, a, x, y):
    return (np.float64(a) * x + np.fmod(offset, 1000)).astype(np.float32)


def fill_i32(out, v):
    return np.full_like(out, v)
