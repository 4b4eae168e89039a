"""The library GEMM against cuBLAS at small model shapes (issue 25 item 1, round 29), on the GPU
machine. Objects from benchmarks/investigations/gemm_small_build.sh (compiled with nvcc here).

    python benchmarks/investigations/gemm_small.py OBJDIR cublas|sweep|trace|xpcheck|xptrace

cublas: what torch.matmul launches at each shape (kernel names, grid, block, registers, shared
        memory, device time: the CUPTI records of torch.profiler).
sweep:  at each shape, every config of the new kernels (configs.py's and gemm_small_configs.cu's
        xp_*) interleaved with cuBLAS, then the old kernels' configs interleaved with cuBLAS
        (one kernel name in two modules: separate passes); CUPTI device time, median of 30;
        each result checked against a float64 reference (rel L2 error <= 2e-3).
trace:  the new_trace variant: per CTA, clock64 at each phase (KITGEMM_MARK in gemm.cuh).
xpcheck: every xp_* config on odd shapes (the mma.sync path, partial tiles) against float64.
xptrace: the xp_* configs' phases, from OBJDIR/xp_trace.cubin (gemm_small_configs.cu, -DKITGEMM_TRACE).
"""

import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import gemm as G  # noqa: E402
import gemm_floor as F  # noqa: E402

LINEAR = [(768, 768), (2304, 768), (3072, 768), (768, 3072), (4096, 4096), (11008, 4096), (4096, 11008)]
# $GEMM_SMALL_M: other token counts (comma separated) for the sweep
SHAPES = [(m, n, k) for m in map(int, os.environ.get("GEMM_SMALL_M", "128,512").split(",")) for n, k in LINEAR]
XP = {"xp_t128x128_k4": (128, 128, 4), "xp_t128x64_k8": (128, 64, 8), "xp_t128x256_k2": (128, 256, 2),
      "xp_t64x64_k2": (64, 64, 2), "xp_t64x128_k1": (64, 128, 1), "xp_t64x128_k2": (64, 128, 2),
      "xp_t64x192_k1": (64, 192, 1), "xp_t128x192_k1": (128, 192, 1), "xp_t128x96_k1": (128, 96, 1)}
# Round 37's other experiments (narrow tiles xp_t64x32_k1, xp_t64x16_k1; A-tile multicast
# clusters xp_t64x64_mc2 ...; benchmarks/results/gemm-small-h100-round37.txt) are in commit
# a69ec39's gemm.cuh and gemm_small_configs.cu, not in this tree.


