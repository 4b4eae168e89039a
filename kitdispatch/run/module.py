"""Running built modules on IREE's cuda device: the iree.runtime API and iree-run-module.

Needs only iree-base-runtime and numpy, the way users deploy: build on one machine, run
on the GPU box.
"""

from __future__ import annotations

import functools
import re
import shutil
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kitdispatch._proc import ToolResult, run_checked
from kitdispatch.run.device import DeviceArray, _is_torch_tensor, element_type, get_device, numpy_dtype
from kitdispatch.errors import KitError, RuntimeUnavailable, UsageError
from kitdispatch.describe.record import RECORD_SUFFIX, BuildRecord, read_record, record_beside  # noqa: F401 (RECORD_SUFFIX: API)
from kitdispatch.describe import abi
from kitdispatch.describe.names import ASYNC_SUFFIX, RECORDING_SUFFIX
from kitdispatch.describe.types import FunctionSignature, ScalarType, TensorType

RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class DeviceStatus:
    available: bool
    reason: str  # what was found, or why there is no device


def cuda_status(device: str = "cuda") -> DeviceStatus:
    """Whether IREE's cuda driver can open a device here, and if not, why."""
    try:
        import iree.runtime as rt
    except ImportError as exc:
        return DeviceStatus(False, f"iree-base-runtime is not installed ({exc})")
    name = _driver_name(device)
    try:
        driver = rt.get_driver(name)
        devices = driver.query_available_devices()
    except Exception as exc:  # the binding raises RuntimeError/ValueError with IREE's status text
        return DeviceStatus(False, f"IREE's {name} driver cannot start: {str(exc).strip()}")
    if not devices:
        return DeviceStatus(False, f"IREE's {name} driver found no device")
    names = ", ".join(str(d.get("name", d)) for d in devices)
    kind = "CUDA" if name == "cuda" else name
    return DeviceStatus(True, f"{len(devices)} {kind} device(s): {names}")


def _driver_name(device: str) -> str:
    return device.split("://")[0]


def check_device_uri(device: str) -> None:
    """A device URI must name a driver IREE's runtime has: a typo is bad input, not a missing GPU.
    Without the runtime there is nothing to check (cuda_status says it is missing)."""
    try:
        import iree.runtime as rt
    except ImportError:
        return
    drivers = rt.query_available_drivers()
    if not isinstance(device, str) or _driver_name(device) not in drivers:
        raise UsageError(
            f"IREE's runtime has no device {device!r}",
            fix=f"use cuda (or cuda://N for GPU N); the drivers here: {', '.join(drivers)}",
        )


def require_cuda(device: str = "cuda") -> None:
    check_device_uri(device)
    status = cuda_status(device)
    if not status.available:
        raise RuntimeUnavailable(
            f"no CUDA device: {status.reason}",
            fix="run on a machine with an NVIDIA GPU and driver; building works without one",
        )


def read_record_of(vmfb: Path) -> BuildRecord | None:
    """The build record next to the .vmfb, after checking the .vmfb is the one it describes;
    None for modules built without kitdispatch (no record beside them)."""
    path = record_beside(vmfb)
    if not path.exists():
        return None
    record = read_record(path)
    record.check_file(vmfb.parent, vmfb.name)
    return record


def read_signatures(vmfb: Path) -> dict[str, FunctionSignature]:
    record = read_record_of(vmfb)
    return {f.name: f for f in record.functions} if record else {}


def preflight_run(vmfb: Path, record: BuildRecord | None = None) -> None:
    """Before loading: a PTX-only module must not need a newer PTX ISA than this driver has."""
    from kitdispatch.run.driver_ptx import Version, check_ptx_loads, local_driver

    record = record if record is not None else read_record_of(vmfb)
    needed = record.ptx_isa if record else None
    driver = local_driver()
    if needed and driver:
        check_ptx_loads(Version.parse(needed), driver, compiler="built", where=str(vmfb))


