"""Output allocation: the results a kernel function writes into (`out`), from the device's pool or
adopted from the caller (device arrays, CUDA tensors), each checked against its result type."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kitdispatch.describe.types import TensorType
from kitdispatch.errors import IREE_STATUS_ERRORS, KitError
from kitdispatch.run.arguments import TensorCheck, check_distinct_outputs, check_tensor, is_device_value
from kitdispatch.run.device import Device, DeviceArray


@dataclass(frozen=True)
class GivenOutputs:
    """The results a function's NAME$async form takes as arguments (`storage`: their indices
    among the results; the others are `inout`, returned in their argument)."""

    function: str
    results: tuple[TensorType, ...]
    checks: tuple[TensorCheck, ...]  # one per stored result
    storage: tuple[int, ...]

    @property
    def all_stored(self) -> bool:
        return len(self.storage) == len(self.results)

    def take(self, out: object | None, device: Device, bound: dict[str, int], views: list) -> tuple[list[DeviceArray], object | None]:
        """(arrays the call writes its `out` results into, `out` as given or None): arrays from
        the device's pool, or the caller's (torch tensors imported before join `views`)."""
        stored = self.checks
        if out is None:
            arrays = []
            for r in stored:
                shape = r.shape_from(bound)
                if shape is None:  # a module whose record has no argument names (older builds)
                    raise KitError(
                        f"{self.function}: a result size depends on a scalar argument, and the build record does not name the arguments",
                        fix="rebuild the module with this kitdispatch, or pass out= with arrays of the result shapes",
                    )
                try:
                    arrays.append(device.pooled_array(shape, r))
                except IREE_STATUS_ERRORS as exc:  # IREE's allocator: sizes from scalars may be anything
                    raise KitError(
                        f"{self.function}: cannot allocate a result of shape {shape} ({r.name}): {str(exc).strip()}",
                        fix="check the sizes passed as scalar arguments; free memory with module.device.pool.trim()",
                    ) from None
            return arrays, None
        given = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(given) != len(stored):
            raise KitError(
                f"{self.function} writes {len(stored)} result(s) into new arrays, out= gave {len(given)}",
                fix="pass one array per `out` result (inout results are updated in their argument)",
            )
        arrays = []
        imported = device.torch_imports.get
        for k, value, r in zip(self.storage, given, stored):
            if value.__class__ is DeviceArray and value.device is device:
                array = value
            elif (view := imported(value)) is not None:
                array = view
                views.append(view)
            elif isinstance(value, np.ndarray) or not is_device_value(value):
                raise KitError(
                    f"{self.function} out: out= takes device arrays, got {type(value).__name__}",
                    fix="use module.device.empty(shape, dtype), or a CUDA tensor",
                )
            else:
                array = device.asarray(value)
            if not r.fits(array.shape, array.dtype, bound):
                want = self.results[k]
                check_tensor(f"{self.function} result {k} ({want}) out=", want, array.shape, array.dtype, bound)
            arrays.append(array)
        if len(arrays) > 1:
            check_distinct_outputs(self.function, given, arrays)
        return arrays, (given if len(given) > 1 else given[0])
