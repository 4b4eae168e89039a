"""Running a model built by `build_model` on the GPU: the replaced model against IREE's own
(baseline) build, and a build's dispatches with the advisor's columns (models/advisor.py).

Needs only the runtime: a folder built on another machine (`build --model ... --with-baseline`)
is all it reads. Outputs are compared in process through `iree.runtime`. Whole calls are
timed by `iree-benchmark-module` (its JSON report, inputs from .npy files). Device time per
dispatch comes from Nsight Compute (`ncu`, `gpu__time_duration`, clocks left alone) over
iree-benchmark-module: IREE 3.13's own HAL profiler answers "CUDA HAL-native profiling is
not implemented" on the cuda device (measured on an H100), so it cannot serve.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kitdispatch._files import open_regular
from kitdispatch._proc import run_tool
from kitdispatch.errors import KitError, ToolError, UsageError
from kitdispatch.iree.tools import find_tool
from kitdispatch.describe.names import ASYNC_SUFFIX, TRANSIENTS_SUFFIX
from kitdispatch.describe.model_record import ModelFunction, ModelRecord, read_model_record
from kitdispatch.describe.probe_record import TuneEntry, probes_record_name, read_tune_record, tune_record_name
from kitdispatch.models.advisor import Advice, Peaks, Timed, advise, format_advice, peaks_for, report_ops, unnumbered
from kitdispatch.run.cuda_driver import CudaDevice, driver_info
from kitdispatch.run.device import numpy_dtype
from kitdispatch.run.module import PARAMETER_SCOPE, Module, load_module, require_cuda
from kitdispatch.describe import abi

BENCH_TIMEOUT_S = 600.0
WORST_SHOWN = 5


@dataclass(frozen=True)
class DispatchTime:
    """Device time of one executable function, over every dispatch of it in the profile.
    The median is the figure to read: the program's first kernel runs while the GPU's clock
    is still rising from idle (an H100 at 345 MHz: the first of ten matmuls took 3051 us, the
    other nine 142 us, measured), which a mean over a few calls carries."""

    name: str
    count: int
    average_us: float
    total_us: float
    median_us: float
    per_call_us: float  # the median times the dispatches per call

    def to_json(self) -> dict:
        return {"name": self.name, "count": self.count, "average_us": self.average_us, "total_us": self.total_us,
                "median_us": self.median_us, "per_call_us": self.per_call_us}


@dataclass(frozen=True)
class Comparison:
    function: str
    agree: bool
    max_abs_error: float
    tolerance: str
    worst: tuple[str, ...]  # the worst elements, where the outputs disagree
    call_us: dict[str, float]  # "replaced"/"baseline" -> median whole call, as IREE alone calls it (`call_tool`)
    prepared_us: dict[str, float] = field(default_factory=dict)  # the same, through the kit's prepared call
    call_tool: str = "iree-benchmark-module"
    dispatches: dict[str, tuple[DispatchTime, ...]] = field(default_factory=dict)
    kernel_names: tuple[str, ...] = ()  # exports of the kit's kernels in the replaced module
    replaced_ops: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def replaced_dispatches(self) -> tuple[tuple[DispatchTime, ...], tuple[DispatchTime, ...]]:
        """(the replaced module's dispatches the baseline lacks: the kit's kernels, and any op
        that IREE had fused into the replaced one and now compiles alone, such as an f16
        matmul's truncation; the baseline's dispatches the replaced module lacks). Names are
        compared without their numbers, which shift when a dispatch goes. Where IREE had fused
        the replaced op into a dispatch that stays (a bias and activation into their matmul),
        nothing went: only the whole call compares."""
        mine, base = self.dispatches.get("replaced", ()), self.dispatches.get("baseline", ())
        mine_names, base_names = {unnumbered(t.name) for t in mine}, {unnumbered(t.name) for t in base}
        kit = tuple(t for t in mine if t.name in self.kernel_names or unnumbered(t.name) not in base_names)
        iree = tuple(t for t in base if unnumbered(t.name) not in mine_names)
        return kit, iree

    def to_json(self) -> dict:
        return {
            "function": self.function,
            "agree": self.agree,
            "max_abs_error": self.max_abs_error,
            "tolerance": self.tolerance,
            "worst": list(self.worst),
            "call_us": self.call_us,
            "prepared_us": self.prepared_us,
            "call_tool": self.call_tool,
            "dispatches": {k: [d.to_json() for d in v] for k, v in self.dispatches.items()},
            "kernel_names": list(self.kernel_names),
            "replaced_ops": list(self.replaced_ops),
            "replaced_dispatches": [
                {"kit": [d.to_json() for d in kit], "iree": [d.to_json() for d in iree]} for kit, iree in [self.replaced_dispatches()]
            ],
            "notes": list(self.notes),
            "timing_tools": f"whole call: {self.call_tool} (median), and the kit's prepared call (median of loops, one wait each); "
            "dispatches: Nsight Compute gpu__time_duration",
        }


def compare_model(
    built: str | Path,
    *,
    inputs: str | Path | None = None,
    function: str | None = None,
    device: str = "cuda",
    seed: int = 0,
    repetitions: int = 50,
    parameters: str | Path | None = None,
) -> Comparison:
    """Runs the replaced and the baseline module of a `build_model` folder (built with the
    baseline) on the same inputs, checks the outputs agree, and times both. `parameters`: the
    file the weights are in, for a model imported with them externalized (both modules read it)."""
    folder, record = read_model_record(built)
    if not record.baseline_vmfb:
        raise UsageError(
            f"{folder} has no baseline module",
            fix="build it with the baseline: kitdispatch build PROJECT --model MODEL --with-baseline -o DIR",
        )
    require_cuda(device)
    vmfbs = {"replaced": folder / record.vmfb, "baseline": folder / record.baseline_vmfb}
    modules = {k: load_module(v, device=device, parameters=parameters) for k, v in vmfbs.items()}
    sig = record.function(function)
    args = load_inputs(inputs, sig) if inputs else random_inputs(sig, seed)
    drawn = () if inputs else input_notes(sig)
    outputs = {k: _call(m, sig.name, args) for k, m in modules.items()}
    arithmetic = loosest_arithmetic(r.entry.get("arithmetic") for r in record.replaced)
    agree, err, tol, worst = check_agreement(outputs["replaced"], outputs["baseline"], sig, arithmetic)
    notes: list[str] = list(drawn)
    with tempfile.TemporaryDirectory(prefix="kitdispatch-compare-") as tmp:
        flags = _input_flags(args, Path(tmp)) + _parameter_flags(parameters)
        calls, call_tool = iree_calls(vmfbs, modules, sig.name, args, flags, device=device, repetitions=repetitions)
        prepared = {}
        for k, m in modules.items():
            try:
                prepared[k] = prepared_call_us(m, sig.name, args, repetitions=repetitions)
            except KitError as exc:  # a model function without f$async
                notes.append(f"no prepared call for the {k} module: {exc.what}")
                continue
            if getattr(m.function(sig.name), "takes_transients", False):
                notes.append(f"the kit's prepared call of the {k} module runs {sig.name}{TRANSIENTS_SUFFIX}, its transient memory "
                             f"passed by the kit, so calls overlap; IREE's own call runs {sig.name}{ASYNC_SUFFIX}, which returns only "
                             "once the GPU has run it (README: Calls that do not block)")
        dispatches = {}
        for k, v in vmfbs.items():
            try:
                dispatches[k] = profile_dispatches(v, sig.name, flags, Path(tmp), device=device)
            except ToolError as exc:
                notes.append(f"no dispatch times for the {k} module: {exc.what}")
    return Comparison(
        function=sig.name,
        agree=agree,
        max_abs_error=err,
        tolerance=tol,
        worst=worst,
        call_us=calls,
        prepared_us=prepared,
        call_tool=call_tool,
        dispatches=dispatches,
        kernel_names=tuple(dict.fromkeys(r.kernel_entry for r in record.replaced)),
        replaced_ops=tuple(f"{r.op} at {r.location}" for r in record.replaced),
        notes=tuple(notes),
    )


# --------------------------------------------------------------------------- inputs


# Integer inputs that index no gather the build found (an attention mask, a count, a model
# built before index_bounds were recorded): their range is unknown, so they are drawn from a
# small range that is never negative, 0 or 1, and `--inputs FILE.npz` gives other values.
DEFAULT_INTEGER_RANGE = (0, 2)  # [low, high)


def random_inputs(sig: ModelFunction, seed: int = 0) -> list[np.ndarray]:
    """Inputs of the function's types: floats from -2..2, integers that index a gather within
    its size (index_bounds, found at build time), other integers from DEFAULT_INTEGER_RANGE."""
    rng = np.random.default_rng(seed)
    out = []
    for i, t in enumerate(sig.inputs):
        if any(d is None for d in t.shape):
            raise KitError(
                f"input {i} of {sig.name} has dynamic sizes ({list(t.shape)})",
                fix="pass --inputs FILE.npz with arrays of the sizes to run",
            )
        row = abi.BY_NAME.get(t.dtype)
        if row is None or not row.tensor:
            raise KitError(f"input {i} has element type {t.dtype}, which kitdispatch cannot make", fix="pass --inputs FILE.npz")
        dtype = numpy_dtype(t.dtype)
        shape = t.shape
        if row.kind == "float":
            out.append(rng.uniform(-2.0, 2.0, size=shape).astype(dtype))
        else:
            out.append(rng.integers(*integer_range(sig, i), size=shape).astype(dtype))
    return out


def integer_range(sig: ModelFunction, i: int) -> tuple[int, int]:
    """[low, high) that random_inputs draws integer input `i` from."""
    bound = sig.index_bound(i)
    return (0, bound) if bound else DEFAULT_INTEGER_RANGE


def input_notes(sig: ModelFunction) -> tuple[str, ...]:
    """What random_inputs did with each integer input, for compare's output."""
    notes = []
    for i, t in enumerate(sig.inputs):
        row = abi.BY_NAME.get(t.dtype)
        if row is None or row.kind == "float":
            continue
        low, high = integer_range(sig, i)
        if sig.index_bound(i):
            notes.append(f"input {i} ({t.text}) indexes a gather of size {high}: drawn from {low}..{high - 1}")
        else:
            notes.append(
                f"input {i} ({t.text}) indexes no gather the build found, so its range is unknown: drawn from "
                f"{low}..{high - 1}; pass --inputs FILE.npz for other values"
            )
    return tuple(notes)


