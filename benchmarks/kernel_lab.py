"""Kernel lab for the tensor-core kernels (development, on the GPU machine): loads compiled
objects (a kit-built fatbin, or nvcc cubins/PTX of variants) with CuPy, checks them against
torch in float64 over many shapes, and times them against torch (cuBLAS, SDPA's flash and cuDNN
backends) with CUDA events, kit and torch interleaved. Each step runs in its own process, with a
timeout, so a fault or hang in one variant cannot take the others down.

    python benchmarks/kernel_lab.py all OUTDIR PLAN.json   # steps listed in PLAN, logs in OUTDIR
    python benchmarks/kernel_lab.py STEP ARGS...           # one step, e.g.
    python benchmarks/kernel_lab.py gemm_time build/matmul/matmul.sm_90a_sm_80.fatbin final 4096,8192

PLAN.json is a list of {"args": [STEP, ARGS...], "timeout": seconds}. Steps: env, gemm, gemm_time,
att, att_time (see the step_* functions). Its last H100 run is
benchmarks/results/kernels-lab.txt.
"""

import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SMEM = 100352


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------- helpers


def setup():
    global torch, cp, np
    import cupy as cp
    import numpy as np
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch, cp


def dtype_of(name):
    import torch

    return {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[name]


def gemm_types(name):
    parts = name.split("_")[1:]
    return parts[0], (parts[1] if len(parts) > 1 else "f32")


def load(path, names):
    mod = cp.RawModule(path=path)
    fns = {}
    for n in names:
        f = mod.get_function(n)
        f.max_dynamic_shared_size_bytes = SMEM
        fns[n] = f
    return fns


def bench(fn, iters=30, warmup=5):
    """(median, min, max) device time in us of `iters` launches (CUDA events)."""
    from kernels import event_times_us  # benchmarks/kernels.py, beside this file

    ts = event_times_us(torch, fn, iters, warmup)
    return ts[len(ts) // 2], ts[0], ts[-1]


TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.2e-2}


def rel_err(got, ref):
    got = got.double()
    if torch.isnan(got).any():
        return float("nan")
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# ----------------------------------------------------------------------------- steps


def step_env():
    setup()
    log(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)
    log("torch", torch.__version__, "cuda", torch.version.cuda, "cupy", cp.__version__)
    p = torch.cuda.get_device_properties(0)
    log("device", p.name, "sms", p.multi_processor_count, "cc", p.major, p.minor)
    log("driver", cp.cuda.runtime.driverGetVersion())


GEMM_NAMES = ["matmul_f16", "matmul_bf16", "matmul_f16_f16", "matmul_bf16_bf16", "matmul_f16_bf16", "matmul_bf16_f16"]
SHAPES_ALL = [(256, 256, 64), (300, 1000, 264), (257, 129, 77), (33, 50, 16)]
SHAPES_F16 = [(128, 256, 4096), (1, 8, 8), (1, 1, 1), (129, 264, 8), (1024, 1000, 1000), (2048, 2048, 2048), (4096, 4096, 4096)]


def run_gemm(f, a, b, c, m, n, k):
    f(((n + 255) // 256, (m + 127) // 128, 1), (384, 1, 1),
      (cp.asarray(a), cp.asarray(b), cp.asarray(c), np.int32(m), np.int32(n), np.int32(k)), shared_mem=SMEM)


def step_gemm(path, which="all"):
    setup()
    names = GEMM_NAMES if which == "all" else which.split(",")
    fns = load(path, names)
    bad = 0
    for name in names:
        ti, to = gemm_types(name)
        shapes = SHAPES_ALL + (SHAPES_F16 if name == "matmul_f16_f16" else [])
        for (m, n, k) in shapes:
            torch.manual_seed(m * 7 + n * 3 + k)
            a = torch.randn(m, k, device="cuda").to(dtype_of(ti))
            b = torch.randn(k, n, device="cuda").to(dtype_of(ti))
            c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype_of(to))
            run_gemm(fns[name], a, b, c, m, n, k)
            torch.cuda.synchronize()
            ref = a.double() @ b.double()
            err = rel_err(c, ref)
            ok = err <= TOL[to]
            bad += not ok
            log(f"{'ok ' if ok else 'BAD'} {name:18s} {m:5d}x{n:5d}x{k:5d} rel err {err:.2e}")
    log("GEMM", path, "PASS" if bad == 0 else f"FAIL {bad}")


def step_gemm_time(path, label, sizes="4096,8192"):
    setup()
    fns = load(path, ["matmul_f16_f16", "matmul_bf16_bf16", "matmul_f16"])
    res = []
    for s in [int(x) for x in sizes.split(",")]:
        flop = 2 * s**3
        for name in ["matmul_f16_f16", "matmul_bf16_bf16", "matmul_f16"]:
            ti, to = gemm_types(name)
            a = torch.randn(s, s, device="cuda").to(dtype_of(ti))
            b = torch.randn(s, s, device="cuda").to(dtype_of(ti))
            c = torch.empty(s, s, device="cuda", dtype=dtype_of(to))
            ks, ts = [], []
            for _ in range(3):  # interleaved: clocks and temperature drift alike for both
                ks.append(bench(lambda: run_gemm(fns[name], a, b, c, s, s, s))[0])
                ts.append(bench(lambda: torch.matmul(a, b))[0])
            t, tmin, tmax = sorted(ks)[1], min(ks), max(ks)
            tt = sorted(ts)[1]
            res.append(dict(label=label, size=s, kernel=name, us=t, tflops=flop / t / 1e6, torch_us=tt, torch_tflops=flop / tt / 1e6))
            log(f"{label:10s} {name:18s} {s:5d}^3  kit {t:8.1f} us {flop / t / 1e6:6.1f} TF/s (min {tmin:.1f} max {tmax:.1f})"
                f" | torch {ti}->{ti} {tt:8.1f} us {flop / tt / 1e6:6.1f} TF/s | kit/torch {tt / t * 100:5.1f}%")
            del a, b, c
    print("JSON", json.dumps(res))


ATT_NAMES = ["attention_f16", "attention_causal_f16", "attention_bf16", "attention_causal_bf16"]


def run_att(f, q, k, v, o):
    b, h, s, d = q.shape
    f(((s + 127) // 128, h, b), (384, 1, 1),
      (cp.asarray(q), cp.asarray(k), cp.asarray(v), cp.asarray(o), np.int32(b), np.int32(h), np.int32(s), np.int32(d)),
      shared_mem=SMEM)


def step_att(path):
    setup()
    import torch.nn.functional as F

    fns = load(path, ATT_NAMES)
    bad = 0
    shapes = [(1, 2, 128, 64), (2, 3, 257, 128), (1, 1, 1, 64), (1, 4, 1000, 128), (2, 2, 300, 64), (1, 2, 2048, 128)]
    for name in ATT_NAMES:
        causal = "causal" in name
        dt = dtype_of(name.split("_")[-1])
        for (b, h, s, d) in shapes:
            torch.manual_seed(b + h + s + d)
            q, k, v = (torch.randn(b, h, s, d, device="cuda").to(dt) for _ in range(3))
            o = torch.full_like(q, float("nan"))
            run_att(fns[name], q, k, v, o)
            torch.cuda.synchronize()
            ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
            err = rel_err(o, ref)
            ok = err <= TOL[name.split("_")[-1]]
            bad += not ok
            log(f"{'ok ' if ok else 'BAD'} {name:22s} b{b} h{h} s{s} d{d} rel err {err:.2e}")
    log("ATT", path, "PASS" if bad == 0 else f"FAIL {bad}")


def step_att_time(path, label):
    setup()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fns = load(path, ATT_NAMES)
    res = []
    for (b, h, s, d) in [(4, 16, 4096, 128), (4, 32, 4096, 64), (16, 16, 1024, 128)]:
        for name in ["attention_f16", "attention_causal_f16", "attention_bf16"]:
            causal = "causal" in name
            dt = dtype_of(name.split("_")[-1])
            q, k, v = (torch.randn(b, h, s, d, device="cuda").to(dt) for _ in range(3))
            o = torch.empty_like(q)
            flop = 4 * b * h * s * s * d / (2 if causal else 1)
            t, _, _ = bench(lambda: run_att(fns[name], q, k, v, o), iters=20)
            row = dict(label=label, kernel=name, b=b, h=h, s=s, d=d, us=t, tflops=flop / t / 1e6)
            for backend, key in [(SDPBackend.FLASH_ATTENTION, "flash"), (SDPBackend.CUDNN_ATTENTION, "cudnn")]:
                try:
                    with sdpa_kernel(backend):
                        tt, _, _ = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), iters=20)
                    row[key + "_us"] = tt
                except Exception as exc:  # noqa: BLE001
                    row[key + "_us"] = None
                    log("  ", key, "failed:", str(exc).splitlines()[0])
            res.append(row)
            fl = row.get("flash_us")
            log(f"{label:8s} {name:22s} b{b} h{h} s{s} d{d}: kit {t:8.1f} us {flop / t / 1e6:6.1f} TF/s | flash "
                f"{fl and f'{fl:8.1f} us {flop / fl / 1e6:6.1f} TF/s'} | cudnn {row.get('cudnn_us') and round(row['cudnn_us'], 1)} us"
                f" | kit/flash {fl and f'{fl / t * 100:5.1f}%'}")
    print("JSON", json.dumps(res))


# ----------------------------------------------------------------------------- driver


def step_all(outdir, *plan_file):
    plan = json.load(open(plan_file[0])) if plan_file else []
    results = []
    with open(os.path.join(outdir, "lab.log"), "a") as logf:
        for entry in plan:
            args, timeout = entry["args"], entry.get("timeout", 120)
            t0 = time.time()
            log(f"=== {' '.join(args)}")
            try:
                p = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)
                out, rc = p.stdout + p.stderr, p.returncode
            except subprocess.TimeoutExpired as exc:
                out, rc = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), "TIMEOUT"
            logf.write(f"=== {' '.join(args)} rc={rc} {time.time() - t0:.1f}s\n{out}\n")
            logf.flush()
            summary = [l for l in out.splitlines() if not l.startswith("JSON")]
            tail = summary if len(summary) < 60 else summary[-60:]
            log("\n".join(tail))
            log(f"--- rc={rc} {time.time() - t0:.1f}s")
            for l in out.splitlines():
                if l.startswith("JSON "):
                    results += json.loads(l[5:])
    json.dump(results, open(os.path.join(outdir, "lab.json"), "w"), indent=1)


if __name__ == "__main__":
    step = sys.argv[1]
    globals()["step_" + step](*sys.argv[2:])
