"""models/functions.py: the model's functions as the record keeps them, and which integer inputs
index a gather (and its size), read from real imports at the stage ops are matched; compare's
inputs drawn from them."""

from __future__ import annotations

import io
import json

import numpy as np

from kitdispatch import BuildOptions
from kitdispatch.cli import main
from kitdispatch.describe.model_record import ModelFunction, ModelTensor
from kitdispatch.models.compare import DEFAULT_INTEGER_RANGE, compare_model, format_comparison, input_notes, random_inputs
from kitdispatch.models.functions import model_functions
from kitdispatch.models.pipeline import build_model
from kitdispatch.models.spec import parse_mlir

from conftest import CPU_DEVICE, LINALG_MODEL, cpu_model_build, make_embedding_model, needs_iree_compile


def functions_of(tmp_path, *args) -> tuple[ModelFunction, ...]:
    """The embedding model's functions, read at global optimization (for the CPU: the stage's IR
    is the same for every target up to the executables)."""
    folder = cpu_model_build(_model(tmp_path, *args), tmp_path / "out", baseline=False)
    _, module = parse_mlir(folder / "stage.mlir")
    return model_functions(module)


def _model(tmp_path, *args):
    make_embedding_model(tmp_path / "embed.onnx", *args)
    return tmp_path / "embed.onnx"


@needs_iree_compile
def test_token_and_position_ids_index_their_tables_and_the_mask_indexes_nothing(tmp_path):
    (embed,) = functions_of(tmp_path, "--vocab", 50, "--positions", 12)
    assert embed.name == "embed" and embed.inputs == (ModelTensor("i64", (8,)),) * 3
    assert embed.index_bounds == (50, 12, None)  # the mask is cast to float: no gather reads it


@needs_iree_compile
def test_a_dynamic_number_of_tokens_keeps_the_bounds(tmp_path):
    (embed,) = functions_of(tmp_path, "--dynamic")
    assert embed.inputs == (ModelTensor("i64", (None,)),) * 3 and embed.index_bounds == (50, 12, None)


@needs_iree_compile
def test_an_index_two_inputs_make_gives_neither_a_bound(tmp_path):
    """ids + shift index the token table: the table's size bounds their sum, not either input."""
    (embed,) = functions_of(tmp_path, "--shifted")
    assert embed.index_bounds == (None, 12, None, None)


@needs_iree_compile
def test_a_model_without_gathers_records_no_bounds(tmp_path):
    model = tmp_path / "linalg.mlir"
    model.write_text(LINALG_MODEL)
    folder = cpu_model_build(model, tmp_path / "out", baseline=False)
    (forward,) = model_functions(parse_mlir(folder / "stage.mlir")[1])
    assert forward.index_bounds == () and "index_bounds" not in forward.to_json()


@needs_iree_compile
def test_build_model_records_the_bounds_for_compare(tmp_path):
    """The real build (CUDA target, the library's row softmax in place of IREE's) writes them
    into the model record."""
    result = build_model(None, _model(tmp_path), BuildOptions.create("sm_90"), tmp_path / "built")
    assert [d.kernel.name for d in result.replaced] == ["row_softmax"]
    (embed,) = json.loads(result.record.read_text())["functions"]
    assert embed["index_bounds"] == [50, 12, None]


def test_random_inputs_draw_indices_within_their_gather_and_other_integers_from_0_to_1():
    sig = ModelFunction("f", (ModelTensor("i64", (4096,)), ModelTensor("i32", (4096,)), ModelTensor("f32", (8,))), (), (7, None, None))
    ids, other, floats = random_inputs(sig, seed=3)
    assert ids.dtype == np.int64 and ids.min() == 0 and ids.max() == 6
    assert other.dtype == np.int32 and set(np.unique(other)) == set(range(*DEFAULT_INTEGER_RANGE)) == {0, 1}
    assert floats.dtype == np.float32
    notes = input_notes(sig)
    assert notes == (
        "input 0 (4096xi64) indexes a gather of size 7: drawn from 0..6",
        "input 1 (4096xi32) indexes no gather the build found, so its range is unknown: drawn from 0..1; pass --inputs FILE.npz for other values",
    )
    older = ModelFunction("f", sig.inputs, ())  # a record written before index_bounds
    assert set(np.unique(random_inputs(older)[0])) == {0, 1}


@needs_iree_compile
def test_compare_on_the_cpu_draws_ids_in_range_and_times_both_calls(tmp_path):
    """compare_model on a model folder IREE compiled for local-task: the outputs agree (an id out
    of range would read outside the table), the whole call is timed as IREE alone calls it and
    through the kit's prepared call, and the output says how each integer input was drawn."""
    folder = cpu_model_build(_model(tmp_path), tmp_path / "out")
    result = compare_model(folder, device=CPU_DEVICE, repetitions=3)
    assert result.agree, result.worst
    assert result.call_tool == "iree-benchmark-module"
    assert set(result.call_us) == set(result.prepared_us) == {"replaced", "baseline"}
    assert all(t > 0 for t in (*result.call_us.values(), *result.prepared_us.values()))
    text = format_comparison(result)
    assert "input 0 (8xi64) indexes a gather of size 50: drawn from 0..49" in text
    assert "input 2 (8xi64) indexes no gather the build found" in text
    assert "through the kit's prepared call (load_module(DIR), median)" in text
    out = io.StringIO()
    assert main(["compare", str(folder), "--device", CPU_DEVICE, "--json"], out, io.StringIO()) == 0
    report = json.loads(out.getvalue())
    assert set(report["prepared_us"]) == {"replaced", "baseline"} and report["call_tool"] == "iree-benchmark-module"


@needs_iree_compile
def test_compare_takes_the_inputs_given_and_notes_nothing_of_drawing(tmp_path):
    folder = cpu_model_build(_model(tmp_path), tmp_path / "out")
    npz = tmp_path / "inputs.npz"
    np.savez(npz, np.full(8, 49, np.int64), np.arange(8, dtype=np.int64), np.ones(8, np.int64))
    result = compare_model(folder, inputs=npz, device=CPU_DEVICE, repetitions=2)
    assert result.agree and not any("drawn" in n for n in result.notes)
