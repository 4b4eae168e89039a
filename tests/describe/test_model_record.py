"""describe/model_record.py: the model record, its one writer and one reader (typed, versioned; damaged and
hostile records refused)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LINALG_MODEL, REPO, json_paths, json_replaced_at, json_values, model_project, needs_iree_compile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kitdispatch import KitError
from kitdispatch.cli import main
from kitdispatch.describe.record import DamagedRecord, RecordError, sha256
from kitdispatch.describe.model_record import ModelTensor
from kitdispatch.describe.model_record import (
    MODEL_RECORD_SCHEMA,
    claimed_files,
    read_model_record,
)


@needs_iree_compile
def test_record_lists_functions_for_compare(linalg_build):
    record = json.loads(linalg_build[0].record.read_text())
    assert record["functions"] == [{"name": "forward", "inputs": [{"dtype": "f32", "shape": [512, 256]}, {"dtype": "f32", "shape": [256, 1000]}],
                                    "outputs": [{"dtype": "f32", "shape": [512, 1000]}, {"dtype": "f32", "shape": [1000, 512]}]}]
    assert record["iree_flags"] == ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_89"]  # IREE's defaults otherwise


LIMIT_S = 120  # far beyond what any command here needs; a hang is what it catches

# A model record as build_model writes it, for the damaged-record tests (files made beside it).
MODEL_RECORD = {
    "schema": 1, "kitdispatch": "0.1.0", "model": "m.mlir", "project": "p", "vmfb": "m.vmfb", "baseline_vmfb": "m.baseline.vmfb",
    "spec": "m.spec.mlir", "archs": ["sm_90"], "codegen_target": "sm_89", "iree_compiler": "3.13", "iree_flags": [],
    "matched_after": ["global-optimization"],
    "functions": [{"name": "forward", "inputs": [{"dtype": "f32", "shape": [4, 8]}, {"dtype": "i64", "shape": [4]}],
                   "outputs": [{"dtype": "f32", "shape": [4, 8]}], "index_bounds": [None, 30]}],
    "replaced": [{"op": "linalg.softmax", "location": "m.mlir:3:8", "kernel": "row_softmax", "kernel_entry": "row_softmax"}],
    "not_replaced": [], "kernel_executables": [], "files": {},
}


def _write_model_record(folder, record) -> None:
    folder.mkdir(exist_ok=True)
    for name in ("m.vmfb", "m.baseline.vmfb"):
        (folder / name).write_bytes(name.encode())
    if isinstance(record, dict) and isinstance(record.get("files"), dict) and not record["files"]:
        record = dict(record, files={n: sha256(n.encode()) for n in ("m.vmfb", "m.baseline.vmfb")})
    (folder / "m.model.json").write_text(json.dumps(record))


_JSON = json_values()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_model_records_with_wrong_json_types_are_damaged_records(tmp_path_factory, data):
    """Property: a model record with any one value swapped for another JSON value is read
    whole or refused as damaged (exit 2), never a TypeError inside compare."""
    folder = tmp_path_factory.mktemp("record")
    path = data.draw(st.sampled_from(list(json_paths(MODEL_RECORD))))
    _write_model_record(folder, json_replaced_at(MODEL_RECORD, path, data.draw(_JSON)))
    try:
        read_model_record(folder)
    except DamagedRecord as exc:
        assert exc.exit_code == 2 and "model record" in exc.render()
    except KitError as exc:  # a well-typed record naming files that are not there, or not its own
        text = exc.render()
        assert any(m in text for m in ("is not the file its model record describes", "is not a file it lists",
                                       "which is not a file name of its folder")), text


@pytest.mark.parametrize(
    "record, message",
    [
        (dict(MODEL_RECORD, files=[]), "'files' is not a table of SHA-256s"),
        (dict(MODEL_RECORD, vmfb=5), "'vmfb' is not a file name"),
        (dict(MODEL_RECORD, functions=[{"name": "forward", "inputs": [{"dtype": "f32", "shape": "4x8"}], "outputs": []}]),
         "'functions' is not a list of signatures"),
        (dict(MODEL_RECORD, replaced=[{"op": 1}]), "'replaced' is not a list of replaced ops"),
        ("[" * 100000 + "]" * 100000, "cannot read the model record: RecursionError"),
        (dict(MODEL_RECORD, functions=[dict(MODEL_RECORD["functions"][0], index_bounds=[30])]), "'functions' is not a list of signatures"),
        (dict(MODEL_RECORD, functions=[dict(MODEL_RECORD["functions"][0], index_bounds=[None, 0])]), "'functions' is not a list of signatures"),
    ],
    ids=["files", "vmfb", "functions", "replaced", "deep", "bounds-count", "bounds-zero"],
)
@pytest.mark.parametrize("command", ["compare", "profile"])
def test_compare_and_profile_on_a_damaged_model_record(tmp_path, record, message, command):
    if isinstance(record, str):
        _write_model_record(tmp_path / "built", {})
        (tmp_path / "built" / "m.model.json").write_text(record)
    else:
        _write_model_record(tmp_path / "built", record)
    before = {p.name: p.read_bytes() for p in (tmp_path / "built").iterdir()}
    err = io.StringIO()
    assert main([command, str(tmp_path / "built")], io.StringIO(), err) == 2, err.getvalue()
    assert message in err.getvalue() and "Traceback" not in err.getvalue() and "internal error" not in err.getvalue()
    assert {p.name: p.read_bytes() for p in (tmp_path / "built").iterdir()} == before


@needs_iree_compile
def test_the_record_reads_back_typed_and_writes_the_same_bytes(linalg_build):
    """One writer, one reader: what a build wrote reads as a typed ModelRecord that writes
    itself back byte for byte, and compare's fields are typed."""
    result, _, out = linalg_build
    raw = result.record.read_bytes()
    folder, record = read_model_record(out)
    assert folder == out and record.to_bytes() == raw
    assert record.schema == MODEL_RECORD_SCHEMA and record.vmfb == "mm_softmax.vmfb" and record.baseline_vmfb == "mm_softmax.baseline.vmfb"
    assert [(r.op, r.kernel_entry) for r in record.replaced] == [("linalg.softmax", "row_softmax")]
    assert record.function(None).inputs[0] == ModelTensor("f32", (512, 256))
    assert record.matched_after == ("global-optimization",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.vmfb = "other.vmfb"


def test_a_record_of_another_schema_is_refused(tmp_path):
    _write_model_record(tmp_path / "built", dict(MODEL_RECORD, schema=2))
    with pytest.raises(DamagedRecord, match="schema 2, not 1"):
        read_model_record(tmp_path / "built")


@pytest.mark.parametrize("name", ["../m.vmfb", "/etc/passwd", "sub/m.vmfb", ".."])
def test_a_record_naming_files_outside_its_folder_is_refused_by_compare(tmp_path, name):
    """compare's reader refuses the record; the next build's reads the claims and its
    OutputFolder refuses the name (test_a_model_record_naming_a_file_outside_...)."""
    _write_model_record(tmp_path / "built", dict(MODEL_RECORD, files={name: "0" * 64}))
    with pytest.raises(RecordError, match="which is not a file name of its folder"):
        read_model_record(tmp_path / "built")
    assert name in claimed_files(tmp_path / "built" / "m.model.json")  # the next build's OutputFolder refuses it


def test_the_record_lists_what_the_folder_claims(tmp_path):
    _write_model_record(tmp_path / "built", MODEL_RECORD)
    assert sorted(claimed_files(tmp_path / "built" / "m.model.json")) == ["m.baseline.vmfb", "m.vmfb"]


# ------------------------------------------------ records that are not what a build writes


def _kitdispatch(*argv: object, env: dict | None = None) -> tuple[int, str, float]:
    """The CLI in a subprocess with a hard time limit: a hang fails the test, not the suite."""
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "kitdispatch", *map(str, argv)], cwd=REPO, capture_output=True, text=True,
                              timeout=LIMIT_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kitdispatch {' '.join(map(str, argv))} hung (no answer in {LIMIT_S} s)")
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stderr, time.monotonic() - start


