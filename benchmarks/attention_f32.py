"""kernels/attention_f32 against PyTorch's f32 attention, at the shapes of f32 BERT and GPT-2 layers.

Each case runs, on the same inputs, interleaved in one process:
- kit: the library entry (launched directly from its built object with CuPy, as IREE launches it);
- torch sdpa: `scaled_dot_product_attention` in f32 (PyTorch picks its backend: memory-efficient
  attention for f32 on sm_80+);
- torch eager: Q K^T * scale (+ mask), softmax, P V as three ops (what an eager BERT/GPT-2 layer
  runs), TF32 off.
Results are checked against float64 first (relative L2 error <= 2e-5). Device time per call comes
from CUPTI (torch.profiler): every kernel a call launches, summed; the median of ROUNDS rounds of
REPS calls, the implementations in turn.

    python benchmarks/attention_f32.py BUILD/attention_f32 OUT.json   # on the GPU machine
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys
import tempfile

import numpy as np

# (label, entry, b, h, s, d, causal, layout): BERT's layers read K as K^T and write O [b, s, h, d]
# (_kt), GPT-2's read Q, K and V from one packed projection (_qkv); the plain [b, h, s, d] entry.
CASES = [
    ("BERT b1 s128", "attention_kt_f32", 1, 12, 128, 64, False, "kt"),
    ("BERT b1 s512", "attention_kt_f32", 1, 12, 512, 64, False, "kt"),
    ("BERT b8 s512", "attention_kt_f32", 8, 12, 512, 64, False, "kt"),
    ("GPT-2 b1 s128", "attention_causal_qkv_f32", 1, 12, 128, 64, True, "qkv"),
    ("GPT-2 b1 s512", "attention_causal_qkv_f32", 1, 12, 512, 64, True, "qkv"),
    ("GPT-2 b8 s512", "attention_causal_qkv_f32", 8, 12, 512, 64, True, "qkv"),
    ("b1 h12 s2048 d64", "attention_f32", 1, 12, 2048, 64, False, "bhsd"),
    ("b1 h12 s2048 d64 causal", "attention_causal_f32", 1, 12, 2048, 64, True, "bhsd"),
]
THREADS, ROWS, SMEM = 256, 64, 69632  # kernels/attention_f32/kitdispatch.toml
TOL = 2e-5
REPS = 20  # calls per profiled round
ROUNDS = 7


def main() -> None:
    import cupy as cp
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    build, out = sys.argv[1], sys.argv[2]
    module = cp.RawModule(path=min(glob.glob(os.path.join(build, "attention_f32*.fatbin"))))
    F = torch.nn.functional
    rows, calls = [], []
    for label, entry, b, h, s, d, causal, layout in CASES:
        gen = torch.Generator(device="cuda").manual_seed(s + b)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=gen) for _ in range(3))
        scale = 1.0 / d**0.5
        args, o = _kit_arguments(cp, q, k, v, layout)
        fn = module.get_function(entry)
        fn.max_dynamic_shared_size_bytes = SMEM
        scalars = (np.int32(b), np.int32(h), np.int32(s), np.int32(d))
        kit_args = (*args, o) + (() if entry in ("attention_f32", "attention_causal_f32") else (np.float32(scale),)) + scalars
        grid = ((s + ROWS - 1) // ROWS, h, b)

        def kit(fn=fn, grid=grid, kit_args=kit_args):
            fn(grid, (THREADS, 1, 1), kit_args, shared_mem=SMEM)

        def sdpa(q=q, k=k, v=v, causal=causal):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        mask = torch.triu(torch.full((s, s), float("-inf"), device="cuda"), 1) if causal else None

        def eager(q=q, k=k, v=v, mask=mask, scale=scale):
            scores = q @ k.transpose(-1, -2) * scale
            if mask is not None:
                scores = scores + mask
            return torch.softmax(scores, -1) @ v

        kit()
        torch.cuda.synchronize()
        got = torch.as_tensor(o, device="cuda")
        got = got.transpose(1, 2) if layout in ("kt", "qkv") else got  # O [b, s, h, d] -> [b, h, s, d]
        expected = _reference(q, k, v, causal, scale)
        errors = {name: _rel_err(x, expected) for name, x in (("kit", got), ("torch sdpa", sdpa()), ("torch eager", eager()))}
        assert errors["kit"] <= TOL, f"{label}: kit's relative error {errors['kit']:.2e} > {TOL}"
        rows.append({"case": label, "entry": entry, "b": b, "h": h, "s": s, "d": d, "causal": causal, "errors": errors})
        calls += [((label, "kit"), kit, entry), ((label, "torch sdpa"), sdpa, None), ((label, "torch eager"), eager, None)]
    times = _device_times(torch, calls)
    for row in rows:
        row["device_us"] = {name: times[(row["case"], name)] for name in ("kit", "torch sdpa", "torch eager")}
    _report(rows)
    with open(out, "w") as f:
        json.dump({"environment": _environment(torch, cp), "cases": rows}, f, indent=1)


def _kit_arguments(cp, q, k, v, layout):
    """The entry's tensor arguments (CuPy views of torch tensors) and its output."""
    b, h, s, d = q.shape
    bshd = lambda x: x.transpose(1, 2).contiguous()
    if layout == "kt":
        tensors, o_shape = (q.contiguous(), k.transpose(-1, -2).contiguous(), v.contiguous()), (b, s, h, d)
    elif layout == "qkv":
        tensors, o_shape = (torch_stack(bshd(q), bshd(k), bshd(v)),), (b, s, h, d)
    else:
        tensors, o_shape = (q, k, v), (b, h, s, d)
    o = cp.full(o_shape, np.nan, dtype=np.float32)
    return tuple(cp.asarray(t) for t in tensors), o


