"""What the fused activations cost, old forms against new (issue 25 item 2, round 38), on the GPU
machine. Objects from benchmarks/investigations/gemm_epilogue_build.sh (nvcc here).

    python benchmarks/investigations/gemm_epilogue.py OBJDIR math|time

math: OBJDIR/math.cubin (gemm_epilogue_math.cu): the activations of gemm.cuh's epilogues and the
      forms of the tree before, in f32 over 2.2M inputs in [-30, 30] (and a dense band
      around 0), against float64: max relative error where |exact| >= 1e-30, and how often the
      f16 and bf16 roundings differ from the exact value's.
time: per shape and config, each epilogue's NT f16 entry of every variant OBJDIR/<variant>/matmul_nt.cubin
      (old: the tree before, act: any other build put there (round 38: the new activations
      without the epilogue's loads ahead), new: this tree, newpp: this tree with ping-pong
      persistent consumers for every epilogue); CUPTI device time, median of 3 rounds of 20 interleaved calls, the
      variants in turn (one kernel name per variant: separate profiler passes); every result
      checked against float64 (rel L2 error <= 2e-3); the variants' order rotates by round, and new's against old's (f16 results
      that differ, and by how many f16 steps at most).
"""

import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import gemm as G  # noqa: E402
import gemm_floor as F  # noqa: E402

EPIS = ["none", "bias", "bias_gelu_erf", "bias_gelu_tanh", "bias_silu", "silu_mul", "bias_residual"]
SHAPES = [((128, 3072, 768), ["t64x64"]), ((512, 3072, 768), ["t128x128"]),
          ((2048, 3072, 768), ["t128x128", "t128x128_p", ""]), ((4096, 3072, 768), ["t128x128_p", ""]),
          ((8192, 3072, 768), ["t128x128_p", ""]), ((2048, 768, 3072), ["t128x128_p", "t128x128"]),
          ((8192, 768, 3072), ["t128x128_p", "t128x128"]),
          ((512, 11008, 4096), ["t128x128_p", "t128x128"]), ((2048, 11008, 4096), ["t128x128_p", ""])]


def step_math(objdir):
    torch, cp, np = G.torch, G.cp, G.np
    mod = cp.RawModule(path=os.path.join(objdir, "math.cubin"))
    f = mod.get_function("activations")
    x = torch.cat([torch.linspace(-30, 30, 2_000_001, device="cuda"), torch.linspace(-1, 1, 200_001, device="cuda")])
    x = x.float().contiguous()
    xd = x.double()
    c = 0.7978846
    exact = {"gelu_erf": 0.5 * xd * torch.special.erfc(-xd / math.sqrt(2.0)),  # 1 + erf cancels in f64 too
             "gelu_tanh": xd * torch.sigmoid(2 * c * (xd + 0.044715 * xd**3)),
             "silu": xd * torch.sigmoid(xd)}
    n = x.numel()
    for which, (name, form) in enumerate([(k, "new") for k in exact] + [(k, "old") for k in exact]):
        y = torch.empty_like(x)
        f(((n + 255) // 256,), (256,), (cp.asarray(x), cp.asarray(y), np.int32(n), np.int32(which), np.float32(c)))
        torch.cuda.synchronize()
        ex = exact[name]
        big = ex.abs() >= 1e-30
        rel = ((y.double() - ex).abs()[big] / ex.abs()[big])
        worst = rel.argmax().item()
        xs = x[big][worst].item()
        diff16 = (y.half() != ex.half()).sum().item()
        diffbf = (y.bfloat16() != ex.bfloat16()).sum().item()
        G.log(f"MATH {name:9s} {form}: max rel err {rel.max().item():.2e} at x = {xs:.4f}, median {rel.median().item():.1e}; "
              f"f16 rounding differs at {diff16} of {n}, bf16 at {diffbf}")


def variants(objdir):
    return {v: G.Kernels(os.path.join(objdir, v)) for v in ("old", "act", "new", "newpp")
            if os.path.exists(os.path.join(objdir, v, "matmul_nt.cubin"))}


def f16_steps(got, want):
    """Max distance in f16 steps (at the larger magnitude) between two f16 tensors."""
    torch = G.torch
    g, w = got.double(), want.double()
    mag = torch.maximum(g.abs(), w.abs()).clamp_min(2.0**-14)
    step = torch.exp2(torch.floor(torch.log2(mag)) - 10)
    return ((g - w).abs() / step).max().item()


def step_time(objdir):
    torch = G.torch
    vs = variants(objdir)
    for (m, n, k), cfgs in SHAPES:
        for cfg in cfgs:
            cases, outs = {}, {}
            for epi in EPIS:
                e = G.parse(G.gen_manifest.kernel_name("matmul", "nt", "f16", "f16", epi, cfg))
                a, b, bias, res, scalar, _ = G.make_case(e, 1, m, n, k, seed=11)
                cases[epi] = (e, a, b, bias, res, scalar, G.reference(e, a, b, bias, res, scalar))
            times = {v: {epi: [] for epi in EPIS} for v in vs}
            calls = {}
            for v, K in vs.items():
                calls[v] = []
                for epi, (e, a, b, bias, res, scalar, _) in cases.items():
                    c = outs[v, epi] = torch.full((m, n), float("nan"), device="cuda", dtype=torch.half)
                    calls[v].append((epi, G.launcher(K, e, a, b, c, bias, res, scalar, 1, m, n, k), e["name"]))
            for rnd in range(3):
                order = list(vs)[rnd % len(vs):] + list(vs)[:rnd % len(vs)]  # a long run warms the GPU: rotate
                for v in order:
                    for epi, t in G.kernel_times(calls[v], 20).items():
                        times[v][epi].append(t)
            bad = [f"{v}/{epi} {G.rel_err(outs[v, epi], cases[epi][-1]):.1e}" for v in vs for epi in EPIS
                   if not G.rel_err(outs[v, epi], cases[epi][-1]) <= 2e-3]
            agree = []
            for epi in EPIS:
                if "old" in vs and "new" in vs:
                    o, w = outs["old", epi], outs["new", epi]
                    agree.append(f"{epi} {(o != w).sum().item()}/{o.numel()} max {f16_steps(w, o):.0f}")
            cols = " | ".join(f"{epi} " + "/".join(f"{statistics.median(times[v][epi]):.1f}" for v in vs) for epi in EPIS)
            G.log(f"EPI {m}x{n}x{k} {cfg or 't128x256'} ({'/'.join(vs)}): {cols}" + (f" BAD {bad}" if bad else ""))
            G.log(f"  new vs old, f16 results that differ: {'; '.join(agree)}")


def main():
    F.investigation_main({"math": step_math, "time": step_time})


if __name__ == "__main__":
    main()
