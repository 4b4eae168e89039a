"""A small PyTorch MLP classifier (Linear, GELU, Linear, Softmax), exported to MLIR through
iree-turbine for `kitdispatch build samples/torch_mlp --model OUT.mlir`.

    python samples/torch_mlp/model.py [OUT.mlir] [--batch 512]

Needs `pip install 'kitdispatch[torch]'` (torch and iree-turbine) on the machine that exports.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import kitdispatch as kd

HERE = Path(__file__).parent


class Mlp(torch.nn.Module):
    def __init__(self, features: int = 256, hidden: int = 512, classes: int = 1000):
        super().__init__()
        self.hidden = torch.nn.Linear(features, hidden)
        self.out = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.out(torch.nn.functional.gelu(self.hidden(x))), dim=-1)


def export(path: str | Path, batch: int = 512, seed: int = 0) -> Path:
    torch.manual_seed(seed)  # the weights are the model's constants: the same file every time
    model = Mlp().eval()
    return kd.export_torch(model, (torch.zeros(batch, 256),), path)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=str(HERE / "model.mlir"))
    p.add_argument("--batch", type=int, default=512)
    args = p.parse_args()
    print(f"wrote {export(args.out, args.batch)}")
