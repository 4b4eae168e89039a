"""`tune`: each replacement of a model build measured on the model's own activations.

Reads a folder built with probes (`build --model M -o DIR --probes`, models/probes.py writes
them); needs only the runtime and the GPU, and imports nothing of the build side. It runs the
capture module once on the model's inputs: IREE hands every `flow.tensor.trace` to the HAL
module's debug sink (`iree.runtime.HalModuleDebugSink`, a callback taking the trace's key and
its buffer views), which copies each probe's inputs to the host. (IREE 3.13 lowers the trace to
a copy into a staging resource, a wait on its fence, then `hal.buffer_view.trace`: the callback
sees finished values; `iree-compile --compile-to=hal` on a traced module shows it.) Then per probe it runs the
probe module with the kit's kernel and IREE's own build of it on those inputs: outputs are
compared as compare does (check_agreement, with the kernel's arithmetic), and both are timed on
the device (the sum of the spans of every kernel one call runs, CUPTI, median over the timed
calls after warm-up calls, the two taking turns call by call). A probe is to replace only where
the outputs agree and the kit's time is below IREE's.

A probe alone misjudges ops that IREE fuses with their neighbours inside the model: alone IREE
compiles a norm into one dispatch, in a model it may split it over dispatches it shares with the
residual add before and the cast after (OpKind.timed_in_model). For those the build also wrote
the model with the ops of every probe of that kind, kernel and shape left to IREE (a held-out
build), and tune times the whole model both ways, in turn: those probes replace only where the
model is faster with the kernel.
The record, `DIR/NAME.tune.json`, is what `build --tuned FILE` reads.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from kitdispatch._files import write_atomic
from kitdispatch.describe.model_record import ModelFunction, ModelRecord, read_model_record
from kitdispatch.describe.probe_record import (
    PROBES_SUFFIX, Probe, TuneEntry, TuneRecord, read_probe_record, read_tune_record, tune_record_name,
)
from kitdispatch.describe.record import RecordError
from kitdispatch.errors import IREE_STATUS_ERRORS, KitError, UsageError
from kitdispatch.models.compare import check_agreement, input_notes, load_inputs, random_inputs
from kitdispatch.run.device import DeviceArray, get_device, numpy_dtype
from kitdispatch.run.module import Module, parameter_module, require_cuda
from kitdispatch.run.timing import KernelTimer

WARMUP_CALLS = 3
TIMED_CALLS = 20
PROBE_FUNCTION = "probe"  # the function of every probe module (models/probes.py)


@dataclass(frozen=True)
class TuneResult:
    path: Path  # the tune record written
    record: TuneRecord
    untuned: tuple[tuple[str, str], ...]  # (probe or location, why) for what tune could not run: those ops follow the rule
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"tune": str(self.path), "timed": self.record.timed, "probes": [e.to_json() for e in self.record.entries],
                "untuned": [{"probe": p, "reason": r} for p, r in self.untuned], "notes": list(self.notes)}


def tune_model(
    built: str | Path, *, inputs: str | Path | None = None, parameters: str | Path | None = None, function: str | None = None,
    device: str = "cuda", seed: int = 0, calls: int = TIMED_CALLS,
) -> TuneResult:
    """Measures every probe of a `build_model(..., probes=True)` folder on the model's
    activations (inputs from `inputs`, an .npz, else random in range as compare draws them)
    and writes `<name>.tune.json` beside it. Without a GPU: RuntimeUnavailable, nothing written."""
    folder, model = read_model_record(built)
    probes_name = _probes_of(folder, model)
    require_cuda(device)
    record = read_probe_record(model.check_file(folder, probes_name))
    for name in record.files:
        record.check_file(folder, name)
    target = folder / tune_record_name(record.name)
    _check_tune_target(target)
    sig = model.function(function)
    args = load_inputs(inputs, sig) if inputs else random_inputs(sig, seed)
    captured = capture_activations(folder / record.capture_vmfb, sig.name, args, device=device, parameters=parameters)
    in_model = ModelTimer(folder, model, sig.name, args, device=device, parameters=parameters, calls=calls)
    entries, untuned = [], [(loc, why) for loc, why in record.without_probe]
    for probe in record.probes:
        if probe.status != "built":
            untuned.append((probe.id, probe.note))
            continue
        entries.append(_measure(probe, folder, captured, device=device, calls=calls, in_model=in_model))
    tune = TuneRecord(
        name=record.name, model=record.model, model_sha256=record.model_sha256, probes_sha256=model.files[probes_name],
        function=sig.name, device=device, timed=timed_text(calls), inputs=str(inputs) if inputs else f"random (seed {seed})",
        entries=tuple(entries),
    )
    write_atomic(target, tune.to_bytes())
    return TuneResult(target, tune, tuple(untuned), () if inputs else input_notes(sig))


def timed_text(calls: int) -> str:
    return (f"device time of one probe call: the sum of the spans of every kernel it runs (CUPTI), median of {calls} calls "
            f"after {WARMUP_CALLS} warm-up calls, inputs on the device, the kit's and IREE's in turn; for ops IREE fuses "
            "otherwise in a model, the whole model's the same way, with the kernel and without it")


def _probes_of(folder: Path, model: ModelRecord) -> str:
    """The probe record's name, which the model record must list (it ties the probes to this build)."""
    names = [n for n in model.files if n.endswith(PROBES_SUFFIX)]
    if len(names) != 1:
        raise UsageError(
            f"the model build in {folder} has no probes",
            where=str(folder),
            fix="build it with them: kitdispatch build --model MODEL -o DIR --probes (or kd.build_model(..., probes=True))",
        )
    return names[0]


