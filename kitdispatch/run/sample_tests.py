"""Sample test runs: build a sample (or take a built one), run every function on the cuda
device with generated inputs, and compare with the sample's numpy references."""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kitdispatch.errors import KitError
from kitdispatch.describe.manifest import MANIFEST_NAME
from kitdispatch.describe.record import RECORD_SUFFIX, read_record
from kitdispatch.run.module import Module, check_device_uri, cuda_status
from kitdispatch.run.device import numpy_dtype
from kitdispatch.run.arguments import sizing_scalars
from kitdispatch.describe import abi
from kitdispatch.describe.types import FunctionSignature, ScalarType, TensorType
from kitdispatch.describe.module import InputRange, Tolerance

DEFAULT_SIZE = 257  # not a multiple of common block sizes, so bounds checks get exercised


@dataclass(frozen=True)
class CaseResult:
    module: str
    function: str
    status: str  # "pass", "fail", "skip"
    detail: str
    max_error: float | None = None

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("module", "function", "status", "detail", "max_error")}


@dataclass
class Report:
    cases: list[CaseResult] = field(default_factory=list)
    device: str = ""

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.cases)

    @property
    def ok(self) -> bool:
        return self.count("fail") == 0

    @property
    def checked_nothing(self) -> bool:
        """No function was compared with a reference: green would mean nothing."""
        return self.count("pass") == 0 and self.count("fail") == 0

    def summary(self) -> str:
        line = f"{self.count('pass')} passed, {self.count('fail')} failed, {self.count('skip')} skipped"
        return line + (" (nothing was checked)" if self.checked_nothing else "")

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "passed": self.count("pass"),
            "failed": self.count("fail"),
            "skipped": self.count("skip"),
            "cases": [c.to_json() for c in self.cases],
        }


def find_targets(path: Path) -> list[Path]:
    """A sample folder (with kitdispatch.toml), a build folder (with a build record), or a
    folder of either; subfolders holding neither (a model build, notes) are passed over."""
    path = Path(path)
    found = _targets_under(path)
    if not found:
        raise KitError(
            f"nothing to test in {path}",
            fix=f"pass a sample folder (with {MANIFEST_NAME}), a build folder, or a folder of them",
        )
    return found


def _targets_under(path: Path, seen: set[tuple[int, int]] | None = None) -> list[Path]:
    """Targets at `path` and below; each folder is visited once (by device and inode), so a
    symlink loop, or a link back up the tree, ends the walk instead of recursing without end."""
    seen = set() if seen is None else seen
    if path.is_file() and path.name.endswith(RECORD_SUFFIX):
        return [path]
    try:
        st = path.stat()
    except (OSError, RuntimeError):  # missing, or a symlink loop itself
        return []
    if (st.st_dev, st.st_ino) in seen:
        return []
    seen.add((st.st_dev, st.st_ino))
    if (path / MANIFEST_NAME).is_file():
        return [path]
    records = sorted(p for p in path.glob(f"*{RECORD_SUFFIX}") if p.is_file())
    if records:
        return records
    if not path.is_dir():
        return []
    try:
        subs = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    return [t for sub in subs for t in _targets_under(sub, seen)]


def verify(
    paths: Sequence[str | Path],
    *,
    build_module: Callable[[Path, Path], Path] | None,
    device: str = "cuda",
    log: Callable[[str], None] = lambda _: None,
) -> Report:
    """Tests every target under `paths`. `build_module(sample_dir, out_dir)` builds a sample
    and returns its build record; it is only needed for sample folders."""
    check_device_uri(device)
    status = cuda_status(device)
    report = Report(device=status.reason)
    targets = [t for p in paths for t in find_targets(Path(p))]
    with tempfile.TemporaryDirectory(prefix="kitdispatch-test-") as tmp:
        for i, target in enumerate(targets):
            record = target
            if not target.name.endswith(RECORD_SUFFIX):
                if build_module is None:
                    raise KitError(f"{target} is a sample, not a build", fix="build it first or install the compiler")
                log(f"building {target}")
                record = build_module(target, Path(tmp) / str(i))
            report.cases += _verify_record(record, status.available, status.reason, device, log)
    return report


