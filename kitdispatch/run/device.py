"""Data that stays on the GPU: the kit's device, its arrays, the output pool and the call order.

One `Device` per IREE device URI, shared by every module loaded on it, so an array one module
returns can go straight into another. Calls on a device form one ordered stream, as on a CUDA
stream: a call returns at once and runs after every call launched before it; `synchronize()`
waits for all of them. Host copies (`to_host`, `np.asarray`) and DLPack exports wait for every
call launched before them, so they see what a stream would.

How the order is kept: call number c signals its point on a ring of timeline semaphores
(semaphore (c - 1) % RING, value (c - 1) // RING + 1), launched under a lock. (A ring rather
than one semaphore: one measured slower in an earlier H100 run, 84 against 21 us a launch; the
cause was not established, and the ring costs nothing.)

On CUDA a call waits on no fence: IREE's CUDA HAL issues calls in the order they reach its
queue, from one worker thread onto one CUDA stream, and completes them in that order
(runtime/src/iree/hal/utils/deferred_work_queue.c). Making each call wait on the one before
says the same through IREE's fences, but a wait not yet issued holds the call back in the
host queue: 94 to 107 us a call on an H100 against 4 to 7 us (benchmarks/calls.py).

The ring's semaphores belong to a second, idle IREE device on the same GPU (`timeline`),
because of a race in IREE 3.13's CUDA HAL: signaling one of the device's own semaphores makes
its completion thread issue the device's queue too (drivers/cuda/event_semaphore.c), and a call
that thread takes out of the queue while the calling thread queues the next ones can reach the
stream after them. Measured on an H100: within 6000 back-to-back submissions the device failed
with "timeline already at N, cannot signal N-8" (one semaphore of its own; with a ring of them
the same reordering goes unnoticed), and never in 60000 with the idle device's semaphores,
which also made a submission no slower (6.7 against 7.2 us a recorded call in a loop). No
call may wait on those semaphores on the device: their signal does not wake the device's
queue, so the wait would never be issued. Other devices (IREE's CPU task system runs calls
concurrently) wait on the call before, on their own semaphores.

torch CUDA tensors are imported once and kept per tensor (`TorchImports`): DLPack's export
costs 22 us a tensor on an H100 and the producer's synchronization 5 us (benchmarks/calls.py),
too much for every call. A later call checks the tensor still has the same memory, shape,
strides and dtype, and orders itself after torch's current stream once per call: IREE 3.13's
CUDA HAL can neither wait on a CUDA event nor give its stream (created non-blocking), so the
order is kept on the host, by a wait that happens only when torch still has work queued
(cuStreamQuery first). (iree.runtime 3.13 has `HalSemaphore.import_timepoint` with a
CUDA_EVENT type, but its runtime library holds the import messages of HIP's semaphores only,
which suggests CUDA's fall to the generic "timepoint import is not yet implemented";
benchmarks/calls.py tries it on the GPU and records the answer.)
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import sys
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kitdispatch.errors import IREE_STATUS_ERRORS, KitError, UsageError
from kitdispatch.describe import abi
from kitdispatch.run.cuda_driver import libcuda

if TYPE_CHECKING:
    import torch
    from iree.runtime import HalBuffer, HalBufferView, HalCommandBuffer, HalElementType, HalFence, HalSemaphore, VmRef
    from numpy.typing import ArrayLike, DTypeLike

    from kitdispatch.run.arguments import TensorCheck  # arguments.py imports this module

    PoolKey = tuple[tuple[int, ...], str]  # (shape, the kit's element type name)
    PoolItem = tuple[HalBufferView, VmRef]  # a buffer view, and the ref a call pushes

KDL_CPU, KDL_CUDA = 1, 2  # DLPack device types
DEFAULT_POOL_BYTES = 2 << 30  # free output buffers kept for reuse, per device
SPIN_S = 0.002  # how long a wait polls before it blocks
RING = 64  # timeline semaphores a device's calls signal in turn
ABANDONED_WORK_WAIT_NS = 1_000_000_000  # how long a failed call's queued work may take to finish


# --------------------------------------------------------------------------- the pool


@dataclass
class PoolStats:
    allocations: int = 0  # buffers allocated from the device
    reuses: int = 0  # takes served by a free buffer
    free_bytes: int = 0  # bytes held in free buffers
    dropped: int = 0  # buffers given back over the limit, left to IREE to free


class OutputPool:
    """Device buffers for call results, reused for results of the same shape and type.

    A result array takes a buffer and gives it back when the array is garbage-collected (or
    exported through DLPack, which detaches it); reuse is safe because calls run in order.
    Holds at most `max_free_bytes` of free buffers; `trim()` frees them all. What it hands out
    is whatever `allocate(key, nbytes)` makes (the device: a buffer view)."""

    def __init__(self, allocate: Callable[[PoolKey, int], PoolItem], max_free_bytes: int = DEFAULT_POOL_BYTES):
        self._allocate = allocate
        self.max_free_bytes = max_free_bytes
        self._free: dict = defaultdict(list)
        self._lock = threading.Lock()
        self.stats = PoolStats()

    def take(self, key: PoolKey, nbytes: int) -> PoolItem:
        with self._lock:
            free = self._free.get(key)
            if free:
                self.stats.reuses += 1
                self.stats.free_bytes -= nbytes
                return free.pop()
            self.stats.allocations += 1
        return self._allocate(key, nbytes)

    def give(self, key: PoolKey, nbytes: int, item: PoolItem) -> None:
        with self._lock:
            if self.stats.free_bytes + nbytes > self.max_free_bytes:
                self.stats.dropped += 1
                return
            self._free[key].append(item)
            self.stats.free_bytes += nbytes

    def trim(self) -> int:
        """Drops every free buffer (IREE frees them); returns the bytes released."""
        with self._lock:
            released = self.stats.free_bytes
            self._free.clear()
            self.stats.free_bytes = 0
        return released


# ------------------------------------------------------------------------------ arrays


def _iree_device_array():
    import iree.runtime as rt

    return rt.DeviceArray


class DeviceArray(_iree_device_array()):
    """An array on a kit device: IREE's `DeviceArray` (it goes wherever one goes, and
    `np.asarray` / `to_host()` copy it to the host), plus DLPack export (`torch.from_dlpack`,
    `cupy.from_dlpack`) without a copy. Shape and dtype are fixed at creation."""

    def __init__(self, device: "Device", buffer_view: HalBufferView, shape: tuple[int, ...], dtype: np.dtype, *, pooled: tuple[PoolKey, int] | None = None, ref: VmRef | None = None):
        super().__init__(device.hal, buffer_view, implicit_host_transfer=True, override_dtype=dtype)
        self.device = device
        self._shape = shape
        self._np_dtype = dtype
        self._ref = buffer_view.ref if ref is None else ref  # what a call pushes; made once
        self._pooled = pooled  # (key, nbytes) of the pool entry this array gives back, or None

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._np_dtype

    @property
    def nbytes(self) -> int:
        return self._np_dtype.itemsize * math.prod(self._shape)

    @property
    def buffer_view(self) -> HalBufferView:
        """IREE's HalBufferView of this array (for `Module.raw` and other IREE APIs)."""
        return self._buffer_view

    def _transfer_to_host(self, implicit: bool) -> np.ndarray:
        # Every launched call first; then always a copy: a mapped view of a pooled buffer
        # would change under the caller once the buffer is reused.
        self.device.synchronize()
        return self._copy_to_host()

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None, dl_device: tuple[int, int] | None = None, copy: bool | None = None):
        """A DLPack capsule of this memory (no copy), once every launched call is done.
        The buffer leaves the pool: the consumer may keep the memory as long as it likes."""
        if copy:
            raise BufferError("kitdispatch exports device memory without copying (copy=True asked for one)")
        self.device.synchronize()
        self._pooled = None
        try:
            return self.device.hal.create_dlpack_capsule(self._buffer_view, *self.__dlpack_device__())
        except IREE_STATUS_ERRORS as exc:
            raise BufferError(
                f"IREE cannot export this buffer through DLPack: {exc}. A model function's results are IREE's own "
                "allocations, which its CUDA allocator does not export: pass out= (a torch or CuPy tensor, or "
                "device.empty(...)) to get the result in memory another library can read"
            ) from None

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, self.device.ordinal) if self.device.is_cuda else (KDL_CPU, 0)

    def __del__(self):
        pooled = getattr(self, "_pooled", None)
        if pooled is not None:
            self._pooled = None
            try:
                self.device.pool.give(*pooled, (self._buffer_view, self._ref))
            except Exception:  # interpreter shutdown: the pool may be gone already
                pass

    def __repr__(self) -> str:
        return f"<kitdispatch DeviceArray shape={self._shape} dtype={self._np_dtype} on {self.device.uri}>"