def _replace_with(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(kind)


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_model_record_or_module_that_is_not_a_regular_file_never_blocks_compare(tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    (out / "m.vmfb").write_bytes(b"module")
    record = {"schema": 1, "vmfb": "m.vmfb", "baseline_vmfb": "m.base.vmfb", "functions": [],
              "files": {"m.vmfb": sha256(b"module"), "m.base.vmfb": "0" * 64}}
    (out / "m.model.json").write_text(json.dumps(record))
    _replace_with(out / "m.base.vmfb", kind)
    code, err, _ = _kitdispatch("compare", out)
    assert code == 1 and "m.base.vmfb cannot be read" in err, err
    _replace_with(out / "m.model.json", kind)
    code, err, _ = _kitdispatch("compare", out)
    assert code == 1 and "no model build in" in err, err
    code, err, _ = _kitdispatch("compare", out / "m.model.json")
    assert code == 1, err


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file and link under `folder` with its content (links: their target)."""
    return {
        str(p.relative_to(folder)): b"->" + os.readlink(p).encode() if p.is_symlink() else p.read_bytes() if p.is_file() else b"<dir>"
        for p in folder.rglob("*")
    }


def _one_line_error(err: str, *needles: str) -> None:
    first = next((line for line in err.splitlines() if "error:" in line), "")  # progress lines aside
    assert all(n in first for n in needles), err
    assert "Traceback" not in err and "internal error" not in err, err


@needs_iree_compile
def test_a_model_record_naming_a_file_outside_is_refused_by_build_and_compare(tmp_path):
    model = tmp_path / "mm.mlir"
    model.write_text(LINALG_MODEL)
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("outside the folder\n")
    (out / "mm.model.json").write_text(json.dumps({"schema": 1, "vmfb": "../victim.txt", "files": {"../victim.txt": sha256(victim.read_bytes())}}))
    (tmp_path / "p").mkdir()
    proj = model_project(tmp_path / "p")
    before = _tree(tmp_path)
    for argv, code, message in [(["compare", out], 1, "not a file name of its folder"),
                                (["build", proj, "--model", model, "--arch", "sm_80", "-o", out], 2, "not a plain file name")]:
        err = io.StringIO()
        assert main([str(a) for a in argv], io.StringIO(), err) == code
        _one_line_error(err.getvalue(), "mm.model.json", "'../victim.txt'", message)
    assert _tree(tmp_path) == before


def test_index_bounds_read_back_and_an_older_record_has_none(tmp_path):
    """index_bounds (one per input, or none at all in records written before them) read back
    as the function's bounds; compare draws from them."""
    _write_model_record(tmp_path / "new", MODEL_RECORD)
    forward = read_model_record(tmp_path / "new")[1].function("forward")
    assert forward.index_bounds == (None, 30) and forward.index_bound(1) == 30 and forward.index_bound(0) is None
    assert forward.to_json() == MODEL_RECORD["functions"][0]
    older = {k: v for k, v in MODEL_RECORD["functions"][0].items() if k != "index_bounds"}
    _write_model_record(tmp_path / "old", dict(MODEL_RECORD, functions=[older]))
    forward = read_model_record(tmp_path / "old")[1].function("forward")
    assert forward.index_bounds == () and forward.index_bound(1) is None and "index_bounds" not in forward.to_json()