def _verify_record(record_path: Path, available: bool, reason: str, device: str, log: Callable[[str], None]) -> list[CaseResult]:
    record = read_record(record_path)
    name, sigs = record.name, record.functions
    if record.vmfb is None:
        return [CaseResult(name, s.name, "skip", "built without a .vmfb (kitdispatch gen)") for s in sigs]
    vmfb = record.check_file(record_path.parent, record.vmfb)
    if not available:
        return [CaseResult(name, s.name, "skip", "no CUDA device") for s in sigs]
    test = record.test
    ranges = dict(test.ranges)
    reference = None
    if test.reference:
        reference = _load_reference(record.check_file(record_path.parent, test.reference.name))
    module = Module(vmfb, device=device)
    rng = np.random.default_rng(test.seed)
    sizes = dict(test.sizes)
    results = []
    for sig in sigs:
        ref = getattr(reference, sig.name, None) if reference else None
        if ref is None:
            why = "no reference file ([test] reference)" if reference is None else f"the reference file has no function {sig.name!r}"
            results.append(CaseResult(name, sig.name, "skip", why))
            continue
        log(f"running {name}.{sig.name}")
        tolerance = dict(test.tolerances).get(sig.name)
        results.append(_verify_function(
            name, module, sig, ref, sizes, rng, dict(test.scalars), ranges=ranges, tolerance=tolerance,
        ))
    return results


def _verify_function(
    name: str, module: Module, sig: FunctionSignature, ref: Callable[..., object], sizes: dict[str, int], rng: np.random.Generator,
    scalars: dict[str, int | float] | None = None, *, ranges: dict[str, InputRange] | None = None, tolerance: Tolerance | None = None,
) -> CaseResult:
    """One function against its reference. `ranges` (argument name -> InputRange) say where
    inputs are drawn from; `tolerance` replaces the one of the result's element type."""
    symbols = {s: sizes.get(s, DEFAULT_SIZE) for t in sig.args + sig.results if isinstance(t, TensorType) for s in t.symbols}
    names = sig.arg_names or (None,) * len(sig.args)
    fixed = [(scalars or {}).get(n) for n in names]
    ranges = ranges or {}
    try:
        for i, arg in sizing_scalars(sig).items():  # a scalar that sizes a result: that size
            if fixed[i] is None and arg in ranges:
                fixed[i] = int(rng.integers(*_limits(ranges[arg], arg, sig.args[i].dtype, symbols)))
            symbols[arg] = fixed[i] = symbols[arg] if fixed[i] is None else int(fixed[i])
        args = [
            _make_input(t, symbols, rng, _limits(ranges[n], n, t.dtype, symbols) if n in ranges else None)
            if v is None else _fixed_scalar(t, v)
            for t, v, n in zip(sig.args, fixed, names)
        ]
    except (ValueError, MemoryError) as exc:
        return CaseResult(name, sig.name, "fail", f"cannot make inputs of sizes {symbols}: {exc}")
    try:
        expected = ref(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])
    except Exception as exc:  # the user's reference: its failure is this case's
        return CaseResult(name, sig.name, "fail", f"the reference raised {type(exc).__name__}: {exc}")
    try:
        got = module.call(sig.name, *args)
    except Exception as exc:  # report the failure of this case and go on with the others
        return CaseResult(name, sig.name, "fail", f"call failed: {str(exc).splitlines()[0]}")
    got_list = list(got) if isinstance(got, tuple) else [got]
    exp_list = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    shape_text = ", ".join(f"{s}={v}" for s, v in symbols.items())
    if len(got_list) != len(exp_list):
        return CaseResult(name, sig.name, "fail", f"{len(got_list)} results, reference gives {len(exp_list)}")
    worst = 0.0
    for i, (g, e, t) in enumerate(zip(got_list, exp_list, sig.results)):
        e = np.asarray(e)
        if g.shape != e.shape:
            return CaseResult(name, sig.name, "fail", f"result {i}: shape {g.shape}, reference {e.shape}")
        ok, err = _compare(g, e, _tolerance_dtype(sig, t), tolerance)
        worst = max(worst, err)
        if not ok:
            return CaseResult(name, sig.name, "fail", f"result {i} differs from the reference ({shape_text})", err)
    return CaseResult(name, sig.name, "pass", shape_text, worst)


