"""Describing kernels: what each kernel takes, how it is launched, and the callable around it.

These frozen dataclasses are the Python API for describing kernels; the TOML manifest
(`manifest.py`) produces exactly the same objects. Validation happens here, once, so both
front ends give the same errors.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Literal, Union

from .errors import ManifestError
from .signature import CParam, KernelSignature

# Tensor element types the generated functions accept, with their numpy names.
ELEMENT_TYPES = {
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
}
# By-value scalar types. IREE's CUDA HAL gives every kernel parameter its own slot and
# writes one 32-bit push constant into it (runtime/src/iree/hal/drivers/cuda/
# stream_command_buffer.c and graph_command_buffer.c, `*((uint32_t*)params_ptr[...])`): a
# parameter reads the low bytes of its slot, so 1-, 2- and 4-byte C parameters work, and a
# 64-bit value travels as two constants the kernel takes as two 32-bit C parameters.
SCALAR_TYPES = ("i32", "u32", "f32", "i64", "u64", "f64", "f16", "bf16", "bool")
INTEGER_SCALARS = ("i32", "u32", "i64", "u64")
WIDE_SCALARS = ("i64", "u64", "f64")  # two constants: C parameters NAME_lo, NAME_hi
# Bytes of the C parameter that receives each constant of a scalar type.
SCALAR_C_BYTES = {"i32": 4, "u32": 4, "f32": 4, "f16": 2, "bf16": 2, "bool": 1}
# The type a generated function takes for each scalar. IREE's VM has no f16/bf16 values
# (nor can its host code narrow f32 to them) and its input pipeline demotes f64 to f32, so
# those arrive as their bits: f16/bf16 in an i32, f64 in an i64 (runtime.check_arguments
# converts Python floats with `float_bits`).
SCALAR_ARGUMENT_TYPES = {
    "i32": "i32", "u32": "i32", "f32": "f32", "i64": "i64", "u64": "i64", "f64": "i64",
    "f16": "i32", "bf16": "i32", "bool": "i1",
}
FLOAT_BITS_ARGUMENTS = ("f16", "bf16", "f64")
WIDE_HALVES = ("_lo", "_hi")

# C spellings (as signature.py normalizes them) and the types they carry.
C_SCALAR_TYPES = {
    "int": "i32", "int32_t": "i32", "unsigned int": "u32", "uint32_t": "u32", "float": "f32",
    "__half": "f16", "half": "f16", "__nv_bfloat16": "bf16", "nv_bfloat16": "bf16", "bool": "bool",
}
C_HALF_TYPES = ("int", "int32_t", "unsigned int", "uint32_t")  # a 64-bit scalar's halves
# Known C types that no push constant can carry as one parameter.
C_UNSUPPORTED_SCALARS = (
    "long", "unsigned long", "long long", "unsigned long long", "int64_t", "uint64_t", "size_t",
    "ptrdiff_t", "intptr_t", "uintptr_t", "double", "long double", "char", "signed char",
    "unsigned char", "short", "unsigned short", "int8_t", "uint8_t", "int16_t", "uint16_t",
)
C_ELEMENT_TYPES = {
    "float": "f32", "double": "f64", "__half": "f16", "half": "f16", "__nv_bfloat16": "bf16",
    "nv_bfloat16": "bf16", "int": "i32", "int32_t": "i32", "unsigned int": "i32", "uint32_t": "i32",
    "short": "i16", "unsigned short": "i16", "int16_t": "i16", "uint16_t": "i16", "char": "i8",
    "signed char": "i8", "unsigned char": "i8", "int8_t": "i8", "uint8_t": "i8", "long long": "i64",
    "unsigned long long": "i64", "long": "i64", "unsigned long": "i64", "int64_t": "i64",
    "uint64_t": "i64",
}

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# A C++ name expression as NVRTC takes it: `scale`, `ns::scale`, `scale<float, 4>`.
_CPP_NAME_RE = re.compile(r"^(?:::)?[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*(?:<[\w ,:*&<>().+-]*>)?\Z", re.ASCII)
MAX_IDENTIFIER_LENGTH = 256
_TENSOR_RE = re.compile(r"^\s*([a-z0-9]+)\s*\[(.*)\]\s*\Z", re.S)
MAX_WORKGROUP_THREADS = 1024
MAX_STATIC_DIM = 2**40  # static tensor dimensions (IREE's index is 64-bit; products must fit)
MAX_EXPRESSION_LENGTH = 1000  # index expressions are short; a longer one is a mistake or an attack
MAX_CONSTANT = 2**64  # u64 values fit; anything larger is a mistake
# The largest per-block opt-in of current GPUs (sm_90: 227 KiB). IREE's CUDA driver sets the
# kernel's MAX_DYNAMIC_SHARED_SIZE_BYTES to the export's value and checks the device's own
# limit when it loads the module (runtime/src/iree/hal/drivers/cuda/native_executable.c).
MAX_DYNAMIC_SHARED_MEMORY = 227 * 1024
OBJECT_FORMATS = ("ptx", "cubin", "fatbin")
# Ops of an imported model a kernel may stand in for (`replaces`; replace.py decides per op).
REPLACEABLE_OPS = ("linalg.softmax", "linalg.matmul", "linalg.batch_matmul", "linalg.generic")


def check_identifier(name: object, what: str, where: str) -> str:
    """C and MLIR share this identifier alphabet; anything else is refused up front."""
    if not isinstance(name, str) or not _IDENT_RE.match(name) or len(name) > MAX_IDENTIFIER_LENGTH:
        raise ManifestError(
            f"{what} {_shown(name)} is not a valid identifier",
            where=where,
            fix=f"use letters, digits and '_' only, not starting with a digit, at most "
            f"{MAX_IDENTIFIER_LENGTH} characters",
        )
    return name


def check_kernel_name(name: object, where: str) -> str:
    """A kernel is named by its C identifier or, for C++ kernels, a name expression such as
    `scale<float>` or `ns::scale` (resolved to the mangled entry through NVRTC)."""
    if isinstance(name, str) and len(name) <= MAX_IDENTIFIER_LENGTH and _CPP_NAME_RE.match(name):
        return name
    raise ManifestError(
        f"kernel name {_shown(name)} is not a valid identifier, nor a C++ name expression",
        where=where,
        fix="use the kernel's name as in the source, e.g. 'scale', 'ns::scale' or 'scale<float>'",
    )


def cpp_base_name(name: str) -> str:
    """`ns::scale<float>` -> `scale`: the name the signature parser knows the kernel by."""
    return name.split("<", 1)[0].rsplit("::", 1)[-1]


def default_function_name(kernel: str) -> str:
    """`scale<float>` -> `scale_float`: an identifier for a C++ name expression."""
    text = re.sub(r"\W+", "_", kernel.replace("::", "_"), flags=re.ASCII).strip("_")
    return text if _IDENT_RE.match(text) else f"k_{text}"


def _shown(name: object) -> str:
    text = repr(name)
    return text if len(text) <= 60 else f"{text[:40]}...{text[-10:]} ({len(text)} characters)"



def float_bits(dtype: str, value: float) -> int:
    """The bits of `value` as an f32, f64, f16 or bf16 (rounded to nearest even), unsigned."""
    value = float(value)
    if not math.isfinite(value) or (dtype == "f16" and abs(value) > 65504):
        raise ManifestError(f"{value} is not a finite {dtype}", fix=f"use a number an {dtype} can hold")
    if dtype == "f64":
        return struct.unpack("<Q", struct.pack("<d", value))[0]
    if dtype == "f16":
        return struct.unpack("<H", struct.pack("<e", value))[0]
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    if dtype == "bf16":
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    return bits


# ----------------------------------------------------------------------------- types


@dataclass(frozen=True)
class TensorType:
    """An element type and a shape whose entries are ints (static) or symbol names."""

    dtype: str
    shape: tuple[int | str, ...]

    @classmethod
    def parse(cls, text: object, where: str) -> "TensorType":
        if not isinstance(text, str) or not (m := _TENSOR_RE.match(text)):
            raise ManifestError(
                f"{text!r} is not a tensor type",
                where=where,
                fix="write it as DTYPE[DIMS], e.g. 'f32[n]', 'f16[m,k]', 'f32[4,n]' or 'f32[]'",
            )
        dtype, dims_text = m.group(1), m.group(2).strip()
        check_element_type(dtype, where)
        dims: list[int | str] = []
        for dim in (d.strip() for d in dims_text.split(",")) if dims_text else ():
            if dim.isascii() and dim.isdigit():
                if int(dim) > MAX_STATIC_DIM:
                    raise ManifestError(
                        f"dimension {dim} of {text!r} is larger than {MAX_STATIC_DIM}", where=where,
                        fix="use a dimension name for sizes known only at run time",
                    )
                dims.append(int(dim))
            else:
                dims.append(check_identifier(dim, "dimension", where))
        return cls(dtype, tuple(dims))

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(d for d in self.shape if isinstance(d, str))

    @property
    def mlir(self) -> str:
        dims = "".join(f"{'?' if isinstance(d, str) else d}x" for d in self.shape)
        return f"tensor<{dims}{self.dtype}>"

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class ScalarType:
    dtype: str

    @property
    def mlir(self) -> str:
        """The type a generated function takes for this scalar (see SCALAR_ARGUMENT_TYPES)."""
        return SCALAR_ARGUMENT_TYPES[self.dtype]

    def __str__(self) -> str:
        return self.dtype


def check_element_type(dtype: str, where: str) -> None:
    if dtype not in ELEMENT_TYPES:
        raise ManifestError(
            f"unknown element type {dtype!r}",
            where=where,
            fix=f"use one of {', '.join(ELEMENT_TYPES)}",
        )


def parse_value_type(text: object, where: str) -> TensorType | ScalarType:
    """'f32[n]' is a tensor; a bare 'f32' or 'i32' is a scalar."""
    if isinstance(text, str) and "[" not in text:
        dtype = text.strip()
        if dtype not in SCALAR_TYPES:
            raise ManifestError(
                f"unknown scalar type {dtype!r}",
                where=where,
                fix=f"use one of {', '.join(SCALAR_TYPES)}, or DTYPE[DIMS] for a tensor",
            )
        return ScalarType(dtype)
    return TensorType.parse(text, where)


# ----------------------------------------------------------------------- expressions


@dataclass(frozen=True)
class IndexExpr:
    """An affine expression over symbols: + - * by constants, // % ceildiv by constants."""

    text: str
    tree: ast.expr = field(compare=False, repr=False)

    @classmethod
    def parse(cls, value: object, where: str) -> "IndexExpr":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ManifestError(
                f"{value!r} is not an index expression",
                where=where,
                fix="use an integer or a string such as 'ceildiv(n, 64)' or 'n // 32 + 1'",
            )
        if isinstance(value, int) and abs(value) > MAX_CONSTANT:
            raise ManifestError(f"{value} is too large for an index", where=where, fix=f"use integers below {MAX_CONSTANT}")
        text = str(value)
        if len(text) > MAX_EXPRESSION_LENGTH or text.count("(") > 64:
            raise ManifestError(
                f"index expression {_shown(text)} is too long or too deeply nested",
                where=where,
                fix=f"keep it under {MAX_EXPRESSION_LENGTH} characters and 64 levels of parentheses",
            )
        try:
            tree = ast.parse(text.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: a NUL
            raise ManifestError(
                f"cannot parse index expression {_shown(text)}: {getattr(exc, 'msg', None) or type(exc).__name__}",
                where=where,
                fix="use integers, dimension names, + - *, // and % by integers, and ceildiv(a, b)",
            ) from None
        expr = cls(text, tree)
        expr._check(tree, where)
        return expr

    @property
    def symbols(self) -> tuple[str, ...]:
        callees = {id(n.func) for n in ast.walk(self.tree) if isinstance(n, ast.Call)}
        seen: dict[str, None] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and id(node) not in callees:
                seen.setdefault(node.id, None)
        return tuple(seen)

    @property
    def constant(self) -> int | None:
        return None if self.symbols else self._fold(self.tree)

    def affine(self, symbol_index: dict[str, int]) -> str:
        """Renders this expression in MLIR affine syntax with symbols s0, s1, ..."""
        return self._affine(self.tree, symbol_index)

    def _check(self, node: ast.expr, where: str) -> None:
        bad = lambda why: ManifestError(  # noqa: E731
            f"index expression {self.text!r} is not affine: {why}",
            where=where,
            fix="multiply only by integers; divide (//, ceildiv) and take % only by positive integers",
        )
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int):
                raise bad(f"{node.value!r} is not an integer")
            if abs(node.value) > MAX_CONSTANT:
                raise bad(f"{node.value} is too large for an index")
        elif isinstance(node, ast.Name):
            check_identifier(node.id, "symbol", where)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            self._check(node.operand, where)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            self._check(node.left, where)
            self._check(node.right, where)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            self._check(node.left, where)
            self._check(node.right, where)
            if not (self._is_const(node.left) or self._is_const(node.right)):
                raise bad("a product of two symbols")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
            self._check_divisor(node.left, node.right, where, bad)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "ceildiv"
            and len(node.args) == 2
            and not node.keywords
        ):
            self._check_divisor(node.args[0], node.args[1], where, bad)
        else:
            raise bad(f"unsupported syntax {ast.unparse(node)!r}")

    def _check_divisor(self, lhs: ast.expr, rhs: ast.expr, where: str, bad) -> None:
        self._check(lhs, where)
        self._check(rhs, where)
        if not self._is_const(rhs) or self._fold(rhs) <= 0:
            raise bad(f"divisor {ast.unparse(rhs)!r} is not a positive integer")

    def _is_const(self, node: ast.expr) -> bool:
        callees = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
        return not any(isinstance(n, ast.Name) and id(n) not in callees for n in ast.walk(node))

    def _fold(self, node: ast.expr) -> int:
        return self.evaluate({}, node)

    def evaluate(self, values: dict[str, int], node: ast.expr | None = None) -> int:
        node = self.tree if node is None else node
        ev = lambda n: self.evaluate(values, n)  # noqa: E731
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.UnaryOp):
            return -ev(node.operand)
        if isinstance(node, ast.Call):
            return -(-ev(node.args[0]) // ev(node.args[1]))
        ops = {
            ast.Add: lambda a, b: a + b,
            ast.Sub: lambda a, b: a - b,
            ast.Mult: lambda a, b: a * b,
            ast.FloorDiv: lambda a, b: a // b,
            ast.Mod: lambda a, b: a % b,
        }
        return ops[type(node.op)](ev(node.left), ev(node.right))

    def _affine(self, node: ast.expr, idx: dict[str, int]) -> str:
        if isinstance(node, ast.Constant):
            return str(node.value)
        if isinstance(node, ast.Name):
            return f"s{idx[node.id]}"
        if isinstance(node, ast.UnaryOp):
            return f"-({self._affine(node.operand, idx)})"
        if isinstance(node, ast.Call):
            return f"({self._affine(node.args[0], idx)}) ceildiv ({self._affine(node.args[1], idx)})"
        op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "floordiv", ast.Mod: "mod"}[
            type(node.op)
        ]
        return f"({self._affine(node.left, idx)}) {op} ({self._affine(node.right, idx)})"

    def __str__(self) -> str:
        return self.text


