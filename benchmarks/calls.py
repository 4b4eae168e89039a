"""What a call costs above its kernel: kitdispatch's runtime against a direct launch.

The library's `add` (kernels/elementwise, out = x + y) on the GPU, inputs on the device:

- 1K elements, a loop of LOOP async calls waited for once: wall time per call minus the
  kernel's device time (CUPTI), for kitdispatch's `launch` (outputs from the pool, and `out=`),
  against the same fatbin launched with cuda-python's cuLaunchKernel, torch's eager add, and
  iree-benchmark-module running the module's synchronous `add`;
- 64M elements with outputs from the pool: whole call (a loop of calls waited for once, and
  single synchronous calls) against the kernel's device time;
- synchronous single calls at both sizes, the call IREE's Python API made before (FunctionInvoker,
  device arrays), and IREE's caching allocator for that call;
- prepared calls and repeated launch(out=) (recorded command buffers), IREE alone below the kit
  (its VM call, a recorded command buffer), and whether 60000 back-to-back submissions keep
  their order (IREE alone) and 6000 dependent kit calls compute what they should;
- torch CUDA tensors in and out through the kit (`torch_calls`): first calls on new tensors,
  repeated launches and prepared calls (imports kept per tensor), and a torch add queued before
  each kit call (the host wait for torch's stream), against torch eager and the kernel;
- every benchmarked result compared with numpy once.

Where the time goes (H100, driver 580.159.04, iree-base-runtime 3.13.0; results/calls.json,
results/calls-recorded-h100.txt, and results/calls-investigation-h100.txt with the scripts under
benchmarks/investigations/: per-thread CPU time from /proc, CUPTI for device times; py-spy and
nsys are not on the GPU machine and IREE's CUDA HAL has no native profiling in 3.13):

- The kernel: 1.1 us at 1K, 264 us at 64M, the same through IREE as launched directly.
- A call through IREE is three threads: the caller (the VM function records a deferred command
  buffer and queues it, 7.3 us), IREE's worker (replays it onto the CUDA stream, 10-12 us of CPU
  a call) and its completion thread (waits for the event, signals the fence, 7-8 us); a loop of
  calls runs at the slowest of them (runtime/src/iree/hal/utils/deferred_work_queue.c).
- A recorded call (NAME$record, queued again by PreparedCall and by repeated launch(out=)) skips
  the VM: 1.1 us on the caller, 6.7 us a call in a loop, bound by IREE's worker.
- The fence a call signals: signalling the device's own semaphores makes IREE's completion
  thread issue the queue too, and calls then reach the stream out of order (the device failed
  within 6000 submissions, submission_order section); the kit's semaphores belong to an idle
  second device (device.py), which also took a little off every call (7.2 -> 6.7 us recorded,
  8.1 -> 7.8 us through the VM).
- Chaining calls by fences (each waits on the one before) costs 94-107 us a call: a wait not yet
  issued holds the call in IREE's host queue until something wakes it.
- IREE's graph command buffers (--cuda_use_streams=false) make a recorded call 4.3-5.5 us, but
  every VM call 45-65 us (a CUDA graph instantiated per call), for every module in the process:
  not used.
- Output allocation: IREE's synchronous `add` allocates its result with cuMemAllocFromPoolAsync
  from a pool whose release threshold is 0, and frees it with a synchronizing cuMemFree when
  Python drops it (drivers/cuda/memory_pools.c): 178 us a call at 1K, 1124 us at 64M. The kit's
  calls write into pooled or given buffers.
- Python: packing a call's argument list and fences costs 4.6 us; the kit's checks and output
  handling make a launch 22.6 us (out=) and 26.3 us (pool) through the VM; a prepared call
  7.9 us a call in a loop (3.9 us on the caller).
- A synchronous call adds IREE's thread hand-offs to the launch: 47 us at 1K, 327 us at 64M
  (1.24x the kernel).

Build here (a machine with iree-compile), run on the GPU machine:

    kitdispatch build kernels/elementwise --arch sm_90 -o build/elementwise
    python benchmarks/calls.py build/elementwise OUTDIR   # writes calls.json and calls.txt
    python benchmarks/calls.py build/elementwise OUTDIR --torch-only   # the torch sections alone
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

SMALL, LARGE = 1 << 10, 1 << 26
LOOP = 1000  # async calls per loop at 1K
LOOP_LARGE = 50
SYNC_CALLS = 300
ROUNDS = 15  # interleaved loops of the torch section
BLOCK, PER_BLOCK = 256, 1024  # kernels/elementwise/kitdispatch.toml

RESULTS: dict = {}
CHECKS: dict[str, str] = {}


def record(key: str, value) -> None:
    RESULTS[key] = value
    print(f"{key:<58} {value:10.2f}" if isinstance(value, float) else f"{key:<58} {value}", flush=True)


def checked(name: str, got, expected) -> None:
    """Every benchmarked result matches numpy, once."""
    ok = np.array_equal(np.asarray(got), expected)
    CHECKS[name] = "ok" if ok else "MISMATCH"
    if not ok:
        print(f"CHECK FAILED: {name}", flush=True)


def section(fn):
    def run(*args):
        try:
            return fn(*args)
        except Exception:
            print(f"--- {fn.__name__} failed:\n{traceback.format_exc()}", flush=True)
            RESULTS.setdefault("failed_sections", []).append(fn.__name__)

    return run


def per_call_us(loop, calls: int, wait) -> float:
    loop()  # warm-up
    wait()
    start = time.perf_counter()
    for _ in range(calls):
        loop()
    wait()
    return (time.perf_counter() - start) / calls * 1e6


def interleaved_per_call_us(loops: dict, calls: int, rounds: int) -> dict[str, float]:
    """name -> median over `rounds` of per_call_us(loop, calls, wait), the loops taken in turn
    each round, so that each sees the same moments of a noisy host; the spread is recorded too."""
    samples: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(rounds):
        for name, (loop, wait) in loops.items():
            samples[name].append(per_call_us(loop, calls, wait))
    for name, values in samples.items():
        RESULTS[f"{name}_rounds"] = [round(v, 2) for v in values]
    return {name: statistics.median(values) for name, values in samples.items()}


def median_us(call, calls: int) -> float:
    call()
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def kernel_us(launch, wait, reps: int = 200) -> float:
    """Mean device time of the kernels one `launch` runs (CUPTI)."""
    from kitdispatch.run.timing import KernelTimer

    launch()
    wait()
    with KernelTimer.get().collect() as spans:
        for _ in range(reps):
            launch()
        wait()
    return sum(e - s for s, e in spans) / reps / 1e3


# ------------------------------------------------------------------------ direct launch


class Direct:
    """The fatbin the .vmfb embeds, launched with cuda-python's driver API."""

    def __init__(self, fatbin: bytes):
        from cuda.bindings import driver as cu

        self.cu = cu
        self.check(cu.cuInit(0))
        self.ctx = self.check(cu.cuDevicePrimaryCtxRetain(self.check(cu.cuDeviceGet(0))))
        self.check(cu.cuCtxSetCurrent(self.ctx))
        self.kernel = self.check(cu.cuModuleGetFunction(self.check(cu.cuModuleLoadData(fatbin)), b"add"))
        self.stream = self.check(cu.cuStreamCreate(1))

    def check(self, result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA error {err}")
        return rest[0] if len(rest) == 1 else rest

    def upload(self, host: np.ndarray):
        ptr = self.check(self.cu.cuMemAlloc(host.nbytes))
        self.check(self.cu.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes))
        return ptr

    def download(self, ptr, n: int) -> np.ndarray:
        out = np.empty(n, np.float32)
        self.check(self.cu.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes))
        return out

    def launcher(self, x, y, out, n: int):
        cu = self.cu
        args = [ctypes.c_uint64(int(x)), ctypes.c_uint64(int(y)), ctypes.c_uint64(int(out)), ctypes.c_int32(n)]
        ptrs = (ctypes.c_void_p * 4)(*[ctypes.addressof(a) for a in args])
        grid = (n + PER_BLOCK - 1) // PER_BLOCK
        kernel, stream, address = self.kernel, self.stream, ctypes.addressof(ptrs)

        def launch():
            cu.cuLaunchKernel(kernel, grid, 1, 1, BLOCK, 1, 1, 0, stream, address, 0)

        launch.keep = (args, ptrs)
        return launch

    def wait(self):
        self.check(self.cu.cuStreamSynchronize(self.stream))


