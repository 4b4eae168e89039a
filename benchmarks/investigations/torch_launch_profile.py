"""Where a repeated launch(out=) with torch tensors spends its host time (1K add): each step
timed alone, then cProfile over a loop. Usage: python torch_launch_profile.py BUILD"""

import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import kitdispatch as kd  # noqa: E402

N = 20000


def per_call_us(fn, n=N):
    for _ in range(200):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


module = kd.load_module(Path(sys.argv[1]) / "elementwise.vmfb")
add, dev = module.add, module.device
x = np.arange(1024, dtype=np.float32)
tx, ty, to = (torch.from_numpy(x).cuda() for _ in range(3))
dx, dy, do = (dev.put(x) for _ in range(3))
add.launch(tx, ty, out=to)
dev.synchronize()
imports = dev.torch_imports
steps = {
    "torch_imports.get(tensor)": lambda: imports.get(tx),
    "tensor.data_ptr()": lambda: tx.data_ptr(),
    "tensor.shape": lambda: tx.shape,
    "tensor.stride()": lambda: tx.stride(),
    "tensor.dtype": lambda: tx.dtype,
    "device.order_after_torch()": dev.order_after_torch,
    "_pack(torch)": lambda: add._pack((tx, ty), to),
    "_pack(device arrays)": lambda: add._pack((dx, dy), do),
    "launch issue (torch)": lambda: add.launch(tx, ty, out=to),
    "launch issue (device arrays)": lambda: add.launch(dx, dy, out=do),
}
for name, fn in steps.items():
    us = per_call_us(fn, 5000)
    dev.synchronize()
    print(f"{name:<34} {us:7.2f} us")
profile = cProfile.Profile()
profile.enable()
for _ in range(N):
    add.launch(tx, ty, out=to)
profile.disable()
dev.synchronize()
pstats.Stats(profile).sort_stats("tottime").print_stats(18)

# The pieces of a repeated launch(out=), each alone: the torch-stream order check (its ctypes
# calls against torch's own stream query), the call's lookup with the launch itself stubbed,
# and the submission of the recorded call.
import iree.runtime as rt  # noqa: E402

legacy = dev._legacy_stream
raw_stream = torch._C._cuda_getCurrentRawStream
stream = torch.cuda.current_stream()
query_c = torch._C._CudaStreamBase.query
call = next(c for c in add._torch_calls._entries.values() if c.prepared is not None)
prepared = call.prepared
semaphore = dev.timeline.create_semaphore(0)


class _Stub:
    def queue(self):
        pass


pieces = {
    "torch raw stream handle": lambda: raw_stream(0),
    "ctypes cuCtxGetCurrent": lambda: legacy._current(legacy._current_slot),
    "ctypes cuStreamQuery(legacy)": lambda: legacy._query(1),
    "_LegacyStream.settle(0)": lambda: legacy.settle(0),
    "torch Stream.query() (object kept)": stream.query,
    "torch _CudaStreamBase.query (C)": lambda: query_c(stream),
    "HalFence.create_at": lambda: rt.HalFence.create_at(semaphore, 1),
    "device.submit(recorded call)": lambda: dev.submit(prepared._commands),
    "PreparedCall.launch": prepared.launch,
}
for name, fn in pieces.items():
    us = per_call_us(fn, 5000)
    dev.synchronize()
    print(f"{name:<34} {us:7.2f} us")
call.prepared = _Stub()
print(f"{'launch(out=), the launch stubbed':<34} {per_call_us(lambda: add.launch(tx, ty, out=to), 5000):7.2f} us")
call.prepared = prepared
