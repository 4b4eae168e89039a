"""The build record: what a build wrote and what its module needs, beside the .vmfb.

One writer (`BuildRecord.to_bytes`, called by the build) and one reader (`read_record`), used by
the runtime, `kitdispatch test` and the next build of the same folder. The record is also the
proof of ownership of an output folder: it lists every file the build published with its
SHA-256, and the kit replaces or deletes only files it lists with that content.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kitdispatch._files import open_regular, read_regular_file
from kitdispatch.errors import KitError
from kitdispatch.describe.types import FunctionSignature
from kitdispatch.describe.module import TestSpec

RECORD_SUFFIX = ".kitdispatch.json"
MODEL_RECORD_SUFFIX = ".model.json"  # a model build's record (describe/model_record.py)
SCHEMA = 2
# Written before the first file of a build is moved into place and removed after the record:
# while it exists the folder is half-published (a killed build), and readers refuse it.
JOURNAL_SUFFIX = ".kitdispatch-publishing"
# Records and journals are small; a bigger file in their place is not the kit's (and is not read).
MAX_RECORD_BYTES = 64 << 20


class RecordError(KitError):
    """A build record is missing, unreadable, of another version, or disagrees with its files."""


class DamagedRecord(RecordError):
    """A record that is not what a build writes (invalid JSON, a field of the wrong type):
    bad input, as a damaged manifest is."""

    exit_code = 2


def record_name(module: str) -> str:
    return f"{module}{RECORD_SUFFIX}"


def journal_name(module: str) -> str:
    return f".{module}{JOURNAL_SUFFIX}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path) as f:  # a FIFO or /dev/zero in a file's place would never end
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Diagnostic:
    """A warning a tool printed on success, kept with where it points."""

    tool: str
    where: str
    text: str


@dataclass(frozen=True)
class BuildRecord:
    name: str
    kitdispatch: str
    mlir: str
    vmfb: str | None
    archs: tuple[str, ...]
    format: str
    kernel_formats: dict[str, str]
    # The PTX ISA the module needs from the driver when some kernel runs from PTX only.
    ptx_isa: str | None
    compiler: dict[str, str]
    iree_compiler: str | None
    codegen_target: str
    objects: tuple[str, ...]
    functions: tuple[FunctionSignature, ...]
    test: TestSpec  # its reference by file name, in the output folder
    # Every file the build published in its folder (the record aside) -> its SHA-256.
    files: dict[str, str]
    # Kernel name -> {"function": ..., "entry": ...} where the kit named something differently.
    names: dict[str, dict[str, str]] = field(default_factory=dict)
    diagnostics: tuple[Diagnostic, ...] = ()
    # Files of the folder the build read but did not write (a [test] reference that lives in
    # the output folder itself) -> SHA-256: checked like `files`, never the kit's to replace.
    inputs: dict[str, str] = field(default_factory=dict)
    schema: int = SCHEMA

    def to_bytes(self) -> bytes:
        data = asdict(self)
        data["functions"] = [f.to_json() for f in self.functions]
        data["test"] = self.test.to_json()
        return (json.dumps(data, indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> "BuildRecord":
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
            raise DamagedRecord(f"the build record is not valid JSON ({type(exc).__name__}: {exc})", where=where, fix=_REBUILD) from None
        if not isinstance(data, dict):
            raise DamagedRecord("the build record is not a JSON object", where=where, fix=_REBUILD)
        schema = data.get("schema")
        if schema != SCHEMA:
            raise RecordError(
                f"the build record has schema {schema!r}; this kitdispatch reads schema {SCHEMA}",
                where=where,
                fix=_REBUILD,
            )
        try:
            return cls(
                name=_str(data["name"]),
                kitdispatch=_str(data["kitdispatch"]),
                mlir=_str(data["mlir"]),
                vmfb=None if data["vmfb"] is None else _str(data["vmfb"]),
                archs=tuple(_str(a) for a in _list(data["archs"])),
                format=_str(data["format"]),
                kernel_formats={_str(k): _str(v) for k, v in data["kernel_formats"].items()},
                ptx_isa=None if data["ptx_isa"] is None else _str(data["ptx_isa"]),
                compiler={_str(k): _str(v) for k, v in data["compiler"].items()},
                iree_compiler=None if data["iree_compiler"] is None else _str(data["iree_compiler"]),
                codegen_target=_str(data["codegen_target"]),
                objects=tuple(_str(o) for o in _list(data["objects"])),
                functions=tuple(_function(f, where) for f in _list(data["functions"])),
                test=TestSpec.from_json(
                    data["test"], where, check_name=_str, check_size=lambda v: _int(v, least=1),
                    check_seed=lambda v: _int(v, least=0), check_number=_number,
                ),
                files={_plain_name(k): _str(v) for k, v in data["files"].items()},
                names={_str(k): {_str(a): _str(b) for a, b in v.items()} for k, v in data.get("names", {}).items()},
                diagnostics=tuple(Diagnostic(_str(d["tool"]), _str(d["where"]), _str(d["text"])) for d in _list(data.get("diagnostics", []))),
                inputs={_plain_name(k): _str(v) for k, v in data.get("inputs", {}).items()},
            )
        except KitError as exc:
            raise DamagedRecord(f"the build record is damaged: {exc.what}", where=where, fix=_REBUILD) from None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise DamagedRecord(f"the build record is damaged ({type(exc).__name__}: {exc})", where=where, fix=_REBUILD) from None

    def check_file(self, folder: Path, name: str) -> Path:
        """The file `name` of this build, after checking it is the one the build wrote."""
        path = folder / name
        want = self.files.get(name, self.inputs.get(name))
        try:
            got = file_sha256(path)
        except OSError as exc:
            raise RecordError(f"{path} cannot be read: {exc.strerror}", where=str(folder), fix=_REBUILD) from None
        if want is None or got != want:
            raise RecordError(
                f"{name} is not the file its build record describes (the build was interrupted, or the "
                "file was replaced since)",
                where=str(path),
                fix=_REBUILD,
            )
        return path


_REBUILD = "rebuild the module with this kitdispatch (kitdispatch build ... -o DIR)"


def read_record(path: Path) -> BuildRecord:
    """The record at `path`; refuses a folder whose last build was interrupted."""
    path = Path(path)
    try:
        raw = read_regular_file(path, limit=MAX_RECORD_BYTES)
    except FileNotFoundError:
        raise RecordError(f"no build record at {path}", fix=_REBUILD) from None
    except OSError as exc:
        raise RecordError(f"cannot read the build record {path}: {exc.strerror}", fix=_REBUILD) from None
    record = BuildRecord.from_bytes(raw, str(path))
    if (path.parent / journal_name(record.name)).exists():
        raise RecordError(
            f"the last build of {record.name!r} in {path.parent} was interrupted while it published its files",
            where=str(path.parent),
            fix=_REBUILD,
        )
    return record


def record_beside(vmfb: Path) -> Path:
    return vmfb.with_name(vmfb.name.removesuffix(".vmfb") + RECORD_SUFFIX)


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _function(data: object, where: str) -> FunctionSignature:
    """A function's signature, after checking the JSON types FunctionSignature.from_json reads."""
    if not isinstance(data, dict):
        raise TypeError(f"a function is not a JSON object: {data!r:.60}")
    _str(data["name"])
    for key in ("args", "results", "arg_names"):
        _list(data.get(key, []))
    return FunctionSignature.from_json(data, where)


def _list(value: object) -> list:
    """A JSON array: a string would iterate as its characters."""
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r:.60}")
    return value


def _int(value: object, *, least: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    if least is not None and value < least:  # a size or seed numpy would refuse in `kitdispatch test`
        raise ValueError(f"expected an integer of at least {least}, got {value}")
    return value


def _number(value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    return value


def _plain_name(value: object) -> str:
    """Files of a record are names inside its folder: a path would let a damaged record point
    the kit at someone else's file."""
    name = _str(value)
    if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise TypeError(f"{name!r} is not a file name")
    return name
