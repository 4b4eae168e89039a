"""The model record: what `build_model` wrote and what `compare`, `profile` and `load_module`
read, beside the model's .vmfb (`<name>.model.json`), as the build record is beside a module's.
It lives in describe, like the build record, because the run side reads it (`load_module` of a
model build folder) and imports nothing of the build side.

One writer (`ModelRecord.to_bytes`, called by the model build) and one reader (`ModelRecord.
from_bytes`, through `read_model_record` for compare, profile and load_module and `claimed_files`
for the next build of the folder). Like the build record it proves ownership: it lists every file the
build published with its SHA-256. The reader refuses what a build does not write: a file that
is not regular or is too big, a field of another JSON type (DamagedRecord, exit 2), a file name
that is not a plain name of its folder, a listed module that is not the file recorded. `schema`,
`vmfb` and `files` must be there; the report's other fields, which a build always writes, read
as empty where a hand-made record leaves them out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kitdispatch._files import is_plain_name, read_regular_file
from kitdispatch.describe.record import JOURNAL_SUFFIX, MAX_RECORD_BYTES, MODEL_RECORD_SUFFIX, DamagedRecord, RecordError, file_sha256
from kitdispatch._version import __version__
from kitdispatch.errors import KitError

MODEL_RECORD_SCHEMA = 1
_REBUILD = "build it again"


@dataclass(frozen=True)
class ModelTensor:
    """A ranked tensor of a model: MLIR's element type name and sizes (None: dynamic). A model
    function's ABI tensors in the record; models/ops reads an op's tensors as the same record
    (its TensorFacts)."""

    dtype: str
    shape: tuple[int | None, ...]

    @property
    def text(self) -> str:
        return "x".join(["?" if d is None else str(d) for d in self.shape] + [self.dtype])

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class ModelFunction:
    """A public function of the model with its tensor inputs and outputs (IREE's ABI).
    `index_bounds`, one per input where the build found them (else empty): for an integer input
    whose values index a gather (an embedding's rows), the size of the dimension it indexes, so
    valid values are 0 .. bound-1; None where the build could not tell (models/inputs.py)."""

    name: str
    inputs: tuple[ModelTensor, ...]
    outputs: tuple[ModelTensor, ...]
    index_bounds: tuple[int | None, ...] = ()
    # Whether the module has NAME + TRANSIENTS_SUFFIX (describe/names.py): NAME$async taking its
    # transient memory from a buffer the caller passes (models/transients.py).
    transients: bool = False

    def index_bound(self, i: int) -> int | None:
        return self.index_bounds[i] if i < len(self.index_bounds) else None

    def to_json(self) -> dict:
        data = {"name": self.name, "inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs]}
        return data | ({"index_bounds": list(self.index_bounds)} if self.index_bounds else {}) | ({"transients": True} if self.transients else {})


@dataclass(frozen=True)
class ReplacedOp:
    """One replaced op as the report lists it; `entry` is its whole entry there."""

    op: str
    location: str
    kernel_entry: str  # the kernel's export: the dispatch's name in profiles
    entry: Mapping


@dataclass(frozen=True)
class ModelRecord:
    kitdispatch: str
    model: str
    project: str
    vmfb: str
    baseline_vmfb: str | None
    spec: str
    archs: tuple[str, ...]
    codegen_target: str
    iree_compiler: str
    iree_flags: tuple[str, ...]
    matched_after: tuple[str, ...]  # the stage (and passes) after which the ops were matched
    functions: tuple[ModelFunction, ...]
    replaced: tuple[ReplacedOp, ...]
    not_replaced: tuple[Mapping, ...]  # the report's entries of the ops kept, with the reasons
    kernel_executables: tuple[str, ...]
    files: Mapping[str, str]  # every file the build published (the record aside) -> its SHA-256
    schema: int = MODEL_RECORD_SCHEMA

    def to_json(self) -> dict:
        return {
            "schema": self.schema,
            "kitdispatch": self.kitdispatch,
            "model": self.model,
            "project": self.project,
            "vmfb": self.vmfb,
            "baseline_vmfb": self.baseline_vmfb,
            "spec": self.spec,
            "archs": list(self.archs),
            "codegen_target": self.codegen_target,
            "iree_compiler": self.iree_compiler,
            "iree_flags": list(self.iree_flags),
            "matched_after": list(self.matched_after),
            "functions": [f.to_json() for f in self.functions],
            "replaced": [dict(r.entry) for r in self.replaced],
            "not_replaced": [dict(e) for e in self.not_replaced],
            "kernel_executables": list(self.kernel_executables),
            "files": dict(self.files),
        }

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, raw: bytes, where: str, *, check_names: bool = True) -> "ModelRecord":
        """The record in `raw`. `check_names=False` leaves the file names to the caller: the
        next build's OutputFolder, which refuses more names than plain ones (the kit's own)."""
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
            raise DamagedRecord(f"cannot read the model record: {type(exc).__name__}: {exc}", where=where, fix=_REBUILD) from None
        # Names first: a planted record that reaches outside its folder is refused as such.
        files = data.get("files") if isinstance(data, dict) else None
        bad = [n for n in files if not is_plain_name(n)] if check_names and isinstance(files, dict) else []
        if bad:
            raise RecordError(f"the model record lists {bad[0]!r}, which is not a file name of its folder", where=where, fix=_REBUILD)
        return _typed(data, where)

    def function(self, name: str | None) -> ModelFunction:
        """The function `name` (None: the model's first)."""
        functions = {f.name: f for f in self.functions}
        if name is None and functions:
            return next(iter(functions.values()))
        if name not in functions:
            raise KitError(f"the model has no function {name!r}", fix=f"pass --function with one of {', '.join(functions) or '(none)'}")
        return functions[name]

    def check_file(self, folder: Path, name: str) -> Path:
        """The file `name` of this build, after checking it is the one the build wrote."""
        path = folder / name
        try:
            digest = file_sha256(path)
        except OSError as exc:  # missing, a folder, a FIFO: not the file recorded either
            raise RecordError(
                f"{name} cannot be read ({exc.strerror}), so it is not the file its model record describes", where=str(path), fix=_REBUILD,
            ) from None
        if digest != self.files[name]:
            raise RecordError(f"{name} is not the file its model record describes", where=str(path), fix=_REBUILD)
        return path


def model_record_name(model: str) -> str:
    return f"{model}{MODEL_RECORD_SUFFIX}"


def read_model_record(path: str | Path) -> tuple[Path, ModelRecord]:
    """A folder written by `build_model` (or its record file): (folder, record), its modules
    checked against the record's hashes."""
    path = Path(path)
    records = [path] if path.is_file() else sorted(p for p in path.glob(f"*{MODEL_RECORD_SUFFIX}") if p.is_file())
    if len(records) != 1:
        raise KitError(
            f"{path} holds {len(records)} model builds" if records else f"no model build in {path}",
            fix="pass the folder written by `kitdispatch build PROJECT --model MODEL -o DIR` (one model per folder)",
        )
    if _failed_files(records[0]) is not None:
        report = records[0].name.removesuffix(MODEL_RECORD_SUFFIX) + ".replace.txt"
        raise KitError(
            f"the last model build in {records[0].parent} failed, so there is no module to run",
            where=str(records[0]),
            fix=f"see why in its report ({report}), then build it again",
        )
    folder, record = records[0].parent, _read(records[0])
    if os.path.lexists(folder / f".{records[0].name}{JOURNAL_SUFFIX}"):
        raise RecordError(f"the last model build in {folder} was interrupted", where=str(folder), fix=_REBUILD)
    for key, name in (("vmfb", record.vmfb), ("baseline_vmfb", record.baseline_vmfb)):
        if name is None:
            continue
        if name not in record.files:
            raise RecordError(f"the model record's {key} {name!r} is not a file it lists", where=str(records[0]), fix=_REBUILD)
        record.check_file(folder, name)
    return folder, record


def failed_record(model: str, project: str, error: str, files: Mapping[str, str]) -> bytes:
    """The record of a build that failed once its ops were matched: it claims the report it
    published (`files`), so that the next build may replace it, and says why there is no module."""
    data = {"schema": MODEL_RECORD_SCHEMA, "kitdispatch": __version__, "model": model, "project": project, "failed": error, "files": dict(files)}
    return (json.dumps(data, indent=2) + "\n").encode()


def claimed_files(path: Path) -> dict[str, str]:
    """The files a previous model build of a folder lists ({name: sha256}), for its next build
    (a failed build's record too: it lists its report)."""
    try:
        failed = _failed_files(path)
        if failed is not None:
            return failed
        return dict(_read(path, check_names=False).files)
    except RecordError as exc:
        raise RecordError(f"the model record is damaged ({exc.what})", where=str(path), fix="build into another folder") from None


def _failed_files(path: Path) -> dict[str, str] | None:
    """The files a failed build's record lists; None for a record of a complete build."""
    try:
        data = json.loads(read_regular_file(path, limit=MAX_RECORD_BYTES))
    except (OSError, ValueError, RecursionError):
        return None  # _read says what is wrong with it
    if not isinstance(data, dict) or "failed" not in data:
        return None
    files = data.get("files")
    if data.get("schema") != MODEL_RECORD_SCHEMA or not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise DamagedRecord("the record of a failed model build is damaged", where=str(path), fix=_REBUILD)
    return dict(files)


def _read(path: Path, *, check_names: bool = True) -> ModelRecord:
    try:
        raw = read_regular_file(path, limit=MAX_RECORD_BYTES)
    except OSError as exc:
        raise RecordError(f"cannot read the model record: {exc.strerror or exc}", where=str(path), fix=_REBUILD) from None
    return ModelRecord.from_bytes(raw, str(path), check_names=check_names)


# ------------------------------------------------------------------ the JSON types, checked


def _typed(data: object, where: str) -> ModelRecord:
    """Every field of the JSON type the record declares: a damaged record is one clear error
    here, not a TypeError deep inside compare."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise DamagedRecord(f"the model record is damaged: {what}", where=where, fix=_REBUILD)

    need(isinstance(data, dict), "it is not a JSON object")
    need(data.get("schema") == MODEL_RECORD_SCHEMA, f"schema {data.get('schema')!r}, not {MODEL_RECORD_SCHEMA}")
    need(isinstance(data.get("vmfb"), str), "'vmfb' is not a file name")
    need(data.get("baseline_vmfb") is None or isinstance(data["baseline_vmfb"], str), "'baseline_vmfb' is not a file name")
    files = data.get("files")
    need(isinstance(files, dict) and all(isinstance(v, str) for v in files.values()), "'files' is not a table of SHA-256s")
    functions = data.get("functions", [])
    need(isinstance(functions, list) and all(_is_function_json(f) for f in functions), "'functions' is not a list of signatures")
    replaced = data.get("replaced", [])
    need(
        isinstance(replaced, list) and all(isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("op", "location", "kernel_entry")) for r in replaced),
        "'replaced' is not a list of replaced ops",
    )
    # The report's other fields: of their type where present; a build writes them all, and
    # compare and profile read none of them.
    need(_is_list_of(data.get("not_replaced", []), dict), "'not_replaced' is not a list of kept ops")
    for key in _TEXT_FIELDS:
        need(isinstance(data.get(key, ""), str), f"{key!r} is not a string")
    for key in _LIST_FIELDS:
        need(_is_list_of(data.get(key, []), str), f"{key!r} is not a list of strings")
    return ModelRecord(
        **{key: data.get(key, "") for key in _TEXT_FIELDS},
        **{key: tuple(data.get(key, [])) for key in _LIST_FIELDS},
        vmfb=data["vmfb"],
        baseline_vmfb=data.get("baseline_vmfb"),
        functions=tuple(_function(f) for f in functions),
        replaced=tuple(ReplacedOp(r["op"], r["location"], r["kernel_entry"], r) for r in replaced),
        not_replaced=tuple(data.get("not_replaced", [])),
        files=dict(files),
        schema=data["schema"],
    )


_TEXT_FIELDS = ("kitdispatch", "model", "project", "spec", "codegen_target", "iree_compiler")
_LIST_FIELDS = ("archs", "iree_flags", "matched_after", "kernel_executables")


def _is_list_of(value: object, kind: type) -> bool:
    return isinstance(value, list) and all(isinstance(v, kind) for v in value)


def _is_tensor_json(t: object) -> bool:
    return isinstance(t, dict) and isinstance(t.get("dtype"), str) and isinstance(t.get("shape"), list) and all(
        d is None or (isinstance(d, int) and not isinstance(d, bool) and d >= 0) for d in t["shape"]
    )


def _is_function_json(f: object) -> bool:
    """{name, inputs, outputs} as the model build writes it, each tensor {dtype, shape}, and
    optionally index_bounds (one positive int or null per input) and transients (a bool)."""
    if not (isinstance(f, dict) and isinstance(f.get("name"), str)):
        return False
    bounds = f.get("index_bounds", [])
    return all(isinstance(f.get(k), list) and all(_is_tensor_json(t) for t in f[k]) for k in ("inputs", "outputs")) and (
        isinstance(bounds, list) and len(bounds) in (0, len(f["inputs"]))
        and all(b is None or (isinstance(b, int) and not isinstance(b, bool) and b > 0) for b in bounds)
    ) and isinstance(f.get("transients", False), bool)


def _function(f: dict) -> ModelFunction:
    def tensors(ts: list) -> tuple[ModelTensor, ...]:
        return tuple(ModelTensor(t["dtype"], tuple(t["shape"])) for t in ts)

    return ModelFunction(f["name"], tensors(f["inputs"]), tensors(f["outputs"]), tuple(f.get("index_bounds", [])), f.get("transients", False))


__all__ = ["MODEL_RECORD_SCHEMA", "ModelFunction", "ModelTensor", "ModelRecord", "ReplacedOp", "claimed_files", "failed_record", "model_record_name", "read_model_record"]
