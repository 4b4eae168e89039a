"""Describing kernels: what each kernel takes, how it is launched, and the callable around it.

These frozen dataclasses are the Python API for describing kernels; the TOML manifest
(`manifest.py`) produces exactly the same objects. Validation happens here, once, so both
front ends give the same errors.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Literal, Union

import numpy as np

from . import abi
from .errors import ManifestError
from .signature import CParam, KernelSignature

# The C parameters of a scalar the kernel takes as two 32-bit halves (the form that needs
# no entry bridge): NAME_lo, NAME_hi, low half first.
WIDE_HALVES = ("_lo", "_hi")

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# A C++ name expression as NVRTC takes it: `scale`, `ns::scale`, `scale<float, 4>`.
_CPP_NAME_RE = re.compile(r"^(?:::)?[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*(?:<[\w ,:*&<>().+-]*>)?\Z", re.ASCII)
MAX_IDENTIFIER_LENGTH = 256
_TENSOR_RE = re.compile(r"^\s*([a-z0-9]+)\s*\[(.*)\]\s*\Z", re.S)
MAX_WORKGROUP_THREADS = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)  # CUDA's gridDim limits, x y z
MAX_STATIC_DIM = 2**40  # static tensor dimensions (IREE's index is 64-bit; products must fit)
MAX_EXPRESSION_LENGTH = 1000  # index expressions are short; a longer one is a mistake or an attack
MAX_CONSTANT = 2**64  # u64 values fit; anything larger is a mistake
# The largest per-block opt-in of current GPUs (sm_90: 227 KiB). IREE's CUDA driver sets the
# kernel's MAX_DYNAMIC_SHARED_SIZE_BYTES to the export's value and checks the device's own
# limit when it loads the module (runtime/src/iree/hal/drivers/cuda/native_executable.c).
MAX_DYNAMIC_SHARED_MEMORY = 227 * 1024
# What each launch reserves for a dynamic_shared_memory expression unless
# dynamic_shared_memory_max says otherwise: what every CUDA GPU gives a block without opting in.
DEFAULT_DYNAMIC_SHARED_MEMORY_MAX = 48 * 1024
OBJECT_FORMATS = ("ptx", "cubin", "fatbin")
# Ops of an imported model a kernel may stand in for (`replaces`; replace.py decides per op).
REPLACEABLE_OPS = ("linalg.softmax", "linalg.matmul", "linalg.batch_matmul", "linalg.generic", "iree_linalg_ext.attention")


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


def distinct_names(wanted: dict, salts: dict[object, str], *, join: str, fold=lambda s: s, taken=frozenset(), what: str) -> dict:
    """`wanted` names made distinct (after `fold`) from each other and from `taken`: every name
    that two keys share, or that is taken, gets a short hash of the key's salt appended after
    `join`, until none is shared. Deterministic: a name changes only where it collides."""
    names = dict(wanted)
    for _ in range(4):
        holders: dict[str, list] = {}
        for key, name in names.items():
            holders.setdefault(fold(name), []).append(key)
        colliding = [key for keys in holders.values() for key in keys if len(keys) > 1 or fold(names[key]) in taken]
        if not colliding:
            return names
        for key in colliding:
            names[key] = f"{names[key]}{join}{hashlib.sha256(salts[key].encode()).hexdigest()[:8]}"
    keys = sorted(salts[k] for k in colliding)
    raise ManifestError(f"{what} stay the same after renaming: {', '.join(keys)}", fix="rename one of these files")


def _shown(name: object) -> str:
    text = repr(name)
    return text if len(text) <= 60 else f"{text[:40]}...{text[-10:]} ({len(text)} characters)"



def float_bits(dtype: str, value: float) -> int:
    """The bits of `value` as a float of type `dtype` (rounded to nearest even), unsigned."""
    return abi.bits(abi.lookup(dtype), value)


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
    def mlir_types(self) -> tuple[str, ...]:
        """The function arguments it takes: one tensor."""
        return (self.mlir,)

    @property
    def mlir(self) -> str:
        dims = "".join(f"{'?' if isinstance(d, str) else d}x" for d in self.shape)
        return f"tensor<{dims}{abi.lookup(self.dtype).mlir}>"

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class ScalarType:
    dtype: str

    @property
    def mlir(self) -> str:
        """The type a generated function takes for this scalar (abi.AbiType.argument)."""
        return abi.lookup(self.dtype).argument

    @property
    def mlir_types(self) -> tuple[str, ...]:
        """The function arguments it takes: one, or one i32 per word of a struct."""
        return abi.lookup(self.dtype).arguments

    def __str__(self) -> str:
        return self.dtype


def check_element_type(dtype: str, where: str) -> None:
    abi.element_type(dtype, where)


def parse_value_type(text: object, where: str) -> TensorType | ScalarType:
    """'f32[n]' is a tensor; a bare 'f32' or 'i32' is a scalar."""
    if isinstance(text, str) and "[" not in text:
        dtype = text.strip()
        abi.scalar_type(dtype, where, ", or DTYPE[DIMS] for a tensor")
        return ScalarType(dtype)
    return TensorType.parse(text, where)


# ----------------------------------------------------------------------- expressions


# Functions an index expression may call, with how many arguments each takes (min, max).
INDEX_FUNCTIONS = {"ceildiv": (2, 2), "min": (2, 16), "max": (2, 16), "sizeof": (1, 1)}


@dataclass(frozen=True)
class IndexExpr:
    """An integer expression over symbols (sizes and integer scalars), as host code states
    launch math: + - *, // % and ceildiv(a, b), min(a, b, ...), max(a, b, ...), and
    sizeof(TYPE) (a C or kit type: sizeof(float) is 4). Division and % round as Python's do
    (floor). Affine ones (products and divisors by constants) render as affine maps, others
    as index arithmetic (render.py)."""

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
                fix=EXPRESSION_HELP,
            ) from None
        expr = cls(text, tree)
        expr._check(tree, where)
        return expr

    @property
    def symbols(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for node in _walk_values(self.tree):
            if isinstance(node, ast.Name):
                seen.setdefault(node.id, None)
        return tuple(seen)

    @property
    def constant(self) -> int | None:
        return None if self.symbols else self._fold(self.tree)

    @property
    def is_affine(self) -> bool:
        """Whether an affine map can say it: symbols multiplied and divided only by constants
        (divisors positive), no min or max."""
        return _affine_node(self, self.tree)

    def affine(self, symbol_index: dict[str, int]) -> str:
        """Renders this (affine) expression in MLIR affine syntax with symbols s0, s1, ..."""
        return self._affine(self.tree, symbol_index)

    def _check(self, node: ast.expr, where: str) -> None:
        bad = lambda why: ManifestError(  # noqa: E731
            f"index expression {self.text!r} is not an integer expression the kit can compute: {why}",
            where=where,
            fix=EXPRESSION_HELP,
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
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            self._check(node.left, where)
            self._check(node.right, where)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
            self._check_divisor(node.left, node.right, where, bad)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in INDEX_FUNCTIONS and not node.keywords:
            low, high = INDEX_FUNCTIONS[node.func.id]
            if not low <= len(node.args) <= high:
                raise bad(f"{node.func.id}() takes {low if low == high else f'{low} to {high}'} arguments, got {len(node.args)}")
            if node.func.id == "sizeof":
                _sizeof(node, bad)
            elif node.func.id == "ceildiv":
                self._check_divisor(node.args[0], node.args[1], where, bad)
            else:
                for arg in node.args:
                    self._check(arg, where)
        else:
            raise bad(f"unsupported syntax {ast.unparse(node)!r}")

    def _check_divisor(self, lhs: ast.expr, rhs: ast.expr, where: str, bad) -> None:
        """A constant divisor must be positive; one over symbols is checked at each call."""
        self._check(lhs, where)
        self._check(rhs, where)
        if self._is_const(rhs) and self._fold(rhs) <= 0:
            raise bad(f"divisor {ast.unparse(rhs)!r} is not a positive integer")

    def _is_const(self, node: ast.expr) -> bool:
        return not any(isinstance(n, ast.Name) for n in _walk_values(node))

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
            name = node.func.id
            if name == "sizeof":
                return _sizeof(node)
            if name in ("min", "max"):
                return (min if name == "min" else max)(ev(a) for a in node.args)
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
            if node.func.id == "sizeof":
                return str(_sizeof(node))
            return f"({self._affine(node.args[0], idx)}) ceildiv ({self._affine(node.args[1], idx)})"
        op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "floordiv", ast.Mod: "mod"}[
            type(node.op)
        ]
        return f"({self._affine(node.left, idx)}) {op} ({self._affine(node.right, idx)})"

    def __str__(self) -> str:
        return self.text


EXPRESSION_HELP = (
    "use integers, names of sizes and integer scalars, + - * // %, ceildiv(a, b), min(a, b, ...), "
    "max(a, b, ...) and sizeof(TYPE), e.g. 'ceildiv(B * T, 256)' or '(2 + block_y) * C * sizeof(float)'"
)


def _walk_values(node: ast.expr):
    """The nodes of an expression that are values, breadth first as ast.walk (symbol order
    is the workload's): not callees, not sizeof's type name."""
    queue = [node]
    while queue:
        node = queue.pop(0)
        if isinstance(node, ast.Call):
            sizeof = isinstance(node.func, ast.Name) and node.func.id == "sizeof"
            queue += [] if sizeof else node.args
            continue
        yield node
        queue += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]


def _sizeof(node: ast.Call, bad=None) -> int:
    """sizeof(float), sizeof(f16), sizeof(int64_t): a type name of abi.py, C's or the kit's."""
    arg = node.args[0]
    row = (abi.BY_C_NAME.get(arg.id) or abi.BY_NAME.get(arg.id)) if isinstance(arg, ast.Name) else None
    if row is None:
        if bad is None:
            raise ValueError(ast.unparse(node))
        raise bad(f"{ast.unparse(node)!r} names no type the kit knows (one word: float, int, double, f16, i64 ...)")
    return row.size


def _affine_node(expr: IndexExpr, node: ast.expr) -> bool:
    if isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, ast.UnaryOp):
        return _affine_node(expr, node.operand)
    if isinstance(node, ast.Call):
        if node.func.id == "sizeof":
            return True
        if node.func.id != "ceildiv":
            return False
        lhs, rhs = node.args
    elif isinstance(node.op, (ast.FloorDiv, ast.Mod)):
        lhs, rhs = node.left, node.right
    elif isinstance(node.op, ast.Mult):
        sides = (node.left, node.right)
        return all(_affine_node(expr, s) for s in sides) and any(expr._is_const(s) for s in sides)
    else:
        return _affine_node(expr, node.left) and _affine_node(expr, node.right)
    return _affine_node(expr, lhs) and expr._is_const(rhs) and expr._fold(rhs) > 0


# ----------------------------------------------------------------------------- params


@dataclass(frozen=True)
class Buffer:
    """A pointer parameter: `in` is read-only, `out` a new result, `inout` an in-place result.

    `inferred`: the access is only C's default for a non-const pointer that nothing else
    names (`out`); the build settles it from the compiled code's loads and stores (roles.py)."""

    name: str
    access: Literal["in", "out", "inout"]
    type: TensorType
    inferred: bool = False

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
    """A by-value parameter: one 32-bit push constant, or two for i64/u64/f64 (abi.py).
    A 64-bit scalar is one C parameter (bridged, bridge.py), or with `split` two 32-bit C
    parameters NAME_lo, NAME_hi (low half first), the form that needs no bridge.

    `value` says where it comes from: an index expression over dimension symbols
    (e.g. 'n' or 'm * k'), a literal number, or None, which makes it an argument of
    the generated function (or the dimension of the same name, if there is one).
    """

    name: str
    dtype: str
    value: IndexExpr | float | None = None
    split: bool = False

    @property
    def abi(self) -> abi.AbiType:
        return abi.lookup(self.dtype)

    @property
    def words(self) -> int:
        """Push constants it takes."""
        return self.abi.words

    @property
    def c_names(self) -> tuple[str, ...]:
        """The C parameters this scalar fills."""
        return tuple(self.name + h for h in WIDE_HALVES) if self.split else (self.name,)


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
            size = 4 if p.split else p.abi.size
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
    # The bytes of dynamic shared memory a call needs, as an expression over its sizes (then
    # `dynamic_shared_memory` is what each launch reserves, and each call checks its need
    # against it); None: the need is `dynamic_shared_memory` itself, a constant.
    dynamic_shared_memory_need: IndexExpr | None = None
    # Compile options of this kernel's source (with the module's and every other kernel of
    # that source's): include folders, relative to the manifest's folder, and NAME[=VALUE].
    include_dirs: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()

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
        dynamic_shared_memory: int | str | IndexExpr = 0,
        dynamic_shared_memory_max: int | None = None,
        cpp_name: bool = False,
        replaces: Replaces | Sequence[str] | None = None,
        include_dirs: Sequence[str | Path] = (),
        defines: Sequence[str] = (),
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
        dynamic_shared_memory, need = _shared_memory(dynamic_shared_memory, dynamic_shared_memory_max, where)
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
        _check_constant_counts(count, f"{where}: workgroup_count")
        if format is not None and format not in OBJECT_FORMATS:
            raise ManifestError(
                f"unknown object format {format!r}", where=where, fix=f"use one of {', '.join(OBJECT_FORMATS)}"
            )
        if replaces is not None and not isinstance(replaces, Replaces):
            replaces = Replaces.create(replaces, where=f"{where}: replaces")
        kernel = cls(
            name, Path(source), tuple(params), size, count, function, format, symbol, dynamic_shared_memory, cpp_name, replaces,
            need, check_include_dirs(include_dirs, where), check_defines(defines, where),
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

    @property
    def needs_bridge(self) -> bool:
        """Whether the compiled entry must be adapted to what IREE passes (bridge.py): a C
        parameter wider than the 32 bits of a push constant, or a pointer after a scalar
        (IREE passes every binding before every constant)."""
        slots = self.c_slots
        wide = any(isinstance(s.param, Scalar) and s.size > 4 for s in slots)
        kinds = [isinstance(s.param, Buffer) for s in slots]
        return wide or kinds != sorted(kinds, reverse=True)

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
            if self.is_function_argument(s) and s.abi.is_integer
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
        return FunctionSignature(self.function, args, results, tuple(p.name for p in self.function_arguments))

    def with_roles(self, roles: dict[str, str], where: str) -> "Kernel":
        """This kernel with its buffers' accesses settled (`roles`: name -> in/out/inout for
        those that change), nothing left provisional, and validated again."""
        params = tuple(
            dataclasses.replace(p, access=roles.get(p.name, p.access), inferred=False) if isinstance(p, Buffer) else p
            for p in self.params
        )
        kernel = dataclasses.replace(self, params=params)
        kernel._validate(where)
        return kernel

    # -- validation ----------------------------------------------------------------

    def _validate(self, where: str) -> None:
        names: set[str] = set()
        for i, p in enumerate(self.params):
            pwhere = f"{where}: params[{i}]"
            check_identifier(p.name, "parameter name", pwhere)
            if p.name in names:
                raise ManifestError(
                    f"parameter {p.name!r} appears twice", where=pwhere, fix="give every parameter its own name"
                )
            names.add(p.name)
            if isinstance(p, Scalar):
                row = abi.scalar_type(p.dtype, pwhere)
                if p.split and row.words != 2:
                    raise ManifestError(
                        f"scalar {p.name!r} of type {p.dtype} cannot be split into 32-bit halves",
                        where=pwhere,
                        fix="only 64-bit scalars (i64, u64, f64) come as NAME_lo, NAME_hi",
                    )
                if row.kind == "struct" and p.value is not None:
                    raise ManifestError(
                        f"struct scalar {p.name!r} takes no value", where=pwhere, fix="pass it as an argument"
                    )
                if isinstance(p.value, float) and row.kind != "float":
                    raise ManifestError(
                        f"scalar {p.name!r} of type {p.dtype} has the float value {p.value!r}",
                        where=pwhere,
                        fix="give an integer or an index expression",
                    )
                check_scalar_value(p, row, pwhere)
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
        # A provisional `out` may turn out to be an input whose shape defines these names:
        # they are checked for good once the build has settled the roles (roles.py).
        provisional = {s for b in self.buffers if b.inferred for s in b.type.symbols}
        known = set(self.known_symbols) | provisional
        self._check_symbols(
            (s for b in self.buffers if b.access == "out" for s in b.type.symbols),
            known,
            where,
            "the shape of an 'out' buffer",
        )
        self._check_symbols(
            (s for e in self.workgroup_count for s in e.symbols), known, where, "workgroup_count"
        )
        if self.dynamic_shared_memory_need is not None:
            self._check_symbols(self.dynamic_shared_memory_need.symbols, known, where, "dynamic_shared_memory")
        for s in self.scalars:
            if isinstance(s.value, IndexExpr):
                if s.abi.kind == "float":
                    raise ManifestError(
                        f"scalar {s.name!r} of type {s.dtype} takes an index expression",
                        where=where,
                        fix="give a float scalar a number as value, or leave value out",
                    )
                self._check_symbols(s.value.symbols, known, where, f"the value of {s.name!r}")
        if self.replaces is not None:
            self._check_symbols(self.replaces.limited_symbols, set(self.dimension_symbols) | provisional, where, "replace_when")

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


def _byte_count(value: object, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DYNAMIC_SHARED_MEMORY:
        raise ManifestError(
            f"{key} {value!r} is not a byte count from 0 to {MAX_DYNAMIC_SHARED_MEMORY}",
            where=where,
            fix="give the bytes of `extern __shared__` memory a block needs: an integer, or an expression "
            "over sizes and integer scalars such as '(2 + block_y) * C * sizeof(float)'",
        )
    return value


def _shared_memory(value: object, most: object, where: str) -> tuple[int, IndexExpr | None]:
    """(bytes each launch reserves, the need per call as an expression or None). IREE 3.13
    launches a kernel with its export's fixed size (CUDA HAL, native_executable.c), so an
    expression reserves `most` (default 48 KiB) and each call checks its own need against it."""
    if isinstance(value, (str, IndexExpr)):
        expr = value if isinstance(value, IndexExpr) else IndexExpr.parse(value, f"{where}: dynamic_shared_memory")
        if expr.constant is not None:
            value = expr.constant
        else:
            reserved = DEFAULT_DYNAMIC_SHARED_MEMORY_MAX if most is None else most
            return _byte_count(reserved, "dynamic_shared_memory_max", where), expr
    if most is not None:
        raise ManifestError(
            "dynamic_shared_memory_max is for a dynamic_shared_memory that depends on sizes",
            where=where,
            fix="leave it out: a constant dynamic_shared_memory is what each launch gets",
        )
    return _byte_count(value, "dynamic_shared_memory", where), None


_DEFINE_RE = re.compile(r"^[A-Za-z_]\w*(=[^\x00-\x1f]*)?\Z", re.ASCII)


def check_include_dirs(dirs: object, where: str) -> tuple[str, ...]:
    """Include folders as written (relative ones are resolved against the manifest's folder
    at build time)."""
    if isinstance(dirs, (str, Path)) or not isinstance(dirs, (list, tuple)) or not all(
        isinstance(d, (str, Path)) and str(d) and "\0" not in str(d) for d in dirs
    ):
        raise ManifestError(
            f"include_dirs must be a list of folder names, got {_shown(dirs)}",
            where=where,
            fix='e.g. include_dirs = ["include", "../common"] (relative to the manifest\'s folder)',
        )
    return tuple(str(d) for d in dirs)


def check_defines(defines: object, where: str) -> tuple[str, ...]:
    if isinstance(defines, str) or not isinstance(defines, (list, tuple)) or not all(
        isinstance(d, str) and _DEFINE_RE.match(d) for d in defines
    ):
        raise ManifestError(
            f"defines must be a list of NAME or NAME=VALUE strings, got {_shown(defines)}",
            where=where,
            fix='e.g. defines = ["BLOCK=256", "USE_FAST_PATH"] (a NAME is a C identifier; no control characters)',
        )
    return tuple(defines)


def check_scalar_value(s: Scalar, row: abi.AbiType, where: str) -> None:
    """A number the manifest fixes must fit the C parameter: the kernel would read it wrapped
    (2147483648 as an `int` is -2^31) or rounded to infinity."""
    if s.value is not None and not isinstance(s.value, (IndexExpr, float)):
        raise ManifestError(
            f"value of {s.name!r} is {s.value!r}, not an index expression or a float",
            where=where,
            fix=f"write IndexExpr.parse({s.value!r}, ...) for an integer or an expression, or a float for a float scalar",
        )
    if isinstance(s.value, float):
        try:
            abi.bits(row, s.value)
        except ManifestError as exc:
            raise ManifestError(f"value of {s.name!r}: {exc.what}", where=where, fix=exc.fix) from None
        return
    constant = s.value.constant if isinstance(s.value, IndexExpr) and row.kind != "float" else None
    low, high = abi.integer_range(row) if constant is not None else (0, 0)
    if constant is not None and not low <= constant <= high:
        raise ManifestError(
            f"value of {s.name!r}: {constant} does not fit its type {s.dtype} ({low} to {high})",
            where=where,
            fix=f"give a value from {low} to {high}, or declare the parameter with a wider C type",
        )


def _check_test_value(s: Scalar, value: int | float, where: str) -> None:
    """A `[test] scalars` value must be one the argument takes (abi.argument's checks)."""
    try:
        abi.argument(s.abi, value)
    except (ValueError, OverflowError) as exc:
        raise ManifestError(
            f"[test] scalars: {s.name} = {value!r} is not a {s.dtype}: {exc}",
            where=where,
            fix=f"give {s.name} a value its type {s.dtype} holds",
        ) from None


def value_out_of_range(kernel: "Kernel", sizes: dict[str, int | None]) -> str | None:
    """Why the sizes of one call give an integer scalar a value its C type cannot hold (a
    dimension of 2^31 for an `int n`), or None. Values over sizes not known (None) are not
    checked."""
    for s in kernel.scalars:
        value = s.value if s.value is not None else (
            IndexExpr.parse(s.name, s.name) if s.name in kernel.dimension_symbols else None
        )
        if not isinstance(value, IndexExpr) or s.abi.kind not in ("sint", "uint", "bool"):
            continue
        if any(sizes.get(sym) is None for sym in value.symbols):
            continue
        number, (low, high) = value.evaluate(sizes), abi.integer_range(s.abi)
        if not low <= number <= high:
            shown = s.name if value.text == s.name else f"{s.name} = {value.text}"
            return f"size: {shown} = {number} does not fit the kernel's {s.dtype} parameter {s.name} ({low} to {high})"
    return None


def _check_constant_counts(count: tuple[IndexExpr, ...], where: str) -> None:
    """CUDA's grid holds 2^31 - 1 blocks in x and 65535 in y and z; a larger constant count
    would reach the launch wrapped (2^32 is 0 blocks: the kernel silently never runs)."""
    for axis, limit, expr in zip("xyz", MAX_GRID, count):
        if expr.constant is not None and not 1 <= expr.constant <= limit:
            raise ManifestError(
                f"workgroup_count {axis} = {expr.constant} is not from 1 to CUDA's {limit}",
                where=where,
                fix="launch fewer, larger blocks, or loop inside the kernel (a grid-stride loop)",
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
    outputs: tuple[str, ...] = (),
    scalars: dict[str, str] | None = None,
    values: dict[str, IndexExpr | float] | None = None,
    where: str,
) -> tuple[Param, ...]:
    """The layout from the kernel's C signature: a const pointer is an `in` buffer, one listed
    in `inout`, `in` or `out` has that role, and any other pointer is provisionally `out`
    until the build reads its loads and stores in the compiled code (roles.py); scalar types
    come from the C types, or from `scalars` for what C cannot say (a 64-bit value's two
    halves, a struct)."""
    scalars, values = dict(scalars or {}), dict(values or {})
    for name, dtype in scalars.items():
        abi.scalar_type(dtype, f"{where}: scalars.{name}", " (C's int is i32, float is f32)")
    _check_listed(shapes, [c.name for c in sig.params if c.is_pointer], sig, "shapes", "pointer", where)
    _check_listed(dict.fromkeys(inout + inputs + outputs), [c.name for c in sig.params if c.is_pointer], sig,
                  "inout/in/out", "pointer", where)
    twice = [n for n in dict.fromkeys(inout + inputs + outputs) if (n in inout) + (n in inputs) + (n in outputs) > 1]
    if twice:
        raise ManifestError(f"pointer {twice[0]!r} is listed in more than one of inout, in and out", where=where,
                            fix="give each pointer one role")
    for name in outputs:
        c = next(c for c in sig.params if c.name == name)
        if c.is_const_pointee:
            raise _mismatch(sig, name, "out (written)", f"'{c.type}' (const: read-only)", where)
    c_names = [c.name for c in sig.params]
    wide_halves = {
        n + WIDE_HALVES[0]: n for n, t in scalars.items()
        if abi.lookup(t).words == 2 and n not in c_names and n + WIDE_HALVES[0] in c_names
    }
    scalar_names = [c.name for c in sig.params if not c.is_pointer]
    known = scalar_names + list(wide_halves.values())
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
            named = c.name in inout or c.name in inputs or c.name in outputs or c.is_const_pointee
            params.append(Buffer(c.name, access, shapes[c.name], inferred=not named))
            i += 1
            continue
        if c.name in wide_halves:
            name = wide_halves[c.name]
            params.append(Scalar(name, scalars[name], values.get(name), split=True))
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


def _value_type(c: CParam) -> str:
    """A by-value parameter's C type without qualifiers (`const long long` -> `long long`)."""
    return c.base_type if "*" not in c.type and "&" not in c.type else c.type


def _c_scalar_type(sig: KernelSignature, c: CParam, where: str) -> str:
    row = abi.BY_C_NAME.get(_value_type(c))
    if row is not None and row.scalar:
        return row.name
    if _value_type(c) in abi.C_UNSUPPORTED:
        raise ManifestError(
            f"parameter {c.name!r} of kernel {sig.name!r} has C type '{c.type}', which no push "
            "constant carries",
            where=where,
            fix=f"take it as one of the scalar types ({', '.join(abi.SCALAR_TYPES)})",
        )
    raise ManifestError(
        f"parameter {c.name!r} of kernel {sig.name!r} has C type '{c.type}', which kitdispatch "
        "cannot map to a scalar type",
        where=where,
        fix=f"declare its type: scalars = {{ {c.name} = \"f32\" }} (one of {', '.join(abi.SCALAR_TYPES)}), "
        f"or {{ {c.name} = \"struct16\" }} for a struct of 16 bytes passed by value",
    )


def with_split_halves(params: tuple[Param, ...], sig: KernelSignature) -> tuple[Param, ...]:
    """Explicit params: a 64-bit scalar NAME whose kernel takes NAME_lo, NAME_hi (and no
    NAME) is split into those halves."""
    names = {c.name for c in sig.params}
    return tuple(
        dataclasses.replace(p, split=True)
        if isinstance(p, Scalar) and p.words == 2 and p.name not in names and p.name + WIDE_HALVES[0] in names
        else p
        for p in params
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
            fix="declare every C parameter, in order; a 64-bit scalar NAME may fill NAME_lo and NAME_hi",
        )
    for slot, c in zip(slots, sig.params):
        p = slot.param
        declared = (
            f"{p.access} {p.type}" if isinstance(p, Buffer) else
            f"{p.dtype} half {slot.name!r}" if p.split else f"scalar {p.dtype}"
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
            _check_pointee(sig, c, p, declared, where)
            if c.type.count("*") > 1:
                raise _mismatch(sig, p.name, declared, f"'{c.type}' (a pointer to pointers)", where)
            continue
        row = abi.BY_C_NAME.get(_value_type(c))
        if p.split:
            ok = _unknown_c_type(c) or (row is not None and row.is_integer and row.size == 4)
        else:
            ok = row == p.abi or _unknown_c_type(c)
        if not ok:
            want = "a 32-bit integer half" if p.split else abi.c_spellings(p.dtype)
            raise _mismatch(sig, slot.name, f"{declared} ({want})", f"'{c.type}'", where)


def _check_pointee(sig: KernelSignature, c: CParam, p: Buffer, declared: str, where: str) -> None:
    """A pointer's element type as C states it (through typedefs; a vector type's lanes) against
    the declared tensor; a type the ABI table does not know (a struct, a template's T) is not
    checked here, but after compiling, on the compiler's types (compiled_types.py)."""
    found = abi.pointee(c.base_type)
    if found is None:
        return
    element, lanes = found
    alias = "" if re.search(rf"(?<!\w){re.escape(c.base_type)}(?!\w)", c.type) else f"a typedef of {c.base_type}: "
    what = f"{alias}elements of type {element.name}" + (f", {lanes} at a time" if lanes > 1 else "")
    if not abi.holds(element, abi.lookup(p.type.dtype)):
        raise _mismatch(sig, p.name, declared, f"'{c.type}' ({what})", where)
    inner = p.type.shape[-1] if p.type.shape else 1
    if lanes > 1 and isinstance(inner, int) and inner % lanes:
        raise ManifestError(
            f"kernel {sig.name!r} parameter {p.name!r}: '{c.type}' ({what}) but the innermost dimension "
            f"of {p.type} is {inner}, not a multiple of {lanes}",
            where=where,
            fix=f"declare the tensor in {element.name} elements with an innermost dimension that is a "
            f"multiple of {lanes}, e.g. {element.name}[n,{lanes}] or {element.name}[n] with n a multiple of {lanes}",
        )


def _unknown_c_type(c: CParam) -> bool:
    """A typedef or template parameter the kit cannot see through: not checked."""
    c_type = _value_type(c)
    return c_type not in abi.BY_C_NAME and c_type not in abi.C_UNSUPPORTED and "*" not in c_type


def _mismatch(sig: KernelSignature, param: str, declared: str, source: str, where: str) -> ManifestError:
    origin = f"the source (line {sig.line})" if sig.line else "the compiled kernel"  # line 0: signature.compiled_signature
    return ManifestError(
        f"kernel {sig.name!r} parameter {param!r}: the manifest declares {declared}, {origin} has {source}",
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
    arg_names: tuple[str, ...] = ()  # a generated function's parameter names; () if unknown

    def to_json(self) -> dict:
        data = {
            "name": self.name,
            "args": [str(a) for a in self.args],
            "results": [str(r) for r in self.results],
        }
        return data | ({"arg_names": list(self.arg_names)} if self.arg_names else {})

    @classmethod
    def from_json(cls, data: dict, where: str) -> "FunctionSignature":
        names = tuple(data.get("arg_names", ()))
        if names and (len(names) != len(data["args"]) or not all(isinstance(n, str) for n in names)):
            raise ManifestError(f"function {data['name']!r} has arg_names that do not fit its args", where=where, fix="rebuild")
        return cls(
            data["name"],
            tuple(parse_value_type(a, where) for a in data["args"]),
            tuple(parse_value_type(r, where) for r in data["results"]),
            names,
        )


@dataclass(frozen=True)
class Program:
    """A user's MLIR file whose functions call the generated kernel functions."""

    source: Path
    functions: tuple[FunctionSignature, ...]


Bound = Union[int, float, IndexExpr]


@dataclass(frozen=True)
class InputRange:
    """Where `kitdispatch test` draws an argument's values from: [low, high), as numpy's
    `integers` and `uniform` do. A bound is a number or an index expression over sizes:
    `[0, "V"]` gives valid indices into a table of V rows."""

    low: Bound
    high: Bound

    @classmethod
    def create(cls, value: object, where: str) -> "InputRange":
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ManifestError(
                f"a range is [low, high], got {_shown(value)}", where=where,
                fix='e.g. [0, "V"] (valid indices of a V-long table) or [0.0, 1.0]',
            )
        low, high = (_bound(v, where) for v in value)
        r = cls(low, high)
        if r.constant and not low < high:
            raise ManifestError(f"the range [{low}, {high}) is empty", where=where, fix="give low < high (high is excluded)")
        return r

    @property
    def bounds(self) -> tuple[Bound, Bound]:
        return (self.low, self.high)

    @property
    def constant(self) -> bool:
        return not self.symbols

    @property
    def integral(self) -> bool:
        return not any(isinstance(b, float) for b in self.bounds)

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for b in self.bounds if isinstance(b, IndexExpr) for s in b.symbols))

    def evaluate(self, sizes: dict[str, int]) -> tuple[int | float, int | float]:
        low, high = (b.evaluate(sizes) if isinstance(b, IndexExpr) else b for b in self.bounds)
        return low, high

    def to_json(self) -> list:
        return [str(b) if isinstance(b, IndexExpr) else b for b in self.bounds]


def _bound(value: object, where: str) -> Bound:
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        expr = IndexExpr.parse(value, where)
        return expr if expr.symbols else expr.constant
    raise ManifestError(f"a range bound is a number or a size expression, got {_shown(value)}", where=where, fix='e.g. 0, 1.5 or "V"')


@dataclass(frozen=True)
class Tolerance:
    """How close `kitdispatch test` wants a function's results: |got - expected| <= atol +
    rtol * |expected| (numpy's allclose); a bound left out is 0."""

    rtol: float = 0.0
    atol: float = 0.0

    @classmethod
    def create(cls, value: object, where: str) -> "Tolerance":
        if not isinstance(value, dict) or not value or set(value) - {"rtol", "atol"}:
            raise ManifestError(
                f"a tolerance is a table of rtol and atol, got {_shown(value)}", where=where,
                fix="e.g. { rtol = 1e-4, atol = 1e-5 }",
            )
        for key, number in value.items():
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 <= number < math.inf:
                raise ManifestError(f"{key} must be a number of 0 or more, got {_shown(number)}", where=where, fix="e.g. rtol = 1e-4")
        return cls(float(value.get("rtol", 0.0)), float(value.get("atol", 0.0)))


@dataclass(frozen=True)
class TestSpec:
    """How `kitdispatch test` exercises the module: numpy references, sizes, scalar values,
    input ranges and tolerances."""

    reference: Path | None = None
    sizes: tuple[tuple[str, int], ...] = ()
    seed: int = 0
    # Values of scalar arguments, by name, for every function that takes one of that name
    # (others get small random values).
    scalars: tuple[tuple[str, int | float], ...] = ()  # ints stay exact
    # Ranges of arguments' values (tensors or scalars), by name, for every function that takes one.
    ranges: tuple[tuple[str, InputRange], ...] = ()
    # Tolerances by function name, in place of the one of its element types.
    tolerances: tuple[tuple[str, Tolerance], ...] = ()


@dataclass(frozen=True)
class ModuleSpec:
    """Everything that goes into one .vmfb: kernels, user programs, test settings."""

    name: str
    root: Path
    kernels: tuple[Kernel, ...]
    programs: tuple[Program, ...] = ()
    test: TestSpec = TestSpec()
    # Compile options of every source (Kernel.include_dirs/defines add per kernel).
    include_dirs: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()

    @classmethod
    def create(
        cls,
        name: str,
        kernels: list[Kernel] | tuple[Kernel, ...],
        *,
        root: str | Path = ".",
        programs: list[Program] | tuple[Program, ...] = (),
        test: TestSpec | None = None,
        include_dirs: Sequence[str | Path] = (),
        defines: Sequence[str] = (),
        where: str | None = None,
    ) -> "ModuleSpec":
        where = where or f"module {name!r}"
        check_identifier(name, "module name", where)
        if not kernels:
            raise ManifestError("no kernels described", where=where, fix="add at least one [[kernels]] entry")
        spec = cls(
            name, Path(root), tuple(kernels), tuple(programs), test or TestSpec(),
            check_include_dirs(include_dirs, where), check_defines(defines, where),
        )
        spec._check_unique_functions(where)
        spec._check_test_scalars(where)
        spec._check_test_ranges(where)
        spec._check_test_tolerances(where)
        return spec

    def source_path(self, path: Path) -> Path:
        return path if path.is_absolute() else self.root / path

    def source_flags(self, source: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(include folders, defines) of one source: the module's, then each of its kernels'
        in order; folders resolved against the module's root. Its kernels compile together,
        so two that define one macro differently are refused."""
        kernels = [k for k in self.kernels if self.source_path(k.source) == source]
        dirs = (*self.include_dirs, *(d for k in kernels for d in k.include_dirs))
        defines = (*self.defines, *(d for k in kernels for d in k.defines))
        values: dict[str, str] = {}
        for d in defines:
            name = d.split("=", 1)[0]
            if values.setdefault(name, d) != d:
                raise ManifestError(
                    f"{source.name}: defines {values[name]!r} and {d!r} disagree, and its kernels compile together",
                    where=f"module {self.name!r}",
                    fix="give the macro one value for the source (module-level defines), or put the kernels in separate sources",
                )
        resolved = (str(self.source_path(Path(d))) for d in dirs)
        return tuple(dict.fromkeys(resolved)), tuple(dict.fromkeys(defines))

    def source_stem(self, source: Path) -> str:
        """The name of a source's objects and executable: its file stem, made unique in the
        module where two sources share one (`a/k.cu`, `b/k.cu` -> `k-1c2d3e4f`, `k-5a6b7c8d`),
        also where they differ only in case (`K.cu`, `k.cu`: one file on some file systems)
        or a source is named like a stem so derived."""
        return self._source_stems[self.source_path(Path(source))]

    @functools.cached_property
    def _source_stems(self) -> dict[Path, str]:
        # Each source is hashed by its path as the manifest wrote it (the first spelling).
        written = {}
        for k in self.kernels:
            written.setdefault(self.source_path(k.source), str(Path(k.source)))
        return distinct_names({p: p.stem for p in written}, written, join="-", fold=str.casefold, what="source file names")

    @property
    def signatures(self) -> tuple[FunctionSignature, ...]:
        return tuple(k.signature() for k in self.kernels) + tuple(
            f for p in self.programs for f in p.functions
        )

    def _check_test_scalars(self, where: str) -> None:
        arguments = [p for k in self.kernels for p in k.function_arguments if isinstance(p, Scalar)]
        names = {p.name for p in arguments}
        for name, value in self.test.scalars:
            if name not in names:
                raise ManifestError(
                    f"[test] scalars names {name!r}, which is no scalar argument of a kernel's function",
                    where=where,
                    fix=f"scalar arguments: {', '.join(sorted(names)) or 'none'}",
                )
            for p in arguments:
                if p.name == name and p.abi.kind != "struct":
                    _check_test_value(p, value, where)
        sizes = dict(self.test.sizes)
        for k in self.kernels:
            why = value_out_of_range(k, sizes)
            if why:
                raise ManifestError(
                    f"[test] sizes: kernel {k.name}: {why}", where=where, fix="give sizes the kernel's parameters can hold"
                )

    def _check_test_ranges(self, where: str) -> None:
        """Each range names an argument of some kernel's function and fits its type there;
        its sizes are that function's dimensions."""
        fixed = {name for name, _ in self.test.scalars}
        for name, r in self.test.ranges:
            rwhere = f"{where}: [test] ranges.{name}"
            takers = [(k, p) for k in self.kernels for p in k.function_arguments if p.name == name]
            if not takers:
                known = {p.name for k in self.kernels for p in k.function_arguments}
                raise ManifestError(
                    f"[test] ranges names {name!r}, which is no argument of a kernel's function", where=rwhere,
                    fix=f"arguments: {', '.join(sorted(known)) or 'none'}",
                )
            if name in fixed:
                raise ManifestError(f"{name!r} has both a fixed value ([test] scalars) and a range", where=rwhere, fix="keep one of the two")
            for kernel, p in takers:
                _check_range_fits(r, p.type.dtype if isinstance(p, Buffer) else p.dtype, kernel, rwhere)

    def _check_test_tolerances(self, where: str) -> None:
        functions = [sig.name for sig in self.signatures]
        for name, _ in self.test.tolerances:
            if name not in functions:
                raise ManifestError(
                    f"[test] tolerances names {name!r}, which is no function of the module", where=f"{where}: [test] tolerances.{name}",
                    fix=f"functions: {', '.join(functions)}",
                )

    def _check_unique_functions(self, where: str) -> None:
        for k in self.kernels:
            if k.name in {o.name for o in self.kernels if o is not k and o.source == k.source}:
                raise ManifestError(
                    f"kernel {k.name!r} is described twice for {k.source}",
                    where=where,
                    fix="describe each kernel once; give variants their own C name",
                )
        # Who defines each function: kernels (whose function name may be derived from a C++
        # name, `scale<float>` -> scale_float) and programs.
        owners = [(k.function, f"kernel {k.name!r} ({k.source})") for k in self.kernels]
        owners += [(f.name, f"program {p.source}") for p in self.programs for f in p.functions]
        seen: dict[str, str] = {}
        for name, owner in owners:
            if name in seen:
                raise ManifestError(
                    f"function {name!r} is defined twice: by {seen[name]} and by {owner}",
                    where=where,
                    fix="give the kernel a distinct 'function' name",
                )
            seen[name] = owner


def _check_range_fits(r: InputRange, dtype: str, kernel: Kernel, where: str) -> None:
    """A range of an argument of `kernel` of type `dtype`: integral for integers and within
    the type; sizes that are dimensions of the kernel's function."""
    row = abi.lookup(dtype)
    if row.kind == "struct":
        raise ManifestError(f"a {dtype} argument takes no range", where=where, fix="fix its value with [test] scalars")
    if row.kind != "float" and not r.integral:
        raise ManifestError(
            f"the argument is {dtype} in {kernel.function}, and the range [{r.low}, {r.high}) is not integral", where=where,
            fix="give integer bounds (high is excluded: [0, \"V\"] gives 0 to V-1)",
        )
    if row.kind != "float" and r.constant:
        info = np.iinfo(row.dtype) if row.kind != "bool" else np.iinfo(np.uint8)
        top = 1 if row.kind == "bool" else info.max
        if r.low < info.min or r.high - 1 > top:
            raise ManifestError(f"[{r.low}, {r.high}) does not fit {dtype}", where=where, fix=f"keep it within [{info.min}, {top + 1})")
    sig = kernel.signature()
    sizes = {d for t in (*sig.args, *sig.results) if isinstance(t, TensorType) for d in t.symbols}
    for symbol in r.symbols:
        if symbol not in sizes:
            raise ManifestError(
                f"the range uses {symbol!r}, which is no dimension of {kernel.function}", where=where,
                fix=f"use its dimensions: {', '.join(sorted(sizes)) or 'none'}",
            )
