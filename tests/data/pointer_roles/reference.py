"""numpy references for pointer_roles."""

import numpy as np


def transposeNoBankConflicts(idata):
    return np.ascontiguousarray(idata.T)


def accumulate(acc, x):
    return acc + np.float32(2) * x


def scale_half2(x):
    return (x * np.float16(2)).astype(np.float16)
