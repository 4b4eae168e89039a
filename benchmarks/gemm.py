"""The library GEMM (kernels/matmul/gemm.cuh) against cuBLAS (torch.matmul), on the GPU machine.

    python benchmarks/gemm.py OBJECT_DIR OUT.json [--quick] [--no-check] [--no-time]

OBJECT_DIR holds the compiled kernels: the kit's fatbins (`kitdispatch build
kernels/matmul --arch sm_90a,sm_80 -o DIR`) or nvcc cubins of matmul_nn.cu, matmul_nt.cu, bmm.cu, matmul.cu
(each generated entry is compiled only with its define: pass -DKITGEMM_ENTRY_<name> for each,
as the manifest's entries do).
Loaded with CuPy; inputs and references are torch tensors.

1. Check: every generated entry (kernels/matmul/gen_manifest.py) on odd shapes (m, n, k not
   multiples of the tile; k % 8 != 0 for the mma.sync path; split-K shares with no k slice),
   against a float64 reference of the same epilogue, output poisoned with NaN first. Relative L2
   error limits: f16 2e-3, bf16 1.2e-2, f32 (from f16/bf16 inputs) 2e-5, f32 inputs 1e-5
   (3xTF32) and 5e-3 (TF32).
   With --f32: the f32 entries only (matmul and bmm), and the timing step times every f32
   config at configs.F32_SHAPES and F32_BMM_SHAPES beside cuBLAS SGEMM and cuBLAS TF32.
2. Time: per model shape (BERT-base, GPT-2 small, ViT-base: hidden 768, qkv 2304, ffn 3072;
   Llama-7B-style: 4096, ffn 11008) at M = 128 .. 8192 tokens, the attention batch matmuls, and
   squares: every config of the kit kernel and torch.matmul on the same tensors, interleaved in
   one process, device time per kernel from CUPTI (torch.profiler's kernel records). Ratio =
   cuBLAS time / kit time (>= 1: kit as fast or faster).
"""

import glob
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "kernels", "matmul"))
import gen_manifest  # noqa: E402
from configs import CONFIGS, F32_BMM_SHAPES, F32_CONFIG_ORDER, F32_SHAPES, F32_SMEM, choose_config, choose_config_f32  # noqa: E402
from gemm_shapes import attention_shapes, model_shapes, square_shapes  # noqa: E402
from kernels import event_times_us  # noqa: E402  (benchmarks/kernels.py: this folder is first on the path)

SMEM = 100352
TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.2e-2}


def log(*a):
    print(*a, flush=True)


def setup():
    global torch, cp, np
    import cupy as cp
    import numpy as np
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


