import numpy as np


def iota(n):
    return np.arange(n, dtype=np.int64)


def repeat_rows(x, rows):
    return x[None, :] + np.arange(rows, dtype=np.float32)[:, None]
