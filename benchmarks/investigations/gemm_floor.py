"""Where the library GEMM's ~7 us floor at small shapes comes from (issue 25 item 1), on the GPU
machine. Objects from benchmarks/investigations/gemm_floor_build.sh (compiled with nvcc here).

    python benchmarks/investigations/gemm_floor.py OBJDIR [time|trace|ncu-target]

configs: split-K configs the library does not generate (gemm_floor_configs.cu) at small shapes.
time:  every variant's f16 NT "none" entries at small model shapes against cuBLAS, interleaved,
       CUPTI device time (benchmarks/gemm.py's kernel_times); the base entries also alone
       (no cuBLAS between them); the floor probes (empty kernels, maps only).
trace: the *_trace variants: per CTA, clock64 at each phase (KITGEMM_MARK in gemm.cuh).
"""

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import gemm as G  # noqa: E402

SHAPES = [(128, 768, 768), (512, 768, 768), (2048, 768, 768), (128, 2304, 768), (128, 768, 3072)]
CFGS = ["t128x64_k4", "t128x128", "t128x128_k2", ""]


class Variant:
    def __init__(self, path):
        self.mod = G.cp.RawModule(path=path)
        self.fns = {}

    def has(self, name):
        try:
            self.get(name)
        except Exception:  # noqa: BLE001  (CUDA_ERROR_NOT_FOUND: not in this module)
            return False
        return True

    def get(self, name):
        if name not in self.fns:
            f = self.mod.get_function(name)
            f.max_dynamic_shared_size_bytes = launch_smem()
            self.fns[name] = f
        return self.fns[name]

    def smem(self, e):
        """The launch's dynamic shared memory for entry `e` (G.Kernels.smem's answer, or $KITGEMM_LAUNCH_SMEM)."""
        return launch_smem(e)


LIBRARY_SMEM = {"smem": G.SMEM, "smem_sm90a": G.gen_manifest.SMEM_SM90A}  # the manifest's table of every generated entry


def launch_smem(e=LIBRARY_SMEM):
    """The dynamic shared memory entry `e` gets on this GPU (the manifest's table), or
    $KITGEMM_LAUNCH_SMEM (a build with another KITGEMM_DYNAMIC_SMEM)."""
    if os.environ.get("KITGEMM_LAUNCH_SMEM"):
        return int(os.environ["KITGEMM_LAUNCH_SMEM"])
    return G.gen_manifest.launch_shared_memory(e, G.device_capability()) if "smem" in e else G.SMEM


def variants(objdir):
    out = {}
    for v in sorted(os.listdir(objdir)):
        p = os.path.join(objdir, v, "matmul_nt.cubin")
        if os.path.exists(p):
            out[v] = Variant(p)
    return out


def call(K, cfg, a, b, c, m, n, k):
    e = G.parse(G.gen_manifest.kernel_name("matmul", "nt", "f16", "f16", "none", cfg))
    return G.launcher(K, e, a, b, c, None, None, None, 1, m, n, k)


def step_time(objdir):
    torch = G.torch
    vs = {k: v for k, v in variants(objdir).items() if not k.endswith("_trace") and k != "mma"}
    for (m, n, k) in SHAPES:
        a = torch.randn(m, k, device="cuda").half()
        b = torch.randn(n, k, device="cuda").half()
        ref = a.double() @ b.double().t()
        cfgs = [c for c in CFGS if not (G.CONFIGS[c][1] > 1 and k < 128 * G.CONFIGS[c][1])]
        for cfg in cfgs:
            calls, outs = [], {}
            for vn, K in vs.items():
                c = torch.empty(m, n, device="cuda", dtype=torch.half)
                outs[vn] = c
                name = G.gen_manifest.kernel_name("matmul", "nt", "f16", "f16", "none", cfg)
                # one kernel name in several modules: time each variant in its own pass
                t = G.kernel_times([(vn, call(K, cfg, a, b, c, m, n, k), name), ("cublas", lambda: a @ b.t(), None)], 30)
                calls.append((vn, t[vn], t["cublas"]))
            errs = {vn: G.rel_err(c, ref) for vn, c in outs.items()}
            txt = " ".join(f"{vn}={t:.2f}" + ("" if errs[vn] <= 2e-3 else f"(BAD {errs[vn]:.1e})") for vn, t, _ in calls)
            cb = statistics.median(x for _, _, x in calls)
            G.log(f"TIME {m}x{n}x{k} {cfg or 't128x256'}: cublas {cb:.2f} | {txt}")
        # the base entries alone, back to back
        K = vs["new"]
        c = torch.empty(m, n, device="cuda", dtype=torch.half)
        for cfg in cfgs:
            name = G.gen_manifest.kernel_name("matmul", "nt", "f16", "f16", "none", cfg)
            t = G.kernel_times([("x", call(K, cfg, a, b, c, m, n, k), name)], 30)
            G.log(f"ALONE {m}x{n}x{k} {cfg or 't128x256'}: new {t['x']:.2f}")
    probes(objdir)


