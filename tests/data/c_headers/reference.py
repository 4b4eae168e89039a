import numpy as np


def row_stats(x):
    consts = np.array(
        [np.finfo(np.float32).max, np.pi, 2**31 - 1, 2**32 - 1, np.sqrt(2.0), np.finfo(np.float32).min, 1.0, 65.0],
        dtype=np.float32,
    )
    return x.max(axis=1), np.floor(x * np.float32(8)).sum(axis=1, dtype=np.float32), consts