def _tolerance_dtype(sig: FunctionSignature, result: TensorType) -> str:
    """A result is as precise as the least precise float it was computed from: f16 inputs
    accumulated in f32 (tensor cores) are checked with the f16 tolerance."""
    if abi.lookup(result.dtype).tolerance is None:
        return result.dtype  # integer results match exactly
    return abi.tolerance_type([t.dtype for t in (*sig.args, result)])


def _make_input(t: ScalarType | TensorType, symbols: dict[str, int], rng: np.random.Generator, limits: tuple | None = None) -> np.ndarray | float | int:
    """Random values for an argument: from `limits` ([low, high), [test] ranges) where given,
    else small ones (floats in [-2, 2), integers in [-100, 100), scalars from 1 to 7)."""
    row = abi.lookup(t.dtype)
    if isinstance(t, ScalarType):
        if row.kind == "struct":  # small integers in every 32-bit word, as bytes
            return rng.integers(1, 8, size=row.words).astype("<i4").tobytes()[: row.size]
        if row.kind == "float":
            return float(rng.uniform(*(limits or (0.5, 2.0))))
        return int(rng.integers(*(limits or (1, 8)), dtype=_draw_type(limits)))
    shape = tuple(symbols[d] if isinstance(d, str) else d for d in t.shape)
    if row.kind == "float":
        return rng.uniform(*(limits or (-2.0, 2.0)), size=shape).astype(numpy_dtype(t.dtype))
    limits = limits or (0 if row.kind == "uint" else -100, 100)
    return rng.integers(*limits, size=shape, dtype=_draw_type(limits)).astype(numpy_dtype(t.dtype))


def _draw_type(limits: tuple | None):
    """numpy draws integers as int64; a range above it (u64) as uint64."""
    return np.uint64 if limits and limits[1] > 2**63 else np.int64


def _limits(r: InputRange, arg: str, dtype: str, symbols: dict[str, int]) -> tuple:
    """A [test] range at this case's sizes: [low, high), checked against the argument's type."""
    try:
        low, high = r.evaluate(symbols)
    except KeyError as exc:
        raise ValueError(f"the range of {arg} uses {exc}, which this function has no size for") from None
    if not low < high:
        raise ValueError(f"the range of {arg}, [{low}, {high}), is empty")
    row = abi.lookup(dtype)
    if row.kind in ("sint", "uint"):
        info = np.iinfo(row.dtype)
        if low < info.min or high - 1 > info.max:
            raise ValueError(f"the range of {arg}, [{low}, {high}), does not fit {dtype}")
    return low, high


def _fixed_scalar(t: ScalarType | TensorType, value: float) -> float | int:
    """A value from [test] scalars, as the type of the argument takes it."""
    return value if abi.lookup(t.dtype).kind == "float" else int(value)


def _compare(got: np.ndarray, expected: np.ndarray, dtype: str, given: Tolerance | None = None) -> tuple[bool, float]:
    g = got.astype(np.float64)
    e = expected.astype(np.float64)
    if np.isnan(g).any() and not np.isnan(e).any():
        return False, float("nan")
    err = float(np.max(np.abs(g - e))) if g.size else 0.0
    tolerance = (given.rtol, given.atol) if given is not None else abi.lookup(dtype).tolerance
    if tolerance is None:  # integers: compared as they are (float64 would round above 2^53)
        return bool(np.array_equal(got, expected)), err
    rtol, atol = tolerance
    return bool(np.allclose(g, e, rtol=rtol, atol=atol)), err


def _load_reference(path: Path):
    spec = importlib.util.spec_from_file_location(f"kitdispatch_reference_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise KitError(f"cannot load reference {path}", fix="make it a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's reference file: its error is theirs to fix, shown as one line
        raise KitError(f"the reference file failed to load: {type(exc).__name__}: {exc}", where=str(path), fix="fix the reference file") from None
    return module


def format_table(report: Report) -> str:
    rows = [("module", "function", "result", "max abs error", "detail")]
    for c in report.cases:
        err = "" if c.max_error is None else f"{c.max_error:.3g}"
        rows.append((c.module, c.function, c.status.upper(), err, c.detail))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
