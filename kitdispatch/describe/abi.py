"""The ABI table: one row per type the kit moves between Python, MLIR and a CUDA kernel.

Every stage reads its knowledge of types from here: the manifest and the spec (names, C
spellings), the PTX check (byte sizes), the renderer (MLIR types, how a scalar becomes push
constants), the runtime (numpy dtypes, how a Python number reaches the generated function)
and `kitdispatch test` (tolerances). Adding a type is one row plus its tests.

How a scalar travels. IREE's CUDA HAL gives every kernel parameter its own slot and writes
one 32-bit push constant into it (runtime/src/iree/hal/drivers/cuda/stream_command_buffer.c,
`*((uint32_t*)params_ptr[...])`). A parameter of 1, 2 or 4 bytes reads the low bytes of its
slot; an 8-byte one takes two constants (`words`), which the kernel receives either as two
32-bit C parameters NAME_lo, NAME_hi or, unmodified, through the entry bridge (bridge.py).
The generated function takes each scalar as `argument`: IREE's VM has no f16, bf16 or fp8
values, nothing narrower than i32, and IREE's input pipeline demotes f64 to f32, so those
arrive as their bits (f16, bf16, fp8 in an i32, f64 in an i64) or widened (i8, u16: i32).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kitdispatch.errors import ManifestError

Kind = Literal["sint", "uint", "float", "bool", "struct"]


@dataclass(frozen=True)
class AbiType:
    """One type: its kit name and how each stage spells, stores, passes and checks it."""

    name: str  # in manifests and signatures: "f32", "u64", "f8e4m3"
    mlir: str  # MLIR element type: "f32", "ui64", "f8E4M3FN"
    numpy: str  # numpy dtype name; ml_dtypes provides bfloat16 and the float8 types
    size: int  # bytes, in memory and as a C parameter (its alignment too)
    kind: Kind
    c_names: tuple[str, ...]  # C spellings, as describe/c_signature.py normalizes them
    tensor: bool = True  # a tensor element type
    scalar: bool = True  # a by-value scalar
    tolerance: tuple[float, float] | None = None  # (rtol, atol) for `kitdispatch test`; None: exact

    @property
    def align(self) -> int:
        return self.size

    @property
    def words(self) -> int:
        """32-bit push constants a scalar of this type takes."""
        return max(1, -(-self.size // 4))

    @property
    def arguments(self) -> tuple[str, ...]:
        """The generated function's arguments for one scalar: a struct takes one i32 per word."""
        return (self.argument,) * (self.words if self.kind == "struct" else 1)

    @property
    def argument(self) -> str:
        """The MLIR type the generated function takes for a scalar of this type (for a
        struct, for each of its words)."""
        if self.kind == "bool":
            return "i1"
        if self.name == "f32":
            return "f32"
        return "i64" if self.size == 8 else "i32"

    @property
    def as_bits(self) -> bool:
        """A float that reaches the function as its bits (every float but f32)."""
        return self.kind == "float" and self.argument != "f32"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("sint", "uint")

    @property
    def dtype(self) -> np.dtype:
        if self.kind == "struct":
            return np.dtype((np.void, self.size))
        if self.numpy.startswith(("bfloat", "float8")):
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, self.numpy))
        return np.dtype(self.numpy)


_F8 = ("__nv_fp8_e4m3",), ("__nv_fp8_e5m2",)

TYPES: tuple[AbiType, ...] = (
    AbiType("bool", "i1", "bool", 1, "bool", ("bool",), tensor=False),
    AbiType("i8", "i8", "int8", 1, "sint", ("signed char", "char", "int8_t")),
    AbiType("u8", "ui8", "uint8", 1, "uint", ("unsigned char", "uint8_t")),
    AbiType("i16", "i16", "int16", 2, "sint", ("short", "int16_t")),
    AbiType("u16", "ui16", "uint16", 2, "uint", ("unsigned short", "uint16_t")),
    AbiType("i32", "i32", "int32", 4, "sint", ("int", "int32_t")),
    AbiType("u32", "ui32", "uint32", 4, "uint", ("unsigned int", "uint32_t")),
    AbiType("i64", "i64", "int64", 8, "sint", ("long long", "long", "int64_t", "ptrdiff_t", "intptr_t")),
    AbiType("u64", "ui64", "uint64", 8, "uint", ("unsigned long long", "unsigned long", "uint64_t", "size_t", "uintptr_t")),
    AbiType("f8e4m3", "f8E4M3FN", "float8_e4m3fn", 1, "float", _F8[0], tolerance=(0.13, 1 / 64)),
    AbiType("f8e5m2", "f8E5M2", "float8_e5m2", 1, "float", _F8[1], tolerance=(0.26, 1 / 64)),
    AbiType("f16", "f16", "float16", 2, "float", ("__half", "half"), tolerance=(1e-2, 1e-3)),
    AbiType("bf16", "bf16", "bfloat16", 2, "float", ("__nv_bfloat16", "nv_bfloat16"), tolerance=(2e-2, 1e-2)),
    AbiType("f32", "f32", "float32", 4, "float", ("float",), tolerance=(1e-5, 1e-6)),
    AbiType("f64", "f64", "float64", 8, "float", ("double",), tolerance=(1e-10, 1e-12)),
)