def _check_tune_target(target: Path) -> None:
    """The tune record replaces only a tune record (the kit's own): never another file."""
    if not (target.exists() or target.is_symlink()):
        return
    try:
        if target.is_symlink():
            raise RecordError("it is a symbolic link", where=str(target))
        read_tune_record(target)
    except RecordError as exc:
        raise UsageError(
            f"{target} is in the way of the tune record and is not one ({exc.what}); tune would overwrite it",
            where=str(target),
            fix="move it away, then run tune again",
        ) from None


# ------------------------------------------------------------------------ capturing


def capture_activations(
    vmfb: Path, function: str, args: list[np.ndarray], *, device: str = "cuda", parameters: str | Path | None = None,
) -> dict[str, list[np.ndarray]]:
    """Calls `function` of a module holding `flow.tensor.trace` ops once and returns what each
    trace saw ({key: arrays}, the first time each key is traced), copied to the host."""
    import iree.runtime as rt

    dev = get_device(device)
    captured: dict[str, list[np.ndarray]] = {}
    failures: list[str] = []

    def on_trace(key: str, views: list) -> None:
        if key in captured:
            return
        try:  # copied now: the buffers are IREE's, reused once the call moves on
            captured[key] = [DeviceArray(dev, v, tuple(v.shape), _dtype_of(v)).to_host() for v in views]
        except Exception as exc:  # raised into IREE's VM it would end the call without saying why
            failures.append(f"{key}: {type(exc).__name__}: {exc}")

    instance = rt.VmInstance()
    modules = [rt.create_hal_module(instance, dev.hal, debug_sink=rt.HalModuleDebugSink(on_trace))]
    if parameters is not None:
        modules.append(parameter_module(Path(parameters), SimpleNamespace(vm_instance=instance)))
    try:
        vm = rt.VmModule.mmap(instance, str(vmfb))
        context = rt.VmContext(instance, modules=[*modules, vm])
        entry = vm.lookup_function(function)
        if entry is None:
            raise KitError(f"{vmfb} has no function {function!r}", fix="pass --function with a function of the model")
        rt.FunctionInvoker(context, dev.hal, entry)(*args)
    except IREE_STATUS_ERRORS as exc:
        raise KitError(f"the capture module {vmfb} failed on {device!r}: {str(exc).strip()[:500]}", fix="check that the model runs: kitdispatch compare DIR") from None
    if failures:
        raise KitError(f"tune could not copy the traced tensors to the host: {failures[0]}", fix="report it as a kitdispatch bug")
    return captured


