"""Dynamic shared memory per architecture (`dynamic_shared_memory = {default = .., sm_90a = ..}`):
on the GPU, the variant IREE picks for the device launches with that architecture's size."""

import numpy as np
import pytest

import kitdispatch as kd

from conftest import REPO, prebuilt_or_build

PER_ARCH = REPO / "tests" / "data" / "shared_per_arch"


@pytest.fixture(scope="module")
def per_arch_build(tmp_path_factory, prebuilt_dir):
    return prebuilt_or_build(PER_ARCH, tmp_path_factory, prebuilt_dir, "sm_90a,sm_80")


@pytest.mark.gpu
def test_each_architecture_launches_with_its_own_shared_memory(per_arch_build):
    """The kernel reports %dynamic_smem_size after writing its last byte: 200000 bytes on an
    sm_90 GPU (the sm_90a variant), the default 4096 on others (the sm_80 one)."""
    from kitdispatch.run.cuda_driver import driver_info

    capability = driver_info().devices[0].arch_name
    module = kd.load_module(per_arch_build / "shared_per_arch.vmfb")
    got = np.asarray(module.reserved_shared(130))
    expected = 200000 if capability in ("sm_90", "sm_90a") else 4096
    np.testing.assert_array_equal(got, np.full(130, expected, np.uint32))
