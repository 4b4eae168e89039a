"""Device code as written for nvcc compiles under NVRTC from pip: the kit's C library headers
(kitdispatch/include), its prelude (what nvcc's implicit includes make visible) and CCCL from
the nvidia-cuda-cccl wheel, with no flag. Real NVRTC and nvcc; the GPU test runs the kernel."""

import io
import shutil
from pathlib import Path

import pytest

import kitdispatch as kd
from kitdispatch import _resources
from kitdispatch.compile.archs import Arch
from kitdispatch.compile.cache import object_key
from kitdispatch.cli import main
from kitdispatch.compile.compilers import CompileOptions, NvccCompiler, NvrtcCompiler, rerun_command
from kitdispatch.compile.toolchain import find_nvrtc

from conftest import DATA, needs_iree_compile, prebuilt_or_build

HEADERS = DATA / "c_headers"
SM80 = Arch(8, 0)
needs_nvrtc = pytest.mark.skipif(find_nvrtc() is None, reason="NVRTC is not installed")

# (what, source body): each compiles alone, as it does with nvcc.
SNIPPETS = {
    "assert.h": "#include <assert.h>\n@ assert(n > 0);",
    "cassert": "#include <cassert>\n@ assert(n > 0);",
    "float.h": "#include <float.h>\n@ x[0] = FLT_MAX + FLT_EPSILON + (float)DBL_MIN;",
    "cfloat": "#include <cfloat>\n@ x[0] = FLT_MIN;",
    "limits.h": "#include <limits.h>\n@ x[0] = (float)(INT_MAX + LLONG_MAX + UCHAR_MAX + CHAR_BIT);",
    "climits": "#include <climits>\n@ x[0] = (float)UINT_MAX;",
    "stdint.h": "#include <stdint.h>\n@ uint32_t u = UINT32_MAX; int64_t v = INT64_MIN; x[0] = (float)(u + v);",
    "cstdint": "#include <cstdint>\n@ std::uint8_t u = 7; std::int64_t v = 1; x[0] = (float)(u + v + SIZE_MAX);",
    "math.h": "#include <math.h>\n@ x[0] = INFINITY + NAN + HUGE_VALF + (float)M_PI + (float)M_SQRT1_2;",
    "cmath": "#include <cmath>\n@ x[0] = std::sqrt(x[0]) + std::fmax(1.0f, 2.0f) + std::abs(-1.0f);",
    "stddef.h": "#include <stddef.h>\nstruct P { int a; float b; };\n@ x[0] = (float)offsetof(P, b);",
    "cstdio": "#include <cstdio>\n@ printf(\"%d\\n\", n);",
    "implicit names": "@ uint u = INT_MAX; ushort s = 1; ulong l = 2; x[0] = INFINITY + (float)(M_PI + u + s + l);",
    "cooperative_groups": "#include <cooperative_groups.h>\n#include <cooperative_groups/reduce.h>\nnamespace cg = cooperative_groups;\n"
    "@ auto w = cg::tiled_partition<32>(cg::this_thread_block()); x[0] = cg::reduce(w, x[0], cg::plus<float>());",
    "cub": "#include <cub/warp/warp_reduce.cuh>\n@ __shared__ cub::WarpReduce<float>::TempStorage t; x[0] = cub::WarpReduce<float>(t).Sum(x[0]);",
    "cuda::std with C headers": "#include <climits>\n#include <cstdint>\n#include <cmath>\n#include <cuda/std/cmath>\n#include <cuda/std/cstdint>\n"
    "@ x[0] = cuda::std::numeric_limits<float>::max() + INFINITY + (float)INT64_MAX;",
    # Kernels written for NVRTC define what it lacked; the kit's prelude must not collide.
    "own typedefs": "typedef long long int64_t;\ntypedef unsigned long uint64_t;\n#define M_PI 3.14159265358979323846\n"
    "@ int64_t a = 1; uint64_t b = 2; x[0] = (float)(a + b + M_PI);",
}


