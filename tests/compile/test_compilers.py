"""Compiling kernels with the real NVRTC (and nvcc where present) and checking the objects."""

import pytest

from kitdispatch import AbiError, ArchError, CompileError, CompileOptions, KitError, parse_arch_list
from kitdispatch.compile.archs import Arch
from kitdispatch.compile.compilers import NvccCompiler, NvrtcCompiler, check_archs
from kitdispatch.check.ptx import check_kernel_against_ptx, parse_entries
from kitdispatch.describe.kernel import Buffer, Kernel, Scalar
from kitdispatch.describe.types import TensorType

from conftest import SAMPLES

SM80 = Arch.parse("sm_80")


@pytest.fixture(scope="module")
def nvrtc():
    return NvrtcCompiler()


def test_arch_names():
    assert [a.name for a in parse_arch_list("sm_80, hopper,sm_90a,sm_100")] == ["sm_100", "sm_90a", "sm_90", "sm_80"]
    assert Arch.parse("ampere") == SM80
    assert Arch.parse("sm_121").capability == 121


@pytest.mark.parametrize("bad", ["sm80", "sm_", "compute_80", "volta2", ""])
def test_unknown_arch_is_rejected(bad):
    with pytest.raises(ArchError):
        parse_arch_list(bad)


def test_arch_the_compiler_cannot_target_lists_the_ones_it_can(nvrtc):
    with pytest.raises(ArchError) as err:
        check_archs(nvrtc, parse_arch_list("sm_52"))
    assert "nvrtc cannot target sm_52" in str(err.value)
    assert "sm_75" in str(err.value) and "sm_90" in str(err.value)


def test_nvrtc_ptx_has_the_entries(nvrtc):
    obj = nvrtc.compile(SAMPLES / "simple_mul" / "simple_mul.cu", SM80, "ptx", CompileOptions())
    text = obj.data.decode()
    assert ".target sm_80" in text
    entries = parse_entries(text)
    assert set(entries) == {"simple_mul", "simple_mul_inplace"}
    assert [p.size for p in entries["simple_mul"].params] == [8, 8, 8, 4]
    assert obj.file_name() == "simple_mul.sm_80.ptx"


def test_nvrtc_cubin_is_elf(nvrtc):
    obj = nvrtc.compile(SAMPLES / "simple_mul" / "simple_mul.cu", SM80, "cubin", CompileOptions())
    assert obj.data[:4] == b"\x7fELF"


def test_compile_error_shows_log_with_file_and_line(nvrtc, tmp_path):
    src = tmp_path / "broken.cu"
    src.write_text('extern "C" __global__ void k(float* x) {\n  x[0] = undefined_name;\n}\n')
    with pytest.raises(CompileError) as err:
        nvrtc.compile(src, SM80, "ptx", CompileOptions())
    text = str(err.value)
    assert f"{src}:2" in text
    assert "undefined_name" in text
    assert "re-run:" in text


def test_missing_source(nvrtc, tmp_path):
    with pytest.raises(KitError, match="does not exist"):
        nvrtc.compile(tmp_path / "nope.cu", SM80, "ptx", CompileOptions())


def test_options_reach_the_compiler(nvrtc, tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "scale.h").write_text("#define SCALE 3.0f\n")
    src = tmp_path / "k.cu"
    src.write_text('#include "scale.h"\nextern "C" __global__ void k(float* x) { x[0] = SCALE * OFFSET; }\n')
    opts = CompileOptions(include_dirs=(str(tmp_path / "inc"),), defines=("OFFSET=2.0f",))
    assert b".entry k" in nvrtc.compile(src, SM80, "ptx", opts).data


def _kernel(params, **kw):
    return Kernel.create("simple_mul", "simple_mul.cu", params, workgroup_size=kw.get("size", [64]), workgroup_count=["ceildiv(n, 64)"])


