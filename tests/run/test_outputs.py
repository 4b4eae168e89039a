"""Results sized by scalar arguments (`out = "i64[n]"` with `n` an argument): the runtime, `run`
and `test` size them from the call's values.

On the CPU: the runtime's sizing on IREE's local-task device (tests/data/cpu_sized: the ABI the
kit generates, computed by IREE's CPU codegen), and the generated MLIR of a real kernel project
(tests/data/sized_by_scalar) built with NVRTC and iree-compile. On a GPU: that project through
the runtime API, `kitdispatch run` and `kitdispatch test`."""

import io
import json
import re

import numpy as np
import pytest

import kitdispatch as kd
from kitdispatch import KitError
from kitdispatch.cli import main
from kitdispatch.run.arguments import sizing_scalars
from kitdispatch.describe.types import FunctionSignature, ScalarType, TensorType

from conftest import CPU_DEVICE, REPO, needs_iree_compile, prebuilt_or_build

CPU = CPU_DEVICE
PROJECT = REPO / "tests" / "data" / "sized_by_scalar"


def test_sizing_scalars_are_the_integer_arguments_a_result_shape_names():
    sig = FunctionSignature(
        "f", (TensorType("f32", ("n",)), ScalarType("u32"), ScalarType("f32"), ScalarType("i64")),
        (TensorType("f32", ("rows", "n")), TensorType("i32", ("k",))), ("x", "rows", "alpha", "k"),
    )
    assert sizing_scalars(sig) == {1: "rows", 3: "k"}
    assert sizing_scalars(FunctionSignature("g", sig.args, sig.results)) == {}  # no names: none


@needs_iree_compile
def test_results_are_sized_from_the_call_values(cpu_sized_module):
    dev = cpu_sized_module.device
    np.testing.assert_array_equal(cpu_sized_module.iota(5), np.arange(5, dtype=np.int64))
    np.testing.assert_array_equal(cpu_sized_module.iota(np.int32(9)), np.arange(9))  # numpy scalars too
    launched = cpu_sized_module.iota.launch(7)
    assert isinstance(launched, kd.DeviceArray) and launched.shape == (7,)
    np.testing.assert_array_equal(launched.to_host(), np.arange(7))
    x = np.arange(4, dtype=np.float32)
    got = cpu_sized_module.rows(x, 3)  # f32[count, n]: a u32 argument and a tensor's size together
    np.testing.assert_array_equal(got, x[None, :] + np.arange(3, dtype=np.float32)[:, None])
    rows = cpu_sized_module.rows(dev.put(x), 2)  # device arrays in, device array out
    assert rows.shape == (2, 4)
    out = dev.empty((6,), np.int64)
    assert cpu_sized_module.iota(6, out=out) is out
    np.testing.assert_array_equal(out.to_host(), np.arange(6))
    step = cpu_sized_module.iota.prepare(6, out=out)
    assert step() is out


@needs_iree_compile
def test_sizes_from_scalars_are_checked(cpu_sized_module):
    dev = cpu_sized_module.device
    with pytest.raises(KitError, match=r"n = 6 here but 5") as exc:
        cpu_sized_module.iota(5, out=dev.empty((6,), np.int64))  # out= of another size than n
    assert "iota" in str(exc.value)
    with pytest.raises(KitError, match="-3 sizes a result and cannot be negative"):
        cpu_sized_module.iota(-3)
    with pytest.raises(KitError, match="out of range"):
        cpu_sized_module.rows(np.ones(2, np.float32), -1)  # u32
    # 2^32 - 1 rows of 2^20: 16 PiB, beyond any address space, refused by IREE's allocator.
    with pytest.raises(KitError, match=r"rows: cannot allocate a result of shape \(4294967295, 1048576\) \(f32\)"):
        cpu_sized_module.rows(np.ones(1 << 20, np.float32), 2**32 - 1)