class Module:
    """A .vmfb loaded on a device. `module.NAME(...)` (or `module["NAME"]`) is a `Function`:
    host arrays in give host arrays out; device arrays in (this module's, IREE's, or CUDA
    tensors of torch, CuPy, ... through DLPack) give device arrays out."""

    def __init__(self, vmfb: str | Path, *, device: str = "cuda"):
        import iree.runtime as rt

        self.path = Path(vmfb)
        if not self.path.is_file():
            raise KitError(f"no module at {self.path}", fix="build it first: kitdispatch build ... -o DIR")
        record = read_record_of(self.path)
        require_cuda(device)
        preflight_run(self.path, record)
        self.signatures = {f.name: f for f in record.functions} if record else {}
        self.device = get_device(device)
        self.hal_device = self.device.hal
        config = rt.Config(device=self.hal_device)
        self._context = rt.SystemContext(config=config)
        try:
            self._vm_module = rt.VmModule.mmap(config.vm_instance, str(self.path))
            self._context.add_vm_module(self._vm_module)
        except (RuntimeError, ValueError) as exc:
            raise _load_error(self.path, device, exc) from None
        self._functions = self._context.modules[self._vm_module.name]
        self._bound: dict[str, Function] = {}
        self.name = self._vm_module.name

    @property
    def function_names(self) -> tuple[str, ...]:
        return tuple(self.signatures) if self.signatures else ()

    def raw(self, name: str):
        """IREE's own callable: no argument checks, and it takes device arrays
        (`iree.runtime.asdevicearray(module.hal_device, x)`) as well as numpy."""
        try:
            return self._functions[name]
        except (KeyError, AttributeError):
            known = ", ".join(self.function_names) or "see `iree-dump-module`"
            raise KitError(f"{self.path} has no function {name!r}", fix=f"call one of: {known}") from None

    def function(self, name: str) -> "Function":
        bound = self._bound.get(name)
        if bound is None:
            invoker = self.raw(name)
            lookup = self._vm_module.lookup_function
            vm_calls = (lookup(name + ASYNC_SUFFIX), lookup(name + RECORDING_SUFFIX))
            bound = self._bound[name] = Function(self, name, self.signatures.get(name), invoker, *vm_calls)
        return bound

    def __getitem__(self, name: str) -> "Function":
        return self.function(name)

    def __getattr__(self, name: str) -> "Function":
        if name.startswith("_"):
            raise AttributeError(name)
        return self.function(name)

    def call(self, name: str, *args, out=None):
        """Calls `name` and waits; one result, or a tuple for several."""
        return self.function(name)(*args, out=out)


def _load_error(vmfb: Path, device: str, exc: Exception) -> KitError:
    """IREE's refusal to load a module, as one error: a module compiled for another device
    (every kit module holds CUDA kernels) is bad input, anything else a failed load."""
    text = str(exc).strip()
    if "INCOMPATIBLE" in text:
        target = re.search(r'#hal\.device\.target<"([^"]+)"', text)
        return UsageError(
            f"{vmfb} was compiled for IREE's {target.group(1) if target else 'another'} device and cannot run on {device!r}",
            fix="run it on the device it was built for: kitdispatch's modules run on --device cuda (or cuda://N)",
        )
    return KitError(f"IREE's runtime cannot load {vmfb} on {device!r}: {text[:500]}", fix="rebuild the module")


def load_module(vmfb: str | Path, *, device: str = "cuda") -> Module:
    return Module(vmfb, device=device)


