"""Does IREE's CUDA HAL keep the order of submissions that wait on nothing? Loops of
back-to-back submissions of add's recorded command buffer, each signalling the next value of
one semaphore (IREE fails the device at the first signalled out of order): semaphores of the
device itself (nowait), chained waits (chained), semaphores of a second, idle device
(shadow, what kitdispatch/device.py does). Findings in benchmarks/results/calls-investigation-h100.txt.

    VMFB=build/elementwise/elementwise.vmfb python benchmarks/investigations/submission_order.py streams 20 shadow
"""
import os, sys, time
import numpy as np
import iree.runtime as rt

MODE = sys.argv[1]
LOOP, LOOPS = 3000, int(sys.argv[2]) if len(sys.argv) > 2 else 10
if MODE == "graphs":
    rt.flags.parse_flags("--cuda_use_streams=false")
N = 1 << 10
config = rt.Config("cuda")
dev = config.device
mod = rt.VmModule.mmap(config.vm_instance, os.environ["VMFB"])
ctx = rt.SystemContext(vm_modules=[mod], config=config)
vm = ctx.vm_context

def put(a):
    return dev.allocator.allocate_buffer_copy(memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=dev, buffer=a, element_type=rt.HalElementType.FLOAT_32)
x = np.arange(N, dtype=np.float32); y = np.full(N, 2.0, np.float32)
xv, yv, ov = put(x), put(y), put(np.zeros(N, np.float32))
args = rt.VmVariantList(3); args.push_ref(xv); args.push_ref(yv); args.push_ref(ov)
res = rt.VmVariantList(1)
vm.invoke(mod.lookup_function("add$record"), args, res)
cmd = res.get_as_object(0, rt.HalCommandBuffer)
no_wait = rt.HalFence(0)
shadow = rt.get_device("cuda", cache=False) if sys.argv[3] == "shadow" else None

def run(name, chained, sem_device):
    fails, times = 0, []
    for _ in range(LOOPS):
        sem = sem_device.create_semaphore(0)
        v = 0
        try:
            t0 = time.perf_counter()
            for _ in range(LOOP):
                v += 1
                wait = rt.HalFence.create_at(sem, v - 1) if chained and v > 1 else no_wait
                dev.queue_execute(cmd, wait, rt.HalFence.create_at(sem, v))
            rt.HalFence.create_at(sem, v).wait()
            times.append((time.perf_counter() - t0) / LOOP * 1e6)
        except (RuntimeError, ValueError) as e:
            fails += 1
            last = str(e).strip().splitlines()[-1][-90:]
    med = sorted(times)[len(times) // 2] if times else float("nan")
    print(f"{MODE} {name}: {LOOPS} loops of {LOOP}: out-of-order failures {fails}, median per call {med:.2f} us, all {['%.1f' % t for t in times]}", flush=True)
    if fails:
        print("   last error:", last, flush=True)

variant = sys.argv[3]
if variant == "nowait": run("no wait, one semaphore", False, dev)
if variant == "chained": run("chained waits, one semaphore", True, dev)
if variant == "shadow": run("no wait, semaphore of a second device", False, shadow)
ok = np.array_equal(np.asarray(rt.DeviceArray(dev, ov, implicit_host_transfer=True)), x + y)
print(MODE, variant, "result", ok)
