"""Kernels: their parameters (buffers, scalars), launch and what model ops they replace."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, Union
from kitdispatch.describe import abi
from kitdispatch.errors import ManifestError
from kitdispatch.describe.index_expr import Condition, IndexExpr
from kitdispatch.describe.limits import (
    DEFAULT_DYNAMIC_SHARED_MEMORY_MAX, MAX_DYNAMIC_SHARED_MEMORY, MAX_GRID, MAX_WORKGROUP_THREADS, OPT_IN_SHARED_MEMORY,
)
from kitdispatch.describe.choices import ObjectFormat
from kitdispatch.describe.names import WIDE_HALVES, _IDENT_RE, _shown, check_identifier, check_kernel_name, default_function_name
from kitdispatch.describe.types import FunctionSignature, ScalarType, TensorType
from kitdispatch.describe.op_names import ATTENTION_MASKS, EPILOGUE_OPS, EPILOGUES, PATTERN_OPS, REPLACEABLE_OPS  # `replaces`; models/ops decides per op


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
    op must match; for a matmul the epilogue the kernel computes after the product (the
    elementwise ops it replaces with the op, describe/op_names.py's EPILOGUES). Each op is still
    checked against the params (replace.py)."""

    ops: tuple[str, ...]
    multiple_of: tuple[tuple[str, int], ...] = ()
    max_size: tuple[tuple[str, int], ...] = ()
    dimension: int | None = None
    pattern: Path | None = None
    when: Condition | None = None  # a condition over the sizes (a tile config's shape class)
    arithmetic: str | None = None  # how an f32 kernel multiplies (ARITHMETICS); "tf32" only on request
    mask: str | None = None  # an attention kernel's mask (ATTENTION_MASKS); None: it applies none
    epilogue: str = "none"

    @classmethod
    def create(
        cls,
        ops: Sequence[str],
        *,
        multiple_of: dict[str, int] | None = None,
        max_size: dict[str, int] | None = None,
        dimension: int | None = None,
        pattern: str | Path | None = None,
        when: str | None = None,
        arithmetic: str | None = None,
        mask: str | None = None,
        epilogue: str | None = None,
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
        if (pattern is None) == any(op in PATTERN_OPS for op in ops):
            raise ManifestError(
                "a linalg.generic needs a pattern, and a pattern is for linalg.generic only",
                where=where,
                fix='replaces = ["linalg.generic"] with replace_when = { pattern = "FILE.mlir" } (one linalg.generic in a func)',
            )
        if pattern is not None and not isinstance(pattern, (str, Path)):
            raise ManifestError(f"pattern {pattern!r} is not a file name", where=where, fix='e.g. pattern = "bias_gelu.mlir"')
        if arithmetic is not None and arithmetic not in ARITHMETICS:
            raise ManifestError(
                f"arithmetic {arithmetic!r} is not one the kit knows", where=where, fix=f"use one of {', '.join(ARITHMETICS)}"
            )
        if mask is not None and (mask not in ATTENTION_MASKS or list(ops) != ["iree_linalg_ext.attention"]):
            raise ManifestError(
                f"mask {mask!r}: only a kernel that replaces iree_linalg_ext.attention alone says its mask, one of {', '.join(ATTENTION_MASKS)}",
                where=where,
                fix='e.g. replaces = ["iree_linalg_ext.attention"] with replace_when = { mask = "causal" }',
            )
        return cls(
            tuple(dict.fromkeys(ops)),
            _positive_sizes(multiple_of or {}, "multiple_of", where),
            _positive_sizes(max_size or {}, "max", where),
            dimension,
            Path(pattern) if pattern is not None else None,
            Condition.parse(when, f"{where}: when") if when is not None else None,
            arithmetic,
            mask,
            _epilogue(epilogue, ops, where),
        )

    @property
    def limited_symbols(self) -> tuple[str, ...]:
        conditioned = self.when.symbols if self.when is not None else ()
        return tuple(dict.fromkeys([*(s for s, _ in self.multiple_of + self.max_size), *conditioned]))


# How a kernel of f32 inputs multiplies (replace_when.arithmetic): "3xtf32" splits each operand in
# two TF32 halves (f32-level error); "tf32" rounds the inputs to TF32 (~1e-3 relative error) and
# replaces ops only where the model build asks for it (BuildOptions tf32, --tf32).
ARITHMETICS = {"3xtf32": "3xTF32 (f32-level error)", "tf32": "TF32 (inputs rounded to 10 bits, ~1e-3 relative error)"}


def _epilogue(epilogue: object, ops: Sequence[str], where: str) -> str:
    """replace_when's `epilogue`: one of EPILOGUES, for matmul kinds only; None is "none"."""
    if epilogue is None:
        return "none"
    if not isinstance(epilogue, str) or epilogue not in EPILOGUES:
        raise ManifestError(
            f"unknown epilogue {epilogue!r}", where=where, fix=f"use one of {', '.join(EPILOGUES)} (kernels/matmul/README.md: their formulas)"
        )
    others = [op for op in ops if op not in EPILOGUE_OPS]
    if epilogue != "none" and others:
        raise ManifestError(
            f"an epilogue is for {', '.join(EPILOGUE_OPS[:-1])} and {EPILOGUE_OPS[-1]} only, not {', '.join(others)}",
            where=where,
            fix=f'replaces = ["linalg.matmul"] with replace_when = {{ epilogue = "{epilogue}" }}',
        )
    return epilogue


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
    format: ObjectFormat | None = None  # object format for this kernel's source; None: the build's
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
    # Architectures whose objects reserve another `dynamic_shared_memory` ((arch name, bytes),
    # e.g. ("sm_90a", 183296)): a Hopper kernel can take 227 KiB where sm_86 gives 99 KiB.
    shared_memory_by_arch: tuple[tuple[str, int], ...] = ()

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
        dynamic_shared_memory: int | str | IndexExpr | Mapping[str, int] = 0,
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
        dynamic_shared_memory, by_arch = _shared_memory_table(dynamic_shared_memory, dynamic_shared_memory_max, where)
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
        if format is not None and format not in ObjectFormat.choices():
            raise ManifestError(
                f"unknown object format {format!r}", where=where, fix=f"use one of {', '.join(ObjectFormat.choices())}"
            )
        format = ObjectFormat(format) if format is not None else None
        if replaces is not None and not isinstance(replaces, Replaces):
            replaces = Replaces.create(replaces, where=f"{where}: replaces")
        kernel = cls(
            name, Path(source), tuple(params), size, count, function, format, symbol, dynamic_shared_memory, cpp_name, replaces,
            need, check_include_dirs(include_dirs, where), check_defines(defines, where), by_arch,
        )
        kernel._validate(where)
        return kernel

    # -- derived views -------------------------------------------------------------

    @property
    def entry(self) -> str:
        """The kernel's name in the compiled object, and its export name in the MLIR."""
        return self.symbol or self.name

    def shared_memory_for(self, arch: str) -> int:
        """The dynamic shared memory each launch of this kernel's object for `arch` reserves."""
        return dict(self.shared_memory_by_arch).get(arch, self.dynamic_shared_memory)

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
    def _check_symbols(symbols: Iterable[str], known: set[str], where: str, what: str) -> None:
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


_ARCH_KEY_RE = re.compile(r"sm_\d+[af]?\Z", re.ASCII)
DEFAULT_ARCH_KEY = "default"


def _shared_memory_table(value: object, most: object, where: str) -> tuple[object, tuple[tuple[str, int], ...]]:
    """A per-architecture table ({"default": bytes, "sm_90a": bytes, ...}) as (the default,
    the other entries); any other value as it is, with no entries. Each architecture's bytes
    must fit what its GPUs give a block (limits.OPT_IN_SHARED_MEMORY)."""
    if not isinstance(value, Mapping):
        return value, ()
    key_fix = 'give {default = BYTES, sm_90a = BYTES, ...}: architectures as --arch names them, each an integer'
    if most is not None:
        raise ManifestError(
            "dynamic_shared_memory_max is for a dynamic_shared_memory that depends on sizes, not for a table of architectures",
            where=where,
            fix="leave it out",
        )
    if DEFAULT_ARCH_KEY not in value:
        raise ManifestError(
            f"the dynamic_shared_memory table {dict(value)!r} has no 'default' entry (for the architectures it does not name)",
            where=where,
            fix=key_fix,
        )
    entries = []
    for key, count in value.items():
        if key == DEFAULT_ARCH_KEY:
            continue
        if not isinstance(key, str) or not _ARCH_KEY_RE.match(key):
            raise ManifestError(f"dynamic_shared_memory names {key!r}, which is no architecture", where=where, fix=key_fix)
        count = _byte_count(count, f"dynamic_shared_memory[{key}]", where)
        limit = OPT_IN_SHARED_MEMORY.get(int(key[3:].rstrip("af")))
        if limit is not None and count > limit:
            raise ManifestError(
                f"dynamic_shared_memory[{key}] = {count} bytes is more than a block may have on {key} ({limit})",
                where=where,
                fix=f"reserve at most {limit} bytes (less the kernel's static __shared__ memory) for {key}",
            )
        entries.append((key, count))
    default = value[DEFAULT_ARCH_KEY]
    if isinstance(default, bool) or not isinstance(default, int):
        raise ManifestError(
            f"dynamic_shared_memory[default] {default!r} is not a byte count (a table takes integers, not expressions)",
            where=where,
            fix=key_fix,
        )
    return default, tuple(sorted(entries))


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


def _pad3(values: object, fill: int, where: str) -> tuple:
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    if not 1 <= len(values) <= 3:
        raise ManifestError(
            f"expected 1 to 3 entries (x, y, z), got {len(values)}", where=where, fix="e.g. [64] or [16, 16, 1]"
        )
    return tuple(values + [fill] * (3 - len(values)))
