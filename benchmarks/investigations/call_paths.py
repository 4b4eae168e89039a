"""How IREE's CUDA HAL spends a call, below the kit (H100 findings in
benchmarks/results/calls-investigation-h100.txt): the add$async VM call against add's recorded
command buffer (add$record) queued again, with IREE's stream or graph command buffers
(MODE: streams | graphs) and the CUDA context's scheduling flags (auto | spin | yield |
blocking); per thread of the process, CPU time and context switches per call.

    kitdispatch build kernels/elementwise --arch sm_90 -o build/elementwise
    VMFB=build/elementwise/elementwise.vmfb python benchmarks/investigations/call_paths.py streams 3000 auto
"""
import os, sys, time
import numpy as np
import iree.runtime as rt

MODE = sys.argv[1]  # streams | graphs
N = int(os.environ.get("N", 1 << 10))
LOOP = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
SCHED = sys.argv[3] if len(sys.argv) > 3 else "auto"
if SCHED != "auto":
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    d = ctypes.c_int()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(d), 0) == 0
    rc = cu.cuDevicePrimaryCtxSetFlags_v2(d, {"spin": 1, "yield": 2, "blocking": 4}[SCHED])
    print("set primary ctx flags", SCHED, "rc", rc)
if MODE == "graphs":
    rt.flags.parse_flags("--cuda_use_streams=false")

def threads():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            comm = open(f"/proc/self/task/{tid}/comm").read().strip()
            run_ns, wait_ns, slices = map(int, open(f"/proc/self/task/{tid}/schedstat").read().split())
            st = open(f"/proc/self/task/{tid}/status").read().split("\n")
            vol = int([l for l in st if l.startswith("voluntary_ctxt")][0].split()[1])
            inv = int([l for l in st if l.startswith("nonvoluntary_ctxt")][0].split()[1])
            out[tid] = (comm, run_ns, vol, inv)
        except OSError:
            pass
    return out

def thread_report(before, after, calls):
    rows = []
    for tid, (comm, run, vol, inv) in after.items():
        b = before.get(tid, (comm, 0, 0, 0))
        d_run = (run - b[1]) / calls / 1e3
        if d_run < 0.05:
            continue
        rows.append(f"    {comm:<20} tid {tid:>7}: busy {d_run:6.2f} us/call, vol cs {(vol-b[2])/calls:5.2f}/call, invol {(inv-b[3])/calls:5.2f}/call")
    return "\n".join(rows)

config = rt.Config("cuda")
dev = config.device
mod = rt.VmModule.mmap(config.vm_instance, os.environ["VMFB"])
ctx = rt.SystemContext(vm_modules=[mod], config=config)
vm = ctx.vm_context
fn_async = mod.lookup_function("add$async")
fn_record = mod.lookup_function("add$record")

x = np.arange(N, dtype=np.float32); y = np.full(N, 2.0, np.float32)
def put(a):
    return dev.allocator.allocate_buffer_copy(memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=dev, buffer=a, element_type=rt.HalElementType.FLOAT_32)
xv, yv, ov = put(x), put(y), put(np.zeros(N, np.float32))
sem = dev.create_semaphore(0)
counter = [0]
def fence_next():
    counter[0] += 1
    return rt.HalFence.create_at(sem, counter[0])
def wait_all():
    rt.HalFence.create_at(sem, counter[0]).wait()
no_wait = rt.HalFence(0)

def measure(name, one_call, loop=LOOP):
    for _ in range(50): one_call()
    wait_all()
    before = threads()
    t0 = time.perf_counter()
    for _ in range(loop): one_call()
    t1 = time.perf_counter()
    wait_all()
    t2 = time.perf_counter()
    after = threads()
    print(f"{MODE}/{SCHED} {name}: issue {(t1-t0)/loop*1e6:6.2f} us/call, loop {(t2-t0)/loop*1e6:6.2f} us/call", flush=True)
    print(thread_report(before, after, loop), flush=True)

def check(name):
    wait_all()
    ok = np.array_equal(np.asarray(rt.DeviceArray(dev, ov, implicit_host_transfer=True)), x + y) if N <= 1 << 20 else np.array_equal(np.asarray(rt.DeviceArray(dev, ov, implicit_host_transfer=True))[:1000], (x + y)[:1000])
    print(f"{MODE} {name}: result {'ok' if ok else 'MISMATCH'}", flush=True)

# 1. the VM function per call (what the kit's prepared call does, less its Python)
ret = rt.VmVariantList(1)
def vm_call():
    args = rt.VmVariantList(5)
    args.push_ref(xv); args.push_ref(yv); args.push_ref(ov)
    args.push_ref(no_wait); args.push_ref(fence_next())
    vm.invoke(fn_async, args, ret)
for _ in range(3): measure("vm invoke add$async " + os.path.basename(os.environ["VMFB"]), vm_call)
check("vm invoke")

# 2. recorded once, submitted per call
ov = put(np.zeros(N, np.float32))
rargs = rt.VmVariantList(3); rargs.push_ref(xv); rargs.push_ref(yv); rargs.push_ref(ov)
rres = rt.VmVariantList(1)
t0 = time.perf_counter(); vm.invoke(fn_record, rargs, rres); t1 = time.perf_counter()
print(f"{MODE} record: {(t1-t0)*1e6:.1f} us", flush=True)
cmd = rres.get_as_object(0, rt.HalCommandBuffer) if hasattr(rres, "get_as_object") else None
print(f"{MODE} command buffer: {cmd!r}", flush=True)
def submit_single():
    dev.queue_execute(cmd, no_wait, fence_next())
try:
    for _ in range(3): measure("queue_execute recorded cb", submit_single)
except Exception as e:
    print("no-list form:", e)
check("recorded")
# 3. pieces of Python cost
t0 = time.perf_counter()
for _ in range(LOOP): rt.HalFence.create_at(sem, 1)
print(f"{MODE} HalFence.create_at: {(time.perf_counter()-t0)/LOOP*1e6:.2f} us", flush=True)
t0 = time.perf_counter()
for _ in range(LOOP):
    args = rt.VmVariantList(5); args.push_ref(xv); args.push_ref(yv); args.push_ref(ov); args.push_ref(no_wait); args.push_ref(no_wait)
print(f"{MODE} pack 5 refs: {(time.perf_counter()-t0)/LOOP*1e6:.2f} us", flush=True)
