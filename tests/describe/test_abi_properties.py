"""Property tests of the manifest loader: any TOML-shaped table gives a ModuleSpec or the
kit's ManifestError, never another exception; names that are not identifiers are refused."""

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kitdispatch import ManifestError, ModuleSpec
from kitdispatch.describe.manifest import parse_manifest

ROOT = Path(tempfile.mkdtemp(prefix="kitdispatch-props-"))
(ROOT / "k.cu").write_text(
    'extern "C" __global__ void k(const float* x, float* y, float a, int n, unsigned s_lo, unsigned s_hi) {}\n'
)

KEYS = [
    "name", "kernels", "programs", "test", "source", "params", "shapes", "inout", "in", "scalars",
    "values", "workgroup_size", "workgroup_count", "function", "format", "out", "scalar", "value",
    "x", "y", "a", "n", "s", "functions", "args", "results", "reference", "sizes", "seed",
]
leaves = st.one_of(
    st.sampled_from(["k", "k.cu", "f32[n]", "i64", "u64", "f16", "bool", "ceildiv(n, 64)", "n", "fatbin", "x", "y"]),
    st.text(max_size=12),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
toml_values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=6),
    max_leaves=30,
)
kernel_tables = st.fixed_dictionaries(
    {"name": st.sampled_from(["k", "k<float>", "ns::k", "bad name"]), "source": st.just("k.cu")},
    optional={
        "workgroup_size": st.lists(st.integers(-2, 2048), max_size=4),
        "workgroup_count": st.lists(st.sampled_from(["ceildiv(n, 64)", 1, "n * n", "m"]), max_size=4),
        "shapes": st.dictionaries(st.sampled_from(["x", "y", "z"]), st.sampled_from(["f32[n]", "i32[n]", "f32[", 3])),
        "inout": st.lists(st.sampled_from(["x", "y", "q"]), max_size=2),
        "scalars": st.dictionaries(st.sampled_from(["a", "n", "s"]), st.sampled_from(["f32", "i64", "u64", "f64", "x"])),
        "values": st.dictionaries(st.sampled_from(["a", "n", "s"]), leaves),
        "params": toml_values,
    },
)
manifests = st.one_of(
    st.dictionaries(st.sampled_from(KEYS), toml_values, max_size=5),
    st.fixed_dictionaries({"kernels": st.lists(kernel_tables, min_size=1, max_size=2)}),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests)
def test_any_table_gives_a_spec_or_a_manifest_error(data):
    try:
        spec = parse_manifest(data, root=ROOT, where="kitdispatch.toml")
    except ManifestError as err:
        assert str(err)
    else:
        assert isinstance(spec, ModuleSpec)


def test_a_valid_inferred_manifest_loads():
    data = {"kernels": [{"name": "k", "source": "k.cu", "workgroup_size": [64], "workgroup_count": ["ceildiv(n, 64)"],
                         "shapes": {"x": "f32[n]", "y": "f32[n]"}, "scalars": {"s": "u64"}}]}
    spec = parse_manifest(data, root=ROOT, where="kitdispatch.toml")
    assert [p.name for p in spec.kernels[0].params] == ["x", "y", "a", "n", "s"]


@pytest.mark.parametrize(
    "bad",
    ['k"x', "k{", "k}", "k$", "k\nx", "kérnel", "k" * 300, "", "1k", "k x"],
)
@pytest.mark.parametrize("field", ["name", "function"])
def test_names_that_are_not_identifiers_are_refused_clearly(bad, field):
    kernel = {"name": "k", "source": "k.cu", "workgroup_size": [64], "workgroup_count": [1],
              "shapes": {"x": "f32[4]", "y": "f32[4]"}, "values": {"a": 1.0, "n": 4}}
    kernel[field] = bad
    with pytest.raises(ManifestError) as err:
        parse_manifest({"kernels": [kernel]}, root=ROOT, where="kitdispatch.toml")
    text = str(err.value)
    assert "not a valid identifier" in text or "non-empty string" in text
    assert len(text) < 1000  # a 300-character name is shortened in the message


@settings(max_examples=300, deadline=None)
@given(value=st.floats(allow_nan=False))
def test_an_f32_argument_is_refused_exactly_when_it_would_arrive_as_infinity(value):
    """A finite number too large for an f32 used to reach the kernel as inf; infinities stay legal."""
    import math

    import numpy as np

    from kitdispatch.describe import abi

    with np.errstate(over="ignore"):  # rounding to f32 decides: values just over the largest round down
        fits = math.isinf(value) or math.isfinite(float(np.float32(value)))
    try:
        got = abi.argument(abi.BY_NAME["f32"], value)
    except OverflowError as exc:
        assert not fits and "out of range for f32" in str(exc)
        return
    assert fits and (math.isinf(got) == math.isinf(value))
