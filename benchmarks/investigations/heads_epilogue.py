"""(benchmarks/results/heads-h100-round30.txt) GPU check and timing of the heads entries (kernels/matmul: matmul_*_bias_heads[_t]_*) against
numpy and against the plain bias entry of the same config (bitwise: same sums, same rounding,
another address), and device time (a CUDA graph of 100 launches timed by CUDA events, median)
at 4096x768x768, 1576x768x768 and 128x768x768. Loads a fatbin of the entries (nvcc -fatbin
-arch=sm_90a with their KITGEMM_ENTRY_ defines) with cupy: python heads_epilogue.py FATBIN"""
import functools
import sys
import numpy as np
import cupy as cp

mod = cp.RawModule(path=sys.argv[1])
CFG = {"t64x64": (64, 64), "t128x128": (128, 128), "": (256, 128)}  # BN, TM
SMEM = 183296  # gemm.cuh's kDynamicSmem on sm_90a since round 35 (100352 when round 30 measured)


@functools.cache
def fn(name):
    f = mod.get_function(name)
    f.max_dynamic_shared_size_bytes = SMEM
    return f


def launch(name, cfg, a, b, bias, c, m, n, k, nb=None, seq=None, d=None):
    bn, tm = CFG[cfg]
    grid = ((n + bn - 1) // bn, (m + tm - 1) // tm, 1)
    i = np.int32
    args = (a, b, bias, c, i(nb), i(seq), i(m), i(n), i(k), i(d)) if nb is not None else (a, b, bias, c, i(m), i(n), i(k))
    fn(name)(grid, (384,), args, shared_mem=SMEM)


def to_bits(x, t):
    """f16 or bf16 (round to nearest even) bits of x, as uint16."""
    if t == "f16":
        return np.asarray(x, np.float16).view(np.uint16)
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bits(u, t):
    if t == "f16":
        return u.view(np.float16).astype(np.float64)
    return (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def name(layout, t, epi, cfg):
    return f"matmul_{layout}_{t}_{epi}" + (f"_{cfg}" if cfg else "")


def check(layout, t, cfg, nb, seq, heads, d, k, rng):
    m, n = nb * seq, heads * d
    a = to_bits(rng.standard_normal((m, k)), t)
    w = to_bits(rng.standard_normal((n, k) if layout == "nt" else (k, n)) / np.sqrt(k), t)
    bias = to_bits(rng.standard_normal((heads, d)), t)
    ga, gw, gb = (cp.asarray(x) for x in (a, w, bias))
    plain = cp.zeros((m, n), cp.uint16)
    launch(name(layout, t, "bias", cfg), cfg, ga, gw, gb, plain, m, n, k)
    wf = from_bits(w, t).T if layout == "nt" else from_bits(w, t)
    ref = (from_bits(a, t) @ wf + from_bits(bias, t).reshape(-1)).astype(np.float32)
    got_plain = from_bits(cp.asnumpy(plain), t)
    err = np.abs(got_plain - ref).max() / (np.abs(ref).max())
    ok = err < (1e-2 if t == "bf16" else 2e-3)
    res = []
    for epi, perm in (("bias_heads", (0, 2, 1, 3)), ("bias_heads_t", (0, 2, 3, 1))):
        shape = [nb, seq, heads, d]
        out = cp.full([shape[p] for p in perm], 0xFFFF, cp.uint16)  # NaN-filled: every element must be written
        launch(name(layout, t, epi, cfg), cfg, ga, gw, gb, out, m, n, k, nb, seq, d)
        want = cp.asnumpy(plain).reshape(nb, seq, heads, d).transpose(perm)
        same = np.array_equal(cp.asnumpy(out), want)
        res.append(f"{epi}={'bitwise' if same else 'DIFF'}")
        ok &= same
    print(f"{'OK ' if ok else 'BAD'} {layout} {t} cfg={cfg or 'default'} nb={nb} seq={seq} heads={heads} d={d} k={k}: "
          f"bias vs f64 rel err {err:.2e}; " + ", ".join(res), flush=True)
    return ok


def timed(f, reps=100, runs=5):
    """Device time a launch: `reps` launches captured in a CUDA graph (no host gaps), timed by events."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for _ in range(reps):
            f()
        graph = stream.end_capture()
    times = []
    for _ in range(runs):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(stream)
        graph.launch(stream)
        e.record(stream)
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) * 1000 / reps)
    return float(np.median(times))


def timing(m, nb, seq, cfg):
    n = k = 768
    heads, d = 12, 64
    a = cp.asarray(np.random.default_rng(1).standard_normal((m, k)).astype(np.float16).view(np.uint16))
    w = cp.asarray((np.random.default_rng(2).standard_normal((k, n)) / 30).astype(np.float16).view(np.uint16))
    bias = cp.zeros((heads, d), cp.uint16)
    c = cp.zeros((m * n,), cp.uint16)
    runs = {
        "bias": lambda: launch(name("nn", "f16", "bias", cfg), cfg, a, w, bias, c, m, n, k),
        "bias_heads": lambda: launch(name("nn", "f16", "bias_heads", cfg), cfg, a, w, bias, c, m, n, k, nb, seq, d),
        "bias_heads_t": lambda: launch(name("nn", "f16", "bias_heads_t", cfg), cfg, a, w, bias, c, m, n, k, nb, seq, d),
    }
    for f in runs.values():
        f()
    cp.cuda.Device().synchronize()
    out = {key: [] for key in runs}
    for _ in range(3):  # interleaved
        for key, f in runs.items():
            out[key].append(timed(f))
    print(f"TIME (graph of 100 launches) {m}x{n}x{k} cfg={cfg or 'default'} (nb={nb} seq={seq}): "
          + ", ".join(f"{key} {np.median(v):.2f} us" for key, v in out.items()), flush=True)


rng = np.random.default_rng(0)
ok = True
for layout, t, cfg, nb, seq, heads, d, k in [
    ("nn", "f16", "t64x64", 1, 128, 12, 64, 768),   # BERT b1s128
    ("nn", "f16", "t128x128", 8, 197, 12, 64, 768),  # ViT b8s197: m = 1576
    ("nn", "f16", "", 8, 512, 12, 64, 768),          # BERT b8s512: m = 4096
    ("nn", "f16", "t64x64", 3, 101, 5, 24, 264),    # odd m = 303, d % 8 == 0, d < tile
    ("nn", "f16", "t128x128", 3, 77, 6, 20, 100),   # k % 8 != 0: the mma.sync path; d % 8 != 0
    ("nn", "f16", "", 2, 99, 7, 40, 264),           # odd m, n = 280 (partial 256 tile)
    ("nt", "f16", "t64x64", 2, 65, 4, 64, 256),
    ("nt", "bf16", "t128x128", 3, 100, 25, 40, 264),
    ("nt", "bf16", "", 1, 300, 12, 64, 768),
    ("nn", "bf16", "t64x64", 2, 33, 3, 10, 72),     # d = 10: no 16-byte stores
]:
    ok &= check(layout, t, cfg, nb, seq, heads, d, k, rng)
print("ALL OK" if ok else "SOME BAD", flush=True)
for m, nb, seq, cfg in [(4096, 8, 512, ""), (128, 1, 128, "t64x64"), (1576, 8, 197, "t128x128")]:
    timing(m, nb, seq, cfg)