@section
def direct_launch(fatbin: bytes, host: dict) -> None:
    d = Direct(fatbin)
    for n, tag in ((SMALL, "1k"), (LARGE, "64m")):
        x, y = host[n]
        dx, dy, dout = d.upload(x), d.upload(y), d.upload(np.full(n, np.nan, np.float32))
        launch = d.launcher(dx, dy, dout, n)
        loop = LOOP if n == SMALL else LOOP_LARGE
        record(f"direct_{tag}_per_call_us", per_call_us(launch, loop, d.wait))
        record(f"direct_{tag}_sync_us", median_us(lambda: (launch(), d.wait()), SYNC_CALLS))
        record(f"direct_{tag}_kernel_us", kernel_us(launch, d.wait))
        checked(f"direct {tag}", d.download(dout, n), x + y)
        for p in (dx, dy, dout):
            d.check(d.cu.cuMemFree(p))


# --------------------------------------------------------------------------------- torch


@section
def torch_add(host: dict) -> None:
    import torch

    RESULTS["torch"] = torch.__version__
    sync = torch.cuda.synchronize
    for n, tag in ((SMALL, "1k"), (LARGE, "64m")):
        x, y = (torch.from_numpy(a).cuda() for a in host[n])
        o = torch.empty_like(x)
        loop = LOOP if n == SMALL else LOOP_LARGE
        record(f"torch_{tag}_per_call_us", per_call_us(lambda: torch.add(x, y, out=o), loop, sync))
        record(f"torch_{tag}_sync_us", median_us(lambda: (torch.add(x, y, out=o), sync()), SYNC_CALLS))
        record(f"torch_{tag}_kernel_us", kernel_us(lambda: torch.add(x, y, out=o), sync))
        checked(f"torch {tag}", o.cpu().numpy(), host[n][0] + host[n][1])