def xp_call(xp, name, a, b, c, m, n, k, symbol=None):
    """(a call of xp_* kernel `name` of module `xp` (its `symbol` there, if another): c = a @ b^T, its grid)."""
    tm, bn, s = XP[name]
    f, smem = xp.get_function(symbol or name), F.launch_smem()
    f.max_dynamic_shared_size_bytes = smem
    args = (G.cp.asarray(a), G.cp.asarray(b), G.cp.asarray(c), G.np.int32(m), G.np.int32(n), G.np.int32(k))
    grid = ((n + bn - 1) // bn, (m + tm - 1) // tm, s)
    return (lambda: f(grid, (384, 1, 1), args, shared_mem=smem)), grid


def operands(m, n, k):
    torch = G.torch
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", generator=g).half()
    b = torch.randn(n, k, device="cuda", generator=g).half()
    return a, b, a.double() @ b.double().t()


def step_cublas(objdir):
    torch = G.torch
    from torch.profiler import ProfilerActivity, profile

    for (m, n, k) in SHAPES:
        a, b, _ = operands(m, n, k)
        for _ in range(3):
            a @ b.t()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                a @ b.t()
            torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        prof.export_chrome_trace(path)
        trace = json.load(open(path))
        os.unlink(path)
        kev = [ev for ev in trace.get("traceEvents", []) if ev.get("cat") == "kernel" and ev.get("ph") == "X"]
        per = {}
        for ev in kev:
            a_ = ev.get("args", {})
            key = (ev["name"], tuple(a_.get("grid", [])), tuple(a_.get("block", [])), a_.get("registers per thread"),
                   a_.get("shared memory"))
            per.setdefault(key, []).append(float(ev["dur"]))
        for (name, grid, block, regs, smem), ds in per.items():
            G.log(f"CUBLAS {m}x{n}x{k}: {len(ds) // 10} per call, {statistics.median(ds):.2f} us, grid {list(grid)} "
                  f"block {list(block)} regs {regs} smem {smem} | {name}")


def step_sweep(objdir):
    torch = G.torch
    vs = F.variants(objdir)
    # xp.cubin, and xp<tag>.cubin: the same configs built with other flags and -DXP_PREFIX=xp<tag>
    # (kernels xp<tag>_t64x64_k2 ...: CUPTI tells kernels apart by name)
    xps = {f[2:-6]: G.cp.RawModule(path=os.path.join(objdir, f))
           for f in sorted(os.listdir(objdir)) if f.startswith("xp") and f.endswith(".cubin") and "trace" not in f}
    for (m, n, k) in SHAPES:
        a, b, ref = operands(m, n, k)
        res = {}
        for vn in ("new", "old"):
            if vn not in vs:  # a build of this tree alone (gemm_small_build.sh's `new` and xp.cubin)
                continue
            K = vs[vn]
            calls, outs = [], {}
            for cfg in G.CONFIGS:
                bn, s, _ = G.CONFIGS[cfg]
                if s > 1 and k < 128 * s or not K.has(G.gen_manifest.kernel_name("matmul", "nt", "f16", "f16", "none", cfg)):
                    continue
                c = torch.empty(m, n, device="cuda", dtype=torch.half)
                outs[cfg or "t128x256"] = c
                calls.append((cfg or "t128x256", F.call(K, cfg, a, b, c, m, n, k),
                              G.gen_manifest.kernel_name("matmul", "nt", "f16", "f16", "none", cfg)))
            for tag, xp in xps.items() if vn == "new" else ():
                for name in XP:
                    key = "xp" + tag + name[2:]
                    c = outs[key] = torch.empty(m, n, device="cuda", dtype=torch.half)
                    calls.append((key, xp_call(xp, name, a, b, c, m, n, k, key)[0], key))
            cublas, kit, best, bad = F.against_cublas(calls, outs, ref, a, b)
            res[vn] = (cublas, kit)
            G.log(f"SWEEP {vn} {m}x{n}x{k}: cublas {cublas:.2f} | " + " ".join(f"{key}={v:.2f}" for key, v in kit.items())
                  + f" | best {best} {cublas / kit[best]:.2f}x" + (f" BAD {list(bad)} {list(bad.values())}" if bad else ""))
        chosen = G.choose_config(m, n, k) or "t128x256"
        if "old" not in res:
            continue
        (cn, kn), (co, ko) = res["new"], res["old"]
        was = OLD_CHOICE.get((m, n, k), chosen)
        G.log(f"CHOSEN {m}x{n}x{k}: old {was} {ko[was]:.2f} (cublas {co:.2f}, {co / ko[was]:.2f}x) -> "
              f"new {chosen} {kn[chosen]:.2f} (cublas {cn:.2f}, {cn / kn[chosen]:.2f}x)")


# choose_config of main (before this round) at SHAPES, where it differs from this tree's
OLD_CHOICE = {(128, 768, 768): "t128x64_k4", (128, 2304, 768): "t128x64_k2", (128, 3072, 768): "t128x64_k2",
              (128, 768, 3072): "t128x64_k4", (128, 4096, 4096): "t128x64_k2", (128, 11008, 4096): "t128x128",
              (128, 4096, 11008): "t128x64_k2", (512, 768, 768): "t128x64_k2", (512, 2304, 768): "t128x128",
              (512, 3072, 768): "t128x128", (512, 768, 3072): "t128x64_k2", (512, 4096, 4096): "t128x128",
              (512, 11008, 4096): "t128x128", (512, 4096, 11008): "t128x128"}


TRACE = [((128, 768, 768), "t128x64_k4"), ((128, 768, 768), "t64x64"), ((512, 768, 768), "t64x64"),
         ((128, 768, 3072), "t64x64_k4"), ((128, 4096, 4096), "t128x64_k2")]


def step_trace(objdir):
    torch = G.torch
    K = F.variants(objdir)["new_trace"]
    for (m, n, k), cfg in TRACE:
        a, b, _ = operands(m, n, k)
        c = torch.empty(m, n, device="cuda", dtype=torch.half)
        fn = F.call(K, cfg, a, b, c, m, n, k)
        nb, summary = F.trace_summary(K, fn, cfg, m, n, k)
        G.log(f"TRACE new_trace {m}x{n}x{k} {cfg} ({nb} CTAs): {summary}")


XP_ODD_SHAPES = [(130, 333, 77), (130, 336, 200), (77, 48, 4096)]  # k = 77: the mma.sync path; n = 333, 48: partial tiles


def step_xp_check(objdir):
    """Every xp_* config on odd shapes (the mma.sync path at k = 77, partial tiles on TMA),
    output poisoned with NaN first, against float64."""
    torch = G.torch
    xp = G.cp.RawModule(path=os.path.join(objdir, "xp.cubin"))
    for (m, n, k) in XP_ODD_SHAPES:
        a, b, ref = operands(m, n, k)
        for name in XP:
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.half)
            xp_call(xp, name, a, b, c, m, n, k)[0]()
            torch.cuda.synchronize()
            err = G.rel_err(c, ref)
            G.log(f"XPCHECK {m}x{n}x{k} {name}: rel err {err:.2e} {'ok' if err <= 2e-3 else 'BAD'}")


XP_TRACE = [(128, 768, 768), (512, 768, 768)]


def step_xp_trace(objdir):
    """The xp_* configs' phases (xp_trace.cubin: gemm_small_configs.cu with -DKITGEMM_TRACE)."""
    torch = G.torch
    xp = G.cp.RawModule(path=os.path.join(objdir, "xp_trace.cubin"))
    for (m, n, k) in XP_TRACE:
        a, b, _ = operands(m, n, k)
        for name in XP:
            c = torch.empty(m, n, device="cuda", dtype=torch.half)
            call, grid = xp_call(xp, name, a, b, c, m, n, k)
            nb = grid[0] * grid[1] * grid[2]
            line = F.trace_line(xp, call, nb)
            G.log(f"TRACE {m}x{n}x{k} {name} ({nb} CTAs): {line}")


def main():
    F.investigation_main({"cublas": step_cublas, "sweep": step_sweep, "trace": step_trace, "xpcheck": step_xp_check,
                          "xptrace": step_xp_trace})


if __name__ == "__main__":
    main()
