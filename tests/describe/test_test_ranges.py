"""[test] ranges and tolerances: where `kitdispatch test` draws each argument's values from
(valid indices for an index argument), and how close a function's results must be.

On the CPU: the manifest's errors, the drawn values (within range, the same for a seed), the
record carrying both from a real build (tests/data/test_ranges, NVRTC + iree-compile), and
`kitdispatch test`'s case logic on IREE's local-task device (tests/data/cpu_sized). On a GPU:
the gather and reduction kernels of tests/data/test_ranges through `kitdispatch test`."""

import io

import numpy as np
import pytest

import kitdispatch as kd
from kitdispatch import ManifestError
from kitdispatch.cli import main
from kitdispatch.describe.manifest import load_manifest
from kitdispatch.describe.record import read_record
from kitdispatch.describe.module import InputRange, Tolerance
from kitdispatch.describe.types import ScalarType, TensorType
from kitdispatch.run.sample_tests import _limits, _make_input, _verify_function

from conftest import kernel_toml, REPO, needs_iree_compile, prebuilt_or_build, write_kernel_project

PROJECT = REPO / "tests" / "data" / "test_ranges"

GATHER_CU = r"""
extern "C" __global__ void gather(const int* idx, const float* table, float* out, int n, float scale) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = scale * table[idx[i]];
}
"""
GATHER_TOML = kernel_toml("gather", body="""shapes = { idx = "i32[n]", table = "f32[v]", out = "f32[n]" }

[test]
""")


def load(tmp_path, test_lines: str):
    return load_manifest(write_kernel_project(tmp_path, GATHER_CU, GATHER_TOML + test_lines))


def test_ranges_and_tolerances_load_into_the_spec(tmp_path):
    spec = load(tmp_path, 'ranges = { idx = [0, "v"], scale = [0.5, 1], table = [-1, "2 * v"] }\ntolerances = { gather = { atol = 0.01 } }\n')
    ranges = dict(spec.test.ranges)
    assert str(ranges["idx"].high) == "v" and ranges["idx"].low == 0 and ranges["idx"].integral
    assert ranges["scale"].bounds == (0.5, 1) and not ranges["scale"].integral
    assert ranges["table"].evaluate({"v": 7}) == (-1, 14)
    assert dict(spec.test.tolerances) == {"gather": Tolerance(rtol=0.0, atol=0.01)}


@pytest.mark.parametrize(
    "lines, key, message",
    [
        ('ranges = { index = [0, "v"] }', "ranges.index", "'index', which is no argument of a kernel's function"),
        ("ranges = { idx = [5, 5] }", "ranges.idx", r"the range \[5, 5\) is empty"),
        ("ranges = { idx = [3, 1] }", "ranges.idx", "is empty"),
        ("ranges = { idx = [0, 1.5] }", "ranges.idx", "i32 in gather, and the range .* is not integral"),
        ("ranges = { idx = [0, 1, 2] }", "ranges.idx", r"a range is \[low, high\]"),
        ("ranges = { idx = [0, true] }", "ranges.idx", "a range bound is a number or a size expression"),
        ('ranges = { idx = [0, "v +"] }', "ranges.idx", "cannot parse index expression"),
        ('ranges = { idx = [0, "w"] }', "ranges.idx", "'w', which is no dimension of gather"),
        ("ranges = { idx = [0, 3000000000] }", "ranges.idx", "does not fit i32"),
        ("ranges = { idx = 4 }", "ranges.idx", r"a range is \[low, high\]"),
        ("ranges = [1, 2]", "ranges", "ranges must be a table"),
        ("scalars = { scale = 2.0 }\nranges = { scale = [0, 1] }", "ranges.scale", "both a fixed value"),
        ("tolerances = { gathr = { rtol = 1e-3 } }", "tolerances.gathr", "'gathr', which is no function of the module"),
        ("tolerances = { gather = { rtol = -1.0 } }", "tolerances.gather", "rtol must be a number of 0 or more"),
        ("tolerances = { gather = { rel = 1e-3 } }", "tolerances.gather", "a table of rtol and atol"),
        ("tolerances = { gather = 1e-3 }", "tolerances.gather", "a table of rtol and atol"),
    ],
)
def test_bad_ranges_and_tolerances_are_manifest_errors_naming_file_and_key(tmp_path, lines, key, message):
    with pytest.raises(ManifestError, match=message) as exc:
        load(tmp_path, lines + "\n")
    assert str(tmp_path / "kitdispatch.toml") in exc.value.render() and key in exc.value.render()