# ----------------------------------------------------------------------------- params


@dataclass(frozen=True)
class Buffer:
    """A pointer parameter: `in` is read-only, `out` a new result, `inout` an in-place result."""

    name: str
    access: Literal["in", "out", "inout"]
    type: TensorType

    @property
    def read_only(self) -> bool:
        return self.access == "in"

    @property
    def is_argument(self) -> bool:
        return self.access in ("in", "inout")

    @property
    def is_result(self) -> bool:
        return self.access in ("out", "inout")


@dataclass(frozen=True)
class Scalar:
    """A by-value parameter: one 32-bit push constant, or two for i64/u64/f64, which the
    kernel takes as two 32-bit C parameters NAME_lo, NAME_hi (low half first).

    `value` says where it comes from: an index expression over dimension symbols
    (e.g. 'n' or 'm * k'), a literal number, or None, which makes it an argument of
    the generated function (or the dimension of the same name, if there is one).
    """

    name: str
    dtype: str
    value: IndexExpr | float | None = None

    @property
    def is_wide(self) -> bool:
        return self.dtype in WIDE_SCALARS

    @property
    def c_names(self) -> tuple[str, ...]:
        """The C parameters this scalar fills, one per push constant."""
        return tuple(self.name + h for h in WIDE_HALVES) if self.is_wide else (self.name,)


