"""Describing kernels: the TOML manifest and the Python API give the same, validated spec."""

import pytest

from kitdispatch import Buffer, Kernel, ManifestError, ModuleSpec, Scalar, TensorType, load_manifest
from kitdispatch.manifest import parse_manifest
from kitdispatch.spec import IndexExpr

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
    from kitdispatch.record import read_record

    cu = 'extern "C" __global__ void k(unsigned long long* o, unsigned long long v) { o[0] = v; }\n'
    toml = ('[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [1]\nworkgroup_count = [1]\n'
            'shapes = { o = "i64[1]" }\n\n[test]\nscalars = { v = 9007199254740993 }\n')
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "k.cu").write_text(cu)
    (tmp_path / "p" / "kitdispatch.toml").write_text(toml)
    result = generate(tmp_path / "p", BuildOptions.create("sm_80", format="ptx"), tmp_path / "out")
    assert read_record(result.record).test.scalars == {"v": 2**53 + 1}
