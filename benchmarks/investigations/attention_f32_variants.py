"""Variants of kernels/attention_f32 (query rows per block, blocks per SM the registers are
capped for), made from the library source by text substitution and compiled by CuPy's NVRTC on
the GPU machine; device time per variant at BERT's and GPT-2's shapes (CUPTI via torch.profiler,
variants interleaved), results checked against float64.

    python benchmarks/investigations/attention_f32_variants.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attention_f32 import (  # benchmarks/attention_f32.py: the same CUPTI sum
    REPS,
    _kernel_us,
)

SOURCE = Path(__file__).resolve().parents[2] / "kernels" / "attention_f32" / "attention_f32.cu"
VARIANTS = {"bm64-min2 (library)": (64, 2), "bm64-min3": (64, 3), "bm32-min2": (32, 2), "bm32-min4": (32, 4), "bm32-min6": (32, 6)}
CASES = [("attention_kt_f32", 1, 12, 512, False, "kt"), ("attention_kt_f32", 8, 12, 512, False, "kt"),
         ("attention_causal_qkv_f32", 1, 12, 512, True, "qkv"), ("attention_causal_qkv_f32", 8, 12, 512, True, "qkv"),
         ("attention_f32", 1, 12, 2048, False, "bhsd")]
D, ROUNDS = 64, 5


def variant_source(rows: int, min_blocks: int) -> str:
    text = SOURCE.read_text()
    swaps = [
        ("constexpr int kThreads = 256;", f"constexpr int kThreads = {rows} / 4 * 16;"),
        ("constexpr int BM = 64;", f"constexpr int BM = {rows};"),
        ("__launch_bounds__(256, 2)", f"__launch_bounds__({rows * 4}, {min_blocks})"),
        # Q's load takes BM rows, K's and V's 64
        ("load_transposing(float* dst, const float* src, int r0, int rows, long long stride, int d) {\n  for (int i = threadIdx.x; i < 64 * D;",
         "load_transposing(float* dst, const float* src, int r0, int rows, long long stride, int d, int n = 64) {\n  for (int i = threadIdx.x; i < n * D;"),
        ("load_transposing(qt, p.q, p.q0, p.s, p.q_row, p.d);", "load_transposing(qt, p.q, p.q0, p.s, p.q_row, p.d, BM);"),
    ]
    for old, new in swaps:
        assert old in text, old
        text = text.replace(old, new)
    return text


def main() -> None:
    import cupy as cp
    import torch

    out = sys.argv[1]
    modules = {}
    for name, (rows, min_blocks) in VARIANTS.items():
        modules[name] = (cp.RawModule(code=variant_source(rows, min_blocks), options=("-std=c++17", f"-I{SOURCE.parent}")), rows)
    results, calls = [], []
    for entry, b, h, s, causal, layout in CASES:
        gen = torch.Generator(device="cuda").manual_seed(s + b)
        q, k, v = (torch.randn(b, h, s, D, device="cuda", generator=gen) for _ in range(3))
        scale = 1.0 / D**0.5
        if layout == "kt":
            tensors, o_shape = (q.contiguous(), k.transpose(-1, -2).contiguous(), v.contiguous()), (b, s, h, D)
        elif layout == "qkv":
            tensors, o_shape = (torch.stack([x.transpose(1, 2) for x in (q, k, v)], dim=2).contiguous(),), (b, s, h, D)
        else:
            tensors, o_shape = (q, k, v), (b, h, s, D)
        expected = q.double() @ k.double().transpose(-1, -2) * scale
        if causal:
            expected = expected.masked_fill(~torch.ones(s, s, dtype=torch.bool, device="cuda").tril(), float("-inf"))
        expected = expected.softmax(-1) @ v.double()
        for name, (module, rows) in modules.items():
            fn = module.get_function(entry)
            fn.max_dynamic_shared_size_bytes = 69632
            o = cp.full(o_shape, np.nan, dtype=np.float32)
            args = (*(cp.asarray(t) for t in tensors), o) + (() if entry == "attention_f32" else (np.float32(scale),)) + tuple(
                np.int32(x) for x in (b, h, s, D))

            def launch(fn=fn, args=args, grid=((s + rows - 1) // rows, h, b), threads=rows * 4):
                fn(grid, (threads, 1, 1), args, shared_mem=69632)

            launch()
            torch.cuda.synchronize()
            got = torch.as_tensor(o, device="cuda")
            got = got.transpose(1, 2) if layout != "bhsd" else got
            err = float((got.double() - expected).norm() / expected.norm())
            key = f"{entry} b{b} s{s} | {name}"
            results.append({"key": key, "error": err})
            calls.append((key, launch))
    per = {key: [] for key, _ in calls}
    for _ in range(ROUNDS):
        for key, fn in calls:
            per[key].append(_kernel_us(torch, fn) / REPS)
    for r in results:
        r["device_us"] = statistics.median(per[r["key"]])
        print(f"{r['key']:<56} {r['device_us']:8.1f} us  err {r['error']:.1e}", flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