class Function:
    """A function of a loaded module.

    `f(*args, out=None)` returns once the results are ready: numpy arrays when every tensor
    argument is a host array and `out` is not given, device arrays otherwise. `f.launch(...)`
    queues the call and returns its device arrays at once; calls on a device run in launch
    order, and `module.device.synchronize()` (or any host copy) waits for them. `out` (one
    device array, or a tuple with one per `out` result) receives those results instead of
    arrays from the device's pool, and is returned as given (a torch tensor stays a torch
    tensor); `inout` results are their argument, updated in place. `f.prepare(...)` checks the
    arguments once for calls repeated on the same arrays.

    Kernel functions built by this kitdispatch run through `NAME$async` (render.py): the
    outputs are given, not allocated, and nothing blocks. Others ([[programs]], older builds)
    run through IREE's synchronous call, which allocates its results."""

    def __init__(self, module: Module, name: str, signature: FunctionSignature | None, invoker, vm_async, vm_record=None):
        self.module = module
        self.name = name
        self.signature = signature
        self._invoker = invoker
        self._vm_async = vm_async if signature is not None else None
        self._vm_record = vm_record if self._vm_async is not None else None
        self._recorded = RecordedCalls(self._record)
        self._torch_calls = TorchCalls(self)
        self._device = module.device
        self._invoke = module._context.vm_context.invoke
        if signature is not None:
            self._args = [a.dtype if isinstance(a, ScalarType) else _TensorCheck(a) for a in signature.args]
            self._results = [_TensorCheck(r) for r in signature.results]
            self._storage = _stored_results(self._vm_async) if self._vm_async is not None else ()
            self._stored_checks = [self._results[k] for k in self._storage]
            self._all_stored = len(self._storage) == len(signature.results)
            self._list_size = sum(len(a.mlir_types) for a in signature.args) + len(self._storage) + 2
            self._sizes = sizing_scalars(signature)
            self._returned = None  # made on first use: needs iree.runtime

    def __repr__(self) -> str:
        return f"<kitdispatch Function {self.name} of {self.module.name}>"

    @property
    def writes_into_outputs(self) -> bool:
        """Whether calls run through NAME$async (`out=`, no allocation, no blocking)."""
        return self._vm_async is not None

    def __call__(self, *args, out=None):
        if self._vm_async is None:
            return self._call_allocating(args, out)
        results, host_only, value = self._launch(args, out)
        self._device.wait_for(value)
        if host_only:
            arrays = results if isinstance(results, tuple) else (results,)
            hosts = tuple(a.to_host() for a in arrays)
            return hosts if isinstance(results, tuple) else hosts[0]
        return results

    def launch(self, *args, out=None):
        """Queues the call and returns its results (device arrays, or `out`) at once."""
        if self._vm_async is None:
            return self._call_allocating(args, out)
        if out is not None and self._vm_record is not None and self._all_stored and self._torch_calls.launched(args, out):
            return out
        return self._launch(args, out)[0]

    # -- the fast path: NAME$async with given outputs --------------------------------

    def prepare(self, *args, out=None) -> "PreparedCall":
        """This call with its arguments fixed and checked once; `launch()` / `()` on it run it
        again into the same result arrays, at little more than IREE's own cost."""
        if self._vm_async is None:
            raise KitError(f"{self.name} has no NAME$async form to prepare", fix="call it directly")
        return PreparedCall(self, *self._pack(args, out))

    def _launch(self, args, out):
        refs, results, given, host_only, bound, inputs, views = self._pack(args, out)
        if given is not None and self._all_stored and not inputs and self._vm_record is not None:
            # Every array is the caller's: the same call again is a recorded command buffer.
            arrays = [a for a in args if a.__class__ is DeviceArray] + views + results
            commands = self._recorded.commands_for(refs, arrays)
            if commands is not None:
                return given, False, self._device.submit(commands)
        value = self._queue(refs, results, bound)
        if given is not None and self._all_stored:
            returned = given
        else:
            returned = tuple(results) if len(results) > 1 else results[0]
        return returned, host_only and out is None, value

    def _pack(self, args, out):
        """Checks the arguments and takes the outputs: (what to push, the stored results,
        `out` as given, whether every tensor came from the host, the bound sizes, arrays made
        here, which must live until the call is queued, and torch tensors' kept imports)."""
        device = self._device
        if len(args) != len(self._args):
            _check_count(self.signature, args)
        refs = []  # VmRefs, or (push method name, number) for scalars
        bound: dict[str, int] = {}
        host_only = True
        inputs, views = [], []
        imported = device.torch_imports.get
        for i, (check, value) in enumerate(zip(self._args, args)):
            if value.__class__ is not DeviceArray and check.__class__ is _TensorCheck and (view := imported(value)) is not None:
                views.append(view)  # a torch tensor imported before
                value = view
            if value.__class__ is DeviceArray and check.__class__ is _TensorCheck and value.device is device:
                host_only = False
                if not check.fits(value._shape, value._np_dtype, bound):
                    check_tensor(self._where(i), self.signature.args[i], value._shape, value._np_dtype, bound)
                refs.append(value._ref)
            elif check.__class__ is str:  # a scalar's dtype
                number = scalar_argument(check, value, self._where(i))
                if i in self._sizes:  # a result's size: the value, as the MLIR's index_cast reads it
                    bound[self._sizes[i]] = result_size(value, self._where(i))
                if isinstance(number, tuple):  # a struct: one i32 per word
                    refs += [("push_int", word) for word in number]
                else:
                    refs.append(("push_float" if check == "f32" else "push_int", number))
            else:
                array, from_host = self._device_argument(i, value, bound)
                host_only = host_only and from_host
                inputs.append(array)
                refs.append(array._ref)
        outputs, given = self._outputs(out, bound, views)
        refs += [array._ref for array in outputs]
        if views:  # once a call, not once a tensor (fresh imports waited for torch already)
            device.order_after_torch()
        return refs, outputs, given, host_only, bound, inputs, views

    def _queue(self, refs: list, outputs: list, bound: dict) -> int:
        """Invokes NAME$async; returns the number of the call. Fills in `outputs` with inout
        results (IREE returns them) where there are any."""
        import iree.runtime as rt

        device = self._device
        if self._returned is None:
            self._returned = rt.VmVariantList(len(self._results))  # what IREE returns (read for inout)
        vm_args = self._argument_list(refs)
        with device.order:  # calls reach IREE's queue in the order of their numbers
            wait, done = device.next_fences()
            vm_args.push_ref(wait.ref)
            vm_args.push_ref(done.ref)
            try:
                self._invoke(self._vm_async, vm_args, self._returned)
            except (RuntimeError, ValueError) as exc:
                device.abandon(done)
                raise KitError(
                    f"{self.name}: IREE refused the call: {str(exc).strip()}",
                    fix="check the arguments against the function's signature",
                ) from None
            value = device.launched()
            if not self._all_stored:
                outputs[:] = self._with_in_place(outputs, bound)
        return value

    def _argument_list(self, refs: list):
        import iree.runtime as rt

        vm_args = rt.VmVariantList(self._list_size)
        push = vm_args.push_ref
        for ref in refs:
            if ref.__class__ is tuple:
                getattr(vm_args, ref[0])(ref[1])
            else:
                push(ref)
        return vm_args

    def _record(self, refs: list):
        """This call recorded into a command buffer that `Device.submit` queues again
        (NAME$record, render.py), or None for a module built without NAME$record."""
        import iree.runtime as rt

        if self._vm_record is None:
            return None
        returned = rt.VmVariantList(1)
        try:
            self._invoke(self._vm_record, self._argument_list(refs), returned)
        except (RuntimeError, ValueError) as exc:
            raise KitError(f"{self.name}: IREE could not record the call: {str(exc).strip()}", fix="check the arguments against the function's signature") from None
        return returned.get_as_object(0, rt.HalCommandBuffer)

    def _with_in_place(self, outputs: list, bound: dict) -> list:
        """All results in order: the stored ones, and inout results, which IREE returns as
        their argument's buffer (updated in place)."""
        import iree.runtime as rt

        stored = iter(outputs)
        results = []
        for k, r in enumerate(self._results):
            if k in self._storage:
                results.append(next(stored))
            else:
                view = self._returned.get_as_object(k, rt.HalBufferView)
                results.append(DeviceArray(self._device, view, r.shape_from(bound), r.dtype))
        return results

    def _where(self, i: int) -> str:
        return f"{self.signature.name} argument {i} ({self.signature.args[i]})"

    def _device_argument(self, i: int, value, bound: dict):
        """The argument as an array on this device, checked; and whether it came from the host."""
        want = self.signature.args[i]
        if isinstance(value, np.ndarray) or not _is_device_value(value):
            host = np.asarray(value)
            check_tensor(self._where(i), want, host.shape, host.dtype, bound)
            return self._device.put(host), True
        array = self._device.asarray(value)
        check_tensor(self._where(i), want, array.shape, array.dtype, bound)
        return array, False

    def _outputs(self, out, bound: dict, views: list):
        """(arrays the call writes its `out` results into, `out` as given or None): arrays from
        the device's pool, or the caller's (torch tensors imported before join `views`)."""
        stored = self._stored_checks
        if out is None:
            arrays = []
            for r in stored:
                shape = r.shape_from(bound)
                if shape is None:  # a module whose record has no argument names (older builds)
                    raise KitError(
                        f"{self.name}: a result size depends on a scalar argument, and the build record does not name the arguments",
                        fix="rebuild the module with this kitdispatch, or pass out= with arrays of the result shapes",
                    )
                try:
                    arrays.append(self._device.pooled_array(shape, r))
                except (RuntimeError, ValueError) as exc:  # IREE's allocator: sizes from scalars may be anything
                    raise KitError(
                        f"{self.name}: cannot allocate a result of shape {shape} ({r.name}): {str(exc).strip()}",
                        fix="check the sizes passed as scalar arguments; free memory with module.device.pool.trim()",
                    ) from None
            return arrays, None
        given = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(given) != len(stored):
            raise KitError(
                f"{self.name} writes {len(stored)} result(s) into new arrays, out= gave {len(given)}",
                fix="pass one array per `out` result (inout results are updated in their argument)",
            )
        arrays = []
        imported = self._device.torch_imports.get
        for k, value, r in zip(self._storage, given, stored):
            if value.__class__ is DeviceArray and value.device is self._device:
                array = value
            elif (view := imported(value)) is not None:
                array = view
                views.append(view)
            elif isinstance(value, np.ndarray) or not _is_device_value(value):
                raise KitError(
                    f"{self.name} out: out= takes device arrays, got {type(value).__name__}",
                    fix="use module.device.empty(shape, dtype), or a CUDA tensor",
                )
            else:
                array = self._device.asarray(value)
            if not r.fits(array.shape, array.dtype, bound):
                want = self.signature.results[k]
                check_tensor(f"{self.name} result {k} ({want}) out=", want, array.shape, array.dtype, bound)
            arrays.append(array)
        if len(arrays) > 1:
            _check_distinct_outputs(self.name, given, arrays)
        return arrays, (given if len(given) > 1 else given[0])

    # -- the fallback: IREE's synchronous call ---------------------------------------

    def _call_allocating(self, args, out):
        if out is not None:
            raise KitError(
                f"{self.name} cannot write into given outputs: only kernel functions of modules built by this kitdispatch can",
                fix="rebuild the module, or drop out= ([[programs]] functions allocate their results)",
            )
        device = self._device
        sig = self.signature
        host_only = all(isinstance(a, np.ndarray) or not _is_device_value(a) for a in args)
        if sig is not None and host_only:
            args = check_arguments(sig, args)
        elif sig is not None:
            _check_count(sig, args)
            bound: dict[str, int] = {}
            args = [
                v
                for i, (t, a) in enumerate(zip(sig.args, args))
                for v in _flat(scalar_argument(t.dtype, a, self._where(i)) if isinstance(t, ScalarType) else self._device_argument(i, a, bound)[0])
            ]
        # IREE's invoker packs only its own DeviceArray class without a host round trip.
        args = [a._buffer_view if isinstance(a, DeviceArray) else a for a in args]
        device.synchronize()  # IREE's own call does not wait for launched calls
        results = self._invoker(*args)
        many = isinstance(results, (list, tuple))
        values = tuple(results) if many else (results,)
        if host_only:
            values = tuple(_to_numpy(v) for v in values)
        else:
            values = tuple(device.asarray(v) if hasattr(v, "_buffer_view") else v for v in values)
        return values if many else values[0]