def torch_stack(*xs):
    import torch

    return torch.stack(xs, dim=2).contiguous()  # [b, s, 3, h, d]


def _reference(q, k, v, causal, scale):
    q, k, v = (x.double() for x in (q, k, v))
    scores = q @ k.transpose(-1, -2) * scale
    if causal:
        s = q.shape[-2]
        scores = scores.masked_fill(~q.new_ones((s, s), dtype=bool).tril(), float("-inf"))
    return scores.softmax(-1) @ v


def _rel_err(got, expected) -> float:
    got = got.double()
    return float((got - expected).norm() / expected.norm())


def _device_times(torch, calls):
    """Median device time (us) per call key: rounds of REPS calls of each in turn (interleaved),
    each round profiled on its own (CUPTI, torch.profiler) and its kernels summed."""
    for _, fn, _ in calls:
        fn()
    torch.cuda.synchronize()
    per = {key: [] for key, _, _ in calls}
    for _ in range(ROUNDS):
        for key, fn, _ in calls:
            per[key].append(_kernel_us(torch, fn) / REPS)
    return {key: statistics.median(v) for key, v in per.items()}


def _kernel_us(torch, fn) -> float:
    """The summed duration of every kernel REPS calls of `fn` launch."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    return sum(float(e["dur"]) for e in events if e.get("cat") == "kernel" and e.get("ph") == "X")


def _report(rows) -> None:
    print(f"{'case':<26} {'entry':<26} {'kit us':>8} {'sdpa us':>8} {'eager us':>9} {'sdpa/kit':>9} {'eager/kit':>9}  kit err")
    for r in rows:
        t = r["device_us"]
        print(f"{r['case']:<26} {r['entry']:<26} {t['kit']:8.1f} {t['torch sdpa']:8.1f} {t['torch eager']:9.1f} "
              f"{t['torch sdpa'] / t['kit']:9.2f} {t['torch eager'] / t['kit']:9.2f}  {r['errors']['kit']:.1e}")


def _environment(torch, cp) -> dict:
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda, "cupy": cp.__version__,
            "driver": cp.cuda.runtime.driverGetVersion()}


if __name__ == "__main__":
    main()