def load_inputs(path: str | Path, sig: ModelFunction) -> list[np.ndarray]:
    """The arrays of an .npz in the function's argument order (the order they were saved)."""
    try:
        with open_regular(Path(path)) as f, np.load(f) as data:  # never a FIFO: it would block
            arrays = [data[k] for k in data.files]
    except (OSError, ValueError, TypeError) as exc:  # TypeError: a .npy, not an .npz
        raise KitError(f"cannot read inputs {path}: {exc}", fix="save them with numpy.savez(path, x0, x1, ...)") from None
    if len(arrays) != len(sig.inputs):
        raise KitError(
            f"{path} holds {len(arrays)} arrays; {sig.name} takes {len(sig.inputs)}",
            fix="save one array per input, in argument order",
        )
    for i, (a, t) in enumerate(zip(arrays, sig.inputs)):
        shape_ok = a.ndim == len(t.shape) and all(d is None or d == s for d, s in zip(t.shape, a.shape))
        if a.dtype != numpy_dtype(t.dtype) or not shape_ok:
            raise KitError(
                f"input {i} in {path} is {a.dtype}{list(a.shape)}; {sig.name} takes {t.dtype}{list(t.shape)}",
                fix="save arrays of the model's input types and shapes",
            )
    return arrays


def _parameter_flags(parameters: str | Path | None) -> list[str]:
    """IREE's tools' flag for the parameter file (load_module has checked it is one)."""
    return [] if parameters is None else [f"--parameters={PARAMETER_SCOPE}={Path(parameters).resolve()}"]


