"""On a CUDA GPU: the sample's functions through the runtime API, iree-run-module and
`kitdispatch test`. Skipped where IREE's cuda driver finds no device."""

import io

import numpy as np
import pytest

from kitdispatch import KitError, load_module
from kitdispatch.cli import main

pytestmark = pytest.mark.gpu


def test_runtime_api_returns_numpy(simple_mul_build):
    module = load_module(simple_mul_build / "simple_mul.vmfb")
    rng = np.random.default_rng(1)
    lhs = rng.standard_normal(1000, dtype=np.float32)
    rhs = rng.standard_normal(1000, dtype=np.float32)
    out = module.simple_mul(lhs, rhs)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_allclose(out, lhs * rhs, rtol=1e-6)
    np.testing.assert_allclose(module["simple_mul_inplace"](lhs, rhs), lhs * rhs, rtol=1e-6)
    # Sizes that are not multiples of the 64-thread block, and a single element.
    for n in (1, 63, 65, 4097):
        a = np.full(n, 3, np.float32)
        np.testing.assert_array_equal(module.simple_mul(a, a), np.full(n, 9, np.float32))


def test_runtime_api_checks_arguments(simple_mul_build):
    module = load_module(simple_mul_build / "simple_mul.vmfb")
    with pytest.raises(KitError, match="got dtype float64"):
        module.simple_mul(np.ones(4), np.ones(4))
    with pytest.raises(KitError, match="n = 5 here but 4"):
        module.simple_mul(np.ones(4, np.float32), np.ones(5, np.float32))


def test_mixed_invocation_through_iree_run_module(simple_mul_build):
    out, err = io.StringIO(), io.StringIO()
    code = main(
        ["run", str(simple_mul_build / "simple_mul.vmfb"), "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4"],
        out,
        err,
    )
    assert code == 0, err.getvalue()
    assert "8xf32=96 96 96 96 96 96 96 96" in out.getvalue()


def test_sample_suite_passes(simple_mul_build):
    out, err = io.StringIO(), io.StringIO()
    code = main(["test", str(simple_mul_build)], out, err)
    assert code == 0, out.getvalue() + err.getvalue()
    assert "3 passed, 0 failed, 0 skipped" in out.getvalue()
