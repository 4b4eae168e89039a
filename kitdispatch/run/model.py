"""Models built by `build_model`, called like kernel modules: `load_module(DIR)` loads the
model's .vmfb (or, with `baseline=True`, IREE's own build of it) with the functions its model
record lists, and each is a `ModelEntry`.

How IREE exports a model's functions (3.13; iree-import-onnx and iree-turbine alike): `f` is a
synchronous wrapper (it creates a fence, calls `f$async` and blocks on the fence) and `f$async`
takes the inputs, then a wait and a signal fence (the "coarse-fences" ABI, the one the kit's
own `NAME$async` functions have), and returns result buffers it allocated in queue order.
Unlike the kit's kernels it takes no output buffers (`iree.abi.output`), so `out=` is a queued
device-to-device copy of each result after the call, and a prepared call is `f$async` with its
arguments checked and packed once: no host wait, no kit allocation, IREE's own queue-ordered
allocations for its results. An MLIR model written with `func.func` has only the synchronous
`f`: it runs through IREE's synchronous call, without `out=` or `prepare`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kitdispatch.describe import abi
from kitdispatch.describe.model_record import ModelFunction, ModelRecord, read_model_record
from kitdispatch.describe.record import MODEL_RECORD_SUFFIX
from kitdispatch.describe.types import FunctionSignature, TensorType
from kitdispatch.errors import KitError, UsageError
from kitdispatch.run.arguments import TensorCheck
from kitdispatch.run.device import DeviceArray
from kitdispatch.run.function import Function
from kitdispatch.run.outputs import GivenOutputs

if TYPE_CHECKING:
    from iree.runtime import FunctionInvoker, HalBufferView, VmFunction

    from kitdispatch.run.module import Module

def model_build(path: Path, baseline: bool) -> tuple[Path, ModelRecord] | None:
    """(the .vmfb to load, the model record) where `path` is a model build: its folder, its
    record, or one of its .vmfbs; None for anything else (a kernel module)."""
    if path.is_file() and path.suffix == ".vmfb":
        records = sorted(path.parent.glob(f"*{MODEL_RECORD_SUFFIX}"))
        if len(records) != 1 or baseline:
            return None
        folder, record = read_model_record(records[0])
        if path.name not in (record.vmfb, record.baseline_vmfb):
            return None
        return folder / path.name, record
    if not (path.name.endswith(MODEL_RECORD_SUFFIX) or (path.is_dir() and any(path.glob(f"*{MODEL_RECORD_SUFFIX}")))):
        return None
    folder, record = read_model_record(path)
    if not baseline:
        return folder / record.vmfb, record
    if not record.baseline_vmfb:
        raise UsageError(
            f"{folder} has no baseline module",
            fix="build it with the baseline: kitdispatch build --model MODEL --with-baseline -o DIR",
        )
    return folder / record.baseline_vmfb, record


def model_signature(function: ModelFunction) -> FunctionSignature | str:
    """The function as the run side checks calls against it, or why it cannot be called:
    dynamic sizes become names of their own (each input's sizes are checked where static)."""
    def tensor(t: object, role: str, i: int) -> TensorType:
        row = abi.BY_MLIR.get(t.dtype)
        name = None if row is None else row.name
        if name is None or abi.lookup(name).dtype is None:
            raise ValueError(f"its {role} {i} is {t.text}, an element type kitdispatch cannot pass")
        return TensorType(name, tuple(f"{role}{i}_d{axis}" if d is None else d for axis, d in enumerate(t.shape)))

    try:
        args = tuple(tensor(t, "input", i) for i, t in enumerate(function.inputs))
        results = tuple(tensor(t, "output", i) for i, t in enumerate(function.outputs))
    except ValueError as exc:
        return str(exc)
    return FunctionSignature(function.name, args, results)


class ModelEntry(Function):
    """A public function of a model: `f(*args, out=None)`, `f.launch(...)` and `f.prepare(...)`
    as for a kernel function (Function), through the model's `f$async`. Results are the arrays
    IREE allocated for them (shapes as IREE returns them: dynamic sizes come out of the call);
    `out=` receives copies of them, queued after the call."""

    def __init__(self, module: Module, name: str, signature: FunctionSignature | str, invoker: FunctionInvoker, vm_async: VmFunction | None,
                 *, transients: int | None = None):
        self._refusal = signature if isinstance(signature, str) else None
        super().__init__(module, name, None if self._refusal else signature, invoker, vm_async)
        # `vm_async` is NAME$async_transients where `transients` (bytes) is given (CUDA only,
        # Module._model_async): its transient memory is one buffer of the function's, allocated
        # at its first call and passed to every call; calls on the device run in queue order on
        # one stream, so no two calls use it at once.
        self._transients_size = transients if self._vm_async is not None else None
        self._transients = None
        if self._refusal is None:
            checks = tuple(TensorCheck(r) for r in self.signature.results)
            self._targets = GivenOutputs(name, self.signature.results, checks, tuple(range(len(checks))))
            if self._transients_size is not None:
                self._list_size += 1

    @property
    def takes_transients(self) -> bool:
        """Whether calls pass the function its transient memory (calls that never block the host)."""
        return self._transients_size is not None

    def _argument_list(self, refs: list):
        vm_args = super()._argument_list(refs)
        if self._transients_size is not None:
            if self._transients is None:
                with self.device.order:  # one buffer, whichever thread calls first
                    if self._transients is None:
                        self._transients = self.device.allocate_storage(self._transients_size, f"{self.module.path}: {self.name}")
            vm_args.push_ref(self._transients)
        return vm_args

    def __repr__(self) -> str:
        return f"<kitdispatch ModelEntry {self.name} of {self.module.name}>"

    def __call__(self, *args: object, out: object | None = None) -> object:
        self._check_callable(out)
        return super().__call__(*args, out=out)

    def launch(self, *args: object, out: object | None = None) -> object:
        self._check_callable(out)
        return super().launch(*args, out=out)

    def prepare(self, *args: object, out: object | None = None) -> "PreparedModelCall":
        self._check_callable(out, prepared=True)
        return PreparedModelCall(self, *self._pack(args, out))

    def _check_callable(self, out: object | None, *, prepared: bool = False) -> None:
        where = f"{self.module.path}: function {self.name}"
        if self._refusal is not None:
            raise KitError(f"{where} cannot be called by kitdispatch: {self._refusal}", fix=f"call it through IREE's own API: module.raw({self.name!r})")
        if self._vm_async is None and (out is not None or prepared):
            raise KitError(
                f"{where} has no {self.name}$async form (IREE's coarse-fences ABI, which iree-import-onnx and iree-turbine "
                f"give a model's functions; an MLIR model's func.func has only the synchronous one), so it cannot "
                f"{'be prepared' if prepared else 'write into out='}",
                fix="call it without out= (it runs through IREE's synchronous call), or build the model from ONNX or PyTorch",
            )

    # -- the call: f$async, then copies into out= -------------------------------------

    def _launch(self, args: Sequence[object], out: object | None):
        refs, targets, given, host_only, bound, *_ = self._pack(args, out)  # the rest: kept alive until queued
        results: list[DeviceArray] = []
        value = self.queue_call(refs, results, bound)
        if given is None:
            return (tuple(results) if len(results) > 1 else results[0]), host_only, value
        return given, False, self.copy_results(results, targets, value)

    def _pack(self, args: Sequence[object], out: object | None):
        """The arguments as Function packs them; `out=`, checked against the result types, as
        the arrays the results are copied into (f$async takes no output buffers)."""
        refs, _, _, host_only, bound, inputs, views = super()._pack(args, None)
        if out is None:
            return refs, [], None, host_only, bound, inputs, views
        imported = len(views)
        targets, given = self._targets.take(out, self.device, bound, views)
        if len(views) > imported and not imported:  # a torch tensor among the outputs only
            self.device.order_after_torch()
        return refs, targets, given, host_only, bound, inputs, views

    def _with_in_place(self, outputs: list, bound: dict) -> list:
        """Every result is one IREE returned, with the shape it has. The list IREE returned them
        in goes: it would hold the results' buffers until the next call (and past the device
        at exit, which crashed the process on local-task)."""
        import iree.runtime as rt

        views: list[HalBufferView] = [self._returned.get_as_object(k, rt.HalBufferView) for k in range(len(self._results))]
        self._returned = rt.VmVariantList(len(self._results))
        return [DeviceArray(self.device, v, tuple(v.shape), r.dtype) for v, r in zip(views, self._results)]

    def copy_results(self, results: Sequence[DeviceArray], targets: Sequence[DeviceArray], call: int) -> int:
        """Queues a copy of each result of call number `call` into its `out` array; returns the
        number of the last copy (`call` where there were no bytes to copy)."""
        for k, (result, target) in enumerate(zip(results, targets)):
            if result.shape != target.shape:
                raise KitError(
                    f"{self.name}: result {k} is {list(result.shape)} this call, and out= gave {list(target.shape)}",
                    fix="pass out= arrays of the result's shape (call once without out= to see it)",
                )
        value = call
        for result, target in zip(results, targets):
            source = result.buffer_view.get_buffer()
            if not result.buffer_view.byte_length:
                continue
            if source.byte_length() == result.buffer_view.byte_length:  # IREE's buffer holds the result alone
                value = self.device.queue_copy(source, target.buffer_view.get_buffer())
            else:
                value = self._copy_part(result, target)
        return value

    def _copy_part(self, result: DeviceArray, target: DeviceArray) -> int:
        """The result's bytes only, out of a larger buffer: a recorded copy."""
        import iree.runtime as rt

        commands = rt.HalCommandBuffer(self.device.hal, begin=True)
        commands.copy(result.buffer_view.get_buffer(), target.buffer_view.get_buffer(), 0, 0, result.buffer_view.byte_length)
        commands.end()
        return self.device.submit(commands)


class PreparedModelCall:
    """A model call whose arguments are checked and packed once (`ModelEntry.prepare`):
    `launch()` invokes `f$async` again on them (no host wait; IREE allocates the results in
    queue order) and returns its results, or the `out` arrays, into which they are copied;
    `()` also waits for them."""

    def __init__(
        self, function: ModelEntry, refs: list, targets: list[DeviceArray], given: object | None, host_only: bool,
        bound: dict[str, int], inputs: list[DeviceArray], views: list[DeviceArray],
    ):
        self.function = function
        self._refs, self._bound, self._kept = refs, bound, (inputs, views, targets)  # kept alive
        self._targets, self._given = targets, given
        self.after_torch = bool(views)  # each launch ordered after torch's queued work
        self._last = 0
        self._results: object = None

    def launch(self) -> object:
        function = self.function
        if self.after_torch:
            function.device.order_after_torch()
        results: list[DeviceArray] = []
        self._last = function.queue_call(self._refs, results, self._bound)
        if self._given is not None:
            self._last = function.copy_results(results, self._targets, self._last)
            self._results = self._given
        else:
            self._results = tuple(results) if len(results) > 1 else results[0]
        return self._results

    def __call__(self) -> object:
        self.launch()
        self.function.device.wait_for(self._last)
        return self._results

    @property
    def results(self) -> object:
        """The last launch's results (None before the first)."""
        return self._results


__all__ = ["ModelEntry", "PreparedModelCall", "model_build", "model_signature"]
