"""IREE's text forms of values, so `kitdispatch run` reads and prints what iree-run-module does.

Inputs: `4xf32=1 2 3 4`, `2x2xi32=[1 2][3 4]`, one value to fill the shape (`8xf32=2`),
`@file.npy`, and bare numbers for scalar arguments. Results print as iree-run-module prints
them: `result[0]: hal.buffer_view` then `8xf32=96 96 ...` (`%g` numbers, rows in brackets).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from kitdispatch.describe import abi
from kitdispatch._files import open_regular
from kitdispatch.errors import KitError
from kitdispatch.describe.types import ScalarType, TensorType
from kitdispatch.run.device import numpy_dtype

MAX_PRINTED = 1024  # iree-run-module's --print_max_element_count default
_INPUT_RE = re.compile(r"^\s*((?:\d+x)*)([a-z]+\d*)\s*=(.*)$", re.S)


def parse_input(text: str, want: TensorType | ScalarType, where: str) -> np.ndarray | int | float:
    """One --input for an argument of type `want`: a numpy array, or a number for a scalar."""
    if isinstance(want, ScalarType):
        try:
            return float(text) if _is_float(want.dtype) else int(text, 0)
        except ValueError:
            raise KitError(f"{where}: {text!r} is not a {want.dtype} number", fix="pass a bare number, e.g. --input 2.5") from None
    if text.startswith("@"):
        try:
            with open_regular(Path(text[1:])) as f:  # a FIFO named here would block np.load forever
                return np.load(f, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise KitError(f"{where}: cannot read {text[1:]}: {exc}", fix="pass a .npy file written by numpy.save") from None
    m = _INPUT_RE.match(text)
    if not m:
        raise KitError(f"{where}: {text!r} is not an input", fix="write SHAPExTYPE=VALUES, e.g. 4xf32=1 2 3 4, or @file.npy")
    shape = tuple(int(d) for d in m.group(1).split("x") if d)
    if m.group(2) != want.dtype:
        raise KitError(f"{where}: the input is {m.group(2)}, the argument {want}", fix=f"write the input as {want.dtype}")
    words = m.group(3).replace("[", " ").replace("]", " ").replace(",", " ").split()
    try:
        numbers = [float(w) if _is_float(want.dtype) else int(w, 0) for w in words]
        with np.errstate(over="ignore"):
            values = np.array(numbers, dtype=numpy_dtype(want.dtype))
    except (ValueError, OverflowError) as exc:
        raise KitError(f"{where}: {exc}", fix=f"write {want.dtype} numbers") from None
    if _is_float(want.dtype) and not np.array_equal(np.isfinite(values.astype(np.float64)), np.isfinite(numbers)):
        raise KitError(f"{where}: a number is too large for {want.dtype} (it would be infinity)", fix=f"write {want.dtype} numbers")
    count = math.prod(shape)
    if values.size == 1:
        try:
            return np.full(shape, values[0], dtype=values.dtype)
        except (MemoryError, ValueError):  # ValueError: numpy's "array is too big"
            raise KitError(f"{where}: an input of shape {shape} ({count} elements) does not fit in memory", fix="give a smaller shape") from None
    if values.size != count:
        raise KitError(f"{where}: {values.size} values for shape {shape} ({count} elements)", fix="give one value, or one per element")
    return values.reshape(shape)


def _is_float(dtype: str) -> bool:
    return abi.lookup(dtype).kind == "float"


def format_result(index: int, value: object) -> str:
    """A result as iree-run-module prints it."""
    if not isinstance(value, np.ndarray):
        return f"result[{index}]: {value}"
    dtype = _dtype_name(value.dtype)
    head = "x".join([*map(str, value.shape), dtype])
    return f"result[{index}]: hal.buffer_view\n{head}={_format_elements(value)}"


def _format_elements(value: np.ndarray) -> str:
    if value.size > MAX_PRINTED:
        return " ".join(_number(v) for v in value.reshape(-1)[:MAX_PRINTED].tolist()) + "..."
    if value.ndim <= 1:
        return " ".join(_number(v) for v in value.reshape(-1).tolist())
    return "".join(f"[{_format_elements(row)}]" for row in value)


def _number(v: bool | int | float) -> str:
    return str(int(v)) if isinstance(v, (bool, int)) else f"{v:g}"


def _dtype_name(dtype: np.dtype) -> str:
    row = abi.BY_NUMPY.get(dtype.name)
    return row.name if row is not None else dtype.name