_HAL_TO_NUMPY = {  # iree.runtime.HalElementType -> numpy, for the traced views' element types
    "FLOAT_16": "f16", "FLOAT_32": "f32", "FLOAT_64": "f64", "BFLOAT_16": "bf16", "SINT_8": "i8", "SINT_16": "i16",
    "SINT_32": "i32", "SINT_64": "i64", "INT_8": "i8", "INT_16": "i16", "INT_32": "i32", "INT_64": "i64", "UINT_8": "ui8",
    "BOOL_8": "i1", "UINT_16": "ui16", "UINT_32": "ui32", "UINT_64": "ui64",
}


def _dtype_of(view: object) -> np.dtype:
    import iree.runtime as rt

    element = rt.HalElementType(view.element_type)
    name = _HAL_TO_NUMPY.get(element.name)
    if name is None:
        raise KitError(f"a traced tensor has element type {element.name}, which tune cannot copy", fix="report it as a kitdispatch bug")
    return numpy_dtype(name)


# ------------------------------------------------------------------------ measuring


class ModelTimer:
    """The whole model's device time a call, its build against a held-out build (the same
    model with some probes' ops left to IREE), on the model's inputs, the two in turn; once per
    held-out build, which the probes of one kind, kernel and shape share."""

    def __init__(self, folder: Path, model: ModelRecord, function: str, args: list[np.ndarray], *, device: str,
                 parameters: str | Path | None, calls: int):
        self._load = lambda name: Module(folder / name, device=device, model=model, parameters=parameters)
        self._built_name, self._function, self._args, self._calls = model.vmfb, function, args, calls
        self._built: Module | None = None
        self._times: dict[str, tuple[float, float]] = {}

    def times(self, held_out: str) -> tuple[float, float]:
        """(us with the kernels, us without them)."""
        if held_out not in self._times:
            if self._built is None:
                self._built = self._load(self._built_name)
            with_us, without_us = device_times([self._built, self._load(held_out)], self._function, self._args, calls=self._calls)
            self._times[held_out] = (with_us, without_us)
        return self._times[held_out]


def _measure(probe: Probe, folder: Path, captured: dict[str, list[np.ndarray]], *, device: str, calls: int, in_model: ModelTimer) -> TuneEntry:
    def keep(reason: str, **measured: object) -> TuneEntry:
        return _entry(probe, "keep", reason, **measured)

    missing = [k for k in probe.trace_keys() if k not in captured]
    if missing:
        return keep(f"no activations captured for {', '.join(missing)} (its function was not the one called)")
    args = [captured[k][0] for k in probe.trace_keys()]
    for j, (a, t) in enumerate(zip(args, probe.arguments)):
        if a.dtype != numpy_dtype(t.dtype) or tuple(a.shape) != tuple(t.shape):
            return keep(f"argument {j} was captured as {a.dtype}{list(a.shape)}, the probe takes {t.text}")
    modules = {k: Module(folder / v, device=device) for k, v in (("kit", probe.vmfb), ("iree", probe.baseline_vmfb))}
    outputs = {k: _call(m, args) for k, m in modules.items()}
    sig = ModelFunction(PROBE_FUNCTION, probe.arguments, (probe.result,))
    agree, err, tolerance, _ = check_agreement([outputs["kit"]], [outputs["iree"]], sig, probe.arithmetic)
    kit_us, iree_us = device_times([modules["kit"], modules["iree"]], PROBE_FUNCTION, args, calls=calls)
    measured = {"kit_us": kit_us, "iree_us": iree_us, "max_abs_error": err, "tolerance": tolerance, "agree": agree}
    if not agree:
        return keep(f"outputs differ by {err:.3g} ({tolerance})", **measured)
    alone = f"alone, kit {kit_us:.1f} us vs IREE {iree_us:.1f} us"
    if probe.heldout_vmfb is not None:
        model_us, heldout_us = in_model.times(probe.heldout_vmfb)
        measured |= {"model_us": model_us, "heldout_us": heldout_us, "heldout": probe.heldout_vmfb}
        in_the_model = f"the model {model_us:.1f} us with the kit's kernel vs {heldout_us:.1f} us without it ({alone})"
        if model_us >= heldout_us:
            return keep(f"in the model the kit's kernel is not faster: {in_the_model}", **measured)
        return _entry(probe, "replace", f"outputs agree and the model is faster with the kit's kernel: {in_the_model}", **measured)
    untimed = f"; {probe.heldout_note}, so only the probe was timed" if probe.heldout_note else ""
    if kit_us >= iree_us:
        return keep(f"the kit's kernel is not faster: {kit_us:.1f} us vs IREE's {iree_us:.1f} us{untimed}", **measured)
    return _entry(probe, "replace", f"outputs agree and the kit's kernel is faster: {kit_us:.1f} us vs IREE's {iree_us:.1f} us{untimed}", **measured)


