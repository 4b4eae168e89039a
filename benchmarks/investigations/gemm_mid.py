"""The library GEMM against cuBLAS at mid model shapes (issue 25 item 1, round 32: M = 512..8192
tokens, BERT/GPT-2/ViT widths), with the TMA-multicast configs of gemm_mid_configs.cu, on the GPU
machine. Objects from benchmarks/investigations/gemm_mid_build.sh (nvcc, sm_90a cubins).

    python benchmarks/investigations/gemm_mid.py OBJDIR

Per shape: what cuBLAS (torch.matmul) launches, then every config of the library (OBJDIR/new) and
the multicast configs (OBJDIR/xp_mid.cubin) interleaved with cuBLAS; CUPTI device time, median of
30; each result checked against float64 (rel L2 error <= 2e-3). First the multicast kernels on odd
shapes (partial tiles, an odd count of tile rows), NT and NN, against float64.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import gemm as G  # noqa: E402
import gemm_floor as F  # noqa: E402
import gemm_small as GS  # noqa: E402

WIDTHS = [(768, 768), (2304, 768), (3072, 768), (768, 3072)]
SHAPES = ([(m, n, k) for m in (512, 1576, 2048, 4096, 8192) for n, k in WIDTHS]
          + [(2048, 4096, 4096), (2048, 11008, 4096), (512, 11008, 4096)])
XP = {"xp_t128x256_m2": (256, 2), "xp_t128x128_m2": (128, 2),
      # persistent 128 x 128: ping-pong consumers, and the same source's cooperative ones (mc 0: grid 132)
      "xp_t128x128_pp": (128, 0), "xp_t128x128_pc": (128, 0)}
BIG = int(os.environ.get("KITGEMM_BIG", 183296))
ODD = [(300, 264, 520), (333, 333, 776), (1, 256, 64), (129, 512, 1024), (2000, 3000, 136), (1576, 2304, 768)]


def xp_launch(f, nt, bn, mc, a, b, c, m, n, k):
    grid = (132, 1, 1) if mc == 0 else ((n + bn - 1) // bn, mc * ((m + 128 * mc - 1) // (128 * mc)), 1)
    args = (G.cp.asarray(a), G.cp.asarray(b), G.cp.asarray(c), G.np.int32(m), G.np.int32(n), G.np.int32(k))
    return lambda: f(grid, (384, 1, 1), args, shared_mem=G.SMEM)


def xp_function(mod, name):
    f = mod.get_function(name)
    f.max_dynamic_shared_size_bytes = G.SMEM
    return f


def step_check(xp, label=""):
    torch = G.torch
    for name, (bn, mc) in XP.items():
        for nt in (True, False):
            fname = name if nt else name.replace("xp_", "xp_nn_")
            if name.endswith("_pc") and not nt:
                continue
            f = xp_function(xp, fname)
            for (m, n, k) in ODD:
                g = torch.Generator(device="cuda").manual_seed(m * 7 + n + k)
                a = torch.randn(m, k, device="cuda", generator=g).half()
                b = torch.randn(n, k, device="cuda", generator=g).half() if nt else torch.randn(k, n, device="cuda", generator=g).half()
                c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.half)
                xp_launch(f, nt, bn, mc, a, b, c, m, n, k)()
                torch.cuda.synchronize()
                ref = a.double() @ (b.double().t() if nt else b.double())
                err = G.rel_err(c, ref)
                G.log(f"CHECK{label} {fname} {m}x{n}x{k}: rel err {err:.2e} {'ok' if err <= 2e-3 else 'BAD'}")


def step_sweep(objdir, xp, variant="new", xp_big=None):
    """variant "big" with xp_big: the kernels built for BIG bytes of dynamic shared memory."""
    torch = G.torch
    K = F.variants(objdir)[variant.replace("_nomc", "")]
    for (m, n, k) in SHAPES:
        a, b, ref = GS.operands(m, n, k)
        calls, outs = [], {}
        for cfg in G.CONFIGS:
            bn, s, _ = G.CONFIGS[cfg]
            name = G.gen_manifest.kernel_name("matmul", "nt", "f16", "f16", "none", cfg)
            if s > 1 and k < 128 * s or not K.has(name):
                continue
            c = torch.empty(m, n, device="cuda", dtype=torch.half)
            outs[cfg or "t128x256"] = c
            calls.append((cfg or "t128x256", F.call(K, cfg, a, b, c, m, n, k), name))
        for name, (bn, mc) in XP.items():
            c = torch.empty(m, n, device="cuda", dtype=torch.half)
            outs[name] = c
            calls.append((name, xp_launch(xp_function(xp, name), True, bn, mc, a, b, c, m, n, k), name))
        calls.append(("cublas", lambda: a @ b.t(), None))
        t = G.kernel_times(calls, 30)
        errs = {key: G.rel_err(c, ref) for key, c in outs.items()}
        bad = [key for key, e in errs.items() if not e <= 2e-3]
        kit = {key: v for key, v in t.items() if key != "cublas"}
        best = min(kit, key=kit.get)
        chosen = G.choose_config(m, n, k) or "t128x256"
        chosen = chosen if chosen in kit else best
        G.log(f"SWEEP {variant} {m}x{n}x{k}: cublas {t['cublas']:.2f} | " + " ".join(f"{key}={v:.2f}" for key, v in kit.items())
              + f" | chosen {chosen} {t['cublas'] / kit[chosen]:.2f}x | best {best} {t['cublas'] / kit[best]:.2f}x"
              + (f" BAD {bad} {[errs[x] for x in bad]}" if bad else ""))


def main():
    objdir = sys.argv[1]
    G.setup()
    p = G.torch.cuda.get_device_properties(0)
    G.log("ENV", p.name, "driver", G.cp.cuda.runtime.driverGetVersion(), "torch", G.torch.__version__)
    xp = G.cp.RawModule(path=os.path.join(objdir, "xp_mid.cubin"))
    if "--xp-only" in sys.argv:  # the experimental kernels against the library's
        step_check(xp)
        step_sweep(objdir, xp)
        return
    if "--big-only" not in sys.argv:
        step_check(xp)
        GS.SHAPES = SHAPES
        GS.step_cublas(objdir)
        step_sweep(objdir, xp)
    G.SMEM = G.gen_manifest.SMEM = BIG  # the launches' dynamic shared memory (entries carry it)
    step_check(G.cp.RawModule(path=os.path.join(objdir, "xp_mid_big.cubin")), " big")
    step_sweep(objdir, G.cp.RawModule(path=os.path.join(objdir, "xp_mid_big.cubin")), "big")


if __name__ == "__main__":
    main()
