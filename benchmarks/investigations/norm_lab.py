"""kernels/norm at model shapes on the GPU machine: builds of norm.cu with the lab's knobs
(KIT_NORM_CHUNKS, KIT_NORM_BLOCKS) and an earlier norm.cu, each at the grids the manifest's
count could give, against torch's F.layer_norm / F.rms_norm; device time from CUPTI (the kit's
KernelTimer), median of the calls; every result checked against float64.

    python benchmarks/investigations/norm_lab.py OUT.txt [OLD_NORM_CU] [--final]

OLD_NORM_CU: an earlier norm.cu to compare, e.g. `git show 0a577e5~1:kernels/norm/norm.cu` (round 33's),
saved anywhere (its includes resolve against this tree's kernels/norm).

Run 1 (the variants): `rule` a team per row of the fewest warps that hold it and a block per
row up to 384 rows, `teams` the same without the few-rows term, `block` a block per row.
--final: the library's build (4 chunks, 2 blocks an SM) at kitdispatch.toml's count.
"""

import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
NORM = HERE.parent.parent / "kernels" / "norm"
CALLS, WARMUP = 30, 5
SHAPES = [  # (kind, rows, cols): BERT/ViT/GPT-2 hidden 768 at b1s128, ViT b8, b8s512; Llama 2048 and 4096 hidden
    ("layer", 128, 768), ("layer_bias", 128, 768), ("layer", 1576, 768), ("layer", 4096, 768), ("layer", 512, 1024),
    ("rms", 512, 2048), ("rms", 128, 4096), ("rms", 512, 4096), ("rms", 2048, 4096), ("rms", 4096, 2048),
    ("rms", 16, 2048), ("layer", 64, 12288),
]
VARIANTS = [("c4b3", 4, 3), ("c2b3", 2, 3), ("c2b2", 2, 2), ("c4b2", 4, 2), ("c2b4", 2, 4)]  # run 1
if "--final" in sys.argv:  # the library's build and its count (run 2)
    VARIANTS = [("lib", 4, 2)]


def log(out, *a):
    line = " ".join(str(x) for x in a)
    print(line, flush=True)
    out.write(line + "\n")
    out.flush()


def grids(rows, cols, chunks):
    per_warp = 32 * chunks * 8  # halves a warp keeps in registers
    teams = max(1, 8 // -(-cols // per_warp))
    if VARIANTS[0][0] == "lib":  # kitdispatch.toml's count: twice as wide teams where the rows fit one wave so
        wide = max(1, 8 // -(-cols // (per_warp // 2)))
        return {"rule": min(max(-(-rows // teams), min(-(-rows // wide), 256)), 65535)}
    rule = min(max(-(-rows // teams), min(rows, 384)), 65535)
    return {"rule": rule, "teams": min(-(-rows // teams), 65535), "block": min(rows, 65535)}


def old_grid(rows, cols):
    return min(max(-(-rows // 8), min(rows, 384), min(rows, (cols // 1025) * 4096)), 65535)


def main(out_path, old_source=None):
    import cupy as cp
    import torch
    import torch.nn.functional as F

    from kitdispatch.run.timing import KernelTimer

    timer = KernelTimer.get()
    out = open(out_path, "w")
    props = torch.cuda.get_device_properties(0)
    log(out, "ENV", props.name, "torch", torch.__version__, "cupy", cp.__version__, "driver", cp.cuda.runtime.driverGetVersion())
    source = (NORM / "norm.cu").read_text()
    modules, chunks_of = {}, {}
    for name, chunks, blocks in VARIANTS:
        opts = ("-I" + str(NORM), "--std=c++17", f"-DKIT_NORM_CHUNKS={chunks}", f"-DKIT_NORM_BLOCKS={blocks}")
        modules[name] = cp.RawModule(code=source, options=opts)
        chunks_of[name] = chunks
    if old_source:
        modules["old"] = cp.RawModule(code=Path(old_source).read_text(), options=("-I" + str(NORM), "--std=c++17"))

    def device_us(fn):
        for _ in range(WARMUP):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(CALLS):
            with timer.collect() as spans:
                fn()
                torch.cuda.synchronize()
            times.append(sum(e - s for s, e in spans) / 1000)
        return statistics.median(times)

    rng = np.random.default_rng(0)
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    with stream:
        for kind, rows, cols in SHAPES:
            x64 = rng.standard_normal((rows, cols)) * 2 + 0.5
            w64 = 1 + 0.1 * rng.standard_normal(cols)
            b64 = 0.1 * rng.standard_normal(cols)
            x = torch.tensor(x64, dtype=torch.float16, device="cuda")
            w = torch.tensor(w64, dtype=torch.float16, device="cuda")
            b = torch.tensor(b64, dtype=torch.float16, device="cuda")
            xf, wf, bf = (t.double().cpu().numpy() for t in (x, w, b))
            if kind == "rms":
                ref = xf / np.sqrt((xf * xf).mean(-1, keepdims=True) + 1e-5) * wf
                entry, args = "rms_norm_f16", (x, w)
                torch_fn = lambda: F.rms_norm(x, (cols,), w, 1e-5)
            else:
                norm = (xf - xf.mean(-1, keepdims=True)) / np.sqrt(xf.var(-1, keepdims=True) + 1e-5)
                if kind == "layer":
                    ref, entry, args = norm * wf + bf, "layer_norm_f16", (x, w, b)
                    torch_fn = lambda: F.layer_norm(x, (cols,), w, b, 1e-5)
                else:
                    ref, entry, args = norm + bf, "layer_norm_bias_f16", (x, b)
                    torch_fn = lambda: F.layer_norm(x, (cols,), None, b, 1e-5)
            y = torch.empty_like(x)
            ptrs = [cp.intp(t.data_ptr()) for t in (*args, y)]
            scalars = (cp.float32(1e-5), cp.int32(0), cp.int32(rows), cp.int32(cols))
            cells = [f"torch {device_us(torch_fn):6.2f}"]
            for name, module in modules.items():
                fn = module.get_function(entry)
                choices = {"old": old_grid(rows, cols)} if name == "old" else grids(rows, cols, chunks_of[name])
                for gname, g in choices.items():
                    launch = lambda: fn((g,), (256,), (*ptrs, *scalars))
                    y.fill_(float("nan"))
                    launch()
                    torch.cuda.synchronize()
                    err = float(np.abs(y.double().cpu().numpy() - ref).max())
                    bad = "" if err < 2e-2 * max(1.0, float(np.abs(ref).max())) else f" BAD err {err:.3g}"
                    cells.append(f"{name}/{gname}[{g}] {device_us(launch):6.2f}{bad}")
            log(out, f"{kind:10s} {rows:5d}x{cols:<5d} |", " | ".join(cells))
    log(out, "done")


if __name__ == "__main__":
    main(*[a for a in sys.argv[1:] if a != "--final"])
