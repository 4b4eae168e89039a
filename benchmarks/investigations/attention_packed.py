"""The packed-QKV attention entry (qkv [b, s, 3, h, d]) against the [b, s, h, d] one on
contiguous Q, K, V, at GPT-2's shapes: device time per call from CUPTI (torch.profiler, median
of CALLS), each result checked against torch SDPA in f32.

    python attention_packed.py BUILD   # BUILD: a build of kernels/attention (attention.vmfb)
"""

import statistics
import sys
from pathlib import Path

import numpy as np

SHAPES = [(8, 12, 512, 64), (1, 12, 128, 64), (1, 12, 300, 64)]  # (b, h, s, d)
CALLS = 20


def main(build: Path) -> None:
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    import kitdispatch as kd

    module = kd.load_module(build / "attention.vmfb")
    rng = np.random.default_rng(0)
    print(torch.cuda.get_device_name(), flush=True)
    for b, h, s, d in SHAPES:
        qkv = rng.standard_normal((b, s, 3, h, d)).astype(np.float16)
        q, k, v = (np.ascontiguousarray(qkv[:, :, i]) for i in range(3))
        scale = float(np.float16(1 / np.sqrt(d)))
        tq, tk, tv = (torch.from_numpy(x).cuda().float().transpose(1, 2) for x in (q, k, v))
        ref = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, scale=scale).transpose(1, 2).cpu().numpy()
        runs = {
            "attention_causal_qkv_f16": [module.device.put(qkv), scale],
            "attention_causal_bshd_f16": [module.device.put(q), module.device.put(k), module.device.put(v), scale],
        }
        for entry, args in runs.items():
            out = getattr(module, entry)(*args)
            got = np.asarray(out.to_host() if hasattr(out, "to_host") else out).astype(np.float32)
            print(f"{entry} b{b} h{h} s{s} d{d}: max abs error against f32 SDPA {np.abs(got - ref).max():.2e}", flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                for entry, args in runs.items():
                    getattr(module, entry)(*args)
            torch.cuda.synchronize()
        for entry in runs:
            times = [e.device_time for e in prof.events() if e.name.startswith(entry)] or \
                [e.cuda_time for e in prof.events() if e.name.startswith(entry)]
            shown = f"{statistics.median(times):.1f} us (median of {len(times)})" if times else "no kernel seen by CUPTI"
            print(f"{entry} b{b} h{h} s{s} d{d}: device time {shown}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
