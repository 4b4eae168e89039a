"""Where a call's time goes: device time of its kernels (CUPTI) against whole-call time.

`time_calls` measures one function with its inputs on the device and its outputs reused
(`out=`): the kernels' device time from CUPTI's activity records (ctypes, no extra package:
libcupti ships with the CUDA toolkit and the `nvidia-cuda-cupti` wheel), the wall time per
call of N launches waited for once, and the wall time of single synchronous calls. The
difference is the runtime's overhead. Without CUPTI the device time is reported missing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kitdispatch.errors import KitError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kitdispatch.run.function import Function

_KIND_KERNEL, _KIND_CONCURRENT_KERNEL = 3, 10  # CUpti_ActivityKind
# Offsets of `start` and `end` (ns) in every CUpti_ActivityKernel record since version 4:
# kind (4 bytes), cache and shared-memory config (1 + 1), registers (2), partitioned global
# cache requested/executed (4 + 4), then start and end.
_START, _END = 16, 24
_BUFFER_BYTES = 1 << 20


@dataclass(frozen=True)
class CallTimes:
    calls: int
    device_us: float | None  # kernel time per call on the GPU (CUPTI), None without CUPTI
    launched_us: float  # wall time per call: `calls` launches, one wait
    sync_us: float  # median wall time of one synchronous call
    kernels_per_call: float | None = None
    cupti_note: str = ""

    def lines(self, name: str) -> list[str]:
        def overhead(total: float) -> str:
            return f"   overhead {total - self.device_us:8.1f} us" if self.device_us is not None else ""

        device = (
            f"{self.device_us:10.1f} us/call   ({self.kernels_per_call:g} kernel(s) a call, CUPTI)"
            if self.device_us is not None
            else f"       n/a          ({self.cupti_note})"
        )
        return [
            f"{name}: {self.calls} calls, inputs on the device",
            f"  device time         {device}",
            f"  launched, one wait  {self.launched_us:10.1f} us/call{overhead(self.launched_us)}",
            f"  synchronous         {self.sync_us:10.1f} us/call{overhead(self.sync_us)}",
        ]

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("calls", "device_us", "launched_us", "sync_us", "kernels_per_call", "cupti_note")}


def time_calls(function: Function, args: Sequence[object], *, calls: int = 1000, sync_calls: int = 200) -> CallTimes:
    """Times `function` (a kitdispatch Function) on `args` (already on its device)."""
    device = function.module.device
    out = function.launch(*args)  # warm-up, and the outputs every timed call reuses
    device.synchronize()
    extra = {"out": out} if function.writes_into_outputs else {}
    launch = function.launch

    start = time.perf_counter()
    for _ in range(calls):
        launch(*args, **extra)
    device.synchronize()
    launched = (time.perf_counter() - start) / calls

    samples = []
    for _ in range(sync_calls):
        t = time.perf_counter()
        function(*args, **extra)
        samples.append(time.perf_counter() - t)

    device_us, per_call, note = None, None, ""
    reps = min(calls, 200)
    try:
        with KernelTimer.get().collect() as spans:
            for _ in range(reps):
                launch(*args, **extra)
            device.synchronize()
    except KitError as exc:
        note = exc.what
    else:
        if spans:
            device_us = sum(end - begin for begin, end in spans) / reps / 1e3
            per_call = len(spans) / reps
        else:
            note = "CUPTI recorded no kernels"
    return CallTimes(calls, device_us, launched * 1e6, statistics.median(samples) * 1e6, per_call, note)


# ------------------------------------------------------------------------------- CUPTI


def find_cupti() -> str | None:
    """libcupti: $KITDISPATCH_CUPTI, the loader's path, CUDA toolkits, pip's nvidia wheels."""
    if os.environ.get("KITDISPATCH_CUPTI"):
        return os.environ["KITDISPATCH_CUPTI"]
    found = ctypes.util.find_library("cupti")
    if found:
        return found
    patterns = ["/usr/local/cuda/extras/CUPTI/lib64/libcupti.so*", "/usr/local/cuda*/extras/CUPTI/lib64/libcupti.so*"]
    patterns += [str(Path(p) / "nvidia" / "*" / "lib" / "libcupti.so*") for p in sys.path if p]
    for pattern in patterns:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


_REQUEST = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
_COMPLETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)


class KernelTimer:
    """Start and end of every kernel the GPU runs while `collect()` is open."""

    _instance: "KernelTimer | None" = None

    @classmethod
    def get(cls) -> "KernelTimer":
        if cls._instance is None:
            path = find_cupti()
            if path is None:
                raise KitError("CUPTI not found", fix="pip install nvidia-cuda-cupti, or set KITDISPATCH_CUPTI=/path/libcupti.so")
            cls._instance = cls(path)
        return cls._instance

    def __init__(self, path: str):
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as exc:
            raise KitError(f"CUPTI did not load: {exc}", fix="set KITDISPATCH_CUPTI to a libcupti matching the driver") from None
        self._buffers: dict[int, ctypes.Array] = {}
        self._spans: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self._request, self._complete = _REQUEST(self._on_request), _COMPLETE(self._on_complete)  # kept alive
        self._check(self._lib.cuptiActivityRegisterCallbacks(self._request, self._complete), "cuptiActivityRegisterCallbacks")

    def collect(self) -> "_Collection":
        return _Collection(self)

    def _on_request(self, buffer: ctypes._Pointer[ctypes.c_void_p], size: ctypes._Pointer[ctypes.c_size_t], max_records: ctypes._Pointer[ctypes.c_size_t]) -> None:
        storage = ctypes.create_string_buffer(_BUFFER_BYTES + 8)
        address = (ctypes.addressof(storage) + 7) & ~7  # records are 8-byte aligned
        self._buffers[address] = storage
        buffer[0] = address
        size[0] = _BUFFER_BYTES
        max_records[0] = 0

    def _on_complete(self, context: int | None, stream_id: int, buffer: int, size: int, valid_size: int) -> None:
        record = ctypes.c_void_p()
        spans = []
        while self._lib.cuptiActivityGetNextRecord(ctypes.c_void_p(buffer), ctypes.c_size_t(valid_size), ctypes.byref(record)) == 0:
            address = record.value
            if ctypes.c_uint32.from_address(address).value in (_KIND_KERNEL, _KIND_CONCURRENT_KERNEL):
                spans.append((ctypes.c_uint64.from_address(address + _START).value, ctypes.c_uint64.from_address(address + _END).value))
        with self._lock:
            self._spans += spans
        self._buffers.pop(buffer, None)

    def _check(self, code: int, call: str) -> None:
        if code != 0:
            raise KitError(f"{call} failed with CUPTI error {code}", fix="another profiler (ncu, nsys) may hold CUPTI; run without it")


class _Collection:
    def __init__(self, timer: KernelTimer):
        self._timer = timer
        self.spans: list[tuple[int, int]] = []

    def __enter__(self) -> list[tuple[int, int]]:
        timer = self._timer
        with timer._lock:
            timer._spans = []
        timer._check(timer._lib.cuptiActivityEnable(_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable")
        return self.spans

    def __exit__(self, *exc: object) -> None:
        timer = self._timer
        timer._lib.cuptiActivityFlushAll(1)  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
        timer._lib.cuptiActivityDisable(_KIND_CONCURRENT_KERNEL)
        with timer._lock:
            self.spans += [s for s in timer._spans if 0 < s[1] - s[0] < 10**10]
