"""Modules: the functions a build exports, their programs and sample tests, and the `ModuleSpec`
that holds a whole build description."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Union
import numpy as np
from kitdispatch.describe import abi
from kitdispatch.errors import ManifestError
from kitdispatch.describe.index_expr import IndexExpr
from kitdispatch.describe.kernel import Buffer, Kernel, Scalar, _check_test_value, check_defines, check_include_dirs, value_out_of_range
from kitdispatch.describe.names import _shown, check_identifier, distinct_names
from kitdispatch.describe.types import FunctionSignature, TensorType


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

    def to_json(self) -> dict:
        """As the build record keeps it: the reference by its file name in the output folder."""
        return {
            "reference": self.reference.name if self.reference else None,
            "sizes": dict(self.sizes),
            "seed": self.seed,
            "scalars": dict(self.scalars),
            "ranges": {name: r.to_json() for name, r in self.ranges},
            "tolerances": {name: {"rtol": t.rtol, "atol": t.atol} for name, t in self.tolerances},
        }

    @classmethod
    def from_json(cls, data: dict, where: str, *, check_name: Callable[[object], str], check_size: Callable[[object], int],
                  check_seed: Callable[[object], int], check_number: Callable[[object], int | float]) -> "TestSpec":
        """The record's form back; the checks are the record reader's (a damaged record is its error)."""
        reference = data["reference"]
        return cls(
            reference=None if reference is None else Path(check_name(reference)),
            sizes=tuple((check_name(k), check_size(v)) for k, v in data["sizes"].items()),
            seed=check_seed(data["seed"]),
            scalars=tuple((check_name(k), check_number(v)) for k, v in data.get("scalars", {}).items()),
            ranges=tuple((check_name(k), InputRange.create(v, f"{where}: test.ranges.{k}")) for k, v in data.get("ranges", {}).items()),
            tolerances=tuple((check_name(k), Tolerance.create(v, k)) for k, v in data.get("tolerances", {}).items()),
        )


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