Param = Union[Buffer, Scalar]


@dataclass(frozen=True)
class Replaces:
    """Which ops of an imported model a kernel may stand in for, and the limits its params
    cannot say: a dimension's divisor or largest size, for a softmax the dimension it
    normalizes (None: the last), and for a linalg.generic the MLIR file whose one generic the
    op must match. Each op is still checked against the params (replace.py)."""

    ops: tuple[str, ...]
    multiple_of: tuple[tuple[str, int], ...] = ()
    max_size: tuple[tuple[str, int], ...] = ()
    dimension: int | None = None
    pattern: Path | None = None

    @classmethod
    def create(
        cls,
        ops: Sequence[str],
        *,
        multiple_of: dict[str, int] | None = None,
        max_size: dict[str, int] | None = None,
        dimension: int | None = None,
        pattern: str | Path | None = None,
        where: str = "replaces",
    ) -> "Replaces":
        if isinstance(ops, str) or not ops or not all(isinstance(o, str) for o in ops):
            raise ManifestError(
                f"replaces must be a non-empty list of op names, got {ops!r}",
                where=where,
                fix=f'e.g. replaces = ["linalg.softmax"]; known: {", ".join(REPLACEABLE_OPS)}',
            )
        for op in ops:
            if op not in REPLACEABLE_OPS:
                raise ManifestError(
                    f"kitdispatch cannot replace {op!r}", where=where, fix=f"use one of {', '.join(REPLACEABLE_OPS)}"
                )
        if dimension is not None and (isinstance(dimension, bool) or not isinstance(dimension, int)):
            raise ManifestError(f"dimension {dimension!r} is not an integer", where=where, fix="e.g. dimension = 1")
        if (pattern is None) == ("linalg.generic" in ops):
            raise ManifestError(
                "a linalg.generic needs a pattern, and a pattern is for linalg.generic only",
                where=where,
                fix='replaces = ["linalg.generic"] with replace_when = { pattern = "FILE.mlir" } (one linalg.generic in a func)',
            )
        if pattern is not None and not isinstance(pattern, (str, Path)):
            raise ManifestError(f"pattern {pattern!r} is not a file name", where=where, fix='e.g. pattern = "bias_gelu.mlir"')
        return cls(
            tuple(dict.fromkeys(ops)),
            _positive_sizes(multiple_of or {}, "multiple_of", where),
            _positive_sizes(max_size or {}, "max", where),
            dimension,
            Path(pattern) if pattern is not None else None,
        )

    @property
    def limited_symbols(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for s, _ in self.multiple_of + self.max_size))


