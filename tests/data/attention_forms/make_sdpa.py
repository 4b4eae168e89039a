"""Writes torch.aten.scaled_dot_product_attention in the torch dialect, as iree-turbine exports
PyTorch's SDPA (f16, Q [b, h, s, d]), with the masks models pass it:

    python tests/data/attention_forms/make_sdpa.py OUT.mlir --mask causal|bool-input|all-true|arange-causal|none
        [--batch 2 --heads 8 --kv-heads 8 --seq 256 --head-dim 64]

`causal` is `is_causal=True`; `bool-input` a boolean [b, 1, s, s] mask given as an input;
`all-true` a constant all-true mask (what transformers builds under export for BERT);
`arange-causal` the boolean k <= q that transformers builds from aranges for GPT-2 and Llama,
expanded to [b, 1, s, s]. `--kv-heads` below `--heads` is GQA (`enable_gqa=True`). No torch is
needed: IREE's torch input conversion makes of it what it makes of a real export.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def sdpa(mask: str = "causal", batch: int = 2, heads: int = 8, kv_heads: int | None = None, seq: int = 256, head_dim: int = 64) -> str:
    kv_heads = kv_heads or heads
    q = f"!torch.vtensor<[{batch},{heads},{seq},{head_dim}],f16>"
    kv = f"!torch.vtensor<[{batch},{kv_heads},{seq},{head_dim}],f16>"
    m4 = f"!torch.vtensor<[{batch},1,{seq},{seq}],i1>"
    args = [f"%q: {q}", f"%k: {kv}", f"%v: {kv}"] + ([f"%m: {m4}"] if mask == "bool-input" else [])
    lines = [
        "%none = torch.constant.none", "%f0 = torch.constant.float 0.000000e+00", "%false = torch.constant.bool false",
        "%true = torch.constant.bool true", "%int0 = torch.constant.int 0", "%int1 = torch.constant.int 1",
        f"%int_b = torch.constant.int {batch}", f"%int_s = torch.constant.int {seq}", "%int4 = torch.constant.int 4",
        '%cpu = torch.constant.device "cpu"',
    ]
    if mask == "all-true":
        lines.append(f"%m = torch.vtensor.literal(dense<true> : tensor<{batch}x1x{seq}x{seq}xi1>) : {m4}")
    if mask == "arange-causal":
        ar = f"!torch.vtensor<[{seq}],si64>"
        lines += [
            f"%ar = torch.aten.arange.start_step %int0, %int_s, %int1, %int4, %none, %cpu, %false : !torch.int, !torch.int, !torch.int, !torch.int, !torch.none, !torch.Device, !torch.bool -> {ar}",
            f"%qi = torch.aten.unsqueeze %ar, %int1 : {ar}, !torch.int -> !torch.vtensor<[{seq},1],si64>",
            f"%ki = torch.aten.unsqueeze %ar, %int0 : {ar}, !torch.int -> !torch.vtensor<[1,{seq}],si64>",
            f"%m2 = torch.aten.le.Tensor %ki, %qi : !torch.vtensor<[1,{seq}],si64>, !torch.vtensor<[{seq},1],si64> -> !torch.vtensor<[{seq},{seq}],i1>",
            f"%m3 = torch.aten.unsqueeze %m2, %int0 : !torch.vtensor<[{seq},{seq}],i1>, !torch.int -> !torch.vtensor<[1,{seq},{seq}],i1>",
            f"%m1 = torch.aten.unsqueeze %m3, %int0 : !torch.vtensor<[1,{seq},{seq}],i1>, !torch.int -> !torch.vtensor<[1,1,{seq},{seq}],i1>",
            "%sz = torch.prim.ListConstruct %int_b, %int1, %int_s, %int_s : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>",
            f"%m = torch.aten.expand %m1, %sz, %false : !torch.vtensor<[1,1,{seq},{seq}],i1>, !torch.list<int>, !torch.bool -> {m4}",
        ]
    masked = mask in ("bool-input", "all-true", "arange-causal")
    gqa = "%true" if kv_heads != heads else "%false"
    lines.append(
        f"%0 = torch.aten.scaled_dot_product_attention %q, %k, %v, {'%m' if masked else '%none'}, %f0, "
        f"{'%true' if mask == 'causal' else '%false'}, %none, {gqa} : {q}, {kv}, {kv}, {m4 if masked else '!torch.none'}, "
        f"!torch.float, !torch.bool, !torch.none, !torch.bool -> {q}"
    )
    body = "\n  ".join(lines)
    return f"func.func @main({', '.join(args)}) -> {q} {{\n  {body}\n  return %0 : {q}\n}}\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--mask", choices=["none", "causal", "bool-input", "all-true", "arange-causal"], default="causal")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--head-dim", type=int, default=64)
    a = p.parse_args()
    Path(a.out).write_text(sdpa(a.mask, a.batch, a.heads, a.kv_heads, a.seq, a.head_dim))


if __name__ == "__main__":
    main()
