"""Describing kernels: the TOML manifest and the Python API give the same, validated spec."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kitdispatch import Buffer, Kernel, ManifestError, Scalar, TensorType, load_manifest
from kitdispatch.describe.manifest import parse_manifest
from kitdispatch.describe.index_expr import IndexExpr

from conftest import SAMPLES

GOOD_KERNEL = {
    "name": "k",
    "source": "k.cu",
    "workgroup_size": [64],
    "workgroup_count": ["ceildiv(n, 64)"],
    "params": [{"name": "x", "in": "f32[n]"}, {"name": "y", "out": "f32[n]"}, {"name": "n", "scalar": "i32"}],
}


def parse(data, tmp_path):
    return parse_manifest(data, root=tmp_path, where="kitdispatch.toml")


def kernel_with(**changes):
    k = dict(GOOD_KERNEL)
    k.update(changes)
    return {"kernels": [k]}


def test_sample_manifest_matches_python_api():
    spec = load_manifest(SAMPLES / "simple_mul")
    api = Kernel.create(
        "simple_mul",
        "simple_mul.cu",
        [
            Buffer("lhs", "in", TensorType("f32", ("n",))),
            Buffer("rhs", "in", TensorType("f32", ("n",))),
            Buffer("out", "out", TensorType("f32", ("n",))),
            Scalar("n", "i32"),
        ],
        workgroup_size=[64],
        workgroup_count=["ceildiv(n, 64)"],
    )
    assert spec.kernels[0] == api
    assert spec.name == "simple_mul"
    assert [s.name for s in spec.signatures] == ["simple_mul", "simple_mul_inplace", "mixed_invocation"]


def test_signature_of_inplace_kernel():
    spec = load_manifest(SAMPLES / "simple_mul")
    sig = spec.kernels[1].signature()
    assert [str(a) for a in sig.args] == ["f32[n]", "f32[n]"]
    assert [str(r) for r in sig.results] == ["f32[n]"]


@pytest.mark.parametrize(
    "data, message",
    [
        ({}, "missing key 'kernels'"),
        ({"kernels": [], "colour": 1}, "unknown key 'colour'"),
        (kernel_with(wokgroup_size=[1]), "unknown key 'wokgroup_size'"),
        ({"kernels": [{k: v for k, v in GOOD_KERNEL.items() if k != "source"}]}, "missing key 'source'"),
        (kernel_with(params=[{"name": "x", "inn": "f32[n]"}]), "unknown key 'inn'"),
        (kernel_with(params=[{"name": "x", "in": "f32[n]", "out": "f32[n]"}]), "exactly one of"),
        (kernel_with(params=[{"name": "x", "in": "f33[n]"}]), "unknown element type 'f33'"),
        (kernel_with(params=[{"name": "x", "in": "f32(n)"}]), "is not a tensor type"),
        (kernel_with(name="my-kernel"), "not a valid identifier"),
        (kernel_with(workgroup_size=[2048]), "over CUDA's 1024"),
        (kernel_with(workgroup_size=[0]), "positive integers"),
        (kernel_with(workgroup_count=["n ** 2"]), "unsupported syntax 'n ** 2'"),
        (kernel_with(workgroup_count=["ceildiv(n, 0)"]), "divisor '0' is not a positive integer"),
        (kernel_with(workgroup_count=["n // (2 - 4)"]), "divisor '2 - 4' is not a positive integer"),
        (kernel_with(workgroup_count=["min(n)"]), "min() takes 2 to 16 arguments, got 1"),
        (kernel_with(workgroup_count=["n * sizeof(n)"]), "'sizeof(n)' names no type"),
        (kernel_with(workgroup_count=["ceildiv(n, m)"]), "uses 'm'"),
        (kernel_with(dynamic_shared_memory="n * 4 * k"), "dynamic_shared_memory uses 'k'"),
        (kernel_with(dynamic_shared_memory=-1), "dynamic_shared_memory -1 is not a byte count"),
        (kernel_with(dynamic_shared_memory="n * 4", dynamic_shared_memory_max=300000), "dynamic_shared_memory_max 300000 is not a byte count"),
        (kernel_with(dynamic_shared_memory=256, dynamic_shared_memory_max=1024), "dynamic_shared_memory_max is for"),
        (kernel_with(dynamic_shared_memory={"sm_90a": 200000}), "has no 'default' entry"),
        (kernel_with(dynamic_shared_memory={"default": 0, "hopper": 200000}), "names 'hopper', which is no architecture"),
        (kernel_with(dynamic_shared_memory={"default": 0, "sm_86": 110000}), "110000 bytes is more than a block may have on sm_86 (101376)"),
        (kernel_with(dynamic_shared_memory={"default": 0, "sm_90a": 300000}), "dynamic_shared_memory[sm_90a] 300000 is not a byte count"),
        (kernel_with(dynamic_shared_memory={"default": "n * 4", "sm_90a": 1024}), "dynamic_shared_memory[default] 'n * 4' is not a byte count"),
        (kernel_with(dynamic_shared_memory={"default": 0, "sm_90a": 1024}, dynamic_shared_memory_max=2048), "not for a table of architectures"),
        (kernel_with(defines=["A B"]), "defines must be a list of NAME or NAME=VALUE"),
        (kernel_with(defines="A"), "defines must be a list"),
        (kernel_with(include_dirs="inc"), "include_dirs must be a list"),
        ({"kernels": [GOOD_KERNEL], "defines": ["X=1\n"]}, "defines must be a list"),
        (kernel_with(workgroup_count=["ceildiv(m, 64)"]), "uses 'm'"),
        (kernel_with(workgroup_count=["n +"]), "cannot parse index expression"),
        (kernel_with(workgroup_count=[1, 1, 1, 1]), "1 to 3 entries"),
        (kernel_with(params=[{"name": "x", "in": "f32[n]"}]), "no result buffer"),
        (kernel_with(params=[{"name": "x", "in": "f32[n]"}, {"name": "y", "out": "f32[m]"}]), "uses 'm'"),
        (kernel_with(params=[{"name": "x", "inout": "f32[n]"}, {"name": "x", "scalar": "i32"}]), "appears twice"),
        (kernel_with(params=[{"name": "x", "inout": "f32[n]"}, {"name": "s", "scalar": "f8"}]), "f8"),
        ({"kernels": [GOOD_KERNEL, GOOD_KERNEL]}, "described twice"),
        ({"kernels": [GOOD_KERNEL], "test": {"sizes": {"n": -1}}}, "positive integers"),
    ],
)
def test_manifest_errors_name_the_problem(tmp_path, data, message):
    with pytest.raises(ManifestError) as err:
        parse(data, tmp_path)
    assert message in str(err.value)
    assert "kitdispatch.toml" in str(err.value)
    assert "fix:" in str(err.value)


def test_shared_memory_per_arch_from_toml_and_python_agree(tmp_path):
    spec = load_manifest(SAMPLES.parent / "tests" / "data" / "shared_per_arch")
    kernel = spec.kernels[0]
    assert (kernel.shared_memory_for("sm_90a"), kernel.shared_memory_for("sm_90"), kernel.shared_memory_for("sm_80")) == (200000, 4096, 4096)
    same = parse(kernel_with(dynamic_shared_memory={"sm_90a": 200000, "default": 4096}), tmp_path).kernels[0]
    assert same.shared_memory_by_arch == kernel.shared_memory_by_arch and same.dynamic_shared_memory == 4096


def test_toml_syntax_error_has_a_line(tmp_path):
    (tmp_path / "kitdispatch.toml").write_text("name = \n")
    with pytest.raises(ManifestError, match=r"line 1"):
        load_manifest(tmp_path)


def test_missing_manifest(tmp_path):
    with pytest.raises(ManifestError, match="no manifest at"):
        load_manifest(tmp_path)


@pytest.mark.parametrize(
    "text, values, expected",
    [
        ("ceildiv(n, 64)", {"n": 129}, 3),
        ("n // 32 + 1", {"n": 64}, 3),
        ("(m + 15) // 16", {"m": 17}, 2),
        ("4 * n - 1", {"n": 2}, 7),
        ("n % 8", {"n": 13}, 5),
        ("7", {}, 7),
    ],
)
def test_index_expressions_evaluate_like_affine(text, values, expected):
    expr = IndexExpr.parse(text, "test")
    assert expr.evaluate(values) == expected
    assert set(expr.symbols) == set(values)


def test_scalar_from_shape_and_free_scalars():
    k = Kernel.create(
        "k",
        "k.cu",
        [
            Buffer("x", "in", TensorType("f32", ("m", "n"))),
            Buffer("y", "out", TensorType("f32", ("n", "m"))),
            Scalar("m", "i32"),
            Scalar("n", "i32"),
            Scalar("alpha", "f32"),
            Scalar("count", "u32"),
        ],
        workgroup_size=[16, 16],
        workgroup_count=["ceildiv(n, 16)", "ceildiv(m, 16)"],
    )
    assert k.dimension_symbols == ("m", "n")
    assert [p.name for p in k.function_arguments] == ["x", "alpha", "count"]
    assert k.workload == ("n", "m")
    assert k.workgroup_size == (16, 16, 1)


def test_test_scalars_keep_integers_exact_through_the_record(tmp_path):
    """A u64 test value above 2^53 must reach the kernel as written, not rounded by a float."""
    from kitdispatch import BuildOptions, generate
    from kitdispatch.describe.record import read_record

    cu = 'extern "C" __global__ void k(unsigned long long* o, unsigned long long v) { o[0] = v; }\n'
    toml = ('[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [1]\nworkgroup_count = [1]\n'
            'shapes = { o = "i64[1]" }\n\n[test]\nscalars = { v = 9007199254740993 }\n')
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "k.cu").write_text(cu)
    (tmp_path / "p" / "kitdispatch.toml").write_text(toml)
    result = generate(tmp_path / "p", BuildOptions.create("sm_80", format="ptx"), tmp_path / "out")
    assert read_record(result.record).test.scalars == (("v", 2**53 + 1),)


# ------------------------------------------------------- numbers against the C parameter's type
# Issue 21, item 6: a number the manifest fixes reaches the kernel as a C integer of fixed
# width; one that does not fit would be read wrapped (2147483648 as an `int` is -2^31).

RANGE_CU = 'extern "C" __global__ void k(const float* x, float* y, int m, unsigned u, float a, bool b, long long w, signed char c) {}\n'
RANGE_TOML = """[[kernels]]
name = "k"
source = "k.cu"
workgroup_size = [64]
workgroup_count = ["ceildiv(n, 64)"]
shapes = {{ x = "f32[n]", y = "f32[n]" }}
values = {{ {values} }}
"""
FITTING = "m = 1, u = 1, a = 0.5, b = 1, w = 1, c = 1"


def _range_project(tmp_path, **values):
    from conftest import write_kernel_project

    table = dict(kv.split(" = ") for kv in FITTING.split(", "))
    table.update(values)
    return write_kernel_project(tmp_path / "p", RANGE_CU, RANGE_TOML.format(values=", ".join(f"{k} = {v}" for k, v in table.items())))


@pytest.mark.parametrize(
    "values, message",
    [
        ({"m": "2147483648"}, "value of 'm': 2147483648 does not fit its type i32 (-2147483648 to 2147483647)"),
        ({"m": '"2147483647 + 1"'}, "value of 'm': 2147483648 does not fit its type i32"),
        ({"m": "-2147483649"}, "value of 'm': -2147483649 does not fit its type i32"),
        ({"u": "-1"}, "value of 'u': -1 does not fit its type u32 (0 to 4294967295)"),
        ({"u": "4294967296"}, "value of 'u': 4294967296 does not fit its type u32"),
        ({"b": "2"}, "value of 'b': 2 does not fit its type bool (0 to 1)"),
        ({"c": "128"}, "value of 'c': 128 does not fit its type i8 (-128 to 127)"),
        ({"w": "9223372036854775808"}, "value of 'w': 9223372036854775808 does not fit its type i64"),
        ({"a": "1e300"}, "value of 'a': 1e+300 is not a finite f32"),
    ],
)
def test_constant_values_must_fit_the_c_parameter(tmp_path, values, message):
    """Through the CLI: exit 2, the manifest and parameter named, nothing written."""
    from conftest import run_cli as run

    code, out, err = run("gen", str(_range_project(tmp_path, **values)), "-o", str(tmp_path / "out"))
    assert code == 2, err
    assert message in err and f"kitdispatch.toml: kernels[0] (k): values.{next(iter(values))}: " in err and "fix:" in err
    assert "Traceback" not in err and "internal error" not in err
    assert not (tmp_path / "out").exists()


def test_constant_values_at_the_ends_of_the_range_are_kept(tmp_path):
    spec = load_manifest(_range_project(
        tmp_path, m="-2147483648", u="4294967295", w="-9223372036854775808", c="-128", b="0", a="3.4e38"
    ))
    values = {s.name: s.value for s in spec.kernels[0].scalars}
    assert values["m"].constant == -(2**31) and values["u"].constant == 2**32 - 1 and values["w"].constant == -(2**63)


INTEGER_TYPES = ("bool", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64")


@settings(max_examples=300, deadline=None)
@given(dtype=st.sampled_from(INTEGER_TYPES), value=st.integers(-(2**64), 2**64))
def test_a_constant_value_is_accepted_exactly_when_its_type_holds_it(dtype, value):
    """Property: a scalar's constant value passes validation iff the C type's range holds it
    (the range written out here from the type's width, not taken from the kit)."""
    bits = 1 if dtype == "bool" else int(dtype[1:])
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if dtype.startswith("i") else (0, 2**bits - 1)
    params = [Buffer("x", "in", TensorType("f32", ("n",))), Buffer("y", "out", TensorType("f32", ("n",))), Scalar("s", dtype, IndexExpr.parse(value, "s"))]
    try:
        Kernel.create("k", "k.cu", params, workgroup_size=[64], workgroup_count=["ceildiv(n, 64)"])
        accepted = True
    except ManifestError as exc:
        assert "does not fit its type" in exc.render()
        accepted = False
    assert accepted == (low <= value <= high)


@pytest.mark.parametrize(
    "test_table, message",
    [
        ({"sizes": {"n": 2**31}}, "[test] sizes: kernel k: size: n = 2147483648 does not fit the kernel's i32 parameter n"),
        ({"sizes": {"n": 2**30}, "scalars": {"s": 2**31}}, "[test] scalars: s = 2147483648 is not a i32"),
        ({"scalars": {"a": 1e300}}, "[test] scalars: a = 1e+300 is not a f32"),
    ],
)
def test_test_sizes_and_scalars_must_fit_the_kernel(tmp_path, test_table, message):
    data = {
        "kernels": [dict(GOOD_KERNEL, params=GOOD_KERNEL["params"] + [{"name": "s", "scalar": "i32"}, {"name": "a", "scalar": "f32"}])],
        "test": test_table,
    }
    with pytest.raises(ManifestError) as err:
        parse(data, tmp_path)
    assert message in err.value.render()


def test_a_negative_test_seed_is_a_manifest_error(tmp_path):
    """numpy's generators refuse it: `kitdispatch test` failed on it with an internal error."""
    with pytest.raises(ManifestError) as err:
        parse(dict(kernel_with(), test={"seed": -1}), tmp_path)
    assert "seed must be a non-negative integer, got -1" in err.value.render()


@pytest.mark.parametrize("count, axis", [([2**31], "x"), ([1, 65536], "y"), ([1, 1, 2**32], "z"), ([0], "x")])
def test_constant_workgroup_counts_must_fit_cuda_grid(tmp_path, count, axis):
    with pytest.raises(ManifestError) as err:
        parse(kernel_with(workgroup_count=count), tmp_path)
    assert f"workgroup_count {axis} = " in err.value.render() and "CUDA's" in err.value.render()


@pytest.mark.parametrize("nested", ["x = " + "[" * 50000 + "]" * 50000, "x = " + "{a = " * 5000 + "1" + "}" * 5000])
def test_deeply_nested_toml_is_a_manifest_error(tmp_path, nested):
    from conftest import run_cli as run

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "kitdispatch.toml").write_text(nested + "\n")
    code, out, err = run("gen", str(tmp_path / "p"), "-o", str(tmp_path / "out"))
    assert code == 2, err
    assert f"{tmp_path / 'p' / 'kitdispatch.toml'}: arrays or tables are nested too deeply" in err
    assert "Traceback" not in err and "internal error" not in err and not (tmp_path / "out").exists()


def test_explicit_params_values_are_range_checked_where_they_are_written(tmp_path):
    params = GOOD_KERNEL["params"][:2] + [{"name": "n", "scalar": "u16", "value": 65536}]
    with pytest.raises(ManifestError) as err:
        parse(kernel_with(params=params), tmp_path)
    assert "kitdispatch.toml: kernels[0] (k): params[2]: value of 'n': 65536 does not fit its type u16 (0 to 65535)" in err.value.render()


@pytest.mark.parametrize("value", [5, True, "n", 2**40])
def test_a_python_api_value_that_is_no_index_expression_or_float_is_refused(value):
    """`Scalar("m", "i32", 5)`: the renderer would have failed on it with a KeyError."""
    params = [Buffer("x", "in", TensorType("f32", ("n",))), Buffer("y", "out", TensorType("f32", ("n",))), Scalar("m", "i32", value)]
    with pytest.raises(ManifestError) as err:
        Kernel.create("k", "k.cu", params, workgroup_size=[64], workgroup_count=["ceildiv(n, 64)"])
    assert f"value of 'm' is {value!r}, not an index expression or a float" in err.value.render()
