"""Argument checking: each argument against the function's signature, sizes bound once across arguments, scalars in their C type's range."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING
import numpy as np
from kitdispatch.run.device import element_type, numpy_dtype
from kitdispatch.errors import KitError
from kitdispatch.describe import abi
from kitdispatch.describe.types import FunctionSignature, ScalarType, TensorType

if TYPE_CHECKING:
    from iree.runtime import VmFunction


class TensorCheck:
    """A tensor type, ready for the per-call check (the error text comes from check_tensor)."""

    __slots__ = ("dtype", "hal_type", "dims", "name")

    def __init__(self, t: TensorType):
        self.dtype = numpy_dtype(t.dtype)
        self.hal_type = element_type(self.dtype)
        self.dims = t.shape
        self.name = t.dtype  # with a shape, the pool's key

    def fits(self, shape: tuple, dtype: np.dtype, bound: dict[str, int]) -> bool:
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


def result_size(value: object, where: str) -> int:
    """A scalar argument (range-checked already) as the size of a result dimension."""
    size = int(value)
    if size < 0:
        raise KitError(f"{where}: {size} sizes a result and cannot be negative", fix="pass a size of 0 or more")
    return size


def stored_results(vm_function: VmFunction) -> tuple[int, ...]:
    """Indices of the results NAME$async writes into given buffers (its `iree.abi.output`
    arguments, in order); the others are inout, updated in their argument."""
    declaration = vm_function.reflection.get("iree.abi.declaration", "")
    return tuple(int(k) for k in re.findall(r"iree\.abi\.output = (\d+)", declaration))


def check_distinct_outputs(name: str, given: tuple, arrays: list) -> None:
    """Two results written into one array would leave it holding only one of them: one
    object given twice (a torch tensor), or one IREE buffer view."""
    for k in range(1, len(arrays)):
        for j in range(k):
            if given[k] is given[j] or arrays[k]._buffer_view is arrays[j]._buffer_view:
                raise KitError(
                    f"{name} out: results {j} and {k} are given one array; each result needs an array of its own",
                    fix="pass a separate array per result, e.g. module.device.empty(shape, dtype) for each",
                )


def is_device_value(value: object) -> bool:
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


def check_count(sig: FunctionSignature, args: Sequence) -> None:
    if len(args) != len(sig.args):
        raise KitError(
            f"{sig.name} takes {len(sig.args)} arguments ({', '.join(map(str, sig.args))}), got {len(args)}",
            fix="pass one array per tensor argument and one number per scalar",
        )


def check_arguments(sig: FunctionSignature, args: Sequence) -> list:
    """Checks count, dtype, rank, static dims and shared symbols before IREE sees them."""
    check_count(sig, args)
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


def check_tensor(where: str, want: TensorType, shape: tuple, dtype: np.dtype, bound: dict[str, int]) -> None:
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


def scalar_argument(dtype: str, value: object, where: str = "scalar") -> int | float | tuple[int, ...]:
    """A Python or numpy scalar as the generated function takes it (abi.argument),
    range-checked; a struct (`structN`) as the tuple of its 32-bit words."""
    try:
        return abi.argument(abi.lookup(dtype), value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise KitError(f"{where}: {exc}", fix=f"pass a number that fits {dtype}") from None


def flat_values(value: object) -> tuple:
    """An argument as the VM arguments it becomes: a struct's words, or itself."""
    return value if isinstance(value, tuple) else (value,)


def to_numpy(value: object) -> np.ndarray:
    return value.to_host() if hasattr(value, "to_host") else np.asarray(value)
