"""The library GEMM against cuBLAS at mid model shapes (issue 25 item 1, round 32: M = 512..8192
tokens, BERT/GPT-2/ViT widths, some Llama ones; attention's batched shapes), on the GPU machine.
Objects from benchmarks/investigations/gemm_mid_build.sh (nvcc, sm_90a cubins).

    python benchmarks/investigations/gemm_mid.py OBJDIR

cublas: what torch.matmul launches at each shape (kernel name, grid, shared memory, device time).
sweep:  every config of the library (OBJDIR/new: f16 NT "none" entries) interleaved with cuBLAS;
        then the configs that fit 179 KB of dynamic shared memory built for it (OBJDIR/big: deeper
        rings, what an sm_90-only launch could have), in a pass of their own; CUPTI device time,
        median of 30; every result checked against float64 (rel L2 error <= 2e-3).
bmm:    the persistent entries (t128x128_p) of bmm_nt / bmm_nn on attention's shapes, with cuBLAS.
epilogues (`--epilogues`): every epilogue of the f16 NT entries at K = 768 shapes, t128x256,
        t128x128 and t128x128_p as generated (OBJDIR/epi/lib: ping-pong consumers but for
        configs.TRANSCENDENTAL_EPILOGUES), then t128x128_p with cooperative ones for every
        epilogue (OBJDIR/epi/coop, KITGEMM_PERSISTENT_COOPERATIVE=1), a pass each. Before the
        per-epilogue choice (the results' run 15) the lib pass had ping-pong for all.

Commit 5d92320 also had, under `--xp-only`, a TMA-multicast variant (the two CTAs of a cluster along
M sharing the B tile) and the persistent kernel with both consumer warpgroups on each tile
(before ping-pong): benchmarks/results/gemm-mid-h200-round32.txt has what they measured.
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
BIG = int(os.environ.get("KITGEMM_BIG", 183296))  # + a 48 KB static stage: the 227 KB an sm_90 block may have
BMM = [(96, 512, 512, 64, True), (32, 2048, 2048, 128, True), (96, 512, 64, 512, False), (32, 2048, 128, 2048, False),
       (3, 300, 264, 72, True), (3, 300, 264, 72, False)]


def step_sweep(objdir, variant):
    torch = G.torch
    K = F.variants(objdir)[variant]
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
        cublas, kit, best, bad = F.against_cublas(calls, outs, ref, a, b)
        chosen = G.choose_config(m, n, k) or "t128x256"
        chosen = chosen if chosen in kit else best
        G.log(f"SWEEP {variant} {m}x{n}x{k}: cublas {cublas:.2f} | " + " ".join(f"{key}={v:.2f}" for key, v in kit.items())
              + f" | chosen {chosen} {cublas / kit[chosen]:.2f}x | best {best} {cublas / kit[best]:.2f}x"
              + (f" BAD {list(bad)} {list(bad.values())}" if bad else ""))


def step_bmm(objdir):
    torch = G.torch
    K = F.Variant(os.path.join(objdir, "new", "bmm.cubin"))
    for (batch, m, n, k, nt) in BMM:
        g = torch.Generator(device="cuda").manual_seed(batch + m + n + k)
        a = torch.randn(batch, m, k, device="cuda", generator=g).half()
        b = (torch.randn(batch, n, k, device="cuda", generator=g) if nt else torch.randn(batch, k, n, device="cuda", generator=g)).half()
        ref = a.double() @ (b.double().transpose(1, 2) if nt else b.double())
        name = G.gen_manifest.kernel_name("bmm", "nt" if nt else "nn", "f16", "f16", "none", "t128x128_p")
        c = torch.empty(batch, m, n, device="cuda", dtype=torch.half)
        bt = b.transpose(1, 2) if nt else b
        calls = [("kit", G.launcher(K, G.parse(name), a, b, c, None, None, None, batch, m, n, k), name),
                 ("cublas", lambda: torch.bmm(a, bt), None)]
        t = G.kernel_times(calls, 30)
        err = G.rel_err(c, ref)
        G.log(f"BMM b{batch} {m}x{n}x{k} {'nt' if nt else 'nn'} t128x128_p: cublas {t['cublas']:.2f} | kit {t['kit']:.2f} "
              f"({t['cublas'] / t['kit']:.2f}x) | err {err:.1e}" + (" BAD" if err > 2e-3 else ""))


EPI_SHAPES = [(2048, 3072, 768), (4096, 3072, 768), (8192, 3072, 768), (4096, 2304, 768), (8192, 768, 768)]
EPI_CONFIGS = {"lib": ["", "t128x128", "t128x128_p"], "coop": ["t128x128_p"]}


def epilogues():
    return G.gen_manifest.EPILOGUES + G.gen_manifest.MODEL_EPILOGUES


def step_epilogues(objdir):
    for (m, n, k) in EPI_SHAPES:
        times = {}
        for variant, cfgs in EPI_CONFIGS.items():
            K = G.Kernels(os.path.join(objdir, "epi", variant))
            calls, checks = [], []
            for i, ep in enumerate(epilogues()):
                for cfg in cfgs:
                    name = G.gen_manifest.kernel_name("matmul", "nt", "f16", "f16", ep, cfg)
                    e = G.parse(name)
                    a, b, bias, res, scalar, c = G.make_case(e, 1, m, n, k, seed=i)
                    calls.append(((ep, cfg or "t128x256", variant), G.launcher(K, e, a, b, c, bias, res, scalar, 1, m, n, k), name))
                    checks.append((ep, cfg, variant, c, (e, a, b, bias, res, scalar)))
            a, b, _ = GS.operands(m, n, k)
            calls.append(("cublas", lambda: a @ b.t(), None))
            t = G.kernel_times(calls, 20)
            times.update(t)
            for ep, cfg, variant_, c, case in checks:
                err = G.rel_err(c, G.reference(*case))
                if not err <= 2e-3:
                    G.log(f"EPI BAD {m}x{n}x{k} {ep} {cfg} {variant_}: rel err {err:.2e}")
        for ep in epilogues():
            row = {f"{key[1]}/{key[2]}": val for key, val in times.items() if isinstance(key, tuple) and key[0] == ep}
            G.log(f"EPI {m}x{n}x{k} {ep}: " + " ".join(f"{key}={val:.2f}" for key, val in row.items())
                  + f" | cublas(none) {times['cublas']:.2f}")


def main():
    objdir = sys.argv[1]
    G.setup()
    p = G.torch.cuda.get_device_properties(0)
    G.log("ENV", p.name, "driver", G.cp.cuda.runtime.driverGetVersion(), "torch", G.torch.__version__)
    if "--epilogues" in sys.argv:
        step_epilogues(objdir)
        return
    GS.SHAPES = SHAPES
    GS.step_cublas(objdir)
    step_sweep(objdir, "new")
    step_bmm(objdir)
    G.SMEM = G.gen_manifest.SMEM = BIG  # the launches' dynamic shared memory (entries carry it)
    step_sweep(objdir, "big")


if __name__ == "__main__":
    main()
