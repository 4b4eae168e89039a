"""Prepared calls: one call's dispatch recorded once (NAME$record) and submitted again, `Function.prepare`, and the cache of prepared calls that repeated `launch(out=)` on the same torch tensors goes through."""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from kitdispatch.run.device import DeviceArray, is_torch_tensor


if TYPE_CHECKING:  # a Function makes its prepared calls
    import torch
    from iree.runtime import HalCommandBuffer

    from kitdispatch.run.function import Function


class RecordedCalls:
    """Calls made again on the same arrays and scalars (`launch` with `out=`): the second one
    is recorded (NAME$record, by `record(refs)`) and later ones queue its command buffer, as a
    prepared call does. An entry goes when one of its arrays is garbage-collected (its command
    buffer holds the memory), and the oldest when more than LIMIT are kept."""

    LIMIT = 16

    def __init__(self, record: Callable[[list], HalCommandBuffer | None]):
        self._record = record
        self._entries: OrderedDict = OrderedDict()  # key -> command buffer, or None: seen once

    def commands_for(self, refs: list, arrays: list) -> HalCommandBuffer | None:
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


def _forget(calls_ref: weakref.ref[RecordedCalls], key: tuple) -> None:
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

    def launched(self, args: tuple[object, ...], out: object) -> bool:
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
            prepared.forget_given()
            entries[key] = (snapshot, prepared, token)
            forget = functools.partial(_forget_torch_call, weakref.ref(self), key, token)
            for array in arrays:
                weakref.finalize(array, forget)
        entries.move_to_end(key)
        if not prepared.after_torch:  # tensors imported by this call's own preparation
            function.device.order_after_torch()
        prepared.launch()
        return True

    def __len__(self) -> int:
        """Calls prepared (not those seen once)."""
        return sum(e[1] is not None for e in self._entries.values())


def _call_key(values: Iterable[object]) -> tuple:
    """(the call's key, its arrays) where every value is a torch tensor, a device array or a
    number and one at least is a torch tensor; (None, ()) otherwise."""
    key, arrays, torch_seen = [], [], False
    for v in values:
        if v.__class__ is DeviceArray:
            key.append(id(v))
            arrays.append(v)
        elif is_torch_tensor(v):
            key.append(id(v))
            arrays.append(v)
            torch_seen = True
        elif isinstance(v, (int, float, np.generic)):
            key.append((v.__class__, v))
        else:
            return None, ()
    return (tuple(key), arrays) if torch_seen else (None, ())


def _snapshot(arrays: list[DeviceArray | torch.Tensor]) -> tuple:
    return tuple(
        (weakref.ref(a),) if a.__class__ is DeviceArray else (weakref.ref(a), a.data_ptr(), a.shape, a.stride(), a.dtype)
        for a in arrays
    )


def _unchanged(snapshot: tuple, arrays: list[DeviceArray | torch.Tensor]) -> bool:
    for was, a in zip(snapshot, arrays):
        if was[0]() is not a:
            return False
        if len(was) > 1 and (a.data_ptr() != was[1] or a.shape != was[2] or a.stride() != was[3] or a.dtype != was[4]):
            return False
    return True


def _forget_torch_call(calls_ref: weakref.ref[TorchCalls], key: tuple, token: int) -> None:
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

    def __init__(
        self, function: Function, refs: list, results: list[DeviceArray], given: object | None, host_only: bool,
        bound: dict[str, int], inputs: list[DeviceArray], views: list[DeviceArray],
    ):
        self.function = function
        self._refs, self._bound, self._inputs = refs, bound, inputs + views  # kept alive
        self.after_torch = bool(views)  # each launch ordered after torch's queued work
        self._stored = list(results)
        self._results = list(results)
        self._returned = given if given is not None and function._all_stored else None
        self._commands = None  # the recorded call, once launched
        self._launched = False

    def launch(self) -> object:
        function = self.function
        if self.after_torch:
            function.device.order_after_torch()
        if self._commands is not None:
            self._last = function.device.submit(self._commands)
        elif self._launched:  # no NAME$record in this module
            self._last = function.queue_call(self._refs, list(self._stored), self._bound)
        else:
            self._results = list(self._stored)
            self._last = function.queue_call(self._refs, self._results, self._bound)
            self._launched = True
            self._commands = function.record_call(self._refs)
        return self.results

    def __call__(self):
        self.launch()
        self.function.device.wait_for(self._last)
        return self.results

    def forget_given(self) -> None:
        """Return the results instead of `out`: a caller that returns `out` itself need not
        have it held here (holding it would keep a torch tensor alive)."""
        self._returned = None

    @property
    def results(self) -> object:
        if self._returned is not None:
            return self._returned
        return tuple(self._results) if len(self._results) > 1 else self._results[0]