class RecordedCalls:
    """Calls made again on the same arrays and scalars (`launch` with `out=`): the second one
    is recorded (NAME$record, by `record(refs)`) and later ones queue its command buffer, as a
    prepared call does. An entry goes when one of its arrays is garbage-collected (its command
    buffer holds the memory), and the oldest when more than LIMIT are kept."""

    LIMIT = 16

    def __init__(self, record):
        self._record = record
        self._entries: OrderedDict = OrderedDict()  # key -> command buffer, or None: seen once

    def commands_for(self, refs: list, arrays: list):
        """The recorded call on `refs` (VmRefs of `arrays`, and scalars), or None for now."""
        key = tuple(r if r.__class__ is tuple else id(r) for r in refs)
        entries = self._entries
        if key not in entries:
            entries[key] = None
            if len(entries) > self.LIMIT:
                entries.popitem(last=False)
            return None
        commands = entries[key]
        if commands is None:
            commands = entries[key] = self._record(refs)
            forget = functools.partial(_forget, weakref.ref(self), key)
            for array in arrays:
                weakref.finalize(array, forget)
        entries.move_to_end(key)
        return commands

    def __len__(self) -> int:
        return sum(c is not None for c in self._entries.values())


def _forget(calls_ref, key) -> None:
    calls = calls_ref()
    if calls is not None:
        calls._entries.pop(key, None)