def _input_flags(args: Sequence[np.ndarray], folder: Path) -> list[str]:
    flags = []
    for i, a in enumerate(args):
        path = folder / f"input{i}.npy"
        np.save(path, a)
        flags.append(f"--input=@{path}")
    return flags


# ----------------------------------------------------------------------- agreement


def _call(module: Module, function: str, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    result = module.call(function, *args)  # host arrays in: host arrays out
    return list(result) if isinstance(result, tuple) else [result]


# The tolerance of a model whose f32 matmuls run in a TF32 arithmetic (replace_when.arithmetic):
# (rtol, atol as a share of the output's largest baseline magnitude). A matmul's rounding error
# scales with its operands, not with each result: elements that cancel to near zero carry the
# error of the large terms. TF32 rounds inputs to 10 bits (~1e-3 relative); 3xTF32 is f32-level.
ARITHMETIC_TOLERANCE = {"tf32": (1e-2, 1e-2), "3xtf32": (1e-5, 1e-5)}


def loosest_arithmetic(arithmetics: Iterable[str | None]) -> str | None:
    """The arithmetic among the replaced ops' whose tolerance is loosest (None: none named)."""
    named = [a for a in arithmetics if a in ARITHMETIC_TOLERANCE]
    return max(named, key=lambda a: ARITHMETIC_TOLERANCE[a][0], default=None)


def check_agreement(
    got: Sequence[np.ndarray], expected: Sequence[np.ndarray], sig: ModelFunction, arithmetic: str | None = None
) -> tuple[bool, float, str, tuple[str, ...]]:
    """(agree, max abs error, the tolerance used, the worst elements where they disagree).
    Floats get their type's tolerance (abi.AbiType.tolerance), the least precise input's when
    inputs are less precise, or, where it is looser, the tolerance of the `arithmetic` of the
    model's replaced f32 matmuls (ARITHMETIC_TOLERANCE); integers must match exactly.
    The absolute part is at least rtol x the output's RMS: in a whole model an element near
    zero carries the rounding of the terms that cancelled there, which scale with the output's
    spread, and two routes each off by it differ by twice it (measured on an H100: a Llama-style
    f16 layer, the kit's build and IREE alone each within 1.0e-3 relative L2 of the model in
    f32, as torch's f16 is, differ by up to 0.0059 on outputs of RMS 1:
    benchmarks/results/accuracy-hf-h100.json)."""
    tol_dtype = abi.tolerance_type([t.dtype for t in sig.inputs + sig.outputs])
    type_rtol, type_atol = abi.lookup(tol_dtype).tolerance if tol_dtype else (0.0, 0.0)
    scaled = ARITHMETIC_TOLERANCE[arithmetic] if arithmetic and tol_dtype and ARITHMETIC_TOLERANCE[arithmetic][0] >= type_rtol else None
    agree, max_err, worst, spread = True, 0.0, [], 0.0
    for n, (g, e) in enumerate(zip(got, expected)):
        g64, e64 = np.asarray(g, np.float64), np.asarray(e, np.float64)
        if not _is_float(sig.outputs[n].dtype if n < len(sig.outputs) else None):
            rtol, atol = 0.0, 0.0  # integers and booleans (an index, a count) must match exactly
        elif scaled is not None:
            rtol, atol = scaled[0], scaled[1] * float(np.nanmax(np.abs(e64), initial=0.0))
        else:
            spread = max(spread, _rms(e64))
            rtol, atol = type_rtol, max(type_atol, type_rtol * _rms(e64))
        excess = np.abs(g64 - e64) - (atol + rtol * np.abs(e64))
        excess = np.where(np.isnan(g64) != np.isnan(e64), np.inf, np.nan_to_num(excess, nan=0.0))
        max_err = max(max_err, float(np.nanmax(np.abs(g64 - e64))) if g64.size else 0.0)
        if (excess > 0).any():
            agree = False
            for flat in np.argsort(excess, axis=None)[::-1][:min(WORST_SHOWN, int((excess > 0).sum()))]:
                idx = np.unravel_index(flat, g64.shape)
                worst.append(f"output {n}{list(map(int, idx))}: replaced {g64[idx]:.7g}, baseline {e64[idx]:.7g}")
    tolerance = f"rtol {type_rtol:g}, atol {type_atol:g} ({tol_dtype})" if tol_dtype else "exact"
    if tol_dtype and type_rtol * spread > type_atol:
        tolerance = f"rtol {type_rtol:g}, atol {type_rtol:g} x the output's RMS {spread:.3g} ({tol_dtype})"
    if scaled is not None:
        tolerance = f"rtol {scaled[0]:g}, atol {scaled[1]:g} x the output's largest magnitude ({arithmetic} matmuls)"
    if tol_dtype and not all(_is_float(t.dtype) for t in sig.outputs):
        tolerance += "; integer outputs exact"
    return agree, max_err, tolerance, tuple(worst)


def _is_float(dtype: str | None) -> bool:
    """Whether outputs of this element type are compared within a tolerance (floats; a type
    the kit does not know too, as before: it is compared as the function's floats are)."""
    row = abi.BY_MLIR.get(dtype) or abi.BY_NAME.get(dtype)
    return row is None or row.tolerance is not None


def _rms(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.sqrt(np.mean(finite * finite))) if finite.size else 0.0


# -------------------------------------------------------------------------- timing


def iree_calls(
    vmfbs: dict[str, Path], modules: dict[str, Module], function: str, args: Sequence[np.ndarray], input_flags: Sequence[str],
    *, device: str, repetitions: int,
) -> tuple[dict[str, float], str]:
    """Each module's whole call as IREE alone calls it: iree-benchmark-module where it is
    installed, else iree.runtime's own synchronous call; and which of the two it was."""
    try:
        find_tool("iree-benchmark-module")
    except KitError:
        return {k: invoker_call_us(m, function, args, repetitions=repetitions) for k, m in modules.items()}, "iree.runtime's synchronous call"
    return {k: benchmark_call(v, function, input_flags, device=device, repetitions=repetitions) for k, v in vmfbs.items()}, "iree-benchmark-module"


def invoker_call_us(module: Module, function: str, args: Sequence[np.ndarray], *, repetitions: int = 50) -> float:
    """Median time of IREE's own synchronous call (its FunctionInvoker) on inputs already on
    the device, in microseconds."""
    invoker = module.raw(function)
    on_device = [module.device.put(a) for a in args]
    return _median_us(lambda: invoker(*on_device), module, repetitions, wait=False)


def prepared_call_us(module: Module, function: str, args: Sequence[np.ndarray], *, repetitions: int = 50) -> float:
    """Median time of a whole call through the kit's prepared call (`ModelEntry.prepare`, or
    a kernel function's) on inputs already on the device: loops of launches, one wait each."""
    call = module.function(function).prepare(*[module.device.put(a) for a in args])
    return _median_us(call.launch, module, repetitions, wait=True)


def _median_us(call: object, module: Module, repetitions: int, *, wait: bool) -> float:
    for _ in range(3):  # warm-up: first calls load and allocate
        call()
        module.device.synchronize()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repetitions):
            call()
        if wait:
            module.device.synchronize()
        times.append((time.perf_counter() - start) / repetitions * 1e6)
    return statistics.median(times)


