import numpy as np


def reverse_block(x):
    """Each block of 64 threads writes its tile back in reverse; the last block is padded."""
    n = x.shape[0]
    out = np.empty_like(x)
    for start in range(0, n, 64):
        tile = np.zeros(64, x.dtype)
        tile[: min(64, n - start)] = x[start : start + 64]
        for t in range(64):
            j = start + 63 - t
            if j < n:
                out[j] = tile[t]
    return out