class TorchCalls:
    """launch(out=) repeated on the same torch tensors (with device arrays and scalars): the
    call is prepared once (`Function.prepare`) and launched again after a check that each
    tensor still has the memory, shape, strides and dtype it had, in place of importing and
    checking every argument again (6.3 us of host time a call for three tensors on an H100:
    benchmarks/investigations/torch_launch_profile.py). Prepared at the second sight of a call,
    so one-off calls on fresh tensors record nothing. An entry goes with any of its arrays (it
    holds their imports), and the oldest beyond LIMIT."""

    LIMIT = 16

    def __init__(self, function: Function) -> None:
        self._function = weakref.ref(function)
        self._entries: OrderedDict = OrderedDict()  # key -> (snapshot, PreparedCall or None: seen once, token)
        self._tokens = iter(range(1 << 62))

    def launched(self, args, out) -> bool:
        """Whether the call went out this way; False: take the usual path."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        key, arrays = _call_key((*args, *outs))
        if key is None:
            return False
        entries = self._entries
        entry = entries.get(key)
        if entry is not None and not _unchanged(entry[0], arrays):
            del entries[key]
            entry = None
        if entry is None:  # seen once: the next identical call is prepared
            entries[key] = (_snapshot(arrays), None, None)
            if len(entries) > self.LIMIT:
                entries.popitem(last=False)
            return False
        snapshot, prepared, token = entry
        function = self._function()
        if prepared is None:
            prepared, token = function.prepare(*args, out=out), next(self._tokens)
            prepared._returned = None  # `out` is returned by the caller: holding it would keep the tensor alive
            entries[key] = (snapshot, prepared, token)
            forget = functools.partial(_forget_torch_call, weakref.ref(self), key, token)
            for array in arrays:
                weakref.finalize(array, forget)
        entries.move_to_end(key)
        if not prepared._after_torch:  # tensors imported by this call's own preparation
            function._device.order_after_torch()
        prepared.launch()
        return True

    def __len__(self) -> int:
        """Calls prepared (not those seen once)."""
        return sum(e[1] is not None for e in self._entries.values())


def _call_key(values) -> tuple:
    """(the call's key, its arrays) where every value is a torch tensor, a device array or a
    number and one at least is a torch tensor; (None, ()) otherwise."""
    key, arrays, torch_seen = [], [], False
    for v in values:
        if v.__class__ is DeviceArray:
            key.append(id(v))
            arrays.append(v)
        elif _is_torch_tensor(v):
            key.append(id(v))
            arrays.append(v)
            torch_seen = True
        elif isinstance(v, (int, float, np.generic)):
            key.append((v.__class__, v))
        else:
            return None, ()
    return (tuple(key), arrays) if torch_seen else (None, ())


def _snapshot(arrays) -> tuple:
    return tuple(
        (weakref.ref(a),) if a.__class__ is DeviceArray else (weakref.ref(a), a.data_ptr(), a.shape, a.stride(), a.dtype)
        for a in arrays
    )


def _unchanged(snapshot: tuple, arrays) -> bool:
    for was, a in zip(snapshot, arrays):
        if was[0]() is not a:
            return False
        if len(was) > 1 and (a.data_ptr() != was[1] or a.shape != was[2] or a.stride() != was[3] or a.dtype != was[4]):
            return False
    return True


def _forget_torch_call(calls_ref, key, token) -> None:
    calls = calls_ref()
    entry = calls._entries.get(key) if calls is not None else None
    if entry is not None and entry[2] == token:  # not a later call's entry under reused ids
        del calls._entries[key]


class PreparedCall:
    """A call whose arguments are fixed (`Function.prepare`): `launch()` queues it again and
    returns its results, the same arrays every time; `()` also waits for them.

    The first launch runs NAME$async (which also gives the inout results) and records the call
    into a command buffer (NAME$record); later launches queue that command buffer, with no VM
    call and no argument list: 4 to 7 us a call in a loop on an H100 against 13 us through
    NAME$async (benchmarks/calls.py). Modules built without NAME$record keep NAME$async."""

    def __init__(self, function: Function, refs, results, given, host_only, bound, inputs, views):
        self.function = function
        self._refs, self._bound, self._inputs = refs, bound, inputs + views  # kept alive
        self._after_torch = bool(views)  # each launch ordered after torch's queued work
        self._stored = list(results)
        self._results = list(results)
        self._returned = given if given is not None and function._all_stored else None
        self._commands = None  # the recorded call, once launched
        self._launched = False

    def launch(self):
        function = self.function
        if self._after_torch:
            function._device.order_after_torch()
        if self._commands is not None:
            self._last = function._device.submit(self._commands)
        elif self._launched:  # no NAME$record in this module
            self._last = function._queue(self._refs, list(self._stored), self._bound)
        else:
            self._results = list(self._stored)
            self._last = function._queue(self._refs, self._results, self._bound)
            self._launched = True
            self._commands = function._record(self._refs)
        return self.results

    def __call__(self):
        self.launch()
        self.function._device.wait_for(self._last)
        return self.results

    @property
    def results(self):
        if self._returned is not None:
            return self._returned
        return tuple(self._results) if len(self._results) > 1 else self._results[0]


class _TensorCheck:
    """A tensor type, ready for the per-call check (the error text comes from check_tensor)."""

    __slots__ = ("dtype", "hal_type", "dims", "name")

    def __init__(self, t: TensorType):
        self.dtype = numpy_dtype(t.dtype)
        self.hal_type = element_type(self.dtype)
        self.dims = t.shape
        self.name = t.dtype  # with a shape, the pool's key

    def fits(self, shape: tuple, dtype, bound: dict[str, int]) -> bool:
        if dtype != self.dtype or len(shape) != len(self.dims):
            return False
        for dim, size in zip(self.dims, shape):
            if dim.__class__ is int:
                if dim != size:
                    return False
            elif bound.setdefault(dim, size) != size:
                return False
        return True

    def shape_from(self, bound: dict[str, int]) -> tuple[int, ...] | None:
        try:
            return tuple([d if d.__class__ is int else bound[d] for d in self.dims])
        except KeyError:
            return None


def sizing_scalars(sig: FunctionSignature) -> dict[int, str]:
    """Integer scalar arguments that size a result (`out = "i64[n]"` with `n` an argument):
    their positions and names. The generated function casts them to the result's dimension."""
    used = {d for r in sig.results if isinstance(r, TensorType) for d in r.symbols}
    return {
        i: name
        for i, (t, name) in enumerate(zip(sig.args, sig.arg_names))
        if isinstance(t, ScalarType) and abi.lookup(t.dtype).is_integer and name in used
    }


def result_size(value, where: str) -> int:
    """A scalar argument (range-checked already) as the size of a result dimension."""
    size = int(value)
    if size < 0:
        raise KitError(f"{where}: {size} sizes a result and cannot be negative", fix="pass a size of 0 or more")
    return size


def _stored_results(vm_function) -> tuple[int, ...]:
    """Indices of the results NAME$async writes into given buffers (its `iree.abi.output`
    arguments, in order); the others are inout, updated in their argument."""
    declaration = vm_function.reflection.get("iree.abi.declaration", "")
    return tuple(int(k) for k in re.findall(r"iree\.abi\.output = (\d+)", declaration))


def _check_distinct_outputs(name: str, given: tuple, arrays: list) -> None:
    """Two results written into one array would leave it holding only one of them: one
    object given twice (a torch tensor), or one IREE buffer view."""
    for k in range(1, len(arrays)):
        for j in range(k):
            if given[k] is given[j] or arrays[k]._buffer_view is arrays[j]._buffer_view:
                raise KitError(
                    f"{name} out: results {j} and {k} are given one array; each result needs an array of its own",
                    fix="pass a separate array per result, e.g. module.device.empty(shape, dtype) for each",
                )


def _is_device_value(value) -> bool:
    """Device memory the kit can take as it is (no host copy)."""
    import iree.runtime as rt

    if isinstance(value, (rt.DeviceArray, rt.HalBufferView)):
        return True
    if hasattr(value, "__dlpack_device__") and not isinstance(value, np.ndarray):
        try:
            return int(value.__dlpack_device__()[0]) != 1  # not kDLCPU
        except Exception:
            return False
    return False


def _check_count(sig: FunctionSignature, args: Sequence) -> None:
    if len(args) != len(sig.args):
        raise KitError(
            f"{sig.name} takes {len(sig.args)} arguments ({', '.join(map(str, sig.args))}), got {len(args)}",
            fix="pass one array per tensor argument and one number per scalar",
        )


def check_arguments(sig: FunctionSignature, args: Sequence) -> list:
    """Checks count, dtype, rank, static dims and shared symbols before IREE sees them."""
    _check_count(sig, args)
    bound: dict[str, int] = {}
    out = []
    for i, (want, got) in enumerate(zip(sig.args, args)):
        where = f"{sig.name} argument {i} ({want})"
        if isinstance(want, ScalarType):
            value = scalar_argument(want.dtype, got, where)
            out += value if isinstance(value, tuple) else [value]  # a struct: its words
            continue
        arr = np.asarray(got)
        check_tensor(where, want, arr.shape, arr.dtype, bound)
        out.append(np.ascontiguousarray(arr))
    return out


def check_tensor(where: str, want: TensorType, shape: tuple, dtype, bound: dict[str, int]) -> None:
    """dtype, rank, static dims, and symbols that must agree with earlier arguments (`bound`)."""
    want_dtype = numpy_dtype(want.dtype)
    if dtype != want_dtype:
        raise KitError(f"{where}: got dtype {dtype}", fix=f"pass a {want_dtype} array (arr.astype(...))")
    if len(shape) != len(want.shape):
        raise KitError(f"{where}: got shape {tuple(shape)}", fix=f"pass a rank-{len(want.shape)} array")
    for dim, size in zip(want.shape, shape):
        if isinstance(dim, int) and dim != size:
            raise KitError(f"{where}: got shape {tuple(shape)}", fix=f"dimension must be {dim}")
        if isinstance(dim, str) and bound.setdefault(dim, size) != size:
            raise KitError(
                f"{where}: {dim} = {size} here but {bound[dim]} in an earlier argument",
                fix=f"give every argument the same size for {dim}",
            )


def scalar_argument(dtype: str, value, where: str = "scalar") -> int | float | tuple[int, ...]:
    """A Python or numpy scalar as the generated function takes it (abi.argument),
    range-checked; a struct (`structN`) as the tuple of its 32-bit words."""
    try:
        return abi.argument(abi.lookup(dtype), value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise KitError(f"{where}: {exc}", fix=f"pass a number that fits {dtype}") from None


def _flat(value) -> tuple:
    """An argument as the VM arguments it becomes: a struct's words, or itself."""
    return value if isinstance(value, tuple) else (value,)


def _to_numpy(value):
    return value.to_host() if hasattr(value, "to_host") else np.asarray(value)


# --------------------------------------------------------------- `kitdispatch run`


@dataclass(frozen=True)
class RunResult:
    function: str
    results: tuple[str, ...]  # each as iree-run-module prints it
    times: "CallTimes | None" = None


def run_function(vmfb: str | Path, function: str, inputs: Sequence[str], *, device: str = "cuda", benchmark: int = 0) -> RunResult:
    """Runs one function in process with IREE's --input syntax, the way Python calls it; with
    `benchmark` > 0 also times that many calls (timing.time_calls)."""
    from kitdispatch.run.timing import time_calls
    from kitdispatch.run.text_forms import format_result, parse_input

    module = Module(vmfb, device=device)
    fn = module.function(function)
    sig = fn.signature
    if sig is None:
        raise KitError(f"{vmfb} has no kitdispatch build record for {function}", fix="run it with iree-run-module")
    if len(inputs) != len(sig.args):
        _check_count(sig, inputs)
    args = [parse_input(text, t, f"--input {i + 1} ({t})") for i, (text, t) in enumerate(zip(inputs, sig.args))]
    results = fn(*args)
    results = results if isinstance(results, tuple) else (results,)
    times = None
    if benchmark > 0:
        on_device = [module.device.put(a) if isinstance(a, np.ndarray) else a for a in args]
        times = time_calls(fn, on_device, calls=benchmark)
    return RunResult(function, tuple(format_result(i, r) for i, r in enumerate(results)), times)


# ---------------------------------------------------------------------- iree-run-module


@functools.cache
def find_runtime_tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    try:
        import iree._runtime_libs as libs
    except ImportError:
        raise KitError(f"{name} is not installed", fix="pip install iree-base-runtime") from None
    path = Path(libs.__file__).parent / name
    if not path.is_file():
        raise KitError(f"{name} is missing from iree-base-runtime", fix="reinstall iree-base-runtime")
    return str(path)


def run_module(
    vmfb: str | Path,
    function: str,
    inputs: Sequence[str],
    *,
    device: str = "cuda",
    extra: Sequence[str] = (),
    timeout: float = RUN_TIMEOUT_S,
) -> ToolResult:
    """Runs one function through iree-run-module with IREE's --input syntax (e.g. 8xf32=2)."""
    vmfb = Path(vmfb)
    if not vmfb.is_file():
        raise KitError(f"no module at {vmfb}", fix="build it first: kitdispatch build ... -o DIR")
    require_cuda(device)
    preflight_run(vmfb)
    argv = [
        find_runtime_tool("iree-run-module"),
        f"--device={device}",
        f"--module={vmfb}",
        f"--function={function}",
        *(f"--input={i}" for i in inputs),
        *extra,
    ]
    return run_checked(
        argv,
        timeout=timeout,
        what=f"iree-run-module failed running {function}",
        where=str(vmfb),
        fix="check the function name and the inputs' shapes and types",
    )