def probes(objdir):
    torch = G.torch
    mod = G.cp.RawModule(path=os.path.join(objdir, "floor.cubin"))
    a = torch.randn(128, 768, device="cuda").half()
    b = torch.randn(768, 768, device="cuda").half()
    fns = {}
    for name in ("floor_plain", "floor_cluster4", "floor_maps"):
        f = mod.get_function(name)
        f.max_dynamic_shared_size_bytes = G.SMEM
        fns[name] = f
    z = G.np.int32(0)
    runs = {
        "floor_plain": lambda: fns["floor_plain"]((12, 1, 4), (384, 1, 1), (z,), shared_mem=G.SMEM),
        "floor_cluster4": lambda: fns["floor_cluster4"]((12, 1, 4), (384, 1, 1), (z,), shared_mem=G.SMEM),
        "floor_maps": lambda: fns["floor_maps"]((12, 1, 4), (384, 1, 1), (G.cp.asarray(a), G.np.int32(128), G.np.int32(768), z),
                                                shared_mem=G.SMEM),
    }
    for name, fn in runs.items():
        alone = G.kernel_times([(name, fn, name)], 30)[name]
        inter = G.kernel_times([(name, fn, name), ("cublas", lambda: a @ b.t(), None)], 30)
        G.log(f"PROBE {name} grid 12x1x4: alone {alone:.2f} us, interleaved with cuBLAS {inter[name]:.2f} us (cuBLAS {inter['cublas']:.2f})")


PHASES = [(0, 1, "init+sync+setmaxnreg"), (1, 2, "maps built"), (2, 3, "maps published"), (3, 4, "maps acquired"),
          (4, 5, "first stage landed (consumer)"), (0, 5, "entry to first stage"), (5, 6, "main loop"),
          (6, 8, "epilogue: staged, synced"), (8, 9, "epilogue: summed, stored"), (9, 7, "epilogue: last sync"),
          (0, 7, "CTA total")]


def step_trace(objdir):
    torch = G.torch
    for vn, K in variants(objdir).items():
        if not vn.endswith("_trace"):
            continue
        for (m, n, k) in SHAPES[:4]:
            a = torch.randn(m, k, device="cuda").half()
            b = torch.randn(n, k, device="cuda").half()
            c = torch.empty(m, n, device="cuda", dtype=torch.half)
            for cfg in ["t128x64_k4", "t128x128", ""]:
                fn = call(K, cfg, a, b, c, m, n, k)
                nb, summary = trace_summary(K, fn, cfg, m, n, k)
                G.log(f"TRACE {vn} {m}x{n}x{k} {cfg or 't128x256'} ({nb} CTAs): {summary}")