# ---------------------------------------------------------------------------- kitdispatch


@section
def kit_calls(module, host: dict) -> None:
    """The kit's fast path: NAME$async, outputs from the pool or given, one ordered stream."""
    dev = module.device
    add = module.add
    for n, tag in ((SMALL, "1k"), (LARGE, "64m")):
        x, y = host[n]
        dx, dy = dev.put(x), dev.put(y)
        out = dev.empty((n,), np.float32)
        loop = LOOP if n == SMALL else LOOP_LARGE
        launch = add.launch
        record(f"kit_{tag}_kernel_us", kernel_us(lambda: launch(dx, dy, out=out), dev.synchronize))
        record(f"kit_{tag}_launch_pooled_per_call_us", per_call_us(lambda: launch(dx, dy), loop, dev.synchronize))
        record(f"kit_{tag}_launch_out_per_call_us", per_call_us(lambda: launch(dx, dy, out=out), loop, dev.synchronize))
        issue = per_call_us(lambda: launch(dx, dy, out=out), loop, lambda: None)
        dev.synchronize()
        record(f"kit_{tag}_launch_issue_only_us", issue)
        prepared = add.prepare(dx, dy, out=out)
        record(f"kit_{tag}_prepared_per_call_us", per_call_us(prepared.launch, loop, dev.synchronize))
        issue = per_call_us(prepared.launch, loop, lambda: None)
        dev.synchronize()
        record(f"kit_{tag}_prepared_issue_only_us", issue)
        record(f"kit_{tag}_prepared_sync_us", median_us(prepared, SYNC_CALLS if n == SMALL else 50))
        record(f"kit_{tag}_sync_pooled_us", median_us(lambda: add(dx, dy), SYNC_CALLS if n == SMALL else 50))
        record(f"kit_{tag}_sync_out_us", median_us(lambda: add(dx, dy, out=out), SYNC_CALLS if n == SMALL else 50))
        record(f"kit_{tag}_numpy_in_out_us", median_us(lambda: add(x, y), 50 if n == SMALL else 3))
        checked(f"kit {tag} pooled", add.launch(dx, dy).to_host(), x + y)
        checked(f"kit {tag} out=", add(dx, dy, out=dev.empty((n,), np.float32)).to_host(), x + y)
        checked(f"kit {tag} numpy", add(x, y), x + y)
        out.device.synchronize()
        prepared = add.prepare(dx, dy, out=dev.empty((n,), np.float32))
        checked(f"kit {tag} prepared", prepared().to_host(), x + y)
        RESULTS[f"kit_{tag}_overhead_pooled_us"] = RESULTS[f"kit_{tag}_launch_pooled_per_call_us"] - RESULTS[f"kit_{tag}_kernel_us"]
        RESULTS[f"kit_{tag}_overhead_out_us"] = RESULTS[f"kit_{tag}_launch_out_per_call_us"] - RESULTS[f"kit_{tag}_kernel_us"]
        RESULTS[f"kit_{tag}_overhead_prepared_us"] = RESULTS[f"kit_{tag}_prepared_per_call_us"] - RESULTS[f"kit_{tag}_kernel_us"]
        RESULTS[f"kit_{tag}_whole_call_over_kernel"] = RESULTS[f"kit_{tag}_launch_pooled_per_call_us"] / RESULTS[f"kit_{tag}_kernel_us"]
        RESULTS[f"kit_{tag}_sync_over_kernel"] = RESULTS[f"kit_{tag}_sync_pooled_us"] / RESULTS[f"kit_{tag}_kernel_us"]
    RESULTS["pool"] = vars(dev.pool.stats)


