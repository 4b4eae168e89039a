"""Runtime benchmarks on a CUDA GPU: one custom kernel through IREE against a direct launch.

For the library's `add` kernel (kernels/elementwise, out = x + y, 12 bytes an element):
- dispatch efficiency: the kernel's device time when IREE dispatches it from the .vmfb against
  the same fatbin launched directly with cuda-python's cuLaunchKernel, both read by Nsight
  Compute (`gpu__time_duration`, clocks left alone) in one process; and the wall time of a whole
  call through iree.runtime with inputs already on the device (output allocation, dispatch and
  wait), against the direct launch's event time, for the per-call overhead;
- bandwidth: both against a device-to-device copy of the same size, measured in the same run;
- first-call latency: module load plus the first call, for ptx, cubin and fatbin builds, each in
  a fresh process with CUDA's JIT cache off.

Build here (a machine with iree-compile), run on the GPU machine:

    for f in fatbin cubin ptx; do
      kitdispatch build kernels/elementwise --arch sm_80,sm_90 --format $f -o build/rt/$f; done
    python benchmarks/runtime.py build/rt OUTDIR     # writes runtime.json and bandwidth.png
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SIZES = [1 << k for k in (10, 14, 18, 20, 22, 24, 26)]
BLOCK, PER_BLOCK = 256, 1024  # from kernels/elementwise/kitdispatch.toml


# ------------------------------------------------------------------------ direct launch


def _check(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    from cuda.bindings import driver as cu

    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else rest


class Direct:
    """The fatbin the .vmfb embeds, loaded and launched with the CUDA driver API."""

    def __init__(self, fatbin: bytes):
        from cuda.bindings import driver as cu

        self.cu = cu
        _check(cu.cuInit(0))
        dev = _check(cu.cuDeviceGet(0))
        self.ctx = _check(cu.cuDevicePrimaryCtxRetain(dev))
        _check(cu.cuCtxSetCurrent(self.ctx))
        self.module = _check(cu.cuModuleLoadData(fatbin))
        self.kernel = _check(cu.cuModuleGetFunction(self.module, b"add"))
        self.stream = _check(cu.cuStreamCreate(0))
        self.start, self.stop = _check(cu.cuEventCreate(0)), _check(cu.cuEventCreate(0))

    def alloc(self, host: np.ndarray):
        ptr = _check(self.cu.cuMemAlloc(host.nbytes))
        _check(self.cu.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes))
        return ptr

    def read(self, ptr, n: int) -> np.ndarray:
        out = np.empty(n, np.float32)
        _check(self.cu.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes))
        return out

    def time_ms(self, launch, reps: int) -> float:
        """Mean device time of one launch: events around `reps` back-to-back launches."""
        cu = self.cu
        launch()
        _check(cu.cuStreamSynchronize(self.stream))
        _check(cu.cuEventRecord(self.start, self.stream))
        for _ in range(reps):
            launch()
        _check(cu.cuEventRecord(self.stop, self.stream))
        _check(cu.cuEventSynchronize(self.stop))
        return _check(cu.cuEventElapsedTime(self.start, self.stop)) / reps

    def add_launcher(self, x, y, out, n: int):
        import ctypes

        cu = self.cu
        args = [ctypes.c_uint64(int(x)), ctypes.c_uint64(int(y)), ctypes.c_uint64(int(out)), ctypes.c_int32(n)]
        ptrs = (ctypes.c_void_p * 4)(*[ctypes.addressof(a) for a in args])
        grid = (n + PER_BLOCK - 1) // PER_BLOCK

        def launch():
            _check(cu.cuLaunchKernel(self.kernel, grid, 1, 1, BLOCK, 1, 1, 0, self.stream, ctypes.addressof(ptrs), 0))

        launch.keep = (args, ptrs)
        return launch

    def copy_launcher(self, dst, src, nbytes: int):
        return lambda: _check(self.cu.cuMemcpyDtoDAsync(dst, src, nbytes, self.stream))


# --------------------------------------------------------------------------------- IREE


def iree_time_ms(fn, args, reps: int) -> float:
    fn(*args)  # warm-up: module load, first dispatch
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(*args)  # synchronous: returns once the result is ready
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def reps_for(n: int) -> int:
    return max(20, min(2000, (1 << 28) // (12 * n)))


def measure(build_dir: Path) -> dict:
    import iree.runtime as rt

    import kitdispatch

    fat = build_dir / "fatbin"
    fatbin = next(fat.glob("*.fatbin")).read_bytes()
    direct = Direct(fatbin)
    module = kitdispatch.load_module(fat / "elementwise.vmfb")
    device = module.hal_device
    add = module.raw("add")
    rng = np.random.default_rng(0)
    rows = []
    for n in SIZES:
        x = rng.standard_normal(n, dtype=np.float32)
        y = rng.standard_normal(n, dtype=np.float32)
        reps = reps_for(n)
        dx, dy, dout = direct.alloc(x), direct.alloc(y), direct.alloc(np.full(n, np.nan, np.float32))
        d_ms = direct.time_ms(direct.add_launcher(dx, dy, dout, n), reps)
        assert np.array_equal(direct.read(dout, n), x + y)
        c_ms = direct.time_ms(direct.copy_launcher(dout, dx, 4 * n), reps)
        ix, iy = rt.asdevicearray(device, x), rt.asdevicearray(device, y)
        i_ms = iree_time_ms(add, (ix, iy), min(reps, 200))
        assert np.array_equal(np.asarray(add(ix, iy).to_host()), x + y)
        for p in (dx, dy, dout):
            direct.cu.cuMemFree(p)
        row = {
            "n": n,
            "bytes": 12 * n,
            "direct_us": d_ms * 1e3,
            "iree_us": i_ms * 1e3,
            "copy_us": c_ms * 1e3,
            "direct_gbs": 12 * n / d_ms / 1e6,
            "iree_gbs": 12 * n / i_ms / 1e6,
            "copy_gbs": 8 * n / c_ms / 1e6,
        }
        row["iree_call_overhead_us"] = row["iree_us"] - row["direct_us"]
        row["kernel_over_copy_bandwidth"] = row["direct_gbs"] / row["copy_gbs"]
        rows.append(row)
        print(
            f"n={n:>10}  direct {row['direct_us']:9.1f} us {row['direct_gbs']:7.0f} GB/s   "
            f"iree {row['iree_us']:9.1f} us {row['iree_gbs']:7.0f} GB/s   copy {row['copy_gbs']:7.0f} GB/s   "
            f"kernel/copy {row['kernel_over_copy_bandwidth']:.3f}",
            flush=True,
        )
    return {"sizes": rows}


NCU_SIZES = [1 << 20, 1 << 24, 1 << 26]
NCU_REPS = 3


def ncu_child(build_dir: Path, n: int) -> None:
    """Run under ncu: NCU_REPS dispatches through the .vmfb, then NCU_REPS direct launches."""
    import iree.runtime as rt

    import kitdispatch

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    module = kitdispatch.load_module(build_dir / "fatbin" / "elementwise.vmfb")
    dx, dy = rt.asdevicearray(module.hal_device, x), rt.asdevicearray(module.hal_device, y)
    for _ in range(NCU_REPS):
        module.raw("add")(dx, dy)
    direct = Direct(next((build_dir / "fatbin").glob("*.fatbin")).read_bytes())
    launch = direct.add_launcher(direct.alloc(x), direct.alloc(y), direct.alloc(x), n)
    for _ in range(NCU_REPS):
        launch()
    _check(direct.cu.cuStreamSynchronize(direct.stream))


def device_times(build_dir: Path) -> list[dict]:
    """Kernel device time, vmfb against direct, from Nsight Compute; [] without ncu."""
    import shutil

    ncu = shutil.which("ncu")
    if not ncu:
        print("ncu not found: device-time comparison skipped", flush=True)
        return []
    rows = []
    for n in NCU_SIZES:
        res = subprocess.run(
            [ncu, "--clock-control", "none", "--kernel-name", "add", "--metrics", "gpu__time_duration.sum", "--csv",
             sys.executable, __file__, "--ncu-child", str(n), str(build_dir)],
            capture_output=True, text=True, timeout=600, check=True,
        )
        ns = [float(line.rsplit('","', 1)[1].strip('"').replace(",", "")) for line in res.stdout.splitlines()
              if "gpu__time_duration.sum" in line]
        if len(ns) != 2 * NCU_REPS:
            raise RuntimeError(f"expected {2 * NCU_REPS} kernel times from ncu, got {ns}\n{res.stdout}\n{res.stderr}")
        iree_us, direct_us = statistics.median(ns[:NCU_REPS]) / 1e3, statistics.median(ns[NCU_REPS:]) / 1e3
        row = {"n": n, "iree_kernel_us": iree_us, "direct_kernel_us": direct_us, "iree_over_direct_throughput": direct_us / iree_us}
        rows.append(row)
        print(f"n={n:>10}  kernel device time: vmfb {iree_us:8.1f} us   direct {direct_us:8.1f} us   "
              f"vmfb/direct throughput {row['iree_over_direct_throughput']:.3f}", flush=True)
    return rows


FIRST_CALL = """
import sys, time
t0 = time.perf_counter()
import numpy as np, kitdispatch
m = kitdispatch.load_module(sys.argv[1])
x = np.ones(1024, np.float32)
t1 = time.perf_counter()
out = m.add(x, x)
t2 = time.perf_counter()
assert (out == 2).all()
print(t1 - t0, t2 - t1)
"""


def first_call(build_dir: Path) -> dict:
    """Load + first call in a fresh process, JIT cache off, 3 runs each; median."""
    env = {**os.environ, "CUDA_CACHE_DISABLE": "1"}
    out = {}
    for fmt in ("ptx", "cubin", "fatbin"):
        runs = []
        for _ in range(3):
            res = subprocess.run([sys.executable, "-c", FIRST_CALL, str(build_dir / fmt / "elementwise.vmfb")],
                                 capture_output=True, text=True, env=env, timeout=300, check=True)
            load, call = map(float, res.stdout.split())
            runs.append((load, call))
        out[fmt] = {
            "load_ms": statistics.median(r[0] for r in runs) * 1e3,
            "first_call_ms": statistics.median(r[1] for r in runs) * 1e3,
        }
        print(f"{fmt:<7} load {out[fmt]['load_ms']:8.1f} ms   first call {out[fmt]['first_call_ms']:8.1f} ms", flush=True)
    return out


def environment() -> dict:
    from environment import base

    return {**base("iree-base-runtime", "cuda-bindings"), "numpy": np.__version__}


def plot(rows: list[dict], device_rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["bytes"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(sizes, [r["iree_gbs"] for r in rows], "o-", label="custom add, whole call through iree.runtime")
    ax.plot(sizes, [r["direct_gbs"] for r in rows], "s--", label="same kernel, direct cuLaunchKernel (events)")
    ax.plot(sizes, [r["copy_gbs"] for r in rows], "^:", label="device-to-device copy")
    if device_rows:
        ax.plot([12 * r["n"] / 1e6 for r in device_rows], [12 * r["n"] / r["iree_kernel_us"] / 1e3 for r in device_rows],
                "D", markersize=9, label="custom add dispatched by IREE, kernel time (ncu)")
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved by the kernel (MB)")
    ax.set_ylabel("GB/s (bytes read + written)")
    ax.set_title("kitdispatch: bandwidth of a custom kernel")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    if sys.argv[1] == "--ncu-child":
        return ncu_child(Path(sys.argv[3]), int(sys.argv[2]))
    build_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(json.dumps(env))
    results = {
        "environment": env,
        **measure(build_dir),
        "device_time": device_times(build_dir),
        "first_call": first_call(build_dir),
    }
    (out_dir / "runtime.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results["sizes"], results["device_time"], out_dir / "bandwidth.png")


if __name__ == "__main__":
    main()