def _source(tmp_path: Path, body: str) -> Path:
    head, _, code = body.partition("@ ")
    path = tmp_path / "k.cu"
    path.write_text(f'{head}extern "C" __global__ void k(float* x, int n) {{ {code} }}\n')
    return path


@needs_nvrtc
@pytest.mark.parametrize("what", sorted(SNIPPETS))
def test_nvrtc_compiles_what_nvcc_compiles(what, tmp_path):
    source = _source(tmp_path, SNIPPETS[what])
    obj = NvrtcCompiler().compile(source, SM80, "ptx", CompileOptions())
    assert b".entry k(" in obj.ptx
    # Warnings would mean the kit's headers and CCCL's redefine something differently.
    assert not any("redefinition" in d for d in obj.diagnostics), obj.diagnostics


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("what", ["float.h", "cstdint", "math.h", "cmath", "implicit names", "cooperative_groups", "cub"])
def test_nvcc_compiles_the_same_sources(what, tmp_path):
    obj = NvccCompiler().compile(_source(tmp_path, SNIPPETS[what]), SM80, "ptx", CompileOptions())
    assert b".entry k(" in obj.data


@needs_nvrtc
@needs_iree_compile
@pytest.mark.parametrize("compiler", ["nvrtc", pytest.param("nvcc", marks=pytest.mark.nvcc)])
def test_a_module_using_headers_cooperative_groups_and_cub_builds(compiler, tmp_path):
    if compiler == "nvcc" and shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    result = kd.build(HEADERS, kd.BuildOptions.create("sm_80", compiler=compiler, use_cache=False), tmp_path / "out")
    assert result.vmfb.is_file()


@needs_nvrtc
def test_the_kit_headers_are_in_the_cache_key(tmp_path, monkeypatch):
    """An edit to one of the kit's headers is a new key (they are the toolchain's, not hashed
    as the user's: their digest is in the key)."""
    package = tmp_path / "kitdispatch"
    shutil.copytree(Path(_resources.__file__).parent / "include", package / "include")
    monkeypatch.setattr(_resources, "_PACKAGE", package)
    source = _source(tmp_path, SNIPPETS["math.h"])

    def key() -> str:
        _resources.kit_headers.cache_clear()
        search = NvrtcCompiler().include_search(source, CompileOptions())
        return object_key("nvrtc", "13.0", "ptx", (SM80,), CompileOptions(), source, search)

    before = key()
    assert key() == before
    (package / "include" / "math.h").write_text((package / "include" / "math.h").read_text() + "/* edit */\n")
    after = key()
    monkeypatch.undo()
    _resources.kit_headers.cache_clear()
    assert after != before


def test_rerun_commands_leave_the_kit_headers_to_nvcc():
    """nvcc has the host's C headers: the NVRTC stand-ins must not shadow them in the nvcc
    command a failed NVRTC compile prints."""
    headers = _resources.kit_headers()
    argv = rerun_command(Path("k.cu"), ["--gpu-architecture=sm_80", "-I/x", f"-I{headers.folder}", f"--pre-include={headers.prelude}"])
    assert argv == ["nvcc", "--cubin", "-arch=sm_80", "-I/x", "-o", "/dev/null", "k.cu"]


@needs_nvrtc
def test_doctor_lists_the_c_headers_and_cccl():
    out, err = io.StringIO(), io.StringIO()
    assert main(["doctor"], out, err) == 0, err.getvalue()
    text = out.getvalue()
    assert "C headers" in text and "cstdint" in text and "kitdispatch_nvrtc_prelude.h" in text
    assert "/cccl" in text or "cuda_cccl" in text
    assert "no CCCL" not in text


@pytest.mark.gpu
def test_the_headers_kernel_matches_numpy_on_the_gpu(tmp_path_factory, prebuilt_dir):
    built = prebuilt_or_build(HEADERS, tmp_path_factory, prebuilt_dir)
    out, err = io.StringIO(), io.StringIO()
    assert main(["test", str(built)], out, err) == 0, out.getvalue() + err.getvalue()
    assert "1 passed, 0 failed" in out.getvalue()