@section
def breakdown(module, host: dict) -> None:
    """Where a call's time goes, IREE alone: its VM call (NAME$async, argument lists packed
    beforehand) and a recorded command buffer (NAME$record) queued again, signalling semaphores
    of the device itself or of the kit's idle timeline device (device.py); chained waits."""
    import iree.runtime as rt

    dev = module.device
    x, y = host[SMALL]
    dx, dy = dev.put(x), dev.put(y)
    out = dev.empty((SMALL,), np.float32)
    lookup, invoke = module._vm_module.lookup_function, module._context.vm_context.invoke
    fn = lookup("add$async")
    no_wait = rt.HalFence(0)
    record_args = rt.VmVariantList(3)
    for a in (dx, dy, out):
        record_args.push_ref(a._buffer_view.ref)
    recorded = rt.VmVariantList(1)
    invoke(lookup("add$record"), record_args, recorded)
    commands = recorded.get_as_object(0, rt.HalCommandBuffer)

    def packed(wait, signal):
        args = rt.VmVariantList(5)
        for a in (dx, dy, out):
            args.push_ref(a._buffer_view.ref)
        args.push_ref(wait.ref)
        args.push_ref(signal.ref)
        return args

    for owner, tag in ((dev.hal, "own"), (dev.timeline, "timeline")):
        # A ring of semaphores as the kit uses, so a reordering does not fail the device here.
        ring = [owner.create_semaphore(0) for _ in range(64)]
        points = [(ring[i % 64], i // 64 + 1) for i in range(LOOP)]
        lists = [packed(no_wait, rt.HalFence.create_at(*p)) for p in points]
        t = time.perf_counter()
        for a in lists:
            invoke(fn, a, rt.VmVariantList(1))
        issue = time.perf_counter() - t
        rt.HalFence.create_at(*points[-1]).wait()  # the last call: calls complete in order
        total = time.perf_counter() - t
        record(f"iree_invoke_only_{tag}_issue_us", issue / LOOP * 1e6)
        record(f"iree_invoke_only_{tag}_per_call_us", total / LOOP * 1e6)
        ring = [owner.create_semaphore(0) for _ in range(64)]
        fences = [rt.HalFence.create_at(ring[i % 64], i // 64 + 1) for i in range(LOOP)]
        t = time.perf_counter()
        for f in fences:
            dev.hal.queue_execute(commands, no_wait, f)
        issue = time.perf_counter() - t
        fences[-1].wait()
        total = time.perf_counter() - t
        record(f"iree_recorded_{tag}_issue_us", issue / LOOP * 1e6)
        record(f"iree_recorded_{tag}_per_call_us", total / LOOP * 1e6)
    # Chained: every call waits on the one before (the order said through IREE's fences). On
    # the device's own semaphores: a wait on the timeline device's would never wake the queue.
    sem = dev.hal.create_semaphore(0)
    lists = [packed(rt.HalFence.create_at(sem, i), rt.HalFence.create_at(sem, i + 1)) for i in range(LOOP)]
    t = time.perf_counter()
    for a in lists:
        invoke(fn, a, rt.VmVariantList(1))
    issue = time.perf_counter() - t
    rt.HalFence.create_at(sem, LOOP).wait()
    record("iree_invoke_only_chained_issue_us", issue / LOOP * 1e6)
    record("iree_invoke_only_chained_per_call_us", (time.perf_counter() - t) / LOOP * 1e6)
    # Packing a call's argument list in Python (fences included), without invoking.
    record("python_pack_only_us", per_call_us(lambda: packed(no_wait, rt.HalFence.create_at(sem, 1)), LOOP, lambda: None))
    # Synchronous: one invoke and its wait.
    def one():
        v = sem.query()
        invoke(fn, packed(no_wait, rt.HalFence.create_at(sem, v + 1)), rt.VmVariantList(1))
        rt.HalFence.create_at(sem, v + 1).wait()
    record("iree_invoke_and_wait_us", median_us(one, SYNC_CALLS))
    checked("breakdown out", out.to_host(), x + y)


ORDER_CHILD = """
import sys, numpy as np, iree.runtime as rt
vmfb, owner_kind, loops, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
config = rt.Config("cuda")
dev = config.device
ctx = rt.SystemContext(config=config)
vm = rt.VmModule.mmap(config.vm_instance, vmfb); ctx.add_vm_module(vm)
owner = dev if owner_kind == "own" else rt.get_device("cuda", cache=False)
def put(a):
    return dev.allocator.allocate_buffer_copy(memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
                                              device=dev, buffer=a, element_type=rt.HalElementType.FLOAT_32)
n = 1 << 10
args = rt.VmVariantList(3)
for a in (np.ones(n, np.float32), np.ones(n, np.float32), np.zeros(n, np.float32)):
    args.push_ref(put(a).ref)
res = rt.VmVariantList(1)
ctx.vm_context.invoke(vm.lookup_function("add$record"), args, res)
commands = res.get_as_object(0, rt.HalCommandBuffer)
no_wait = rt.HalFence(0)
for loop in range(loops):
    sem = owner.create_semaphore(0)
    try:
        for v in range(1, calls + 1):
            dev.queue_execute(commands, no_wait, rt.HalFence.create_at(sem, v))
        rt.HalFence.create_at(sem, calls).wait()
    except (RuntimeError, ValueError) as exc:  # the device's queue fails for good
        print(loop * calls + v, str(exc).strip().splitlines()[-1][-100:])
        sys.exit(0)
print(loops * calls, "in order")
"""


@section
def submission_order(vmfb: Path) -> None:
    """Back-to-back submissions that wait on nothing, each signalling the next value of one
    semaphore: IREE fails the device at the first one signalled out of order. Semaphores of
    the device itself against the kit's idle timeline device (device.py), each in a process of
    its own (a failed queue stays failed)."""
    for owner in ("own", "timeline"):
        res = subprocess.run([sys.executable, "-c", ORDER_CHILD, str(vmfb), owner, "20", "3000"], capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-2000:])
        count, _, outcome = res.stdout.strip().partition(" ")
        record(f"order_{owner}_semaphores_submissions", int(count))
        RESULTS[f"order_{owner}_semaphores_outcome"] = outcome


@section
def dependent_calls_keep_order(module, host: dict) -> None:
    """Calls that read what the call before wrote, 2 x 3000 of them, through prepared calls
    (recorded command buffers) and through launch (NAME$async): exact against numpy."""
    dev, add = module.device, module.add
    one = dev.put(np.ones(SMALL, np.float32))
    for tag in ("prepared", "launch"):
        p, q = dev.put(np.zeros(SMALL, np.float32)), dev.empty((SMALL,), np.float32)
        if tag == "prepared":
            steps = (add.prepare(p, one, out=q).launch, add.prepare(q, one, out=p).launch)
        else:
            steps = (lambda: add.launch(p, one, out=q), lambda: add.launch(q, one, out=p))
        for _ in range(3000):
            for step in steps:
                step()
        checked(f"6000 dependent calls, {tag}", p.to_host(), np.full(SMALL, 6000.0, np.float32))


@section
def old_paths(module, host: dict) -> None:
    """IREE's FunctionInvoker with IREE's device arrays (the call before this change)."""
    import iree.runtime as rt

    raw = module.raw("add")
    for n, tag in ((SMALL, "1k"), (LARGE, "64m")):
        x, y = host[n]
        dx, dy = rt.asdevicearray(module.hal_device, x), rt.asdevicearray(module.hal_device, y)
        record(f"iree_invoker_{tag}_sync_us", median_us(lambda: raw(dx, dy), SYNC_CALLS if n == SMALL else 30))
        checked(f"iree invoker {tag}", raw(dx, dy).to_host(), x + y)


CACHING_CHILD = """
import sys, time, statistics, numpy as np, iree.runtime as rt
from iree.runtime import _binding
rt.flags.parse_flags("--cuda_async_allocations=false")
driver = _binding.create_hal_driver("cuda")
device = driver.create_default_device(allocators=["caching"])
config = rt.Config(device=device)
ctx = rt.SystemContext(config=config)
vm = rt.VmModule.mmap(config.vm_instance, sys.argv[1]); ctx.add_vm_module(vm)
add = ctx.modules[vm.name]["add"]
out = {}
for n, reps in ((1 << 10, 300), (1 << 26, 30)):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(n, dtype=np.float32); y = rng.standard_normal(n, dtype=np.float32)
    dx, dy = rt.asdevicearray(device, x), rt.asdevicearray(device, y)
    r = add(dx, dy); assert np.array_equal(r.to_host(), x + y)
    del r
    s = []
    for _ in range(reps):
        t = time.perf_counter(); r = add(dx, dy); s.append(time.perf_counter() - t); del r
    out[n] = statistics.median(s) * 1e6
print(out[1 << 10], out[1 << 26])
"""


@section
def iree_caching_allocator(vmfb: Path) -> None:
    """IREE's caching allocator only sees allocations once the CUDA HAL's stream-ordered
    pools are off: queue_alloca goes to cuMemAllocFromPoolAsync first (cuda_device.c)."""
    res = subprocess.run([sys.executable, "-c", CACHING_CHILD, str(vmfb)], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    small, large = map(float, res.stdout.split())
    record("iree_invoker_caching_no_async_alloc_1k_sync_us", small)
    record("iree_invoker_caching_no_async_alloc_64m_sync_us", large)
    CHECKS["iree caching allocator"] = "ok"


@section
def iree_benchmark_module(vmfb: Path, host: dict) -> None:
    from kitdispatch.run.cli_calls import find_runtime_tool

    tool = find_runtime_tool("iree-benchmark-module")
    runner = find_runtime_tool("iree-run-module")
    with tempfile.TemporaryDirectory() as tmp:
        for n, tag in ((SMALL, "1k"), (LARGE, "64m")):
            x, y = host[n]
            np.save(f"{tmp}/x.npy", x)
            np.save(f"{tmp}/y.npy", y)
            inputs = [f"--input=@{tmp}/x.npy", f"--input=@{tmp}/y.npy"]
            res = subprocess.run(
                [tool, "--device=cuda", f"--module={vmfb}", "--function=add", *inputs,
                 "--benchmark_format=json", "--benchmark_min_time=2s" if n == SMALL else "--benchmark_min_time=3s"],
                capture_output=True, text=True, timeout=300,
            )
            if res.returncode != 0:
                raise RuntimeError(res.stderr[-2000:])
            bench = json.loads(res.stdout)["benchmarks"][0]
            unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3}[bench.get("time_unit", "ns")]
            record(f"iree_benchmark_module_{tag}_real_us", bench["real_time"] * unit)
            res = subprocess.run([runner, "--device=cuda", f"--module={vmfb}", "--function=add", *inputs, f"--output=@{tmp}/out.npy"],
                                 capture_output=True, text=True, timeout=300)
            if res.returncode != 0:
                raise RuntimeError(res.stderr[-2000:])
            checked(f"iree-run-module {tag}", np.load(f"{tmp}/out.npy"), x + y)


@section
def dlpack_round_trip(module, host: dict) -> None:
    """torch tensors in and out without copies: a call on torch tensors, out= a torch tensor."""
    import torch

    x, y = host[SMALL]
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    to = torch.empty_like(tx)
    add = module.add
    result = add(tx, ty, out=to)
    checked("dlpack torch out=", to.cpu().numpy(), x + y)
    assert result is to
    back = torch.from_dlpack(add(tx, ty))
    checked("dlpack torch from_dlpack", back.cpu().numpy(), x + y)
    record("kit_1k_torch_in_out_sync_us", median_us(lambda: add(tx, ty, out=to), SYNC_CALLS))
    record("kit_1k_torch_in_out_launch_per_call_us", per_call_us(lambda: add.launch(tx, ty, out=to), LOOP, module.device.synchronize))
    dev = module.device
    capsule_us = median_us(lambda: tx.__dlpack__(stream=None), SYNC_CALLS)
    record("torch_dlpack_export_us", capsule_us)
    record("legacy_stream_sync_us", median_us(dev._producer_sync, SYNC_CALLS))
    record("iree_from_dlpack_with_export_us", median_us(lambda: dev.hal.from_dlpack_capsule(tx.__dlpack__(stream=None)), SYNC_CALLS))
    record("kit_asarray_torch_us", median_us(lambda: dev.asarray(tx), SYNC_CALLS))
    vx, vy = module.device.asarray(tx), module.device.asarray(ty)  # imported once
    vo = module.device.asarray(to)
    record("kit_1k_torch_views_launch_per_call_us", per_call_us(lambda: add.launch(vx, vy, out=vo), LOOP, module.device.synchronize))
    module.device.synchronize()
    checked("dlpack torch views", to.cpu().numpy(), x + y)


@section
def torch_calls(module, host: dict) -> None:
    """torch CUDA tensors in and out through the kit (device.TorchImports): first calls on new
    tensors (each imported through DLPack), repeated calls (imports kept, the recorded path),
    and calls after torch work still queued (the host wait IREE 3.13 cannot avoid: it cannot
    wait on a CUDA event), against torch eager, a direct launch and the kernel's device time."""
    import torch

    add, dev = module.add, module.device
    x, y = host[SMALL]
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    to, tz = torch.empty_like(tx), torch.empty_like(tx)
    fresh = [(tx.clone(), ty.clone(), torch.empty_like(tx)) for _ in range(100)]
    torch.cuda.synchronize()
    samples = []
    for a, b, o in fresh:
        t = time.perf_counter()
        add(a, b, out=o)
        samples.append(time.perf_counter() - t)
    record("kit_1k_torch_first_call_sync_us", statistics.median(samples) * 1e6)
    checked("torch first calls", fresh[-1][2].cpu().numpy(), x + y)
    del fresh
    record("kit_1k_torch_kernel_us", kernel_us(lambda: add.launch(tx, ty, out=to), dev.synchronize))
    prepared = add.prepare(tx, ty, out=to)
    loops = {  # interleaved rounds: the host's noise between loops is as large as the differences
        "kit_1k_torch_launch_per_call_us": (lambda: add.launch(tx, ty, out=to), dev.synchronize),
        "kit_1k_torch_prepared_per_call_us": (prepared.launch, dev.synchronize),
        "torch_1k_eager_per_call_us": (lambda: torch.add(tx, ty, out=to), torch.cuda.synchronize),
    }
    for name, value in interleaved_per_call_us(loops, LOOP, ROUNDS).items():
        record(name, value)
    issue = per_call_us(lambda: add.launch(tx, ty, out=to), LOOP, lambda: None)
    dev.synchronize()
    record("kit_1k_torch_launch_issue_only_us", issue)
    record("kit_1k_torch_sync_us", median_us(lambda: add(tx, ty, out=to), SYNC_CALLS))
    add.launch(tx, ty, out=to)
    checked("torch repeated calls", to.cpu().numpy(), x + y)
    both = lambda: (dev.synchronize(), torch.cuda.synchronize())  # noqa: E731
    pair = lambda: (torch.add(tx, ty, out=tz), add.launch(tz, ty, out=to))  # noqa: E731
    record("kit_1k_torch_after_torch_add_per_pair_us", per_call_us(pair, LOOP, both))
    checked("torch add then kit add, in order", to.cpu().numpy(), x + y + y)
    record("torch_1k_two_adds_per_pair_us", per_call_us(lambda: (torch.add(tx, ty, out=tz), torch.add(tz, ty, out=to)), LOOP, torch.cuda.synchronize))
    RESULTS["kit_1k_torch_imports_kept"] = len(dev.torch_imports)
    RESULTS["iree_cuda_semaphore_imports_cuda_event"] = cuda_event_import(dev, torch)
    RESULTS["kit_1k_torch_overhead_us"] = RESULTS["kit_1k_torch_launch_per_call_us"] - RESULTS["kit_1k_torch_kernel_us"]
    RESULTS["kit_1k_torch_prepared_overhead_us"] = RESULTS["kit_1k_torch_prepared_per_call_us"] - RESULTS["kit_1k_torch_kernel_us"]


def cuda_event_import(dev, torch) -> str:
    """Whether IREE's CUDA semaphores take a CUDA event as a timepoint (what would let a call
    wait for torch on the GPU instead of the host): IREE's answer."""
    import iree.runtime as rt

    event = torch.cuda.Event()
    event.record()
    timepoint = rt.HalExternalTimepoint()
    try:
        timepoint.type = rt.ExternalTimepointType.CUDA_EVENT
        timepoint.cuda_event = event.cuda_event
        dev.hal.create_semaphore(0).import_timepoint(1, timepoint)
    except Exception as exc:  # IREE's status text is the answer
        return f"no: {type(exc).__name__}: {str(exc).strip()[:300]}"
    return "yes"


@section
def cli_benchmark(vmfb: Path) -> None:
    from kitdispatch.cli import main
    import io

    for n in (SMALL, LARGE):
        out, err = io.StringIO(), io.StringIO()
        code = main(["run", str(vmfb), "--function", "add", "--input", f"{n}xf32=1.5", "--input", f"{n}xf32=2",
                     "--benchmark", str(LOOP if n == SMALL else LOOP_LARGE)], out, err)
        text = out.getvalue()
        print(text[-1200:], err.getvalue()[-1200:], flush=True)
        RESULTS[f"cli_run_benchmark_{n}"] = text.splitlines()[-4:]
        CHECKS[f"cli run {n}"] = "ok" if code == 0 and f"{n}xf32=3.5 3.5" in text else "MISMATCH"


def environment() -> dict:
    from environment import base

    from kitdispatch.run.timing import find_cupti

    return {
        **base("iree-base-runtime", "cuda-bindings", "torch"),
        "numpy": np.__version__,
        "cupti": find_cupti(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
    }


def parse_args():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Build BUILD first: kitdispatch build kernels/elementwise --arch sm_90 -o BUILD")
    parser.add_argument("build_dir", type=Path, metavar="BUILD", help="a build of kernels/elementwise (elementwise.vmfb and its fatbin)")
    parser.add_argument("out_dir", type=Path, metavar="OUT", help="where calls.json and calls.txt go")
    parser.add_argument("--torch-only", action="store_true", help="only the torch sections (torch eager, DLPack, torch tensors through the kit)")
    return parser.parse_args()


def main() -> None:
    import kitdispatch

    args = parse_args()
    build_dir, out_dir = args.build_dir, args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(json.dumps(env), flush=True)
    rng = np.random.default_rng(0)
    host = {n: (rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)) for n in (SMALL, LARGE)}
    vmfb = build_dir / "elementwise.vmfb"
    module = kitdispatch.load_module(vmfb)
    if args.torch_only:
        torch_add(host)
        dlpack_round_trip(module, host)
        torch_calls(module, host)
        return finish(env, out_dir)
    kit_calls(module, host)
    breakdown(module, host)
    dependent_calls_keep_order(module, host)
    submission_order(vmfb)
    old_paths(module, host)
    direct_launch(next(build_dir.glob("*.fatbin")).read_bytes(), host)
    torch_add(host)
    dlpack_round_trip(module, host)
    torch_calls(module, host)
    cli_benchmark(vmfb)
    iree_benchmark_module(vmfb, host)
    iree_caching_allocator(vmfb)
    finish(env, out_dir)


def finish(env: dict, out_dir: Path) -> None:
    summary = {"environment": env, "results": RESULTS, "checks": CHECKS}
    (out_dir / "calls.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = summary_table()
    (out_dir / "calls.txt").write_text(json.dumps(env) + "\n" + table + "\n")
    print(table)


def summary_table() -> str:
    r = RESULTS.get

    def f(key):
        value = r(key)
        return f"{value:8.1f}" if isinstance(value, float) else "     n/a"

    rows = [
        ("1K add", "", ""),
        ("kit launch, pool outputs, loop of 1000, per call (us)", f("kit_1k_launch_pooled_per_call_us"), f("kit_1k_kernel_us")),
        ("kit launch, out=, loop of 1000, per call (us)", f("kit_1k_launch_out_per_call_us"), f("kit_1k_kernel_us")),
        ("kit prepared call, loop of 1000, per call (us)", f("kit_1k_prepared_per_call_us"), f("kit_1k_kernel_us")),
        ("IREE alone: add$async VM call, loop, per call (us)", f("iree_invoke_only_timeline_per_call_us"), f("kit_1k_kernel_us")),
        ("IREE alone: recorded command buffer, loop, per call (us)", f("iree_recorded_timeline_per_call_us"), f("kit_1k_kernel_us")),
        ("IREE alone: VM call, each waiting on the one before (us)", f("iree_invoke_only_chained_per_call_us"), f("kit_1k_kernel_us")),
        ("direct cuLaunchKernel (cuda-python), loop, per call (us)", f("direct_1k_per_call_us"), f("direct_1k_kernel_us")),
        ("torch eager add (out=), loop, per call (us)", f("torch_1k_per_call_us"), f("torch_1k_kernel_us")),
        ("iree-benchmark-module add, per call (us)", f("iree_benchmark_module_1k_real_us"), f("kit_1k_kernel_us")),
        ("kit synchronous call, pool outputs (us)", f("kit_1k_sync_pooled_us"), f("kit_1k_kernel_us")),
        ("kit, torch tensors in and out: launch, loop, per call (us) [m]", f("kit_1k_torch_launch_per_call_us"), f("kit_1k_torch_kernel_us")),
        ("kit, torch tensors: prepared call, loop, per call (us) [m]", f("kit_1k_torch_prepared_per_call_us"), f("kit_1k_torch_kernel_us")),
        ("kit, torch tensors: synchronous call (us)", f("kit_1k_torch_sync_us"), f("kit_1k_torch_kernel_us")),
        ("kit, torch tensors: first call on new tensors, sync (us)", f("kit_1k_torch_first_call_sync_us"), f("kit_1k_torch_kernel_us")),
        ("torch add then kit add (torch work queued), per pair (us)", f("kit_1k_torch_after_torch_add_per_pair_us"), ""),
        ("torch add then torch add, per pair (us)", f("torch_1k_two_adds_per_pair_us"), ""),
        ("IREE FunctionInvoker, device arrays, sync (us)", f("iree_invoker_1k_sync_us"), f("kit_1k_kernel_us")),
        ("64M add", "", ""),
        ("kit launch, pool outputs, loop of 50, per call (us)", f("kit_64m_launch_pooled_per_call_us"), f("kit_64m_kernel_us")),
        ("kit synchronous call, pool outputs (us)", f("kit_64m_sync_pooled_us"), f("kit_64m_kernel_us")),
        ("direct cuLaunchKernel, loop, per call (us)", f("direct_64m_per_call_us"), f("direct_64m_kernel_us")),
        ("torch eager add, loop, per call (us)", f("torch_64m_per_call_us"), f("torch_64m_kernel_us")),
        ("iree-benchmark-module add, per call (us)", f("iree_benchmark_module_64m_real_us"), f("kit_64m_kernel_us")),
        ("IREE FunctionInvoker, device arrays, sync (us)", f("iree_invoker_64m_sync_us"), f("kit_64m_kernel_us")),
        ("same, IREE caching allocator, async allocations off (us)", f("iree_invoker_caching_no_async_alloc_64m_sync_us"), f("kit_64m_kernel_us")),
    ]
    lines = [f"{'':<62} {'whole':>8} {'kernel':>8}"]
    lines += [f"{a:<62} {b:>8} {c:>8}" for a, b, c in rows]
    lines.append(
        f"1K overhead above device time (target <= 10 us): launch, pool {f('kit_1k_overhead_pooled_us')}; "
        f"launch, out= {f('kit_1k_overhead_out_us')}; prepared {f('kit_1k_overhead_prepared_us')}"
    )
    lines.append(
        f"1K torch tensors in and out, above device time (target <= 10 us): launch {f('kit_1k_torch_overhead_us')}; "
        f"prepared {f('kit_1k_torch_prepared_overhead_us')} (torch eager {f('torch_1k_eager_per_call_us')} a call, direct launch {f('direct_1k_per_call_us')})"
    )
    spread = {k: RESULTS.get(f"{k}_rounds") for k in ("kit_1k_torch_launch_per_call_us", "kit_1k_torch_prepared_per_call_us", "torch_1k_eager_per_call_us")}
    if all(spread.values()):
        lines.append(f"[m] median of {ROUNDS} loops of {LOOP}, interleaved with torch eager's (its median {f('torch_1k_eager_per_call_us')}); "
                     + "; ".join(f"{k.replace('_per_call_us', '')} {min(v):.1f}-{max(v):.1f}" for k, v in spread.items()))
    lines.append(f"IREE's CUDA semaphores import a CUDA event as a timepoint: {r('iree_cuda_semaphore_imports_cuda_event')}")
    lines.append(f"64M whole call / device time, kit launch (pool): {r('kit_64m_whole_call_over_kernel', float('nan')):.3f} (target <= 1.10); synchronous: {r('kit_64m_sync_over_kernel', float('nan')):.3f}")
    lines.append(
        "back-to-back submissions in order (IREE fails the device at the first out of order): own semaphores "
        f"{r('order_own_semaphores_submissions')} ({r('order_own_semaphores_outcome')}); timeline device's "
        f"{r('order_timeline_semaphores_submissions')} ({r('order_timeline_semaphores_outcome')})"
    )
    lines.append("checks against numpy: " + ", ".join(f"{k}: {v}" for k, v in CHECKS.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
