"""On a CUDA GPU: kernels whose pointers' roles the compiled code settles (tests/data/
pointer_roles) compute what numpy does: cuda-samples' transpose with its non-const input, an
accumulator inferred inout, half2 vectors over f16 tensors. Skipped without a device."""

import io

import numpy as np
import pytest

from kitdispatch import load_module
from kitdispatch.cli import main

from conftest import DATA, prebuilt_or_build

pytestmark = pytest.mark.gpu
DATA = DATA / "pointer_roles"


@pytest.fixture(scope="module")
def roles_build(tmp_path_factory, prebuilt_dir):
    return prebuilt_or_build(DATA, tmp_path_factory, prebuilt_dir)


def test_the_sample_transpose_reads_its_non_const_input(roles_build):
    module = load_module(roles_build / "pointer_roles.vmfb")
    x = np.random.default_rng(0).standard_normal((48, 80), dtype=np.float32)  # [h, w], multiples of 16
    np.testing.assert_array_equal(module.transposeNoBankConflicts(x), x.T)


def test_an_inferred_inout_accumulates_into_the_callers_data(roles_build):
    module = load_module(roles_build / "pointer_roles.vmfb")
    acc = np.arange(1000, dtype=np.float32)
    x = np.full(1000, 0.5, np.float32)
    np.testing.assert_array_equal(module.accumulate(acc, x), acc + 1)


def test_half2_kernels_take_f16_tensors_of_even_length(roles_build):
    module = load_module(roles_build / "pointer_roles.vmfb")
    x = np.linspace(-4, 4, 1000).astype(np.float16)
    np.testing.assert_array_equal(module.scale_half2(x), x * np.float16(2))


def test_the_suite_passes(roles_build):
    out, err = io.StringIO(), io.StringIO()
    code = main(["test", str(roles_build)], out, err)
    assert code == 0, out.getvalue() + err.getvalue()
    assert "3 passed, 0 failed, 0 skipped" in out.getvalue()