def benchmark_call(vmfb: Path, function: str, input_flags: Sequence[str], *, device: str = "cuda", repetitions: int = 50) -> float:
    """Median real time of a whole call (microseconds), by iree-benchmark-module."""
    argv = [
        find_tool("iree-benchmark-module"), f"--device={device}", f"--module={vmfb}", f"--function={function}",
        *input_flags, f"--benchmark_min_time={repetitions}x", "--benchmark_repetitions=5", "--benchmark_format=json",
    ]
    report = json.loads(_run(argv, "iree-benchmark-module").stdout)
    medians = [b for b in report["benchmarks"] if b.get("aggregate_name") == "median"]
    runs = medians or report["benchmarks"]
    return _to_us(runs[0]["real_time"], runs[0].get("time_unit", "ns"))


def profile_dispatches(
    vmfb: Path, function: str, input_flags: Sequence[str], workdir: Path, *, device: str = "cuda", calls: int = 5
) -> tuple[DispatchTime, ...]:
    """Device time per dispatch (kernel), heaviest first, by Nsight Compute over `calls` calls."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise ToolError("Nsight Compute (ncu) is not on PATH", fix="install Nsight Compute, or read only the whole-call times")
    log = workdir / f"{vmfb.stem}.ncu.csv"
    _run(
        [
            # Caches flushed before each kernel (ncu's default, said): a rate against memory bandwidth reads memory.
            ncu, "--csv", "--log-file", str(log), "--metrics", "gpu__time_duration.sum", "--clock-control", "none", "--cache-control", "all",
            find_tool("iree-benchmark-module"), f"--device={device}", f"--module={vmfb}", f"--function={function}",
            *input_flags, f"--benchmark_min_time={calls}x", "--benchmark_repetitions=1",
        ],
        "ncu over iree-benchmark-module",
    )
    times: dict[str, list[float]] = {}
    for row in _csv_rows(log.read_text(errors="replace")):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            value = float(row["Metric Value"].replace(",", ""))
            times.setdefault(row["Kernel Name"], []).append(value * _NCU_UNITS_US[row.get("Metric Unit", "nsecond")])
    if not times:
        raise ToolError("Nsight Compute measured no kernel", argv=[ncu, str(vmfb)], log=log.read_text()[-2000:],
                        fix="check that ncu may read GPU counters here (it needs profiling permission)")
    rows = [
        DispatchTime(k, len(v), sum(v) / len(v), sum(v), statistics.median(v), statistics.median(v) * len(v) / calls)
        for k, v in times.items()
    ]
    return tuple(sorted(rows, key=lambda t: t.per_call_us, reverse=True))


_NCU_UNITS_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def _csv_rows(text: str) -> list[dict]:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    return [] if start is None else list(csv.DictReader(lines[start:]))


@dataclass(frozen=True)
class Profile:
    """`profile`'s answer: one build's dispatches (the kit's, or IREE's own with `baseline`),
    each with the advisor's columns (models/advisor.py)."""

    vmfb: str
    build: str  # "kit" or "baseline"
    device: str | None  # the GPU's name, as CUDA gives it
    peaks: Peaks | None
    dispatches: tuple[DispatchTime, ...]
    advice: tuple[Advice, ...]
    other_total_us: float | None = None  # the other build's device time a call, where profiled
    tune: str | None = None  # the tune record the measured savings come from
    notes: tuple[str, ...] = ()

    @property
    def total_us(self) -> float:
        return sum(a.per_call_us for a in self.advice)

    def to_json(self) -> dict:
        return {
            "vmfb": self.vmfb, "build": self.build, "device": self.device,
            "peaks": None if self.peaks is None else dataclasses.asdict(self.peaks),
            "total_us": self.total_us, "other_total_us": self.other_total_us, "tune": self.tune,
            "dispatches": [d.to_json() | a.to_json() for d, a in zip(self._by_name(), self.advice)],
            "notes": list(self.notes),
            "timing_tool": "Nsight Compute gpu__time_duration, median per dispatch times dispatches per call",
        }

    def _by_name(self) -> list[DispatchTime]:
        times = {d.name: d for d in self.dispatches}
        return [times[a.name] for a in self.advice]