F32N = TensorType("f32", ("n",))
GOOD_PARAMS = [Buffer("lhs", "in", F32N), Buffer("rhs", "in", F32N), Buffer("out", "out", F32N), Scalar("n", "i32")]


def test_layout_matches_compiled_kernel(nvrtc):
    obj = nvrtc.compile(SAMPLES / "simple_mul" / "simple_mul.cu", SM80, "ptx", CompileOptions())
    check_kernel_against_ptx(_kernel(GOOD_PARAMS), parse_entries(obj.data.decode()), "here")


@pytest.mark.parametrize(
    "params, message",
    [
        (GOOD_PARAMS[:3] + [Scalar("n", "i32"), Scalar("extra", "i32")], "takes 4 parameters in the compiled object but the manifest declares 5"),
        ([Buffer("lhs", "in", F32N), Buffer("out", "out", F32N), Scalar("n", "i32"), Scalar("m", "i32")], "parameter 2 ('n') is declared as i32 (4 bytes) but the compiled kernel takes 8 bytes"),
    ],
)
def test_layout_mismatch_is_an_error(nvrtc, params, message):
    obj = nvrtc.compile(SAMPLES / "simple_mul" / "simple_mul.cu", SM80, "ptx", CompileOptions())
    with pytest.raises(AbiError) as err:
        check_kernel_against_ptx(_kernel(params), parse_entries(obj.data.decode()), "here")
    assert message in str(err.value)


def test_missing_kernel_lists_the_entries(nvrtc):
    obj = nvrtc.compile(SAMPLES / "simple_mul" / "simple_mul.cu", SM80, "ptx", CompileOptions())
    k = Kernel.create("simple_add", "simple_mul.cu", GOOD_PARAMS, workgroup_size=[64], workgroup_count=["ceildiv(n, 64)"])
    with pytest.raises(AbiError) as err:
        check_kernel_against_ptx(k, parse_entries(obj.data.decode()), "here")
    assert "'simple_add' is not in the compiled object (entries found: simple_mul, simple_mul_inplace)" in str(err.value)


def test_launch_bounds_must_agree_with_workgroup_size(nvrtc, tmp_path):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void __launch_bounds__(128) k(float* x, int n) { x[threadIdx.x] = n; }\n')
    entries = parse_entries(nvrtc.compile(src, SM80, "ptx", CompileOptions()).data.decode())
    params = [Buffer("x", "inout", F32N), Scalar("n", "i32")]
    ok = Kernel.create("k", "k.cu", params, workgroup_size=[128], workgroup_count=["ceildiv(n, 128)"])
    check_kernel_against_ptx(ok, entries, "here")
    too_big = Kernel.create("k", "k.cu", params, workgroup_size=[256], workgroup_count=["ceildiv(n, 256)"])
    with pytest.raises(AbiError, match="at most 128 threads"):
        check_kernel_against_ptx(too_big, entries, "here")


@pytest.mark.nvcc
def test_nvcc_matches_nvrtc_entries(nvrtc):
    nvcc = NvccCompiler()
    src = SAMPLES / "simple_mul" / "simple_mul.cu"
    a = parse_entries(nvcc.compile(src, SM80, "ptx", CompileOptions()).data.decode())
    b = parse_entries(nvrtc.compile(src, SM80, "ptx", CompileOptions()).data.decode())
    assert {k: [p.size for p in v.params] for k, v in a.items()} == {k: [p.size for p in v.params] for k, v in b.items()}


@pytest.mark.nvcc
def test_nvcc_compile_error_has_command_and_location(tmp_path):
    src = tmp_path / "broken.cu"
    src.write_text('extern "C" __global__ void k(float* x) {\n  x[0] = undefined_name;\n}\n')
    with pytest.raises(CompileError) as err:
        NvccCompiler().compile(src, SM80, "ptx", CompileOptions())
    assert "broken.cu:2" in str(err.value)
    assert "re-run:" in str(err.value) and "nvcc" in str(err.value)
