"""numpy reference of the row softmax (float64 inside, float32 out)."""

import numpy as np


def row_softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
