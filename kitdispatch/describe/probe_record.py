"""The probe record and the tune record: what `build_model(probes=True)` wrote for `tune`
(`<name>.probes.json`) and what `tune` measured for the next build (`<name>.tune.json`).

They live in describe because both sides read them: `tune` (the run side, models/tune.py)
reads the probe record and writes the tune record; the build side (`build_model(tuned=...)`)
reads the tune record. Like the model record, the probe record lists every file it names with
its SHA-256, and the readers refuse what a build does not write: a file that is not regular or
is too big (RecordError), a field of another JSON type (DamagedRecord, exit 2), a file name that
is not a plain name of its folder, a listed file that is not the one recorded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kitdispatch._files import is_plain_name, read_regular_file
from kitdispatch.describe.model_record import ModelTensor
from kitdispatch.describe.record import MAX_RECORD_BYTES, DamagedRecord, RecordError, file_sha256

PROBES_SCHEMA = 1
TUNE_SCHEMA = 1
PROBES_SUFFIX = ".probes.json"
TUNE_SUFFIX = ".tune.json"
PROBE_ID = re.compile(r"probe_[0-9]{1,6}")  # the only probe names a record may hold
_REBUILD = "build it again with --probes"


def trace_key(probe: str, argument: int) -> str:
    """The key of `flow.tensor.trace` for one argument of one probe: what the capture module
    hands the debug sink, and what tune reads it back by."""
    return f"{probe}/arg{argument}"


@dataclass(frozen=True)
class Probe:
    """One distinct replaced chain of ops, as a module of its own. `status` "built": its
    module with the kit's kernel (`vmfb`) and IREE's own (`baseline_vmfb`) exist; otherwise
    (`"unmatched"`) its own build did not replace it as the model's did (`note` says how), and
    tune leaves its ops to the rule."""

    id: str
    digest: str  # SHA-256 of the probe's MLIR text: what ties a tune record to the chain
    op: str  # the replaced op's kind
    locations: tuple[str, ...]  # every op of the model the probe stands for
    kernel: str
    kernel_entry: str
    arithmetic: str | None  # the kernel's arithmetic (replace_when.arithmetic): the tolerance compare uses
    arguments: tuple[ModelTensor, ...]
    result: ModelTensor
    status: str
    mlir: str | None = None
    vmfb: str | None = None
    baseline_vmfb: str | None = None
    note: str = ""
    # Kinds IREE fuses otherwise inside a model (OpKind.timed_in_model): the whole model built
    # with every op of this probe, and of the other probes of its kind, kernel and shape, left
    # to IREE, the rest as the model's build; tune times it against the model's build. None,
    # with `heldout_note` saying why, where it was not built.
    heldout_vmfb: str | None = None
    heldout_note: str = ""

    def trace_keys(self) -> tuple[str, ...]:
        return tuple(trace_key(self.id, j) for j in range(len(self.arguments)))

    def to_json(self) -> dict:
        return {
            "probe": self.id, "digest": self.digest, "op": self.op, "locations": list(self.locations), "kernel": self.kernel,
            "kernel_entry": self.kernel_entry, "arithmetic": self.arithmetic, "arguments": [t.to_json() for t in self.arguments],
            "trace_keys": list(self.trace_keys()), "result": self.result.to_json(), "status": self.status, "mlir": self.mlir,
            "vmfb": self.vmfb, "baseline_vmfb": self.baseline_vmfb, "note": self.note,
            "heldout_vmfb": self.heldout_vmfb, "heldout_note": self.heldout_note,
        }


@dataclass(frozen=True)
class ProbeRecord:
    name: str  # the model build's name
    model: str
    model_sha256: str  # of the model file the build read
    capture_vmfb: str
    probes: tuple[Probe, ...]
    files: Mapping[str, str]  # every file the probes need -> its SHA-256
    without_probe: tuple[tuple[str, str], ...] = ()  # (location, why) of replaced ops no probe stands for: the rule decides them
    schema: int = PROBES_SCHEMA

    def to_bytes(self) -> bytes:
        data = {
            "schema": self.schema, "name": self.name, "model": self.model, "model_sha256": self.model_sha256,
            "capture_vmfb": self.capture_vmfb, "probes": [p.to_json() for p in self.probes], "files": dict(self.files),
            "without_probe": [{"location": loc, "reason": why} for loc, why in self.without_probe],
        }
        return (json.dumps(data, indent=2) + "\n").encode()

    def check_file(self, folder: Path, name: str) -> Path:
        """The file `name` of this record, after checking it is the one the build wrote."""
        path = folder / name
        if path.is_symlink():  # the build writes files, never links
            raise RecordError(f"{name} is a symbolic link, not the file its probe record describes", where=str(path), fix=_REBUILD)
        try:
            same = file_sha256(path) == self.files[name]
        except OSError as exc:
            raise RecordError(f"{name} cannot be read ({exc.strerror})", where=str(path), fix=_REBUILD) from None
        if not same:
            raise RecordError(f"{name} is not the file its probe record describes", where=str(path), fix=_REBUILD)
        return path


def probes_record_name(name: str) -> str:
    return f"{name}{PROBES_SUFFIX}"


def tune_record_name(name: str) -> str:
    return f"{name}{TUNE_SUFFIX}"


def read_probe_record(path: Path) -> ProbeRecord:
    data = _load(path, "probe record")
    where = str(path)

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise DamagedRecord(f"the probe record is damaged: {what}", where=where, fix=_REBUILD)

    need(isinstance(data, dict) and data.get("schema") == PROBES_SCHEMA, f"not a schema {PROBES_SCHEMA} JSON object")
    files = data.get("files")
    need(isinstance(files, dict) and all(isinstance(v, str) for v in files.values()), "'files' is not a table of SHA-256s")
    bad = [n for n in files if not is_plain_name(n)]
    if bad:  # a planted record that reaches outside its folder is refused as such
        raise RecordError(f"the probe record lists {bad[0]!r}, which is not a file name of its folder", where=where, fix=_REBUILD)
    for key in ("name", "model", "model_sha256", "capture_vmfb"):
        need(isinstance(data.get(key), str), f"{key!r} is not a string")
    if not (is_plain_name(data["name"]) and is_plain_name(tune_record_name(data["name"]))):  # tune writes NAME.tune.json beside it
        raise RecordError(f"the probe record names its model {data['name']!r}, which is not a file name of its folder",
                          where=where, fix=_REBUILD)
    need(data["capture_vmfb"] in files, "its capture module is not a file it lists")
    probes = data.get("probes")
    need(isinstance(probes, list) and all(isinstance(p, dict) for p in probes), "'probes' is not a list")
    without = data.get("without_probe", [])
    need(_is_list_of(without, dict) and all(isinstance(w.get("location"), str) and isinstance(w.get("reason"), str) for w in without),
         "'without_probe' is not a list of locations and reasons")
    return ProbeRecord(
        name=data["name"], model=data["model"], model_sha256=data["model_sha256"], capture_vmfb=data["capture_vmfb"],
        probes=tuple(_probe(p, files, need) for p in probes), files=dict(files),
        without_probe=tuple((w["location"], w["reason"]) for w in without),
    )


def _probe(p: dict, files: Mapping[str, str], need: object) -> Probe:
    need(isinstance(p.get("probe"), str) and PROBE_ID.fullmatch(p["probe"]) is not None, f"probe name {p.get('probe')!r}")
    for key in ("digest", "op", "kernel", "kernel_entry", "status", "note"):
        need(isinstance(p.get(key), str), f"{p['probe']}: {key!r} is not a string")
    need(p["status"] in ("built", "unmatched"), f"{p['probe']}: status {p['status']!r}")
    need(p.get("arithmetic") is None or isinstance(p["arithmetic"], str), f"{p['probe']}: 'arithmetic'")
    need(_is_list_of(p.get("locations"), str), f"{p['probe']}: 'locations' is not a list of strings")
    need(_is_list_of(p.get("arguments"), dict) and all(_is_tensor(t) for t in p["arguments"]), f"{p['probe']}: 'arguments'")
    need(_is_tensor(p.get("result")), f"{p['probe']}: 'result'")
    need(isinstance(p.get("heldout_note", ""), str), f"{p['probe']}: 'heldout_note' is not a string")
    for key in ("mlir", "vmfb", "baseline_vmfb", "heldout_vmfb"):
        need(p.get(key) is None or (isinstance(p[key], str) and p[key] in files), f"{p['probe']}: {key!r} is not a file it lists")
    if p["status"] == "built":
        need(p.get("vmfb") is not None and p.get("baseline_vmfb") is not None, f"{p['probe']}: a built probe without its modules")
    return Probe(
        id=p["probe"], digest=p["digest"], op=p["op"], locations=tuple(p["locations"]), kernel=p["kernel"],
        kernel_entry=p["kernel_entry"], arithmetic=p.get("arithmetic"), arguments=tuple(_tensor(t) for t in p["arguments"]),
        result=_tensor(p["result"]), status=p["status"], mlir=p.get("mlir"), vmfb=p.get("vmfb"),
        baseline_vmfb=p.get("baseline_vmfb"), note=p["note"], heldout_vmfb=p.get("heldout_vmfb"),
        heldout_note=p.get("heldout_note", ""),
    )


# ------------------------------------------------------------------------ the tune record


@dataclass(frozen=True)
class TuneEntry:
    """What tune decided for one probe: "replace" only where the kit's outputs agree with
    IREE's and its device time is below IREE's; "keep" with the reason otherwise."""

    probe: str
    digest: str
    op: str
    locations: tuple[str, ...]
    kernel: str
    kit_us: float | None
    iree_us: float | None
    max_abs_error: float | None
    tolerance: str
    agree: bool | None
    decision: str
    reason: str
    # Where the probe has a held-out build: the whole model's device time a call with the
    # kernels (the model's build) and without them (`heldout`: the build that leaves every op
    # of the probes of its kind, kernel and shape to IREE; entries naming one build share these).
    model_us: float | None = None
    heldout_us: float | None = None
    heldout: str | None = None

    @property
    def timed_in_model(self) -> bool:
        return self.model_us is not None and self.heldout_us is not None

    def to_json(self) -> dict:
        return {
            "probe": self.probe, "digest": self.digest, "op": self.op, "locations": list(self.locations), "kernel": self.kernel,
            "kit_us": self.kit_us, "iree_us": self.iree_us, "max_abs_error": self.max_abs_error, "tolerance": self.tolerance,
            "agree": self.agree, "decision": self.decision, "reason": self.reason, "model_us": self.model_us,
            "heldout_us": self.heldout_us, "heldout": self.heldout,
        }


@dataclass(frozen=True)
class TuneRecord:
    name: str
    model: str
    model_sha256: str
    probes_sha256: str  # of the probe record tune read
    function: str
    device: str
    timed: str  # what the times are, in words
    inputs: str
    entries: tuple[TuneEntry, ...]
    schema: int = TUNE_SCHEMA

    def to_bytes(self) -> bytes:
        data = {
            "schema": self.schema, "name": self.name, "model": self.model, "model_sha256": self.model_sha256,
            "probes_sha256": self.probes_sha256, "function": self.function, "device": self.device, "timed": self.timed,
            "inputs": self.inputs, "probes": [e.to_json() for e in self.entries],
        }
        return (json.dumps(data, indent=2) + "\n").encode()


def read_tune_record(path: Path) -> TuneRecord:
    data = _load(path, "tune record")
    where = str(path)

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise DamagedRecord(f"the tune record is damaged: {what}", where=where, fix="run kitdispatch tune DIR again")

    need(isinstance(data, dict) and data.get("schema") == TUNE_SCHEMA, f"not a schema {TUNE_SCHEMA} JSON object")
    for key in ("name", "model", "model_sha256", "probes_sha256", "function", "device", "timed", "inputs"):
        need(isinstance(data.get(key), str), f"{key!r} is not a string")
    entries = data.get("probes")
    need(_is_list_of(entries, dict), "'probes' is not a list")
    out = []
    for e in entries:
        need(all(isinstance(e.get(k), str) for k in ("probe", "digest", "op", "kernel", "tolerance", "reason")), "a probe's names")
        need(e.get("decision") in ("replace", "keep"), f"{e.get('probe')}: decision {e.get('decision')!r}")
        need(_is_list_of(e.get("locations"), str), f"{e['probe']}: 'locations'")
        need(all(_is_number_or_none(e.get(k)) for k in ("kit_us", "iree_us", "max_abs_error", "model_us", "heldout_us")),
             f"{e['probe']}: a time or error")
        need(e.get("agree") is None or isinstance(e["agree"], bool), f"{e['probe']}: 'agree'")
        need(e.get("heldout") is None or isinstance(e["heldout"], str), f"{e['probe']}: 'heldout'")
        out.append(TuneEntry(
            e["probe"], e["digest"], e["op"], tuple(e["locations"]), e["kernel"], e.get("kit_us"), e.get("iree_us"),
            e.get("max_abs_error"), e["tolerance"], e.get("agree"), e["decision"], e["reason"], e.get("model_us"), e.get("heldout_us"),
            e.get("heldout"),
        ))
    return TuneRecord(
        **{k: data[k] for k in ("name", "model", "model_sha256", "probes_sha256", "function", "device", "timed", "inputs")},
        entries=tuple(out),
    )


# ------------------------------------------------------------------------ shared


def _load(path: Path, what: str) -> object:
    if Path(path).is_symlink():  # the kit writes its records by rename, never links them
        raise RecordError(f"the {what} is a symbolic link, which kitdispatch does not write", where=str(path), fix=_REBUILD)
    try:
        raw = read_regular_file(Path(path), limit=MAX_RECORD_BYTES)
    except OSError as exc:
        raise RecordError(f"cannot read the {what}: {exc.strerror or exc}", where=str(path), fix=_REBUILD) from None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise DamagedRecord(f"cannot read the {what}: {type(exc).__name__}: {exc}", where=str(path), fix=_REBUILD) from None


def _is_list_of(value: object, kind: type) -> bool:
    return isinstance(value, list) and all(isinstance(v, kind) for v in value)


def _is_number_or_none(v: object) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _is_tensor(t: object) -> bool:
    return isinstance(t, dict) and isinstance(t.get("dtype"), str) and _is_list_of(t.get("shape"), int) and all(
        d >= 0 and not isinstance(d, bool) for d in t["shape"]
    )


def _tensor(t: dict) -> ModelTensor:
    return ModelTensor(t["dtype"], tuple(t["shape"]))


__all__ = [
    "PROBES_SCHEMA", "Probe", "ProbeRecord", "TUNE_SCHEMA", "TuneEntry", "TuneRecord", "probes_record_name", "read_probe_record",
    "read_tune_record", "trace_key", "tune_record_name",
]