# ------------------------------------------------------------------------ torch imports


class TorchImports:
    """torch tensors imported once: tensor -> its DeviceArray, while the tensor lives.

    An entry serves a call only while the tensor has the memory, shape, strides and dtype it
    was imported with (`set_`, `resize_` or an in-place transpose make a new import). It goes
    when the tensor is garbage-collected, and with it the import, which holds the tensor's
    storage (a detached view's, so that the tensor itself can die); the oldest go beyond LIMIT."""

    LIMIT = 4096

    def __init__(self):
        self._entries: dict[int, tuple] = {}  # id(tensor) -> (weakref, ptr, shape, strides, dtype, array, token)
        self._tokens = itertools.count()

    def get(self, tensor: object) -> DeviceArray | None:
        entry = self._entries.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return None
        if tensor.data_ptr() != entry[1] or tensor.shape != entry[2] or tensor.stride() != entry[3] or tensor.dtype is not entry[4]:
            return None
        return entry[5]

    def add(self, tensor: torch.Tensor, array: DeviceArray) -> None:
        key, token = id(tensor), next(self._tokens)
        entries = self._entries
        entries.pop(key, None)
        if len(entries) >= self.LIMIT:
            entries.pop(next(iter(entries)))
        entries[key] = (weakref.ref(tensor), tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, array, token)
        weakref.finalize(tensor, _forget_import, weakref.ref(self), key, token)

    def __len__(self) -> int:
        return len(self._entries)


