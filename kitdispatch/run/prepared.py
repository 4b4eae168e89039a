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
    holds their imports), and the oldest beyond LIMIT.

    Two lookups: by the identities of the call's values (`_by_ids`), which costs a tuple of
    ids; then, for a scalar computed afresh each call, by value (`_entries`). A shortcut by ids
    holds the scalars it was made for, so their ids cannot be reused while it lives, and goes
    with its call, which goes with any of its arrays, so theirs cannot either."""

    LIMIT = 16

    def __init__(self, function: Function) -> None:
        self._function = weakref.ref(function)
        self._entries: OrderedDict = OrderedDict()  # value key -> _TorchCall
        self._by_ids: OrderedDict = OrderedDict()  # ids of the values -> (prepared _TorchCall, its key, the scalars)
        self._tokens = iter(range(1 << 62))

    def launched(self, args: tuple[object, ...], out: object) -> bool:
        """Whether the call went out this way; False: take the usual path."""
        values = (*args, *out) if out.__class__ is tuple or out.__class__ is list else (*args, out)
        ids = tuple(map(id, values))
        shortcut = self._by_ids.get(ids)
        if shortcut is not None:
            # _TorchCall.same_layout, written out: this is every repeated call's path, and a
            # Python call costs 0.2-0.3 us of a budget of 10 on an H100 host.
            for i, ptr, shape, stride, dtype in shortcut[0].layouts:
                t = values[i]
                if t.data_ptr() != ptr or t.shape != shape or t.stride() != stride or t.dtype is not dtype:
                    break
            else:
                self._entries.move_to_end(shortcut[1])
                shortcut[0].prepared.queue()
                return True
        return self._launched_by_value(args, out, values, ids)

    def _launched_by_value(self, args: tuple[object, ...], out: object, values: tuple, ids: tuple) -> bool:
        key, arrays = _call_key(values)
        if key is None:
            return False
        entries = self._entries
        call = entries.get(key)
        if call is not None and not call.unchanged(values):
            self._drop(key)
            call = None
        if call is None:  # seen once: the next identical call is prepared
            entries[key] = _TorchCall(values, arrays)
            if len(entries) > self.LIMIT:
                self._drop(next(iter(entries)))
            return False
        if call.prepared is None:
            call.prepare(self._function().prepare(*args, out=out), next(self._tokens))
            forget = functools.partial(_forget_torch_call, weakref.ref(self), key, call.token)
            for array in arrays:
                weakref.finalize(array, forget)
        entries.move_to_end(key)
        self._remember_ids(ids, key, call, values)
        call.prepared.queue()
        return True

    def _remember_ids(self, ids: tuple, key: tuple, call: _TorchCall, values: tuple) -> None:
        """A shortcut to a prepared call of `_entries` (dropped with it)."""
        scalars = tuple(v for v in values if v.__class__ is not DeviceArray and not is_torch_tensor(v))
        by_ids = self._by_ids
        by_ids[ids] = (call, key, scalars)
        by_ids.move_to_end(ids)
        call.shortcuts.add(ids)
        if len(by_ids) > self.LIMIT:
            by_ids.popitem(last=False)

    def _drop(self, key: tuple) -> None:
        """The call goes, with its shortcuts and its PreparedCall (which holds the imports)."""
        call = self._entries.pop(key, None)
        if call is None:
            return
        for ids in call.shortcuts:
            shortcut = self._by_ids.get(ids)
            if shortcut is not None and shortcut[0] is call:
                del self._by_ids[ids]
        call.prepared = None

    def __len__(self) -> int:
        """Calls prepared (not those seen once)."""
        return sum(c.prepared is not None for c in self._entries.values())


class _TorchCall:
    """One call of TorchCalls: what its arrays were (identity, and a torch tensor's memory,
    shape, strides and dtype), and its PreparedCall once seen twice."""

    __slots__ = ("arrays", "layouts", "prepared", "token", "shortcuts")

    def __init__(self, values: tuple, arrays: list) -> None:
        self.arrays = tuple((i, weakref.ref(v)) for i, v in enumerate(values) if v.__class__ is DeviceArray or is_torch_tensor(v))
        self.layouts = tuple((i, v.data_ptr(), v.shape, v.stride(), v.dtype) for i, v in enumerate(values) if is_torch_tensor(v))
        self.prepared: PreparedCall | None = None
        self.token = None
        self.shortcuts: set[tuple] = set()  # ids tuples of TorchCalls._by_ids that lead here

    def prepare(self, prepared: PreparedCall, token: int) -> None:
        prepared.forget_given()
        self.prepared, self.token = prepared, token

    def unchanged(self, values: tuple) -> bool:
        """The same arrays, each torch tensor as it was."""
        return all(was() is values[i] for i, was in self.arrays) and self.same_layout(values)

    def same_layout(self, values: tuple) -> bool:
        """Each torch tensor still has the memory, shape, strides and dtype it had (`set_`,
        `resize_` or an in-place transpose change them)."""
        for i, ptr, shape, stride, dtype in self.layouts:
            t = values[i]
            if t.data_ptr() != ptr or t.shape != shape or t.stride() != stride or t.dtype is not dtype:
                return False
        return True


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


def _forget_torch_call(calls_ref: weakref.ref[TorchCalls], key: tuple, token: int) -> None:
    calls = calls_ref()
    call = calls._entries.get(key) if calls is not None else None
    if call is not None and call.token == token:  # not a later call's entry under reused ids
        calls._drop(key)


class PreparedCall:
    """A call whose arguments are fixed (`Function.prepare`): `launch()` queues it again and
    returns its results, the same arrays every time; `()` also waits for them.

    The first launch runs NAME$async (which also gives the inout results) and records the call
    into a command buffer (NAME$record); later launches queue that command buffer, with no VM
    call and no argument list: 4 to 7 us a call in a loop on an H100 against 13 us through
    NAME$async (benchmarks/calls.py). Modules built without NAME$record keep NAME$async."""

    def __init__(
        self, function: Function, refs: list, results: list[DeviceArray], given: object | None, host_only: bool,
        bound: dict[str, int], inputs: list[DeviceArray], views: list[DeviceArray], *, after_torch: bool,
    ):
        self.function = function
        self._refs, self._bound, self._inputs = refs, bound, inputs + views  # kept alive
        self.after_torch = after_torch  # torch tensors among the arrays: each launch ordered after torch's queued work
        self._stored = list(results)
        self._results = list(results)
        self._returned = given if given is not None and function._all_stored else None
        self._commands = None  # the recorded call, once launched
        self._launched = False

    def launch(self) -> object:
        self.queue()
        return self.results

    def queue(self) -> None:
        """`launch` without its results (TorchCalls returns `out` itself)."""
        function = self.function
        if self._commands is not None:
            self._last = function.device.submit(self._commands, after_torch=self.after_torch)
            return
        if self.after_torch:
            function.device.order_after_torch()
        if self._launched:  # no NAME$record in this module
            self._last = function.queue_call(self._refs, list(self._stored), self._bound)
        else:
            self._results = list(self._stored)
            self._last = function.queue_call(self._refs, self._results, self._bound)
            self._launched = True
            self._commands = function.record_call(self._refs)

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
