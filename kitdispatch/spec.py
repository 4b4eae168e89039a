"""Describing kernels: what each kernel takes, how it is launched, and the callable around it.

These frozen dataclasses are the Python API for describing kernels; the TOML manifest
(`manifest.py`) produces exactly the same objects. Validation happens here, once, so both
front ends give the same errors.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Union

from .errors import ManifestError

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
# Scalars that travel as exactly one 32-bit push constant.
SCALAR_TYPES = ("i32", "u32", "f32")
INTEGER_SCALARS = ("i32", "u32")

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TENSOR_RE = re.compile(r"^\s*([a-z0-9]+)\s*\[(.*)\]\s*$")
MAX_WORKGROUP_THREADS = 1024
OBJECT_FORMATS = ("ptx", "cubin", "fatbin")


def check_identifier(name: object, what: str, where: str) -> str:
    """C and MLIR share this identifier alphabet; anything else is refused up front."""
    if not isinstance(name, str) or not _IDENT_RE.match(name):
        raise ManifestError(
            f"{what} {name!r} is not a valid identifier",
            where=where,
            fix="use letters, digits and '_' only, not starting with a digit",
        )
    return name


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
            if dim.isdigit():
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
        return "i32" if self.dtype == "u32" else self.dtype

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
        text = str(value)
        try:
            tree = ast.parse(text.strip(), mode="eval").body
        except SyntaxError as exc:
            raise ManifestError(
                f"cannot parse index expression {text!r}: {exc.msg}",
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
    """A by-value parameter, passed as one 32-bit push constant.

    `value` says where it comes from: an index expression over dimension symbols
    (e.g. 'n' or 'm * k'), a literal number, or None, which makes it an argument of
    the generated function (or the dimension of the same name, if there is one).
    """

    name: str
    dtype: str
    value: IndexExpr | float | None = None


Param = Union[Buffer, Scalar]


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
        where: str | None = None,
    ) -> "Kernel":
        where = where or f"kernel {name!r}"
        check_identifier(name, "kernel name", where)
        function = check_identifier(function or name, "function name", where)
        size = _pad3(workgroup_size, 1, f"{where}: workgroup_size")
        for n in size:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ManifestError(
                    f"workgroup_size {list(workgroup_size)} must hold positive integers",
                    where=where,
                    fix="give the CUDA block size, e.g. [256] or [16, 16]",
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
        kernel = cls(name, Path(source), tuple(params), size, count, function, format)
        kernel._validate(where)
        return kernel

    # -- derived views -------------------------------------------------------------

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
                if s.dtype not in INTEGER_SCALARS:
                    raise ManifestError(
                        f"scalar {s.name!r} of type {s.dtype} takes an index expression",
                        where=where,
                        fix="give a float scalar a number as value, or leave value out",
                    )
                self._check_symbols(s.value.symbols, set(self.dimension_symbols), where, f"the value of {s.name!r}")

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