def profile_module(
    target: str | Path, *, inputs: str | Path | None = None, function: str | None = None, device: str = "cuda", seed: int = 0,
    parameters: str | Path | None = None, baseline: bool = False,
) -> Profile:
    """The dispatches of a `build_model` folder's module, heaviest first, each with what it
    computes, the rate it reached against the GPU's peak, and the kit kernel that stands in
    for it with the saving: measured where `kitdispatch tune` wrote NAME.tune.json, else
    estimated where the folder has both builds (the other one is profiled too). `baseline`:
    IREE's own build (needs `--with-baseline`), else the kit's."""
    folder, record = read_model_record(target)
    if baseline and not record.baseline_vmfb:
        raise UsageError(f"{folder} has no baseline module", fix="build it with --with-baseline, or profile the kit's build (leave out --baseline)")
    require_cuda(device)
    sig = record.function(function)
    mine, theirs = (record.baseline_vmfb, record.vmfb) if baseline else (record.vmfb, record.baseline_vmfb)
    vmfb = folder / mine  # type: ignore[operator]
    args = load_inputs(inputs, sig) if inputs else random_inputs(sig, seed)
    if parameters is not None:
        load_module(vmfb, device=device, parameters=parameters)  # the file checked, as compare checks it
    tune, tune_note = tune_of(folder, record)
    notes = [tune_note] if tune_note else []
    other: tuple[DispatchTime, ...] = ()
    with tempfile.TemporaryDirectory(prefix="kitdispatch-profile-") as tmp:
        flags = _input_flags(args, Path(tmp)) + _parameter_flags(parameters)
        times = profile_dispatches(vmfb, sig.name, flags, Path(tmp), device=device)
        if theirs is None:
            notes.append("the folder has no baseline module (build with --with-baseline): no estimated savings")
        else:
            try:
                other = profile_dispatches(folder / theirs, sig.name, flags, Path(tmp), device=device)
            except ToolError as exc:
                notes.append(f"the other build could not be profiled ({exc.what}): no estimated savings")
    gpu = cuda_device(device)
    peaks = peaks_for(gpu.name, gpu.capability) if gpu else None
    if gpu is None:
        notes.append("the GPU's name is unknown (no CUDA driver found through ctypes): fractions of peak left out")
    elif peaks is None:
        notes.append(f"{gpu.name} is not in the advisor's table of peaks: fractions of peak left out")
    advice = advise(
        [timed(t) for t in times], report_ops(record), kit_build=not baseline, other=[timed(t) for t in other],
        tune=tune, peaks=peaks,
    )
    return Profile(
        str(vmfb), "baseline" if baseline else "kit", gpu.name if gpu else None, peaks, times, advice,
        other_total_us=sum(t.per_call_us for t in other) if other else None,
        tune=tune_record_name(Path(record.vmfb).stem) if tune is not None else None, notes=tuple(notes),
    )


