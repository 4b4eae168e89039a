"""linalg.batch_matmul: matmul.py's contract with a leading batch dim, the same on A, B and C
(B [batch,k,n], or [batch,n,k] read transposed). IREE folds the batch dims of a 4-D MatMul
([b,h,m,k] x [b,h,k,n]) into one before this stage (a batch_matmul of batch b*h between
collapse_shape and expand_shape), so its ops reach the kernels as 3-D ones. An op of batch 1 also
runs a 2-D matmul kernel that declares linalg.batch_matmul, without its unit batch dim."""

from __future__ import annotations

from kitdispatch.models.ops.matmul import Matmul

KIND = Matmul(
    "linalg.batch_matmul",
    rank=3,
    maps={
        "nn": "[affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>, "
        "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>]",
        "nt": "[affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d2, d3)>, "
        "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>]",
    },
    shapes="[batch,m,k] x [batch,k,n] -> [batch,m,n]",
)