BY_NAME = {t.name: t for t in TYPES}
BY_MLIR = {t.mlir: t for t in TYPES}  # MLIR element types (a model record's): "i1" is bool, "ui8" u8
TENSOR_TYPES = tuple(t.name for t in TYPES if t.tensor)
SCALAR_TYPES = tuple(t.name for t in TYPES if t.scalar)
BY_C_NAME = {c: t for t in TYPES for c in t.c_names}
BY_NUMPY = {t.numpy: t for t in TYPES if t.tensor}  # numpy dtype names: 'float32', 'bfloat16' 
# C types no row describes as a scalar: a parameter of one is refused with the reason.
C_UNSUPPORTED = ("long double", "__int128", "unsigned __int128", "wchar_t", "char16_t", "char32_t")


# CUDA's vector types, by C name: (element type, lanes). A `float4*` points at f32 elements
# four at a time: a tensor it reads or writes is declared with its element type, and its
# innermost dimension counts elements, so a static one must be a multiple of the lanes
# (`f32[n]` with n % 4 == 0, or `f32[n,4]`).
_VECTOR_BASES = {
    "char": "i8", "uchar": "u8", "short": "i16", "ushort": "u16", "int": "i32", "uint": "u32",
    "long": "i64", "ulong": "u64", "longlong": "i64", "ulonglong": "u64", "float": "f32", "double": "f64",
}
VECTORS: dict[str, tuple[str, int]] = {
    **{f"{c}{n}": (t, n) for c, t in _VECTOR_BASES.items() for n in (1, 2, 3, 4)},
    "__half2": ("f16", 2), "half2": ("f16", 2),
    "__nv_bfloat162": ("bf16", 2), "nv_bfloat162": ("bf16", 2),
    "__nv_fp8x2_e4m3": ("f8e4m3", 2), "__nv_fp8x4_e4m3": ("f8e4m3", 4),
    "__nv_fp8x2_e5m2": ("f8e5m2", 2), "__nv_fp8x4_e5m2": ("f8e5m2", 4),
}


def pointee(c_name: str) -> tuple[AbiType, int] | None:
    """What a pointer to C type `c_name` points at: (element row, lanes), lanes 1 for a
    scalar type and more for a vector type (`half2`: f16, 2); None for a type not in the table."""
    if c_name in VECTORS:
        element, lanes = VECTORS[c_name]
        return BY_NAME[element], lanes
    row = BY_C_NAME.get(c_name)
    return (row, 1) if row is not None and row.tensor else None


# A struct passed by value travels as its bytes in 32-bit words ("struct24": 24 bytes, six
# constants); the kernel's PTX parameter must have exactly that size. IREE's CUDA HAL takes
# at most 64 push constants a dispatch.
MAX_STRUCT_BYTES = 256
_STRUCT_RE = re.compile(r"^struct([1-9][0-9]*)\Z")


def lookup(name: str) -> AbiType:
    m = _STRUCT_RE.match(name)
    if m and int(m.group(1)) <= MAX_STRUCT_BYTES:
        return AbiType(name, "", "void", int(m.group(1)), "struct", (), tensor=False)
    return BY_NAME[name]


def find(name: object) -> AbiType | None:
    try:
        return lookup(name) if isinstance(name, str) else None
    except KeyError:
        return None


def element_type(name: object, where: str) -> AbiType:
    """The row of a tensor element type named in a manifest, or a ManifestError."""
    row = BY_NAME.get(name) if isinstance(name, str) else None
    if row is None or not row.tensor:
        raise ManifestError(f"unknown element type {name!r}", where=where, fix=f"use one of {', '.join(TENSOR_TYPES)}")
    return row


def scalar_type(name: object, where: str, hint: str = "") -> AbiType:
    row = find(name)
    if row is None or not row.scalar:
        raise ManifestError(
            f"unknown scalar type {name!r}",
            where=where,
            fix=f"use one of {', '.join(SCALAR_TYPES)}, or structN for a struct of N bytes (N <= {MAX_STRUCT_BYTES}){hint}",
        )
    return row


