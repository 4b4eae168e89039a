"""Sample test runs: which tolerance a result gets, and the report's closing line."""

import pytest

from kitdispatch.describe.types import FunctionSignature, TensorType
from kitdispatch.run.sample_tests import CaseResult, Report, _tolerance_dtype

F32, F16, I32 = (TensorType(d, ("n",)) for d in ("f32", "f16", "i32"))


@pytest.mark.parametrize(
    "args, result, expected",
    [
        ((F32, F32), F32, "f32"),
        ((F16, F16), F32, "f16"),  # f16 inputs, f32 accumulation: the f16 tolerance
        ((F32,), I32, "i32"),  # integer results (argmax) match exactly
        ((TensorType("bf16", ("n",)), F16), F32, "bf16"),
    ],
)
def test_tolerance_follows_the_least_precise_float(args, result, expected):
    assert _tolerance_dtype(FunctionSignature("f", args, (result,)), result) == expected


def test_summary_line_counts_every_status():
    report = Report(cases=[CaseResult("m", f, s, "") for f, s in [("a", "pass"), ("b", "fail"), ("c", "skip")]])
    assert report.summary() == "1 passed, 1 failed, 1 skipped"
    assert not report.ok


def test_a_folder_of_builds_passes_over_subfolders_with_nothing_to_test(tmp_path):
    from kitdispatch import KitError
    from kitdispatch.run.sample_tests import find_targets

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "a.kitdispatch.json").write_text("{}")
    (tmp_path / "model_build").mkdir()  # e.g. a model build: no kit record
    (tmp_path / "model_build" / "m.model.json").write_text("{}")
    assert find_targets(tmp_path) == [tmp_path / "a" / "a.kitdispatch.json"]
    with pytest.raises(KitError, match="nothing to test"):
        find_targets(tmp_path / "model_build")
