"""linalg.batch_matmul: matmul.py's contract with a leading batch dim, the same on A, B and C."""

from __future__ import annotations

from kitdispatch.models.ops.matmul import Matmul

KIND = Matmul(
    "linalg.batch_matmul",
    rank=3,
    plain_maps="[affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>, "
    "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>]",
    shapes="[batch,m,k] x [batch,k,n] -> [batch,m,n]",
)