def _positive_sizes(table: object, key: str, where: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(table, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in table.values()
    ):
        raise ManifestError(
            f"{key} must map dimension names to positive integers, got {table!r}",
            where=where,
            fix=f"e.g. {key} = {{ k = 16 }}",
        )
    return tuple(sorted((check_identifier(k, "dimension", where), v) for k, v in table.items()))


@dataclass(frozen=True)
class CSlot:
    """One C parameter of the kernel as the layout fills it: a buffer's pointer or one
    push constant of a scalar."""

    name: str
    param: "Param"
    size: int  # bytes of the C parameter


def c_slots(params: tuple[Param, ...]) -> tuple[CSlot, ...]:
    slots: list[CSlot] = []
    for p in params:
        if isinstance(p, Buffer):
            slots.append(CSlot(p.name, p, 8))
        else:
            size = 4 if p.is_wide else SCALAR_C_BYTES[p.dtype]
            slots += [CSlot(n, p, size) for n in p.c_names]
    return tuple(slots)


@dataclass(frozen=True)
class Kernel:
    """One `extern "C" __global__` function and how IREE should dispatch it."""

    name: str
    source: Path
    params: tuple[Param, ...]
    workgroup_size: tuple[int, int, int]
    workgroup_count: tuple[IndexExpr, IndexExpr, IndexExpr]
    function: str
    format: str | None = None  # object format for this kernel's source; None: the build's
    # The kernel's entry in the compiled object, when it differs from `name`: the mangled
    # name of a C++ kernel (the build takes it from its own compile, `cpp_name` kernels).
    symbol: str | None = None
    # Bytes of `extern __shared__` memory each block gets at launch (the export's
    # workgroup_local_memory, which IREE's CUDA driver passes as dynamic shared memory).
    dynamic_shared_memory: int = 0
    # Named as in C++ (not extern "C"): its entry is the mangled name the compiler reports.
    cpp_name: bool = False
    # The ops of an imported model this kernel may stand in for (`replaces`); None: none.
    replaces: Replaces | None = None

    @classmethod
    def create(
        cls,
        name: str,
        source: str | Path,
        params: list[Param] | tuple[Param, ...],
        *,
        workgroup_size: tuple[int, ...] | list[int],
        workgroup_count: tuple[int | str, ...] | list[int | str],
        function: str | None = None,
        format: str | None = None,
        symbol: str | None = None,
        dynamic_shared_memory: int = 0,
        cpp_name: bool = False,
        replaces: Replaces | Sequence[str] | None = None,
        where: str | None = None,
    ) -> "Kernel":
        where = where or f"kernel {_shown(name)}"
        check_kernel_name(name, where)
        function = check_identifier(function or default_function_name(name), "function name", where)
        if symbol is not None:
            check_identifier(symbol, "kernel symbol", where)
        cpp_name = cpp_name or (symbol is None and not _IDENT_RE.match(name))  # `ns::k`, `k<float>`
        size = _pad3(workgroup_size, 1, f"{where}: workgroup_size")
        for n in size:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ManifestError(
                    f"workgroup_size {list(workgroup_size)} must hold positive integers",
                    where=where,
                    fix="give the CUDA block size, e.g. [256] or [16, 16]",
                )
        if isinstance(dynamic_shared_memory, bool) or not isinstance(dynamic_shared_memory, int) or not (
            0 <= dynamic_shared_memory <= MAX_DYNAMIC_SHARED_MEMORY
        ):
            raise ManifestError(
                f"dynamic_shared_memory {dynamic_shared_memory!r} is not a byte count from 0 to "
                f"{MAX_DYNAMIC_SHARED_MEMORY}",
                where=where,
                fix="give the bytes of `extern __shared__` memory a block needs",
            )
        if math.prod(size) > MAX_WORKGROUP_THREADS:
            raise ManifestError(
                f"workgroup_size {list(size)} has {math.prod(size)} threads, over CUDA's "
                f"{MAX_WORKGROUP_THREADS}",
                where=where,
                fix="use a smaller block",
            )
        count = tuple(
            IndexExpr.parse(e, f"{where}: workgroup_count")
            for e in _pad3(workgroup_count, 1, f"{where}: workgroup_count")
        )
        if format is not None and format not in OBJECT_FORMATS:
            raise ManifestError(
                f"unknown object format {format!r}", where=where, fix=f"use one of {', '.join(OBJECT_FORMATS)}"
            )
        if replaces is not None and not isinstance(replaces, Replaces):
            replaces = Replaces.create(replaces, where=f"{where}: replaces")
        kernel = cls(
            name, Path(source), tuple(params), size, count, function, format, symbol, dynamic_shared_memory, cpp_name, replaces
        )
        kernel._validate(where)
        return kernel

    # -- derived views -------------------------------------------------------------

    @property
    def entry(self) -> str:
        """The kernel's name in the compiled object, and its export name in the MLIR."""
        return self.symbol or self.name

    @property
    def c_slots(self) -> tuple[CSlot, ...]:
        """Every C parameter the layout fills, in order: pointers, then one per constant."""
        return c_slots(self.params)

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return tuple(p for p in self.params if isinstance(p, Buffer))

    @property
    def scalars(self) -> tuple[Scalar, ...]:
        return tuple(p for p in self.params if isinstance(p, Scalar))

    @property
    def dimension_symbols(self) -> tuple[str, ...]:
        """Symbols bound by the shapes of the function's tensor arguments."""
        seen: dict[str, None] = {}
        for b in self.buffers:
            if b.is_argument:
                for s in b.type.symbols:
                    seen.setdefault(s, None)
        return tuple(seen)

    def is_function_argument(self, scalar: Scalar) -> bool:
        return scalar.value is None and scalar.name not in self.dimension_symbols

    @property
    def function_arguments(self) -> tuple[Param, ...]:
        return tuple(
            p
            for p in self.params
            if (isinstance(p, Buffer) and p.is_argument)
            or (isinstance(p, Scalar) and self.is_function_argument(p))
        )

    @property
    def known_symbols(self) -> tuple[str, ...]:
        """Dimension symbols plus integer scalar arguments: what shapes and counts may use."""
        ints = tuple(
            s.name
            for s in self.scalars
            if self.is_function_argument(s) and s.dtype in INTEGER_SCALARS
        )
        return self.dimension_symbols + ints

    @property
    def workload(self) -> tuple[str, ...]:
        """The dispatch workload: every symbol the workgroup count reads, in order."""
        seen: dict[str, None] = {}
        for e in self.workgroup_count:
            for s in e.symbols:
                seen.setdefault(s, None)
        return tuple(seen)

    def signature(self) -> "FunctionSignature":
        args = tuple(
            p.type if isinstance(p, Buffer) else ScalarType(p.dtype) for p in self.function_arguments
        )
        results = tuple(b.type for b in self.buffers if b.is_result)
        return FunctionSignature(self.function, args, results)

    # -- validation ----------------------------------------------------------------

    def _validate(self, where: str) -> None:
        names: set[str] = set()
        seen_scalar = False
        for i, p in enumerate(self.params):
            pwhere = f"{where}: params[{i}]"
            check_identifier(p.name, "parameter name", pwhere)
            if p.name in names:
                raise ManifestError(
                    f"parameter {p.name!r} appears twice", where=pwhere, fix="give every parameter its own name"
                )
            names.add(p.name)
            if isinstance(p, Scalar):
                seen_scalar = True
                if p.dtype not in SCALAR_TYPES:
                    raise ManifestError(
                        f"scalar {p.name!r} has type {p.dtype!r}",
                        where=pwhere,
                        fix=f"use one of {', '.join(SCALAR_TYPES)}",
                    )
                if isinstance(p.value, float) and p.dtype in INTEGER_SCALARS + ("bool",):
                    raise ManifestError(
                        f"scalar {p.name!r} of type {p.dtype} has the float value {p.value!r}",
                        where=pwhere,
                        fix="give an integer or an index expression",
                    )
            elif seen_scalar:
                raise ManifestError(
                    f"buffer {p.name!r} follows a scalar; IREE passes every buffer before every "
                    "push constant",
                    where=pwhere,
                    fix="reorder the kernel's C parameters: all pointers first, then the scalars",
                )
        if not self.buffers:
            raise ManifestError(
                "the kernel has no buffer parameter", where=where, fix="declare its pointers as in/out/inout"
            )
        if not any(b.is_result for b in self.buffers):
            raise ManifestError(
                "the kernel has no result buffer",
                where=where,
                fix="mark the buffer it writes as 'out' (a new tensor) or 'inout' (in place)",
            )
        known = set(self.known_symbols)
        self._check_symbols(
            (s for b in self.buffers if b.access == "out" for s in b.type.symbols),
            known,
            where,
            "the shape of an 'out' buffer",
        )
        self._check_symbols(
            (s for e in self.workgroup_count for s in e.symbols), known, where, "workgroup_count"
        )
        for s in self.scalars:
            if isinstance(s.value, IndexExpr):
                if s.dtype not in INTEGER_SCALARS + ("bool",):
                    raise ManifestError(
                        f"scalar {s.name!r} of type {s.dtype} takes an index expression",
                        where=where,
                        fix="give a float scalar a number as value, or leave value out",
                    )
                self._check_symbols(s.value.symbols, set(self.dimension_symbols), where, f"the value of {s.name!r}")
        if self.replaces is not None:
            self._check_symbols(self.replaces.limited_symbols, set(self.dimension_symbols), where, "replace_when")

    @staticmethod
    def _check_symbols(symbols, known: set[str], where: str, what: str) -> None:
        for s in symbols:
            if s not in known:
                names = ", ".join(sorted(known)) or "none"
                raise ManifestError(
                    f"{what} uses {s!r}, which no input shape or integer scalar argument defines",
                    where=where,
                    fix=f"use a dimension of an 'in'/'inout' buffer or an integer scalar (known: {names})",
                )


def _pad3(values, fill, where: str) -> tuple:
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    if not 1 <= len(values) <= 3:
        raise ManifestError(
            f"expected 1 to 3 entries (x, y, z), got {len(values)}", where=where, fix="e.g. [64] or [16, 16, 1]"
        )
    return tuple(values + [fill] * (3 - len(values)))


# ------------------------------------------------------------- the kernel's C signature


def infer_params(
    sig: KernelSignature,
    *,
    shapes: dict[str, TensorType],
    inout: tuple[str, ...] = (),
    inputs: tuple[str, ...] = (),
    scalars: dict[str, str] | None = None,
    values: dict[str, IndexExpr | float] | None = None,
    where: str,
) -> tuple[Param, ...]:
    """The layout from the kernel's C signature: a const pointer is an `in` buffer, any other
    pointer an `out` one (or `inout`/`in` where listed); scalar types come from the C types,
    or from `scalars` for what C cannot say (a 64-bit value's two halves, a typedef)."""
    scalars, values = dict(scalars or {}), dict(values or {})
    for name, dtype in scalars.items():
        if dtype not in SCALAR_TYPES:
            raise ManifestError(
                f"unknown scalar type {dtype!r} for {name!r}", where=f"{where}: scalars.{name}",
                fix=f"use one of {', '.join(SCALAR_TYPES)} (C's int is i32, float is f32)",
            )
    _check_listed(shapes, [c.name for c in sig.params if c.is_pointer], sig, "shapes", "pointer", where)
    _check_listed(dict.fromkeys(inout + inputs), [c.name for c in sig.params if c.is_pointer], sig,
                  "inout/in", "pointer", where)
    wide_halves = {n + WIDE_HALVES[0]: n for n, t in scalars.items() if t in WIDE_SCALARS}
    scalar_names = [c.name for c in sig.params if not c.is_pointer]
    known = scalar_names + [n for n, t in scalars.items() if t in WIDE_SCALARS]
    _check_listed(scalars, known, sig, "scalars", "scalar", where)
    _check_listed(values, known, sig, "values", "scalar", where)
    params: list[Param] = []
    i = 0
    while i < len(sig.params):
        c = sig.params[i]
        pwhere = f"{where}: parameter {c.name or i} of {sig.name}"
        if not c.name:
            raise ManifestError(
                f"parameter {i} of kernel {sig.name!r} has no name", where=pwhere,
                fix="name every parameter in the kernel's definition, or declare 'params' explicitly",
            )
        if c.is_pointer:
            if c.name not in shapes:
                raise ManifestError(
                    f"pointer {c.name!r} of kernel {sig.name!r} has no shape", where=pwhere,
                    fix=f'add it to shapes, e.g. shapes = {{ {c.name} = "f32[n]" }}',
                )
            access = "inout" if c.name in inout else "in" if c.name in inputs or c.is_const_pointee else "out"
            if c.name in inout and c.is_const_pointee:
                raise _mismatch(sig, c.name, "inout (written)", f"'{c.type}' (const: read-only)", pwhere)
            params.append(Buffer(c.name, access, shapes[c.name]))
            i += 1
            continue
        if c.name in wide_halves:
            name = wide_halves[c.name]
            params.append(Scalar(name, scalars[name], values.get(name)))
            i += 2  # the pair is checked against the signature below
            continue
        dtype = scalars.get(c.name) or _c_scalar_type(sig, c, pwhere)
        params.append(Scalar(c.name, dtype, values.get(c.name)))
        i += 1
    params = tuple(params)
    check_params(params, sig, where)
    return params


def _check_listed(table: dict, names: list[str], sig: KernelSignature, key: str, what: str, where: str) -> None:
    for name in table:
        if name not in names:
            raise ManifestError(
                f"{key} names {name!r}, which is not a {what} parameter of kernel {sig.name!r}",
                where=where,
                fix=f"{what} parameters of {sig.name}: {', '.join(names) or 'none'}",
            )


def _c_scalar_type(sig: KernelSignature, c: CParam, where: str) -> str:
    if c.type in C_SCALAR_TYPES:
        return C_SCALAR_TYPES[c.type]
    if c.type in C_UNSUPPORTED_SCALARS:
        raise ManifestError(
            f"parameter {c.name!r} of kernel {sig.name!r} has C type '{c.type}', which no push "
            "constant carries: IREE's CUDA HAL writes 32 bits into each kernel parameter",
            where=where,
            fix=f"take a 64-bit value as two 32-bit halves, `unsigned {c.name}_lo, unsigned "
            f"{c.name}_hi`, declared scalars = {{ {c.name} = \"i64\" }} (or u64, f64); use int for "
            "narrower integers",
        )
    raise ManifestError(
        f"parameter {c.name!r} of kernel {sig.name!r} has C type '{c.type}', which kitdispatch "
        "cannot map to a scalar type",
        where=where,
        fix=f"declare its type: scalars = {{ {c.name} = \"f32\" }} (one of {', '.join(SCALAR_TYPES)})",
    )


def check_params(params: tuple[Param, ...], sig: KernelSignature, where: str) -> None:
    """The declared layout against the C signature: count, names, pointer or scalar,
    const-ness, scalar C types and pointer element types."""
    slots = c_slots(params)
    c_names = [c.name for c in sig.params]
    if len(slots) != len(sig.params):
        raise ManifestError(
            f"kernel {sig.name!r} takes {len(sig.params)} parameters in its source "
            f"({', '.join(c.name or '?' for c in sig.params)}) but the manifest fills {len(slots)} "
            f"({', '.join(s.name for s in slots)})",
            where=where,
            fix="declare every C parameter, in order; a 64-bit scalar NAME fills NAME_lo and NAME_hi",
        )
    for slot, c in zip(slots, sig.params):
        p = slot.param
        declared = (
            f"{p.access} {p.type}" if isinstance(p, Buffer) else
            f"{p.dtype} half {slot.name!r}" if p.is_wide else f"scalar {p.dtype}"
        )
        # A name the signature does not use renames the parameter (the generated function's
        # argument); one that names another C parameter means the order is wrong.
        if c.name and c.name != slot.name and slot.name in c_names:
            raise _mismatch(sig, slot.name, f"{declared} named {slot.name!r} at position {c_names.index(c.name)}",
                            f"'{c.type} {c.name}' there and {slot.name!r} at position "
                            f"{c_names.index(slot.name)}", where)
        if isinstance(p, Buffer) != c.is_pointer:
            raise _mismatch(sig, slot.name, declared, f"'{c.type}' ({'a pointer' if c.is_pointer else 'by value'})", where)
        if isinstance(p, Buffer):
            if c.is_const_pointee and p.is_result:
                raise _mismatch(sig, p.name, declared, f"'{c.type}' (const: the kernel cannot write it)", where)
            element = C_ELEMENT_TYPES.get(c.base_type)
            if element is not None and element != p.type.dtype:
                raise _mismatch(sig, p.name, declared, f"'{c.type}' (elements of type {element})", where)
            if c.type.count("*") > 1:
                raise _mismatch(sig, p.name, declared, f"'{c.type}' (a pointer to pointers)", where)
            continue
        if p.is_wide:
            ok = c.type in C_HALF_TYPES or _unknown_c_type(c.type)
        else:
            ok = C_SCALAR_TYPES.get(c.type) == p.dtype or _unknown_c_type(c.type)
        if not ok:
            want = "a 32-bit integer half" if p.is_wide else _c_spellings(p.dtype)
            raise _mismatch(sig, slot.name, f"{declared} ({want})", f"'{c.type}'", where)


def _unknown_c_type(c_type: str) -> bool:
    """A typedef or template parameter the kit cannot see through: not checked."""
    return c_type not in C_SCALAR_TYPES and c_type not in C_UNSUPPORTED_SCALARS and "*" not in c_type


def _c_spellings(dtype: str) -> str:
    return " or ".join(f"'{c}'" for c, t in C_SCALAR_TYPES.items() if t == dtype)


def _mismatch(sig: KernelSignature, param: str, declared: str, source: str, where: str) -> ManifestError:
    return ManifestError(
        f"kernel {sig.name!r} parameter {param!r}: the manifest declares {declared}, the source "
        f"(line {sig.line}) has {source}",
        where=where,
        fix="make the manifest match the kernel's C signature, or leave 'params' out to infer it",
    )


# -------------------------------------------------------------------------- functions


@dataclass(frozen=True)
class FunctionSignature:
    """What a function of the built module takes and returns."""

    name: str
    args: tuple[TensorType | ScalarType, ...]
    results: tuple[TensorType | ScalarType, ...]

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "args": [str(a) for a in self.args],
            "results": [str(r) for r in self.results],
        }

    @classmethod
    def from_json(cls, data: dict, where: str) -> "FunctionSignature":
        return cls(
            data["name"],
            tuple(parse_value_type(a, where) for a in data["args"]),
            tuple(parse_value_type(r, where) for r in data["results"]),
        )


