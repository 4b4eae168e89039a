"""The README's Python API, as a user writes it: both ways of describing a kernel build."""

import kitdispatch as kd
from kitdispatch.describe.manifest import parse_manifest

from conftest import needs_iree_compile

SCALE_CU = 'extern "C" __global__ void scale(const float* x, float* y, float alpha, int n) {\n' \
    "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = alpha * x[i]; }\n"
SAXPY_CU = 'extern "C" __global__ void saxpy(const float* x, float* y, float alpha, int n) {\n' \
    "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += alpha * x[i]; }\n"


def kernels(tmp_path):
    (tmp_path / "scale.cu").write_text(SCALE_CU)
    (tmp_path / "saxpy.cu").write_text(SAXPY_CU)
    scale = kd.Kernel.create("scale", "scale.cu", [
        kd.Buffer("x", "in", kd.TensorType("f32", ("n",))),
        kd.Buffer("y", "out", kd.TensorType("f32", ("n",))),
        kd.Scalar("alpha", "f32"),
        kd.Scalar("n", "i32"),
    ], workgroup_size=[256], workgroup_count=["ceildiv(n, 256)"])
    saxpy = kd.kernel_from_source("saxpy", "saxpy.cu", shapes={"x": "f32[n]", "y": "f32[n]"}, inout=["y"],
                                  workgroup_size=[64], workgroup_count=["ceildiv(n, 64)"], root=tmp_path)
    return scale, saxpy


def test_kernel_from_source_equals_the_manifest_entry(tmp_path):
    _, saxpy = kernels(tmp_path)
    data = {"kernels": [{"name": "saxpy", "source": "saxpy.cu", "shapes": {"x": "f32[n]", "y": "f32[n]"}, "inout": ["y"],
                         "workgroup_size": [64], "workgroup_count": ["ceildiv(n, 64)"]}]}
    assert parse_manifest(data, root=tmp_path, where="t").kernels[0] == saxpy
    assert [str(a) for a in saxpy.signature().args] == ["f32[n]", "f32[n]", "f32"]


@needs_iree_compile
def test_readme_python_api_builds(tmp_path):
    spec = kd.ModuleSpec.create("scale", list(kernels(tmp_path)), root=tmp_path)
    result = kd.build(spec, kd.BuildOptions.create("sm_80,sm_90", compiler="nvrtc"), tmp_path / "out")
    assert result.vmfb.is_file()
    assert "func.func @saxpy(" in result.mlir.read_text()