@needs_iree_compile
def test_cli_run_sizes_the_result(cpu_sized_module):
    cpu_vmfb = cpu_sized_module.path
    out, err = io.StringIO(), io.StringIO()
    assert main(["run", str(cpu_vmfb), "--function", "iota", "--input", "6", "--device", CPU], out, err) == 0, err.getvalue()
    assert "6xi64=0 1 2 3 4 5" in out.getvalue()
    err = io.StringIO()
    assert main(["run", str(cpu_vmfb), "--function", "iota", "--input", "-1", "--device", CPU], io.StringIO(), err) == 1
    assert "cannot be negative" in err.getvalue() and "Traceback" not in err.getvalue()


@needs_iree_compile
def test_generated_mlir_sizes_results_from_the_scalar(tmp_path):
    """The real project, built with NVRTC and iree-compile: each result's dimension is the
    scalar argument cast to index, and the record names the arguments the runtime sizes by."""
    result = kd.build(PROJECT, kd.BuildOptions.create("sm_80"), tmp_path)
    text = result.mlir.read_text()
    iota = text[text.index("util.func public @iota$async"):]
    assert re.search(r"%dim_n = arith.index_cast %n : i32 to index\n.*-> \(tensor<\?xi64>\{%dim_n\}\)", iota)
    assert re.search(r"%dim_rows = arith.index_castui %rows : i32 to index", text)
    functions = {f["name"]: f for f in json.loads(result.record.read_text())["functions"]}
    assert functions["iota"]["arg_names"] == ["n"] and functions["repeat_rows"]["results"] == ["f32[rows,n]"]


# ---------------------------------------------------------------------- on a GPU


@pytest.fixture(scope="module")
def sized_build(tmp_path_factory, prebuilt_dir):
    return prebuilt_or_build(PROJECT, tmp_path_factory, prebuilt_dir)


@pytest.mark.gpu
def test_gpu_results_sized_by_scalars_through_the_runtime(sized_build):
    module = kd.load_module(sized_build / "sized_by_scalar.vmfb")
    np.testing.assert_array_equal(module.iota(1000), np.arange(1000, dtype=np.int64))
    out = module.device.empty((4097,), np.int64)
    assert module.iota(4097, out=out) is out
    np.testing.assert_array_equal(out.to_host(), np.arange(4097))
    x = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    got = module.repeat_rows(module.device.put(x), 5)
    assert isinstance(got, kd.DeviceArray) and got.shape == (5, 300)
    np.testing.assert_array_equal(got.to_host(), x[None, :] + np.arange(5, dtype=np.float32)[:, None])


@pytest.mark.gpu
def test_gpu_run_and_test_size_results_from_scalars(sized_build):
    out, err = io.StringIO(), io.StringIO()
    vmfb = str(sized_build / "sized_by_scalar.vmfb")
    assert main(["run", vmfb, "--function", "iota", "--input", "5"], out, err) == 0, err.getvalue()
    assert "5xi64=0 1 2 3 4" in out.getvalue()
    out, err = io.StringIO(), io.StringIO()
    assert main(["test", str(sized_build)], out, err) == 0, out.getvalue() + err.getvalue()
    assert "2 passed, 0 failed" in out.getvalue()


@needs_iree_compile
def test_kitdispatch_test_gives_sizing_scalars_their_sizes(cpu_sized_module):
    """`kitdispatch test`'s inputs: a scalar that sizes a result is that size ([test] sizes, or
    the default), unless [test] scalars fixes it, which then sizes the result."""
    from kitdispatch.run.sample_tests import DEFAULT_SIZE, _verify_function

    sig = cpu_sized_module.iota.signature
    seen = []
    reference = lambda n: seen.append(n) or np.arange(n, dtype=np.int64)  # noqa: E731
    rng = np.random.default_rng(0)
    case = _verify_function("sized", cpu_sized_module, sig, reference, {"n": 11}, rng)
    assert case.status == "pass" and case.detail == "n=11" and seen == [11]
    case = _verify_function("sized", cpu_sized_module, sig, reference, {}, rng, {"n": 4})
    assert case.status == "pass" and case.detail == "n=4" and seen[-1] == 4
    rows = _verify_function("sized", cpu_sized_module, cpu_sized_module.rows.signature, lambda x, c: x[None, :] + np.arange(c)[:, None].astype(np.float32), {"count": 3}, rng)
    assert rows.status == "pass" and rows.detail == f"n={DEFAULT_SIZE}, count=3", rows