def trace_summary(K, fn, cfg, m, n, k):
    """(CTAs, a line of median phase times) of one traced call `fn` of config `cfg`: the
    kitgemm_trace buffer of a _trace build (clock64 and globaltimer stamps per CTA)."""
    e = G.parse(G.gen_manifest.kernel_name("matmul", "nt", "f16", "f16", "none", cfg))
    tm = e.get("tm", 128)
    nb = ((n + e["bn"] - 1) // e["bn"]) * ((m + tm - 1) // tm) * e["s"]
    return nb, trace_line(K.mod, fn, nb)


def trace_line(mod, fn, nb):
    """A line of median phase times of one traced call `fn` of the first `nb` CTAs of a _trace
    build's module `mod`."""
    torch = G.torch
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    buf = mod.get_global("_ZN7kitgemm13kitgemm_traceE")
    G.cp.cuda.runtime.memset(buf.ptr, 0, 4096 * 12 * 8)
    fn()
    torch.cuda.synchronize()
    tr = G.cp.ndarray((4096, 12), dtype=G.cp.uint64, memptr=buf).get().astype("int64")
    tr = tr[:nb]
    rates = [(r[7] - r[0]) / (r[11] - r[10]) for r in tr if r[7] and r[0] and r[11] > r[10]]
    ghz = statistics.median(rates) if rates else 1.98
    parts = [f"clock64/globaltimer {ghz:.2f} GHz"]
    for i, j, label in PHASES:
        d = [int(r[j] - r[i]) for r in tr if r[i] and r[j]]
        if d:
            parts.append(f"{label} {statistics.median(d) / ghz:.0f} ns (max {max(d) / ghz:.0f})")
    starts = [int(r[10]) for r in tr if r[10]]
    ends = [int(r[11]) for r in tr if r[11]]
    if starts and ends:
        parts.append(f"entry spread {max(starts) - min(starts)} ns, first entry to last exit {max(ends) - min(starts)} ns")
    return "; ".join(parts)


XP = {"xp_t128x128_k4": (128, 4), "xp_t128x128_k8": (128, 8), "xp_t128x64_k2": (64, 2), "xp_t128x64_k8": (64, 8),
      "xp_t128x256_k2": (256, 2)}
XP_SHAPES = [(128, 768, 768), (512, 768, 768), (128, 2304, 768), (128, 3072, 768), (512, 2304, 768), (128, 768, 3072),
             (2048, 768, 768), (128, 4096, 4096), (512, 768, 3072), (512, 4096, 4096)]


def against_cublas(calls, outs, ref, a, b, reps=30):
    """The kit calls (key, fn, kernel name) interleaved with cuBLAS's a @ b.t(), CUPTI device time
    (G.kernel_times), each kit result in outs[key] checked against ref (rel L2 error <= 2e-3):
    (cuBLAS us, {key: kit us}, the fastest key, {key: error} of the results that are off)."""
    t = G.kernel_times(calls + [("cublas", lambda: a @ b.t(), None)], reps)
    errs = {key: G.rel_err(c, ref) for key, c in outs.items()}
    kit = {key: v for key, v in t.items() if key != "cublas"}
    return t["cublas"], kit, min(kit, key=kit.get), {key: e for key, e in errs.items() if not e <= 2e-3}


def step_configs(objdir):
    """Other (BN, S) split-K configs (gemm_floor_configs.cu) against the library's, one pass per shape."""
    torch = G.torch
    xp = G.cp.RawModule(path=os.path.join(objdir, "xp.cubin"))
    K = variants(objdir)["new"]
    for (m, n, k) in XP_SHAPES:
        a = torch.randn(m, k, device="cuda").half()
        b = torch.randn(n, k, device="cuda").half()
        ref = a.double() @ b.double().t()
        calls, outs = [], {}
        for cfg in CFGS:
            c = torch.empty(m, n, device="cuda", dtype=torch.half)
            outs[cfg or "t128x256"] = c
            calls.append((cfg or "t128x256", call(K, cfg, a, b, c, m, n, k),
                          G.gen_manifest.kernel_name("matmul", "nt", "f16", "f16", "none", cfg)))
        for name, (bn, s) in XP.items():
            f = xp.get_function(name)
            f.max_dynamic_shared_size_bytes = G.SMEM
            c = torch.empty(m, n, device="cuda", dtype=torch.half)
            outs[name] = c
            args = (G.cp.asarray(a), G.cp.asarray(b), G.cp.asarray(c), G.np.int32(m), G.np.int32(n), G.np.int32(k))
            grid = ((n + bn - 1) // bn, (m + 127) // 128, s)
            calls.append((name, lambda f=f, grid=grid, args=args: f(grid, (384, 1, 1), args, shared_mem=G.SMEM), name))
        cublas, kit, best, bad = against_cublas(calls, outs, ref, a, b)
        G.log(f"CONFIGS {m}x{n}x{k}: cublas {cublas:.2f} | " + " ".join(f"{key}={v:.2f}" for key, v in kit.items())
              + f" | best {best} {cublas / kit[best]:.2f}x chosen {G.choose_config(m, n, k) or 't128x256'}"
              + (f" BAD {list(bad)}" if bad else ""))


def ncu_target(objdir):
    """What ncu profiles: the base entries at 128x768x768 and the probes, 3 times each."""
    torch = G.torch
    K = variants(objdir)["new"]
    m, n, k = 128, 768, 768
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(n, k, device="cuda").half()
    c = torch.empty(m, n, device="cuda", dtype=torch.half)
    for cfg in ["t128x64_k4", "t128x128"]:
        fn = call(K, cfg, a, b, c, m, n, k)
        for _ in range(3):
            fn()
    for _ in range(3):
        a @ b.t()
    torch.cuda.synchronize()


def investigation_main(steps):
    """`script OBJDIR MODE`: set up, log the device, run steps[MODE](OBJDIR)."""
    objdir, mode = sys.argv[1], sys.argv[2]
    G.setup()
    p = G.torch.cuda.get_device_properties(0)
    G.log("ENV", p.name, "driver", G.cp.cuda.runtime.driverGetVersion(), "torch", G.torch.__version__)
    steps[mode](objdir)


def main():
    investigation_main({"time": step_time, "trace": step_trace, "configs": step_configs, "ncu-target": ncu_target})


if __name__ == "__main__":
    main()
