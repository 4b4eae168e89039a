"""On a CUDA GPU: kernels bridged to IREE's parameter passing (tests/data/abi_bridge) run
unmodified, with 64-bit values above 2^32 and negative ones, scalars before pointers, a
struct by value, narrow integers, fp8 and u64 tensors. Skipped without a device."""

import io

import ml_dtypes
import numpy as np
import pytest

from kitdispatch import load_module
from kitdispatch.cli import main

from conftest import DATA, prebuilt_or_build

pytestmark = pytest.mark.gpu
BRIDGE = DATA / "abi_bridge"
AFFINE = np.dtype([("scale", "<f4"), ("shift", "<i4"), ("offset", "<f8")])


@pytest.fixture(scope="module")
def bridge_build(tmp_path_factory, prebuilt_dir):
    return prebuilt_or_build(BRIDGE, tmp_path_factory, prebuilt_dir)


def test_every_bridged_kernel_matches_numpy(bridge_build):
    out, err = io.StringIO(), io.StringIO()
    code = main(["test", str(bridge_build)], out, err)
    assert code == 0, out.getvalue() + err.getvalue()
    assert "6 passed, 0 failed, 0 skipped" in out.getvalue()


@pytest.mark.parametrize("offset", [2**40 + 5, -(2**35) - 7, -1, 2**62 + 1])
def test_64_bit_values_reach_the_kernel_whole(bridge_build, offset):
    module = load_module(bridge_build / "abi_bridge.vmfb")
    x = np.arange(-500, 500, dtype=np.int64) * (2**33)
    np.testing.assert_array_equal(module.add_i64(offset, x), x + offset + (2**40 + 3))
    np.testing.assert_array_equal(module.add_i64(offset, module.device.put(x)).to_host(), x + offset + (2**40 + 3))


def test_u64_tensors_and_a_mask_above_2_53(bridge_build):
    module = load_module(bridge_build / "abi_bridge.vmfb")
    x = np.arange(1000, dtype=np.uint64) * np.uint64(0x100000001)
    mask = 0xFFFF0000FFFF0001
    np.testing.assert_array_equal(module.xor_u64(x, mask), x ^ np.uint64(mask))


def test_doubles_and_a_struct_by_value(bridge_build):
    module = load_module(bridge_build / "abi_bridge.vmfb")
    x = np.linspace(-3, 3, 1000)
    np.testing.assert_allclose(module.axpb_f64(-1e300, x), -1e300 * x - 0.1, rtol=1e-15)
    p = np.array((1.5, -7, 2.0**40 + 0.25), AFFINE)[()]
    xf = np.linspace(-3, 3, 1000, dtype=np.float32)
    want = ((xf * np.float32(1.5) + np.float32(-7)).astype(np.float64) + (2.0**40 + 0.25)).astype(np.float32)
    np.testing.assert_array_equal(module.affine(xf, p), want)
    np.testing.assert_array_equal(module.affine(xf, p.tobytes()), want)
    # Device arrays in: the call goes through NAME$async, pushing the struct's words.
    on_gpu = module.affine(module.device.put(xf), p)
    np.testing.assert_array_equal(on_gpu.to_host(), want)


def test_narrow_scalars_and_fp8(bridge_build):
    module = load_module(bridge_build / "abi_bridge.vmfb")
    x = np.arange(-500, 500, dtype=np.int32)
    np.testing.assert_array_equal(module.narrow(x, -128, -32768, 255), x * -128 - 32768 + 255)
    e4 = np.linspace(-4, 4, 1000).astype(ml_dtypes.float8_e4m3fn)
    e5 = np.linspace(-4, 4, 1000).astype(ml_dtypes.float8_e5m2)
    out, wide = module.fp8_ops(e4, e5)
    assert out.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(out, (2 * e4.astype(np.float32)).astype(ml_dtypes.float8_e4m3fn))
    np.testing.assert_array_equal(wide, e5.astype(np.float32))
