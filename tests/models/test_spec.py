"""spec.py: the kernels' symbols for the transform spec (built by the build pipeline) and the spec."""

from __future__ import annotations

import pytest
from conftest import write_kernel_project

from kitdispatch import BuildOptions, load_manifest
from kitdispatch.errors import ManifestError
from kitdispatch.models.replace import replacing_kernels
from kitdispatch.models.spec import kernel_symbols


def test_a_replacing_kernel_whose_code_settles_other_roles_is_refused(tmp_path):
    """Model ops are matched against the kernels as described: a function that the compiled
    code changes (out -> inout here) must not be spliced in as if it had not changed."""
    cu = r"""
    extern "C" __global__ void k(const float* x, float* out, int rows, int cols) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < rows * cols) out[i] += x[i];
    }"""
    toml = ('[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [64]\nworkgroup_count = ["ceildiv(rows * 4, 64)"]\n'
            'shapes = { x = "f32[rows,cols]", out = "f32[rows,cols]" }\nreplaces = ["linalg.softmax"]\n')
    spec = load_manifest(write_kernel_project(tmp_path / "src", cu, toml))
    kernels = list(replacing_kernels(spec))  # as described: x -> out
    with pytest.raises(ManifestError, match=r"kernel 'k': its compiled code gives its non-const pointers other roles.*"
                                            r"\(f32\[rows,cols\], f32\[rows,cols\]\) -> \(f32\[rows,cols\]\), not \(f32\[rows,cols\]\) ->"):
        kernel_symbols(spec, kernels, BuildOptions.create("sm_80"), tmp_path)