def tune_of(folder: Path, record: ModelRecord) -> tuple[tuple[TuneEntry, ...] | None, str | None]:
    """The tune record's entries for this build, with a note where there are none: no record,
    or one measured on another build's probes (its probe record's SHA-256 is not the one this
    build's model record lists). A damaged record is an error (DamagedRecord, exit 2)."""
    name = Path(record.vmfb).stem
    path = folder / tune_record_name(name)
    if not path.exists() and not path.is_symlink():
        return None, f"no {path.name} (`kitdispatch tune DIR` writes it): savings are estimated"
    tuned = read_tune_record(path)
    if tuned.probes_sha256 != record.files.get(probes_record_name(name)):
        return None, f"{path.name} was measured on another build's probes, so its times are not used: savings are estimated"
    return tuned.entries, None


def timed(t: DispatchTime) -> Timed:
    """The advisor's view of a profiled dispatch: its time a call and its launches a call."""
    return Timed(t.name, t.per_call_us, t.per_call_us / t.median_us if t.median_us > 0 else 0.0)


def cuda_device(device: str) -> CudaDevice | None:
    """The CUDA device an IREE device URI runs on ("cuda" and "cuda://N": the first, or the
    N-th); None without a driver."""
    info = driver_info()
    index = int(m[1]) if (m := re.fullmatch(r"cuda://(\d+)", device)) else 0
    return next((d for d in info.devices if d.index == index), None) if info else None


