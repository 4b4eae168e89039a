import numpy as np


def coords(base):
    Z, Y, X = base.shape
    z, y, x = np.meshgrid(np.arange(Z), np.arange(Y), np.arange(X), indexing="ij")
    return (base + x + 100 * y + 10000 * z).astype(np.int32)
