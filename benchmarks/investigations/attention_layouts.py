"""The library's attention entries in the layouts HF models give them, in several builds of
kernels/attention, against torch SDPA (flash) at model shapes; each result checked against
torch in f32. For Nsight Compute (device time per kernel):

    ncu --metrics gpu__time_duration.sum --csv python attention_layouts.py old=BUILD1 new=BUILD2 > ncu.csv
    python attention_layouts.py --table ncu.csv old new
"""

import csv
import statistics
import sys
from pathlib import Path

import numpy as np

# (b, h, g, s, d): batch, query heads, K/V heads (the _gqa entries), tokens, head dim
SHAPES = [(1, 12, 4, 128, 64), (1, 12, 4, 197, 64), (8, 12, 4, 197, 64), (4, 12, 4, 256, 64), (1, 12, 4, 384, 64),
          (8, 12, 4, 512, 64), (1, 32, 8, 512, 128), (2, 8, 4, 77, 128), (2, 12, 4, 129, 64)]
ENTRIES = ["attention_f16", "attention_kt_f16", "attention_bshd_f16", "attention_causal_bshd_f16", "attention_gqa_f16",
           "attention_causal_gqa_bshd_f16"]
CALLS = 3


def reference(q, k, v, causal: bool) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v in f32, [b, h, s, d]; k, v may have fewer heads."""
    import torch

    tq, tk, tv = (torch.from_numpy(a).cuda().float() for a in (q, k, v))
    rep = tq.shape[1] // tk.shape[1]
    tk, tv = tk.repeat_interleave(rep, 1), tv.repeat_interleave(rep, 1)
    return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).cpu().numpy()


def inputs(entry: str, q, k, v, kg, vg):
    """The entry's arguments (numpy, its layouts) and whether it is causal; O comes back [b, s, h, d]
    but from attention_f16 ([b, h, s, d])."""
    bshd = lambda a: np.ascontiguousarray(a.transpose(0, 2, 1, 3))  # noqa: E731
    scale = np.float32(np.float16(1 / np.sqrt(q.shape[-1])))
    if entry == "attention_f16":
        return (q, k, v), False
    if entry == "attention_kt_f16":
        return (q, np.ascontiguousarray(k.transpose(0, 1, 3, 2)), v, scale), False
    if entry in ("attention_bshd_f16", "attention_causal_bshd_f16"):
        return (bshd(q), bshd(k), bshd(v), scale), "causal" in entry
    if entry == "attention_gqa_f16":
        return (q, kg, bshd(vg), scale), False
    return (q, bshd(kg), bshd(vg), scale), True


def run(builds: dict[str, Path]) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import kitdispatch as kd

    modules = {name: kd.load_module(folder / "attention.vmfb") for name, folder in builds.items()}
    rng = np.random.default_rng(0)
    for b, h, g, s, d in SHAPES:
        q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float16) for _ in range(3))
        kg, vg = (rng.standard_normal((b, g, s, d)).astype(np.float16) for _ in range(2))
        for name, module in modules.items():
            for entry in ENTRIES:
                args, causal = inputs(entry, q, k, v, kg, vg)
                device_args = [module.device.put(a) if isinstance(a, np.ndarray) else float(a) for a in args]
                for _ in range(CALLS):
                    out = getattr(module, entry)(*device_args)
                got = np.asarray(out.to_host() if hasattr(out, "to_host") else out).astype(np.float32)
                if entry != "attention_f16":
                    got = got.transpose(0, 2, 1, 3)
                grouped = "gqa" in entry
                ref = reference(q, kg if grouped else k, vg if grouped else v, causal)
                print(f"{name} {entry} b{b} h{h} s{s} d{d}: max abs error against f32 {np.abs(got - ref).max():.2e}", flush=True)
        tq, tk, tv = (torch.from_numpy(a).cuda() for a in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for _ in range(CALLS):
                F.scaled_dot_product_attention(tq, tk, tv)
        torch.cuda.synchronize()


def table(ncu_csv: Path, names: list[str]) -> None:
    lines = ncu_csv.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = [r for r in csv.DictReader(lines[start:]) if r["Metric Name"] == "gpu__time_duration.sum"]
    times = [(r["Kernel Name"].split("(")[0], float(r["Metric Value"].replace(",", "")) / 1000) for r in rows]
    kit = [t for t in times if t[0].startswith("attention")]
    torch = [t for t in times if "flash" in t[0]]
    per_shape = len(names) * len(ENTRIES) * CALLS
    print("b h g s d | entry | " + " | ".join(names) + "   (us, median of 3)")
    for n, shape in enumerate(SHAPES):
        block = kit[n * per_shape:(n + 1) * per_shape]
        for e, entry in enumerate(ENTRIES):
            cells = []
            for j in range(len(names)):
                start = (j * len(ENTRIES) + e) * CALLS
                cells.append(f"{statistics.median(t for _, t in block[start:start + CALLS]):7.1f}")
            print(" ".join(map(str, shape)), "|", entry, "|", " | ".join(cells))
    print("torch flash kernels (a call is 1 or 2), in order:", [round(t, 1) for _, t in torch])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        table(Path(sys.argv[2]), sys.argv[3:])
    else:
        run({arg.split("=", 1)[0]: Path(arg.split("=", 1)[1]) for arg in sys.argv[1:]})
