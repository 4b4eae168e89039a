import numpy as np


def gather_rows(idx, table):
    return table[idx]


def total(x):
    return np.array([x.astype(np.float64).sum()], dtype=np.float32)
