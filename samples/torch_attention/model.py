"""PyTorch's scaled_dot_product_attention on Q, K, V [b, h, s, d] in f16, exported to MLIR
through iree-turbine for `kitdispatch build kernels/attention --model OUT.mlir`: the library's
attention_f16 replaces IREE's attention op.

    python samples/torch_attention/model.py [OUT.mlir] [--batch 2] [--heads 8] [--seq 512] [--head-dim 64]

The inputs are the projected Q, K and V: where the projections are in the model too, IREE
computes V's transpose inside a reshape the kit does not look through yet, and the op is kept
(the report says why). Needs `pip install 'kitdispatch[torch]'` on the machine that exports.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import kitdispatch as kd

HERE = Path(__file__).parent


class Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # No mask and the default scale 1/sqrt(d): what the library kernel computes.
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def export(path: str | Path, batch: int = 2, heads: int = 8, seq: int = 512, head_dim: int = 64) -> Path:
    shape = (batch, heads, seq, head_dim)
    args = tuple(torch.zeros(shape, dtype=torch.float16) for _ in range(3))
    return kd.export_torch(Attention().eval(), args, path)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=str(HERE / "model.mlir"))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--head-dim", type=int, default=64)
    args = p.parse_args()
    print(f"wrote {export(args.out, args.batch, args.heads, args.seq, args.head_dim)}")