def same_bits(a: AbiType, b: AbiType) -> bool:
    """Integers of one size differ only in how they are read: `unsigned*` may hold i32 data."""
    return a == b or (a.is_integer and b.is_integer and a.size == b.size)


def holds(c_element: AbiType, declared: AbiType) -> bool:
    """Whether memory that C reads as `c_element` may hold tensor elements of `declared`: the
    same bits (above), or the bits of a float C has no builtin type for (f16, bf16, fp8) in
    integers of its size: `uint16_t*` for f16 or bf16 data, `uint8_t*` for fp8."""
    narrow_float = declared.kind == "float" and declared.size < 4
    return same_bits(c_element, declared) or (c_element.is_integer and narrow_float and c_element.size == declared.size)


def c_spellings(name: str) -> str:
    return " or ".join(f"'{c}'" for c in BY_NAME[name].c_names)


# ------------------------------------------------------------------------------ values


def bits(row: AbiType, value: float) -> int:
    """The bits of `value` as a float of this type (rounded to nearest even), unsigned."""
    value = float(value)
    with np.errstate(over="ignore"):
        converted = np.array(value, np.float64).astype(row.dtype) if math.isfinite(value) else None
    if converted is None or not np.isfinite(converted.astype(np.float64)):
        raise ManifestError(f"{value} is not a finite {row.name}", fix=f"use a number an {row.name} can hold")
    return int(converted.view(f"u{row.size}").item())


def words(row: AbiType, raw: int) -> tuple[int, ...]:
    """A value's bits as the signed i32 words of its push constants, low word first."""
    raw &= (1 << (8 * row.size)) - 1
    out = tuple((raw >> (32 * i)) & 0xFFFFFFFF for i in range(row.words))
    return tuple(w - (1 << 32) if w >= 1 << 31 else w for w in out)


def argument(row: AbiType, value: object) -> int | float:
    """A Python or numpy scalar as the generated function takes it, range-checked.
    Raises ValueError (or TypeError) with the reason."""
    if row.kind == "struct":
        return struct_words(row, value)
    if isinstance(value, (np.ndarray, list, tuple)) and np.ndim(value) != 0:
        raise ValueError(f"got an array of shape {np.shape(value)}")
    if row.kind == "bool":
        return int(bool(value))  # the VM's i1 takes 0 or 1
    if row.as_bits:
        try:
            raw = bits(row, value)
        except ManifestError as exc:
            raise ValueError(exc.what) from None
        return _signed(raw, 64 if row.argument == "i64" else 32) if row.size >= 4 else raw
    if row.kind == "float":
        number = float(value)
        with np.errstate(over="ignore"):
            single = float(np.float32(number))
        if math.isfinite(number) and not math.isfinite(single):  # 1e300 would arrive as inf
            raise OverflowError(f"{value!r} is out of range for f32 (largest {float(np.finfo(np.float32).max):.6g})")
        return single
    number = _integer(value)
    low, high = integer_range(row)
    if not low <= number <= high:
        raise OverflowError(f"{value!r} is out of range [{low}, {high}]")
    return _signed(number, 64 if row.argument == "i64" else 32) if row.size >= 4 else number


def integer_range(row: AbiType) -> tuple[int, int]:
    """The integers a bool or integer C parameter holds: what a value computed from sizes
    or written in a manifest must fit in, or the kernel reads it wrapped."""
    if row.kind == "bool":
        return 0, 1
    if not row.is_integer:
        raise ValueError(f"{row.name} is not an integer type")
    info = np.iinfo(row.dtype)
    return int(info.min), int(info.max)


def struct_words(row: AbiType, value: object) -> tuple[int, ...]:
    """A struct's bytes (bytes, or a numpy structured scalar) as its i32 arguments."""
    raw = value.tobytes() if isinstance(value, (np.void, np.ndarray)) else value
    if not isinstance(raw, (bytes, bytearray, memoryview)) or len(bytes(raw)) != row.size:
        raise ValueError(f"expected {row.size} bytes (bytes, or a numpy structured scalar), got {value!r:.60}")
    padded = bytes(raw) + bytes(4 * row.words - row.size)
    return tuple(int(w) for w in np.frombuffer(padded, "<i4"))


def _signed(value: int, width: int) -> int:
    value &= (1 << width) - 1
    return value - (1 << width) if value >= 1 << (width - 1) else value


def _integer(value: object) -> int:
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    raise ValueError(f"{value!r} is not an integer")


def tolerance_type(names: list[str]) -> str | None:
    """The least precise float among `names`: a result is checked with its tolerance."""
    floats = [n for n in names if n in BY_NAME and BY_NAME[n].tolerance is not None]
    return max(floats, key=lambda n: BY_NAME[n].tolerance[0]) if floats else None
