"""numpy references of the row reductions."""

import numpy as np


def row_sum(x):
    return x.sum(axis=1, dtype=np.float64).astype(np.float32)


def row_max(x):
    return x.max(axis=1)
