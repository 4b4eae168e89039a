"""The library attention_f16 (wgmma + TMA on sm_90a) and attention_kt_f16 (K^T [b, h, d, s]: the mma.sync path, as every layout variant) against torch SDPA (flash, efficient) at model shapes, for Nsight Compute:

    ncu --metrics gpu__time_duration.sum,launch__grid_size --csv python attention_layouts.py ATTENTION_BUILD
"""
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import kitdispatch as kd

m = kd.load_module(Path(sys.argv[1]) / "attention.vmfb")
dev = m.device
rng = np.random.default_rng(0)
for b, h, s, d in [(1, 12, 128, 64), (1, 12, 197, 64), (1, 12, 512, 64), (8, 12, 197, 64), (8, 12, 512, 64), (1, 32, 128, 128)]:
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float16) for _ in range(3))
    kt = np.ascontiguousarray(k.transpose(0, 1, 3, 2))
    dq, dk, dv, dkt = dev.put(q), dev.put(k), dev.put(v), dev.put(kt)
    for _ in range(3):
        o = m.attention_f16(dq, dk, dv)
    for _ in range(3):
        o2 = m.attention_kt_f16(dq, dkt, dv, float(1 / np.sqrt(d)))
    tq, tk, tv = (torch.from_numpy(a).cuda() for a in (q, k, v))
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        with sdpa_kernel(backend):
            for _ in range(3):
                ref = F.scaled_dot_product_attention(tq, tk, tv)
    torch.cuda.synchronize()
    got = np.asarray(o.to_host() if hasattr(o, "to_host") else o).astype(np.float32)
    print(b, h, s, d, "kit vs torch max abs", float(np.abs(got - ref.float().cpu().numpy()).max()), flush=True)