def _forget_import(imports_ref: weakref.ref[TorchImports], key: int, token: int) -> None:
    imports = imports_ref()
    entry = imports._entries.get(key) if imports is not None else None
    if entry is not None and entry[6] == token:  # not a later tensor's entry under the same id
        del imports._entries[key]


def is_torch_tensor(value: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _torch_raw_stream():
    """device index -> torch's current CUDA stream as a raw handle (0: the default stream)."""
    import torch

    try:
        from torch._C import _cuda_getCurrentRawStream

        return _cuda_getCurrentRawStream
    except ImportError:  # the documented, slower way
        return lambda index: torch.cuda.current_stream(index).cuda_stream


# ------------------------------------------------------------------------------ device


class Device:
    """An IREE device with the kit's pool and call order. Get one with `get_device(uri)`."""

    def __init__(self, uri: str, *, pool_bytes: int = DEFAULT_POOL_BYTES):
        import iree.runtime as rt

        self._rt = rt
        self.uri = uri
        try:
            self.hal = rt.get_device(uri)
        except IREE_STATUS_ERRORS as exc:  # IREE's status text: no such GPU, a path it cannot take
            raise UsageError(
                f"IREE cannot open device {uri!r}: {str(exc).strip()[:300]}",
                fix="use cuda, or cuda://N with N below the number of GPUs (`kitdispatch doctor` lists them)",
            ) from None
        self.is_cuda = uri.split("://")[0] == "cuda"
        self.ordinal = _cuda_ordinal(uri)
        self.pool = OutputPool(self._allocate, pool_bytes)
        self._chained = not self.is_cuda  # see the module's docstring
        # An uncached device of the same URI owns the semaphores on CUDA (the module's docstring).
        self.timeline = rt.get_device(uri, cache=False) if self.is_cuda else self.hal
        self._ring = [self.timeline.create_semaphore(0) for _ in range(RING)]
        self._last = 0  # calls launched: the number of the latest
        self.order = threading.Lock()  # held from taking a value to queueing the call
        self._no_wait = rt.HalFence(0)
        self._create_at = rt.HalFence.create_at
        self._execute = self.hal.queue_execute
        self._legacy_stream = None
        self.torch_imports = TorchImports()
        self._torch_stream = None  # torch's current raw stream of a device index, once torch is used

    # -- memory ----------------------------------------------------------------------

    def _allocate(self, key: PoolKey, nbytes: int) -> PoolItem:
        rt = self._rt
        shape, name = key
        hal_type = element_type(numpy_dtype(name))
        buffer = self.hal.allocator.allocate_buffer(
            memory_type=rt.MemoryType.DEVICE_LOCAL,
            allowed_usage=rt.BufferUsage.DEFAULT,
            allocation_size=max(nbytes, 1),
        )
        view = rt.HalBufferView(buffer, shape, hal_type)
        return view, view.ref

    def allocate_storage(self, nbytes: int, what: str) -> HalBuffer:
        """A device buffer of `nbytes` (at least 1) that IREE's dispatches may read and write:
        `what`'s transient memory."""
        rt = self._rt
        try:
            return self.hal.allocator.allocate_buffer(
                memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, allocation_size=max(nbytes, 1)
            )
        except IREE_STATUS_ERRORS as exc:  # IREE's status: out of memory, most likely
            raise KitError(
                f"{what}: IREE could not allocate its {nbytes} bytes of transient memory on {self.uri}: {str(exc).strip()[:300]}",
                fix="free device memory (drop arrays and modules no longer used), or use a GPU with more",
            ) from None

    def empty(self, shape: Iterable[int], dtype: DTypeLike) -> DeviceArray:
        """An uninitialized array from the pool (for `out=`)."""
        shape = tuple(int(d) for d in shape)
        return self.pooled_array(shape, _PoolType(np.dtype(dtype)))

    def pooled_array(self, shape: tuple[int, ...], kind: _PoolType | TensorCheck) -> DeviceArray:
        """An array from the pool; `kind` has the numpy `dtype` and the kit's type `name`."""
        key, nbytes = (shape, kind.name), kind.dtype.itemsize * math.prod(shape)
        view, ref = self.pool.take(key, nbytes)
        return DeviceArray(self, view, shape, kind.dtype, pooled=(key, nbytes), ref=ref)

    def put(self, host: ArrayLike) -> DeviceArray:
        """A copy of a host array on this device."""
        host = np.ascontiguousarray(host)
        hal_type = element_type(host.dtype)
        view = self.hal.allocator.allocate_buffer_copy(
            memory_type=self._rt.MemoryType.DEVICE_LOCAL,
            allowed_usage=self._rt.BufferUsage.DEFAULT,
            device=self.hal,
            buffer=host,
            element_type=hal_type,
        )
        return DeviceArray(self, view, host.shape, host.dtype)

    def asarray(self, value: object) -> DeviceArray:
        """`value` as an array on this device: kit and IREE device arrays and buffer views
        as they are, CUDA tensors of other libraries (torch, CuPy, ...) through DLPack without
        a copy, host arrays copied."""
        if isinstance(value, DeviceArray):
            if value.device is not self:
                raise KitError(f"the array is on {value.device.uri}, not {self.uri}", fix="copy it with to_host() first")
            return value
        rt = self._rt
        if isinstance(value, rt.DeviceArray):
            view = value._buffer_view
            return DeviceArray(self, view, tuple(view.shape), np.dtype(value.dtype))
        if isinstance(value, rt.HalBufferView):
            return DeviceArray(self, value, tuple(value.shape), np.dtype(rt.HalElementType.map_to_dtype(value.element_type)))
        view = self.torch_imports.get(value)
        if view is not None:  # imported before: ordered after torch's work as an import is
            self.order_after_torch()
            return view
        if not isinstance(value, np.ndarray) and hasattr(value, "__dlpack_device__"):
            kind, index = value.__dlpack_device__()
            if int(kind) == KDL_CUDA:
                return self._import_dlpack(value, int(index))
        return self.put(value)

    def _import_dlpack(self, tensor: object, index: int) -> DeviceArray:
        if not self.is_cuda or index != self.ordinal:
            raise KitError(
                f"a CUDA tensor on device {index} cannot go to {self.uri}",
                fix="move it to the module's device, or load the module with device='cuda://N'",
            )
        torch_tensor = is_torch_tensor(tensor)
        try:
            # A torch tensor is exported as a detached view: the import then holds its storage,
            # not the tensor itself, which can die and take its cache entry with it.
            exported = tensor.detach() if torch_tensor else tensor
            capsule = exported.__dlpack__(stream=None)  # we read on the legacy default stream...
        except BufferError as exc:
            raise KitError(f"the tensor cannot be shared through DLPack: {exc}", fix="make it contiguous") from None
        self._producer_sync()  # ...so its pending work is done once that stream is
        try:
            view = self.hal.from_dlpack_capsule(capsule)
        except IREE_STATUS_ERRORS as exc:
            raise KitError(f"IREE cannot import the tensor: {exc}", fix="pass a dense, row-major tensor (x.contiguous())") from None
        array = DeviceArray(self, view, tuple(view.shape), np.dtype(self._rt.HalElementType.map_to_dtype(view.element_type)))
        if torch_tensor:
            self.torch_imports.add(tensor, array)
        return array

    def order_after_torch(self) -> None:
        """Calls queued from now on run after the work torch has queued on its current stream
        of this device: a host wait, only while that stream is busy (IREE 3.13 cannot wait on
        a CUDA event; the module's docstring)."""
        legacy = self._legacy_stream
        if legacy is None or self._torch_stream is None:
            self._torch_stream = _torch_raw_stream()
            legacy = self._legacy_stream = self._legacy_stream or _LegacyStream(self.ordinal)
        legacy.settle(self._torch_stream(self.ordinal))

    def _producer_sync(self) -> None:
        # IREE runs on its own non-blocking stream and cannot wait on other streams' events
        # (3.13's CUDA semaphores do not import timepoints), so a producer is synchronized on
        # the host: asked for the legacy default stream (DLPack's stream=None), it makes that
        # stream wait for its own (torch and CuPy do), and we wait for that stream.
        if self._legacy_stream is None:
            self._legacy_stream = _LegacyStream(self.ordinal)
        self._legacy_stream.synchronize()

    # -- order -----------------------------------------------------------------------

    def _point(self, call: int) -> tuple[HalSemaphore, int]:
        """(semaphore, value) that call number `call` signals (call 0: reached from the start)."""
        return self._ring[(call - 1) % RING], (call - 1) // RING + 1

    def next_fences(self) -> tuple[HalFence, HalFence]:
        """(wait fence, signal fence) for the next call; take them, queue the call, then
        `launched()`, all under `order`."""
        fence = self._rt.HalFence.create_at
        done = fence(*self._point(self._last + 1))
        wait = fence(*self._point(self._last)) if self._chained else self._no_wait
        return wait, done

    def submit(self, commands: HalCommandBuffer, *, after_torch: bool = False) -> int:
        """Queues a recorded command buffer as the next call; returns its number. `after_torch`:
        the call runs after the work torch has queued (order_after_torch; written out here, as
        this is every repeated call's path)."""
        if after_torch:
            legacy, torch_stream = self._legacy_stream, self._torch_stream
            if legacy is None or torch_stream is None:
                self.order_after_torch()
            else:
                legacy.settle(torch_stream(self.ordinal))
        return self._queue(self._execute, commands)

    def queue_copy(self, source: HalBuffer, target: HalBuffer) -> int:
        """Queues a copy of all of `source` into the start of `target` as the next call (IREE
        resolves both buffers when the copy is issued: `source` may be a queue-ordered
        allocation of a call before it); returns its number."""
        return self._queue(functools.partial(self.hal.queue_copy, source), target)

    def _queue(self, issue: Callable[..., None], operand: object) -> int:
        """`issue(operand, wait, done)` as the next call. The path of every repeated call
        (PreparedCall): written out, as each Python call it saves is 0.3 us of the caller's
        time on an H100 host (benchmarks/investigations/torch_launch_profile.py)."""
        with self.order:
            call = self._last + 1
            done = self._create_at(self._ring[(call - 1) % RING], (call - 1) // RING + 1)
            wait = self._create_at(*self._point(call - 1)) if self._chained else self._no_wait
            try:
                issue(operand, wait, done)
            except IREE_STATUS_ERRORS as exc:
                self.abandon()
                raise KitError(f"IREE refused to queue the call: {str(exc).strip()}", fix="see the error above") from None
            self._last = call
            return call

    def launched(self) -> int:
        self._last += 1
        return self._last

    def abandon(self) -> None:
        """A call that failed still passes its place in the order on. Whether IREE had queued
        its work when it failed cannot be told (a result's buffer view fails after a model
        function's final barrier was queued; most failures come before anything is), and such
        work signals the call's point whenever it runs: signalling that point as well fails
        the semaphore for every later call (CI saw it on IREE 3.13's CPU device, on a busy
        machine), and not signalling it leaves the next call waiting forever. So once every
        call before it is done, the point's semaphore is retired (a late signal lands on a
        semaphore no one reads) and a fresh one stands in its place, already at the point."""
        call = self._last + 1
        self.wait_for(call - 1)
        retired, value = self._point(call)
        if self._chained:  # calls may run side by side: let work that was queued finish first
            try:
                self._rt.HalFence.create_at(retired, value).wait(timeout=ABANDONED_WORK_WAIT_NS)
            except IREE_STATUS_ERRORS:  # that work failed: the semaphore goes either way
                pass
        self._ring[(call - 1) % RING] = self.timeline.create_semaphore(value)
        self._last = call

    def wait_for(self, call: int) -> None:
        """Until call number `call` (and every call before it) is done. Polls for a while
        first: the blocking wait costs a thread wake-up after IREE's own."""
        semaphore, value = self._point(call)
        query = semaphore.query
        deadline = time.perf_counter() + SPIN_S
        try:
            while query() < value:
                if time.perf_counter() > deadline:
                    wait_fence(self._rt.HalFence.create_at(semaphore, value))
                    return
        except IREE_STATUS_ERRORS as exc:  # the semaphore failed: a call failed on the device
            raise KitError(f"a call on the device failed: {str(exc).strip()}", fix="see the error above") from None

    def synchronize(self) -> None:
        """Waits for every call launched on this device."""
        self.wait_for(self._last)

    def __repr__(self) -> str:
        return f"<kitdispatch Device {self.uri}>"


def wait_fence(fence: HalFence) -> None:
    try:
        fence.wait()
    except IREE_STATUS_ERRORS as exc:
        raise KitError(f"a call on the device failed: {str(exc).strip()}", fix="see the error above; the device may need a restart of the process") from None


_DEVICES: dict[str, Device] = {}
_DEVICES_LOCK = threading.Lock()


def get_device(uri: str = "cuda") -> Device:
    """The kit's device for an IREE device URI ("cuda", "cuda://1", "local-task"), one per process."""
    with _DEVICES_LOCK:
        device = _DEVICES.get(uri)
        if device is None:
            device = _DEVICES[uri] = Device(uri)
        return device


class _PoolType:
    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.name = _kit_type_name(dtype)


def _kit_type_name(dtype: np.dtype) -> str:
    row = abi.BY_NUMPY.get(dtype.name)
    if row is None:
        raise KitError(f"kitdispatch has no element type for {dtype}", fix=f"use one of {', '.join(abi.BY_NUMPY)}")
    return row.name


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a kit element type ('f32', 'bf16', ...)."""
    return abi.lookup(name).dtype


def element_type(dtype: np.dtype) -> HalElementType:
    from iree.runtime.dtypes import map_dtype_to_hal_element_type

    hal_type = map_dtype_to_hal_element_type(np.dtype(dtype))
    if hal_type is None:
        raise KitError(f"IREE has no element type for {dtype}", fix="use a numeric dtype")
    return hal_type


def _cuda_ordinal(uri: str) -> int:
    _, _, path = uri.partition("://")
    return int(path) if path.isdigit() else 0


# ------------------------------------------------------------------ CUDA stream (ctypes)


class _LegacyStream:
    """The legacy default stream of the device's primary context, through libcuda (no CUDA
    Python package needed)."""

    CU_STREAM_LEGACY = 0x1

    def __init__(self, ordinal: int):
        lib = libcuda()
        if lib is None:
            raise KitError("libcuda is not loadable", fix="install the NVIDIA driver")
        self._lib = lib
        device, context = ctypes.c_int(), ctypes.c_void_p()
        self._check(lib.cuInit(0), "cuInit")
        self._check(lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        self._check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        self._context = context
        # settle's calls, bound once with their argument types: it runs once a call, and
        # building its arguments cost as much as the calls (benchmarks/investigations/
        # torch_launch_profile.py). `lib` is this stream's own CDLL (libcuda makes one a call).
        push, query, pop, current = lib.cuCtxPushCurrent_v2, lib.cuStreamQuery, lib.cuCtxPopCurrent_v2, lib.cuCtxGetCurrent
        push.argtypes = query.argtypes = pop.argtypes = current.argtypes = [ctypes.c_void_p]
        push.restype = query.restype = pop.restype = current.restype = ctypes.c_int
        self._push, self._query, self._pop, self._current = push, query, pop, current
        self._context_value = context.value
        self._popped_value = ctypes.c_void_p()
        self._pop_slot = ctypes.addressof(self._popped_value)
        self._current_value = ctypes.c_void_p()
        self._current_slot = ctypes.addressof(self._current_value)

    CUDA_ERROR_NOT_READY = 600

    def synchronize(self) -> None:
        lib = self._lib
        self._check(lib.cuCtxPushCurrent_v2(self._context), "cuCtxPushCurrent")
        try:
            self._check(lib.cuStreamSynchronize(ctypes.c_void_p(self.CU_STREAM_LEGACY)), "cuStreamSynchronize")
        finally:
            lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))

    def settle(self, stream: int) -> None:
        """Until `stream` (a raw CUstream of this context; 0: the legacy default stream) has
        run what it holds; no wait when it holds nothing. Called once a call: the query itself
        is 1.7 us of driver time on an H100 host, so the rest is kept to the fewest calls."""
        handle = stream or self.CU_STREAM_LEGACY
        # torch's thread usually has the primary context current already: then the query needs
        # no push and pop around it (two driver calls of the three, about 1 us).
        if self._current(self._current_slot) == 0 and self._current_value.value == self._context_value:
            code = self._query(handle)
            if code:
                self._wait_for(handle, code)
            return
        code = self._push(self._context_value)
        if code:
            self._check(code, "cuCtxPushCurrent")
        try:
            code = self._query(handle)
            if code:
                self._wait_for(handle, code)
        finally:
            self._pop(self._pop_slot)

    def _wait_for(self, handle: int, queried: int) -> None:
        """After cuStreamQuery answered `queried` (not 0): wait for the stream while it is busy."""
        code = self._lib.cuStreamSynchronize(ctypes.c_void_p(handle)) if queried == self.CUDA_ERROR_NOT_READY else queried
        if code:
            self._check(code, "cuStreamSynchronize")

    @staticmethod
    def _check(code: int, call: str) -> None:
        if code != 0:
            raise KitError(f"{call} failed with CUDA error {code}", fix="check the driver with `kitdispatch doctor`")