def dt(name):
    return {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[name]


def device_capability():
    major, minor = torch.cuda.get_device_capability(0)
    return major * 10 + minor


def objects_for_this_gpu(paths, capability):
    """Per source, the object IREE would pick on this GPU: a kit build writes one object per
    architecture where its entries' shared memory differs (matmul_nt.sm_90a.fatbin beside
    matmul_nt.sm_80.fatbin), and sm_90a code runs only on compute capability 9.0."""
    best = {}
    for path in paths:
        stem, *middle = os.path.basename(path).split(".")[:-1]
        archs = re.findall(r"sm_(\d+)([af]?)", middle[0]) if middle else []
        usable = [int(c) for c, suffix in archs if (int(c) == capability if suffix else int(c) <= capability)]
        if archs and not usable:
            continue
        rank = max(usable, default=0)
        if stem not in best or rank > best[stem][0]:
            best[stem] = (rank, path)
    return sorted(path for _, path in best.values())


class Kernels:
    def __init__(self, objdir):
        self.capability = device_capability()
        paths = glob.glob(os.path.join(objdir, "*.cubin")) + glob.glob(os.path.join(objdir, "*.fatbin"))
        self.mods = [cp.RawModule(path=p) for p in objects_for_this_gpu(paths, self.capability)]
        self.fns = {}

    def smem(self, e):
        return gen_manifest.launch_shared_memory(e, self.capability) if "smem" in e else SMEM

    def has(self, name):
        try:
            self.get(name)
        except KeyError:
            return False
        return True

    def get(self, name):
        if name not in self.fns:
            for m in self.mods:
                try:
                    f = m.get_function(name)
                except Exception:  # noqa: BLE001
                    continue
                f.max_dynamic_shared_size_bytes = gen_manifest.SMEM_SM90A if self.capability == 90 else SMEM
                self.fns[name] = f
                break
            else:
                raise KeyError(name)
        return self.fns[name]


def parse(name):
    """kernel name -> dict(kind, layout, ti, to, epi, cfg)."""
    for e in gen_manifest.entries():
        if e["name"] == name:
            return e
    raise KeyError(name)


def launcher(K, e, a, b, c, bias=None, res=None, scalar=None, batch=1, m=0, n=0, k=0):
    f = K.get(e["name"])
    bn, s = e["bn"], e["s"]
    tm = e.get("tm", 128)
    grid = ((n + bn - 1) // bn, (m + tm - 1) // tm, batch * s)
    if e.get("persistent"):
        grid = (132, 1, 1)
    args = [cp.asarray(a), cp.asarray(b)]
    if bias is not None:
        args.append(cp.asarray(bias))
    if res is not None:
        args.append(cp.asarray(res))
    args.append(cp.asarray(c))
    if scalar is not None:
        args.append(np.float32(scalar))
    if e["kind"] == "bmm":
        args.append(np.int32(batch))
    args += [np.int32(m), np.int32(n), np.int32(k)]
    args = tuple(args)

    threads, smem = e.get("threads", 384), K.smem(e)

    def run():
        f(grid, (threads, 1, 1), args, shared_mem=smem)

    return run


def tol_of(e):
    if e.get("prec") == "3xtf32":
        return 1e-5
    if e.get("prec") == "tf32":
        return 5e-3
    return TOL[e["to"]]


def reference(e, a, b, bias, res, scalar):
    a64, b64 = a.double(), b.double()
    if e["layout"] == "nt":
        b64 = b64.transpose(-1, -2)
    v = a64 @ b64
    epi = e["epi"]
    if epi == "scale":
        return scalar * v
    if epi == "silu_mul":  # the model epilogues (gen_manifest.MODEL_EPILOGUES): no bias; up in `res`
        return v * torch.sigmoid(v) * res.double()
    if epi.startswith("bias"):
        v = v + bias.double()
    if epi in ("bias_gelu_erf", "gelu_erf"):
        v = 0.5 * v * (1 + torch.erf(v / math.sqrt(2.0)))
    elif epi in ("bias_gelu_tanh", "gelu_tanh"):
        v = 0.5 * v * (1 + torch.tanh(scalar * (v + 0.044715 * v**3)))
    elif epi == "bias_relu":
        v = torch.relu(v)
    elif epi == "bias_silu":
        v = v * torch.sigmoid(v)
    if epi.endswith("residual"):
        v = v + res.double()
    return v


def rel_err(got, ref):
    got = got.double()
    if not torch.isfinite(got).all():
        return float("nan")
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_case(e, batch, m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ti, to = dt(e["ti"]), dt(e["to"])
    lead = (batch,) if e["kind"] == "bmm" else ()
    a = torch.randn(*lead, m, k, device="cuda", generator=g).to(ti)
    bshape = (n, k) if e["layout"] == "nt" else (k, n)
    b = torch.randn(*lead, *bshape, device="cuda", generator=g).to(ti)
    bias = (torch.randn(n, device="cuda", generator=g) * 4).to(to) if e["epi"].startswith("bias") else None
    has_res = e["epi"].endswith("residual") or e["epi"] == "silu_mul"
    res = torch.randn(*lead, m, n, device="cuda", generator=g).to(to) if has_res else None
    scalar = {"scale": 0.37, "bias_gelu_tanh": 0.7978846, "gelu_tanh": 0.797724}.get(e["epi"])
    c = torch.full((*lead, m, n), float("nan"), device="cuda", dtype=to)
    return a, b, bias, res, scalar, c


CHECK_SHAPES = [  # (batch, m, n, k)
    (1, 257, 1000, 264),  # TMA path; partial tiles everywhere; k8 splits with no k slice
    (1, 130, 67, 77),     # k % 8 != 0: mma.sync path (both layouts)
    (1, 200, 333, 128),   # NT: TMA with odd n; NN: mma.sync (n % 8 != 0)
    (1, 70, 264, 1544),   # TMA; 64-row tiles: a partial second tile; 25 k slices over 2 and 4 splits
]
CHECK_SHAPES_BMM = [(3, 257, 200, 72), (2, 65, 33, 77), (1, 129, 136, 520)]


def result_class(e):
    """How an entry's results are grouped in the check's summary: by arithmetic and result type."""
    if e["ti"] == "f32":
        return "tf32" if e["prec"] == "tf32" else "f32_from_f32"
    return e["to"]


def step_check(K, quick=False, only_f32=False):
    bad, n_ok, rows = 0, 0, []
    es = list(gen_manifest.entries())
    if only_f32:
        es = [e for e in es if e["ti"] == "f32"]
    if quick:
        es = [e for e in es if e["epi"] in ("none", "bias_gelu_tanh", "bias_residual", "scale")]
    # The heads entries take nb, seq and d too (launched with this file's arguments they would read
    # past their parameters): tests/models/test_ops_epilogue_heads.py checks them on the GPU.
    heads = [e["name"] for e in es if e["epi"] in gen_manifest.HEADS_EPILOGUES]
    if heads:
        log(f"CHECK skips {len(heads)} heads entries (tests/models/test_ops_epilogue_heads.py checks them)")
    es = [e for e in es if e["epi"] not in gen_manifest.HEADS_EPILOGUES]
    for i, e in enumerate(es):
        shapes = CHECK_SHAPES_BMM if e["kind"] == "bmm" else CHECK_SHAPES
        for (batch, m, n, k) in shapes:
            a, b, bias, res, scalar, c = make_case(e, batch, m, n, k, seed=i * 31 + m + n + k)
            try:
                launcher(K, e, a, b, c, bias, res, scalar, batch, m, n, k)()
                torch.cuda.synchronize()
                err = rel_err(c, reference(e, a, b, bias, res, scalar))
            except Exception as exc:  # noqa: BLE001
                err = float("nan")
                log("ERROR", e["name"], repr(exc)[:200])
                torch.cuda.synchronize()
            ok = err <= tol_of(e)
            bad += not ok
            n_ok += ok
            rows.append(dict(name=e["name"], batch=batch, m=m, n=n, k=k, rel_err=err, ok=ok, result=result_class(e)))
            if not ok:
                log(f"BAD {e['name']:40s} b{batch} {m}x{n}x{k} rel err {err:.2e}")
    worst = {}
    for r in rows:
        worst[r["result"]] = max(worst.get(r["result"], 0), r["rel_err"] if r["rel_err"] == r["rel_err"] else 1e9)
    log(f"CHECK {n_ok} ok, {bad} bad of {len(rows)} (kernels {len(es)}); worst rel err by result type {worst}")
    return rows


# ----------------------------------------------------------------------------- timing


def kernel_times(calls, reps):
    """calls: list of (key, fn, kernel-name-or-None). Interleaved reps; CUPTI device time of each
    call (None: every kernel that is not a named kit kernel counts toward that call). -> {key: us}"""
    for _, fn, _ in calls:
        fn()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for _, fn, _ in calls:
                fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    trace = json.load(open(path))
    os.unlink(path)
    kev = [ev for ev in trace.get("traceEvents", []) if ev.get("cat") == "kernel" and ev.get("ph") == "X"]
    named = {kn: key for key, _, kn in calls if isinstance(kn, str)}
    prefixed = {kn[1]: key for key, _, kn in calls if isinstance(kn, tuple)}  # ("prefix", IREE function): its dispatches
    per = {key: [] for key, _, _ in calls}
    other_key = next((key for key, _, kn in calls if kn is None), None)
    other_total = 0.0
    for ev in kev:
        nm = ev.get("name", "")
        prefix = next((p for p in prefixed if nm.startswith(p + "_dispatch")), None)
        if nm in named:
            per[named[nm]].append(float(ev["dur"]))
        elif prefix is not None:
            per[prefixed[prefix]].append(float(ev["dur"]))
        else:
            other_total += float(ev["dur"])
    res = {}
    for key, _, kn in calls:
        if isinstance(kn, str):
            res[key] = statistics.median(per[key]) if per[key] else None
        elif isinstance(kn, tuple):  # every dispatch of the call, per call
            res[key] = sum(per[key]) / reps if per[key] else None
    if other_key is not None:
        res[other_key] = other_total / reps if other_total else None
    return res


def event_time(fn, reps):
    """Median device time of `fn` (us, CUDA events on torch's stream), after 3 warm-up calls."""
    return statistics.median(event_times_us(torch, fn, reps, warmup=3))


def time_shape(K, label, kind, layout, ti, batch, m, n, k, epi="none", reps=20, configs=None):
    to = ti
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    lead = (batch,) if kind == "bmm" else ()
    a = torch.randn(*lead, m, k, device="cuda", generator=g).to(dt(ti))
    b = torch.randn(*lead, *((n, k) if layout == "nt" else (k, n)), device="cuda", generator=g).to(dt(ti))
    bt = b.transpose(-1, -2) if layout == "nt" else b
    calls = []
    cfgs = list(CONFIGS) if configs is None else configs
    outs = {}
    for cfg in cfgs:
        bn, s, _ = CONFIGS[cfg]
        if s > 1 and k < 128 * s:
            continue
        name = gen_manifest.kernel_name(kind, layout, ti, to, epi, cfg)
        e = parse(name)
        c = torch.empty(*lead, m, n, device="cuda", dtype=dt(to))
        outs[cfg] = c
        calls.append((cfg or "t128x256", launcher(K, e, a, b, c, None, None, None, batch, m, n, k), name))
    calls.append(("cublas", lambda: torch.matmul(a, bt), None))
    iree_call = IREE.call_for(kind, layout, ti, batch, m, n, k, a, b) if IREE is not None else None
    if iree_call is not None:
        calls.append(("iree", *iree_call))
    ts = kernel_times(calls, reps)
    for key, fn, kn in calls:  # CUPTI saw nothing of this call: CUDA events instead
        if not ts.get(key):
            ts[key] = event_time(fn, reps)
            log("  (events for", key, ")")
    errs = {}
    ref = torch.matmul(a.double(), bt.double())
    for cfg, c in outs.items():
        errs[cfg or "t128x256"] = rel_err(c, ref)
    flop = 2.0 * batch * m * n * k
    chosen = choose_config(m, n, k, ti, batch) or "t128x256"
    kit = {key: v for key, v in ts.items() if key not in ("cublas", "iree") and v}
    best = min(kit, key=kit.get) if kit else None
    row = dict(label=label, kind=kind, layout=layout, dtype=ti, batch=batch, m=m, n=n, k=k, cublas_us=ts.get("cublas"),
               kit_us=kit, rel_err=errs, best=best, chosen=chosen, flop=flop)
    if iree_call is not None:
        row["iree_us"] = ts.get("iree")
        row["iree_rel_err"] = rel_err(IREE.last_result(), ref)
    cb = ts.get("cublas")
    if cb and kit:
        row["ratio_best"] = cb / kit[best]
        row["ratio_chosen"] = cb / kit[chosen] if chosen in kit else None
        row["ratio_default"] = cb / kit["t128x256"] if "t128x256" in kit else None
    cfgtxt = " ".join(f"{key}={v:.1f}" for key, v in kit.items())
    bad = [key for key, v in errs.items() if not v <= TOL[to]]
    iree_us = row.get("iree_us")
    iree_txt = f" | IREE {iree_us:.1f} us ({flop / iree_us / 1e6:.0f} TF/s, err {row['iree_rel_err']:.1e})" if iree_us else ""
    log(f"{kind}_{layout} {ti} b{batch} {m:5d}x{n:5d}x{k:5d} cublas {cb and round(cb, 1)} us ({cb and flop / cb / 1e6:.0f} TF/s) | "
        f"{cfgtxt} | best {best} {row.get('ratio_best', 0):.2f}x chosen {chosen} {row.get('ratio_chosen') or 0:.2f}x"
        + iree_txt + (f" BADERR {bad}" if bad else ""))
    return row


class IreeGemm:
    """IREE's own codegen for the benchmark's shapes (benchmarks/gemm_iree.py builds the module):
    each function called on the same operands as the kit and cuBLAS, through iree.runtime."""

    def __init__(self, vmfb):
        import iree.runtime as rt

        from gemm_iree import function_name

        self._rt, self._name = rt, function_name
        self.config = rt.Config("cuda")
        self.module = rt.load_vm_flatbuffer_file(vmfb, driver="cuda")
        self._last = None

    def call_for(self, kind, layout, ti, batch, m, n, k, a, b):
        """(the call, its kernel key) or None where the module has no such function."""
        name = self._name(kind, layout, ti, batch, m, n, k)
        try:
            fn = self.module[name]
        except (KeyError, AttributeError):
            return None
        args = [self._rt.asdevicearray(self.config.device, host(x)) for x in (a, b)]

        def call():
            self._last = fn(*args)

        return call, ("prefix", name)

    def last_result(self):
        """The last call's result as a torch tensor (bf16 comes back as its bits)."""
        out = self._last.to_host()
        if out.dtype == np.uint16:  # bf16
            return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).cuda()
        return torch.from_numpy(out).cuda()


def host(x):
    """A torch CUDA tensor as numpy (bf16 as its bits)."""
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).cpu().numpy().view(np.uint16)
    return x.cpu().numpy()


IREE = None


# f32 configs gemm_f32.cuh takes and the library has no entries for (configs.F32_CONFIGS says
# why): suffix -> (TM, S), timed where a build has them (round 39's investigation build,
# benchmarks/results/gemm-f32-h100-round39.txt, generated them as library entries).
F32_EXTRA = {"t128x128_k2": (128, 2), "t128x128_k4": (128, 4)}


def f32_extra_entry(name, kind, tm, split):
    return dict(name=name, kind=kind, bn=128, tm=tm, s=split, threads=2 * tm, smem=F32_SMEM[(tm, 128)])


def time_f32(K, label, kind, layout, batch, m, n, k, reps=10):
    """Every f32 config of the kit in 3xTF32 and TF32 against cuBLAS f32 (SGEMM, TF32 off) and
    cuBLAS TF32, interleaved; results checked against float64. kind "bmm": `batch` matmuls
    (torch.bmm), else one."""
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    lead = (batch,) if kind == "bmm" else ()
    a = torch.randn(*lead, m, k, device="cuda", generator=g)
    b = torch.randn(*lead, *((n, k) if layout == "nt" else (k, n)), device="cuda", generator=g)
    bt = b.transpose(-1, -2) if layout == "nt" else b
    outs, calls = {}, []
    configs = F32_CONFIG_ORDER + [cfg for cfg in F32_EXTRA if K.has(f"{kind}_{layout}_f32_none_{cfg}")]
    for prec, ti in (("3xtf32", "f32"), ("tf32", "f32_tf32")):
        for cfg in configs:
            name = f"{kind}_{layout}_{ti}_none" + (f"_{cfg}" if cfg else "")
            e = parse(name) if cfg in F32_CONFIG_ORDER else f32_extra_entry(name, kind, *F32_EXTRA[cfg])
            c = torch.full((*lead, m, n), float("nan"), device="cuda")
            outs[(prec, cfg)] = c
            calls.append(((prec, cfg), launcher(K, e, a, b, c, None, None, None, batch, m, n, k), name))

    def cublas_f32():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.matmul(a, bt)

    def cublas_tf32():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.matmul(a, bt)
        torch.backends.cuda.matmul.allow_tf32 = False

    t = kernel_times(calls + [("cublas_f32", cublas_f32, None)], reps)
    t.update(kernel_times([("cublas_tf32", cublas_tf32, None)], reps))
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = torch.matmul(a.double(), bt.double())
    errs = {key: rel_err(c, ref) for key, c in outs.items()}
    errs["cublas_f32"] = rel_err(torch.matmul(a, bt), ref)
    flop = 2.0 * batch * m * n * k
    chosen = choose_config_f32(m, n, k, batch)
    row = dict(label=label, kind=kind, layout=layout, dtype="f32", batch=batch, m=m, n=n, k=k, flop=flop, chosen=chosen,
               kit_us={f"{p}:{c}": t[(p, c)] for p, c in outs},
               rel_err={f"{key[0]}:{key[1]}" if isinstance(key, tuple) else key: v for key, v in errs.items()},
               cublas_us=t["cublas_f32"], cublas_tf32_us=t["cublas_tf32"])
    parts = []
    for prec, base in (("3xtf32", "cublas_f32"), ("tf32", "cublas_tf32")):
        times = {cfg: t[(prec, cfg)] for cfg in configs}
        best = min(times, key=times.get)
        row[f"ratio_{prec}_best"] = t[base] / times[best]
        row[f"ratio_{prec}_chosen"] = t[base] / times[chosen]
        worst_err = max(errs[(prec, cfg)] for cfg in configs)
        parts.append(f"{prec} " + " ".join(f"{cfg or 't128x128'}={v:.1f}" for cfg, v in times.items())
                     + f" (err <= {worst_err:.1e}) | best {best or 't128x128'} {row[f'ratio_{prec}_best']:.2f}x"
                     f" chosen {chosen or 't128x128'} {row[f'ratio_{prec}_chosen']:.2f}x")
    what = f"b{batch} " if kind == "bmm" else ""
    log(f"f32 {kind} {layout} {what}{m:5d}x{n:5d}x{k:5d} | cuBLAS SGEMM {t['cublas_f32']:.1f} us (err {errs['cublas_f32']:.1e}), "
        f"TF32 {t['cublas_tf32']:.1f} us\n    " + "\n    ".join(parts))
    return row


def step_time(K, quick=False, f32_only=False):
    rows = []
    for (m, n, k) in F32_SHAPES:
        for layout in ("nn", "nt") if (m, n, k) in ((4096, 4096, 4096), (512, 768, 768)) else ("nn",):
            rows.append(time_f32(K, "f32", "matmul", layout, 1, m, n, k))
    for (label, batch, m, n, k) in F32_BMM_SHAPES:
        for layout in ("nn", "nt"):
            rows.append(time_f32(K, label, "bmm", layout, batch, m, n, k))
    if f32_only:
        return rows
    shapes = model_shapes()
    if quick:
        shapes = shapes[::3]
    for (label, m, n, k) in shapes:
        rows.append(time_shape(K, label, "matmul", "nt", "f16", 1, m, n, k))
    for ti, s, layout in square_shapes():
        rows.append(time_shape(K, f"square {s}", "matmul", layout, ti, 1, s, s, s, reps=10 if s == 8192 else 20,
                               configs=["", "t128x128", "t128x128_p"]))
    for label, layout, batch, m, n, k in attention_shapes():
        rows.append(time_shape(K, label, "bmm", layout, "f16", batch, m, n, k, configs=["", "t128x128", "t128x128_p"]))
    # epilogues: the chosen config with each epilogue against none (what fusing costs)
    for (m, n, k) in ((2048, 3072, 768), (8192, 768, 3072), (512, 4096, 4096)):
        rows.append(time_epilogues(K, m, n, k))
    return rows


def time_epilogues(K, m, n, k, reps=20):
    """Each epilogue's entry of the config choose_config picks for the shape (any epilogue's)."""
    calls, configs = [], {}
    case = None
    config = choose_config(m, n, k, "f16", 1)
    for epi in ("none", "bias", "bias_gelu_erf", "bias_gelu_tanh", "bias_silu", "bias_residual", "scale"):
        configs[epi] = config
        e = parse(gen_manifest.kernel_name("matmul", "nt", "f16", "f16", epi, config))
        a, b, bias, res, scalar, c = make_case(e, 1, m, n, k, seed=7)
        if case is None:
            case = (a, b)
        a, b = case
        calls.append((epi, launcher(K, e, a, b, c, bias, res, scalar, 1, m, n, k), e["name"]))
    a, b = case
    calls.append(("cublas", lambda: torch.matmul(a, b.t()), None))
    ts = kernel_times(calls, reps)
    log(f"epilogues {m}x{n}x{k}: " + " ".join(f"{key}={v:.1f}" + (f" ({configs[key] or 't128x256'})" if key in configs else "")
                                            for key, v in ts.items()))
    return dict(label="epilogues", m=m, n=n, k=k, config=configs, us=ts)


def main():
    objdir, out = sys.argv[1], sys.argv[2]
    flags = set(sys.argv[3:])
    setup()
    p = torch.cuda.get_device_properties(0)
    env = dict(device=p.name, sms=p.multi_processor_count, torch=torch.__version__, cuda=torch.version.cuda,
               driver=cp.cuda.runtime.driverGetVersion(), cupy=cp.__version__, date=time.strftime("%Y-%m-%d %H:%M"))
    try:
        import subprocess

        env["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit",
                                            "--format=csv,noheader"], capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    log("ENV", json.dumps(env))
    K = Kernels(objdir)
    global IREE
    if "--iree" in sys.argv:
        IREE = IreeGemm(sys.argv[sys.argv.index("--iree") + 1])
        env["iree_module"] = sys.argv[sys.argv.index("--iree") + 1]
    result = dict(env=env)
    t0 = time.time()
    if "--no-check" not in flags:
        result["check"] = step_check(K, quick="--quick" in flags, only_f32="--f32" in flags)
        log(f"check took {time.time() - t0:.1f} s")
        json.dump(result, open(out, "w"), indent=1)
    if "--no-time" not in flags:
        result["time"] = step_time(K, quick="--quick" in flags, f32_only="--f32" in flags)
        json.dump(result, open(out, "w"), indent=1)
    log(f"done in {time.time() - t0:.1f} s")
    bad = [r for r in result.get("check", []) if not r["ok"]]
    if bad:  # the timings stand beside results that are wrong: not a green run
        log(f"FAILED: {len(bad)} checked results wrong (the BAD lines above)")
        sys.exit(1)
    if "check" not in result:
        log("note: --no-check: no result was checked")


if __name__ == "__main__":
    main()