@dataclass(frozen=True)
class Program:
    """A user's MLIR file whose functions call the generated kernel functions."""

    source: Path
    functions: tuple[FunctionSignature, ...]


@dataclass(frozen=True)
class TestSpec:
    """How `kitdispatch test` exercises the module: numpy references and sizes."""

    reference: Path | None = None
    sizes: tuple[tuple[str, int], ...] = ()
    seed: int = 0


@dataclass(frozen=True)
class ModuleSpec:
    """Everything that goes into one .vmfb: kernels, user programs, test settings."""

    name: str
    root: Path
    kernels: tuple[Kernel, ...]
    programs: tuple[Program, ...] = ()
    test: TestSpec = TestSpec()

    @classmethod
    def create(
        cls,
        name: str,
        kernels: list[Kernel] | tuple[Kernel, ...],
        *,
        root: str | Path = ".",
        programs: list[Program] | tuple[Program, ...] = (),
        test: TestSpec | None = None,
        where: str | None = None,
    ) -> "ModuleSpec":
        where = where or f"module {name!r}"
        check_identifier(name, "module name", where)
        if not kernels:
            raise ManifestError("no kernels described", where=where, fix="add at least one [[kernels]] entry")
        spec = cls(name, Path(root), tuple(kernels), tuple(programs), test or TestSpec())
        spec._check_unique_functions(where)
        return spec

    def source_path(self, path: Path) -> Path:
        return path if path.is_absolute() else self.root / path

    def source_stem(self, source: Path) -> str:
        """The name of a source's objects and executable: its file stem, made unique in the
        module where two sources share one (`a/k.cu`, `b/k.cu` -> `k-1c2d3e4f`, `k-5a6b7c8d`)."""
        path = self.source_path(Path(source))
        sharing = {self.source_path(k.source) for k in self.kernels if Path(k.source).stem == path.stem}
        if len(sharing) <= 1:
            return path.stem
        digest = hashlib.sha256(str(Path(source)).encode()).hexdigest()[:8]
        return f"{path.stem}-{digest}"

    @property
    def signatures(self) -> tuple[FunctionSignature, ...]:
        return tuple(k.signature() for k in self.kernels) + tuple(
            f for p in self.programs for f in p.functions
        )

    def _check_unique_functions(self, where: str) -> None:
        seen: set[str] = set()
        for k in self.kernels:
            if k.name in {o.name for o in self.kernels if o is not k and o.source == k.source}:
                raise ManifestError(
                    f"kernel {k.name!r} is described twice for {k.source}",
                    where=where,
                    fix="describe each kernel once; give variants their own C name",
                )
        for sig in self.signatures:
            if sig.name in seen:
                raise ManifestError(
                    f"function {sig.name!r} is defined twice",
                    where=where,
                    fix="give the kernel a distinct 'function' name",
                )
            seen.add(sig.name)