def test_inputs_are_drawn_within_their_ranges_the_same_for_a_seed():
    symbols = {"n": 5000, "v": 37}
    idx_t, x_t = TensorType("i32", ("n",)), TensorType("f16", ("n",))
    idx_range, x_range = InputRange.create([0, "v"], "t"), InputRange.create([0.25, 0.5], "t")

    def draw(seed):
        rng = np.random.default_rng(seed)
        return (
            _make_input(idx_t, symbols, rng, _limits(idx_range, "idx", "i32", symbols)),
            _make_input(x_t, symbols, rng, _limits(x_range, "x", "f16", symbols)),
            _make_input(ScalarType("u64"), symbols, rng, _limits(InputRange.create([2**63, 2**64], "t"), "s", "u64", symbols)),
        )

    idx, x, big = draw(3)
    assert idx.dtype == np.int32 and idx.min() == 0 and idx.max() == 36  # every valid index, no other
    assert x.dtype == np.float16 and x.min() >= 0.25 and x.max() <= 0.5
    assert 2**63 <= big < 2**64
    again = draw(3)
    np.testing.assert_array_equal(idx, again[0])
    np.testing.assert_array_equal(x, again[1])
    assert big == again[2] and not np.array_equal(idx, draw(4)[0])
    with pytest.raises(ValueError, match=r"the range of idx, \[0, 0\), is empty"):
        _limits(idx_range, "idx", "i32", {"v": 0})
    with pytest.raises(ValueError, match="does not fit u8"):
        _limits(InputRange.create([0, "v"], "t"), "idx", "u8", {"v": 300})


@needs_iree_compile
def test_the_record_carries_ranges_and_tolerances(tmp_path):
    result = kd.build(PROJECT, kd.BuildOptions.create("sm_80"), tmp_path / "out")
    test = read_record(result.record).test
    assert {name: r.to_json() for name, r in test.ranges} == {"idx": [0, "v"], "x": [0, 1]}
    assert dict(test.tolerances) == {"total": Tolerance(rtol=1e-4, atol=0.0)}


@needs_iree_compile
def test_cases_use_ranges_and_tolerances(cpu_sized_module):
    """On IREE's CPU device: `rows(x, count)` gets x from its range, and a reference that is
    off by 0.5 fails with the f32 tolerance and passes with atol = 1."""
    sig = cpu_sized_module.rows.signature
    seen = []

    def reference(x, count):
        seen.append(x)
        return x[None, :] + np.arange(count, dtype=np.float32)[:, None]

    ranges = {"x": InputRange.create([10, 11], "t"), "count": InputRange.create([2, 3], "t")}
    case = _verify_function("m", cpu_sized_module, sig, reference, {"n": 64}, np.random.default_rng(0), ranges=ranges)
    assert case.status == "pass" and case.detail == "n=64, count=2", case
    assert seen[-1].min() >= 10 and seen[-1].max() <= 11
    off = lambda x, count: reference(x, count) + 0.5  # noqa: E731
    assert _verify_function("m", cpu_sized_module, sig, off, {"n": 8}, np.random.default_rng(0), {"count": 2}).status == "fail"
    loose = _verify_function("m", cpu_sized_module, sig, off, {"n": 8}, np.random.default_rng(0), {"count": 2}, tolerance=Tolerance(atol=1.0))
    assert loose.status == "pass" and loose.max_error == pytest.approx(0.5)
    empty = _verify_function("m", cpu_sized_module, sig, reference, {"n": 8}, np.random.default_rng(0), ranges={"count": InputRange.create([0, "n - 8"], "t")})
    assert empty.status == "fail" and "the range of count, [0, 0), is empty" in empty.detail


# ---------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_gpu_index_and_reduction_kernels_pass_with_ranges_and_a_tolerance(tmp_path_factory, prebuilt_dir):
    build = prebuilt_or_build(PROJECT, tmp_path_factory, prebuilt_dir)
    out, err = io.StringIO(), io.StringIO()
    assert main(["test", str(build)], out, err) == 0, out.getvalue() + err.getvalue()
    assert "2 passed, 0 failed" in out.getvalue()
