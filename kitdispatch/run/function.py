"""A function of a loaded module: `Function` checks its arguments (arguments.py), allocates or adopts its outputs (outputs.py), queues the call on the device and returns its results."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kitdispatch.run.device import DeviceArray, is_torch_tensor
from kitdispatch.errors import IREE_STATUS_ERRORS, KitError
from kitdispatch.describe.types import FunctionSignature, ScalarType
from kitdispatch.run.arguments import TensorCheck, check_count, flat_values, is_device_value, stored_results, to_numpy, check_arguments, check_tensor, result_size, scalar_argument, sizing_scalars
from kitdispatch.run.outputs import GivenOutputs
from kitdispatch.run.prepared import PreparedCall, RecordedCalls, TorchCalls


if TYPE_CHECKING:  # a Function belongs to a Module, which makes its Functions
    from collections.abc import Sequence

    from iree.runtime import FunctionInvoker, HalCommandBuffer, VmFunction

    from kitdispatch.run.module import Module


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

    def __init__(self, module: Module, name: str, signature: FunctionSignature | None, invoker: FunctionInvoker, vm_async: VmFunction | None, vm_record: VmFunction | None = None):
        self.module = module
        self.name = name
        self.signature = signature
        self._invoker = invoker
        self._vm_async = vm_async if signature is not None else None
        self._vm_record = vm_record if self._vm_async is not None else None
        self._recorded = RecordedCalls(self.record_call)
        self.device = module.device
        self._invoke = module._context.vm_context.invoke
        if signature is not None:
            self._args = [a.dtype if isinstance(a, ScalarType) else TensorCheck(a) for a in signature.args]
            self._results = [TensorCheck(r) for r in signature.results]
            storage = stored_results(self._vm_async) if self._vm_async is not None else ()
            self.outputs = GivenOutputs(name, signature.results, tuple(self._results[k] for k in storage), storage)
            self._all_stored = self.outputs.all_stored  # read on every launch: kept as a plain attribute
            self._list_size = sum(len(a.mlir_types) for a in signature.args) + len(storage) + 2
            self._sizes = sizing_scalars(signature)
            self._returned = None  # made on first use: needs iree.runtime
        # Repeated launch(out=) on torch tensors, prepared once: for NAME$record modules whose
        # results are all given (not inout).
        self._torch_calls = TorchCalls(self) if self._vm_record is not None and signature is not None and self._all_stored else None

    def __repr__(self) -> str:
        return f"<kitdispatch Function {self.name} of {self.module.name}>"

    @property
    def writes_into_outputs(self) -> bool:
        """Whether calls run through NAME$async (`out=`, no allocation, no blocking)."""
        return self._vm_async is not None

    def __call__(self, *args: object, out: object | None = None) -> object:
        if self._vm_async is None:
            return self._call_allocating(args, out)
        results, host_only, value = self._launch(args, out)
        self.device.wait_for(value)
        if host_only:
            arrays = results if isinstance(results, tuple) else (results,)
            hosts = tuple(a.to_host() for a in arrays)
            return hosts if isinstance(results, tuple) else hosts[0]
        return results

    def launch(self, *args: object, out: object | None = None) -> object:
        """Queues the call and returns its results (device arrays, or `out`) at once."""
        if self._vm_async is None:
            return self._call_allocating(args, out)
        if out is not None and self._torch_calls is not None and self._torch_calls.launched(args, out):
            return out
        return self._launch(args, out)[0]

    # -- the fast path: NAME$async with given outputs --------------------------------

    def prepare(self, *args: object, out: object | None = None) -> "PreparedCall":
        """This call with its arguments fixed and checked once; `launch()` / `()` on it run it
        again into the same result arrays, at little more than IREE's own cost."""
        if self._vm_async is None:
            raise KitError(f"{self.name} has no NAME$async form to prepare", fix="call it directly")
        outs = out if isinstance(out, (tuple, list)) else (out,)
        after_torch = any(is_torch_tensor(v) for v in (*args, *outs))  # imported now or before
        return PreparedCall(self, *self._pack(args, out), after_torch=after_torch)

    def _launch(self, args: Sequence[object], out: object | None):
        refs, results, given, host_only, bound, inputs, views = self._pack(args, out)
        if given is not None and self._all_stored and not inputs and self._vm_record is not None:
            # Every array is the caller's: the same call again is a recorded command buffer.
            arrays = [a for a in args if a.__class__ is DeviceArray] + views + results
            commands = self._recorded.commands_for(refs, arrays)
            if commands is not None:
                return given, False, self.device.submit(commands)
        value = self.queue_call(refs, results, bound)
        if given is not None and self._all_stored:
            returned = given
        else:
            returned = tuple(results) if len(results) > 1 else results[0]
        return returned, host_only and out is None, value

    def _pack(self, args: Sequence[object], out: object | None):
        """Checks the arguments and takes the outputs: (what to push, the stored results,
        `out` as given, whether every tensor came from the host, the bound sizes, arrays made
        here, which must live until the call is queued, and torch tensors' kept imports)."""
        device = self.device
        if len(args) != len(self._args):
            check_count(self.signature, args)
        refs = []  # VmRefs, or (push method name, number) for scalars
        bound: dict[str, int] = {}
        host_only = True
        inputs, views = [], []
        imported = device.torch_imports.get
        for i, (check, value) in enumerate(zip(self._args, args)):
            if value.__class__ is not DeviceArray and check.__class__ is TensorCheck and (view := imported(value)) is not None:
                views.append(view)  # a torch tensor imported before
                value = view
            if value.__class__ is DeviceArray and check.__class__ is TensorCheck and value.device is device:
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
        outputs, given = self.outputs.take(out, self.device, bound, views)
        refs += [array._ref for array in outputs]
        if views:  # once a call, not once a tensor (fresh imports waited for torch already)
            device.order_after_torch()
        return refs, outputs, given, host_only, bound, inputs, views

    def queue_call(self, refs: list, outputs: list, bound: dict) -> int:
        """Invokes NAME$async; returns the number of the call. Fills in `outputs` with inout
        results (IREE returns them) where there are any."""
        import iree.runtime as rt

        device = self.device
        if self._returned is None:
            self._returned = rt.VmVariantList(len(self._results))  # what IREE returns (read for inout)
        vm_args = self._argument_list(refs)
        with device.order:  # calls reach IREE's queue in the order of their numbers
            wait, done = device.next_fences()
            vm_args.push_ref(wait.ref)
            vm_args.push_ref(done.ref)
            try:
                self._invoke(self._vm_async, vm_args, self._returned)
            except IREE_STATUS_ERRORS as exc:
                device.abandon()
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

    def record_call(self, refs: list) -> HalCommandBuffer | None:
        """This call recorded into a command buffer that `Device.submit` queues again
        (NAME$record, render.py), or None for a module built without NAME$record."""
        import iree.runtime as rt

        if self._vm_record is None:
            return None
        returned = rt.VmVariantList(1)
        try:
            self._invoke(self._vm_record, self._argument_list(refs), returned)
        except IREE_STATUS_ERRORS as exc:
            raise KitError(f"{self.name}: IREE could not record the call: {str(exc).strip()}", fix="check the arguments against the function's signature") from None
        return returned.get_as_object(0, rt.HalCommandBuffer)

    def _with_in_place(self, outputs: list, bound: dict) -> list:
        """All results in order: the stored ones, and inout results, which IREE returns as
        their argument's buffer (updated in place)."""
        import iree.runtime as rt

        stored = iter(outputs)
        results = []
        for k, r in enumerate(self._results):
            if k in self.outputs.storage:
                results.append(next(stored))
            else:
                view = self._returned.get_as_object(k, rt.HalBufferView)
                results.append(DeviceArray(self.device, view, r.shape_from(bound), r.dtype))
        return results

    def _where(self, i: int) -> str:
        return f"{self.signature.name} argument {i} ({self.signature.args[i]})"

    def _device_argument(self, i: int, value: object, bound: dict):
        """The argument as an array on this device, checked; and whether it came from the host."""
        want = self.signature.args[i]
        if isinstance(value, np.ndarray) or not is_device_value(value):
            host = np.asarray(value)
            check_tensor(self._where(i), want, host.shape, host.dtype, bound)
            return self.device.put(host), True
        array = self.device.asarray(value)
        check_tensor(self._where(i), want, array.shape, array.dtype, bound)
        return array, False

    # -- the fallback: IREE's synchronous call ---------------------------------------

    def _call_allocating(self, args: Sequence[object], out: object | None):
        if out is not None:
            raise KitError(
                f"{self.name} cannot write into given outputs: only kernel functions of modules built by this kitdispatch can",
                fix="rebuild the module, or drop out= ([[programs]] functions allocate their results)",
            )
        device = self.device
        sig = self.signature
        host_only = all(isinstance(a, np.ndarray) or not is_device_value(a) for a in args)
        if sig is not None and host_only:
            args = check_arguments(sig, args)
        elif sig is not None:
            check_count(sig, args)
            bound: dict[str, int] = {}
            args = [
                v
                for i, (t, a) in enumerate(zip(sig.args, args))
                for v in flat_values(scalar_argument(t.dtype, a, self._where(i)) if isinstance(t, ScalarType) else self._device_argument(i, a, bound)[0])
            ]
        # IREE's invoker packs only its own DeviceArray class without a host round trip.
        args = [a._buffer_view if isinstance(a, DeviceArray) else a for a in args]
        device.synchronize()  # IREE's own call does not wait for launched calls
        results = self._invoker(*args)
        many = isinstance(results, (list, tuple))
        values = tuple(results) if many else (results,)
        if host_only:
            values = tuple(to_numpy(v) for v in values)
        else:
            values = tuple(device.asarray(v) if hasattr(v, "_buffer_view") else v for v in values)
        return values if many else values[0]