def _entry(probe: Probe, decision: str, reason: str, *, kit_us: float | None = None, iree_us: float | None = None,
           max_abs_error: float | None = None, tolerance: str = "", agree: bool | None = None, model_us: float | None = None,
           heldout_us: float | None = None, heldout: str | None = None) -> TuneEntry:
    return TuneEntry(probe.id, probe.digest, probe.op, probe.locations, probe.kernel, kit_us, iree_us, max_abs_error, tolerance,
                     agree, decision, reason, model_us, heldout_us, heldout)


def _call(module: Module, args: list[np.ndarray]) -> np.ndarray:
    return np.asarray(module.raw(PROBE_FUNCTION)(*args).to_host())


def device_times(modules: list[Module], function: str, args: list[np.ndarray], *, calls: int = TIMED_CALLS) -> list[float]:
    """Per module (all on one device), the median over `calls` calls of the summed device time
    of the kernels one call of `function` runs. The modules take turns call by call, so a
    change of clocks during the measurement reaches each alike."""
    device = modules[0].device
    invokers = [m.raw(function) for m in modules]
    on_device = [device.put(a) for a in args]
    for _ in range(WARMUP_CALLS):
        for invoker in invokers:
            invoker(*on_device)
    device.synchronize()
    timer, per_call = KernelTimer.get(), [[] for _ in modules]
    for _ in range(calls):
        for invoker, times in zip(invokers, per_call):
            with timer.collect() as spans:
                invoker(*on_device)
                device.synchronize()
            times.append(sum(end - begin for begin, end in spans) / 1e3)
    return [statistics.median(times) for times in per_call]


# ------------------------------------------------------------------------ printing


def format_tune(result: TuneResult) -> str:
    rows = [("probe", "op", "kit us", "IREE us", "model us: with", "without", "max err", "agree", "decision", "ops")]
    for e in result.record.entries:
        num = lambda v: "-" if v is None else f"{v:.1f}"
        rows.append((e.probe, e.op, num(e.kit_us), num(e.iree_us), num(e.model_us), num(e.heldout_us),
                     "-" if e.max_abs_error is None else f"{e.max_abs_error:.2g}", "-" if e.agree is None else ("yes" if e.agree else "NO"),
                     e.decision, str(len(e.locations))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines += [f"{e.probe}: {e.decision}: {e.reason}" for e in result.record.entries]
    lines += [f"{p}: not tuned (its ops follow the rule): {why}" for p, why in result.untuned]
    lines += [f"timed: {result.record.timed}", *[f"note: {n}" for n in result.notes], f"wrote {result.path}"]
    return "\n".join(lines)


__all__ = ["ModelTimer", "TuneResult", "capture_activations", "device_times", "format_tune", "timed_text", "tune_model"]