def format_profile(p: Profile) -> str:
    which = "IREE's own build" if p.build == "baseline" else "the kit's build"
    peaks = f"; peaks of the {p.peaks.gpu} ({p.peaks.source})" if p.peaks else ""
    lines = [f"dispatches of {p.vmfb} ({which}), device time by Nsight Compute, on {p.device or 'an unknown GPU'}{peaks}:"]
    lines += format_advice(p.advice, peaks=p.peaks)
    if p.other_total_us is not None:
        other = "the kit's build" if p.build == "baseline" else "IREE's own build"
        lines.append(f"{p.other_total_us:9.1f} us a call in {other}, profiled the same way")
    if p.tune:
        lines.append(f"measured savings from {p.tune}")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def _run(argv: list[str], what: str):
    res = run_tool(argv, timeout=BENCH_TIMEOUT_S)
    if res.returncode != 0:
        raise ToolError(f"{what} failed", argv=argv, returncode=res.returncode, log=res.stderr + res.stdout,
                        fix="check that the module runs: kitdispatch run MODULE --function F --input ...")
    return res


def _to_us(value: float, unit: str) -> float:
    return value * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[unit]


# ------------------------------------------------------------------------ printing


def format_comparison(c: Comparison) -> str:
    lines = [f"function {c.function}: outputs {'agree' if c.agree else 'DISAGREE'} "
             f"(max abs error {c.max_abs_error:.3g}; tolerance {c.tolerance})"]
    lines += [f"  {w}" for w in c.worst]
    base, mine = c.call_us["baseline"], c.call_us["replaced"]
    lines.append(f"whole call, as IREE alone calls it ({c.call_tool}, median): baseline {base:.1f} us, replaced {mine:.1f} us ({base / mine:.2f}x)")
    if len(c.prepared_us) == 2:
        base, mine = c.prepared_us["baseline"], c.prepared_us["replaced"]
        lines.append(f"whole call, through the kit's prepared call (load_module(DIR), median): baseline {base:.1f} us, replaced {mine:.1f} us ({base / mine:.2f}x)")
    for op in c.replaced_ops:
        lines.append(f"replaced: {op}")
    kit, iree = c.replaced_dispatches()
    if kit or iree:
        total = lambda ts: sum(t.per_call_us for t in ts)  # noqa: E731
        lines.append(
            f"dispatches that changed, device time per call (Nsight Compute): IREE's that went {total(iree):.1f} us "
            f"({', '.join(t.name for t in iree) or 'none: IREE had fused the op into a dispatch that stays'}), "
            f"the new ones {total(kit):.1f} us ({', '.join(t.name for t in kit)})"
        )
    for k in ("baseline", "replaced"):
        if k in c.dispatches:
            lines.append(f"device time per dispatch, {k} (Nsight Compute):")
            lines += [f"  {format_dispatch(t)}" for t in c.dispatches[k]]
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)


def format_dispatch(t: DispatchTime) -> str:
    return f"{t.median_us:9.1f} us median  {t.average_us:9.1f} us mean  x{t.count:<4} {t.per_call_us:9.1f} us per call  {t.name}"
