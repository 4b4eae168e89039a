"""C++ kernels (names as C++ spells them, templates, namespaces, bridged entries) with NVRTC
and nvcc alike: a template named in the manifest needs no explicit instantiation with either
compiler, nvcc's objects name their own entries (its entries unit, cxx_names.entries_unit), so
an nvcc build never needs NVRTC. Real NVRTC, nvcc, ptxas and iree-compile; the GPU tests run
tests/data/cxx_kernels built by each compiler."""

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kitdispatch as kd
from kitdispatch.compile import compilers, cxx_names
from kitdispatch.compile.archs import Arch
from kitdispatch.compile.bridge import rewrite_entry
from kitdispatch.compile.cache import object_key
from kitdispatch.cli import main
from kitdispatch.compile.compilers import CompileOptions, NvccCompiler, NvrtcCompiler
from kitdispatch.errors import CompileError, KitError
from kitdispatch.check.ptx import parse_entries
from kitdispatch.compile.toolchain import find_nvrtc

from conftest import DATA, needs_iree_compile, prebuilt_or_build, write_kernel_project

CXX = DATA / "cxx_kernels"
SM80 = Arch(8, 0)
needs_nvrtc = pytest.mark.skipif(find_nvrtc() is None, reason="NVRTC is not installed")
COMPILERS = ["nvrtc", pytest.param("nvcc", marks=pytest.mark.nvcc)]

# Templates (type and non-type parameters), namespaces, one template named twice, a C++ kernel
# that is no template, and an extern "C" kernel beside them; nothing instantiated explicitly.
MIXED_CU = r"""
template <int B, typename T> __global__ void tile(T* x, int n) { int i = blockIdx.x * B + threadIdx.x; if (i < n) x[i] += B; }
namespace outer { namespace inner {
template <typename T> __global__ void scale(T* x, T a, int n) { int i = threadIdx.x; if (i < n) x[i] *= a; }
} }
template <typename T> __global__ void fill(T* out, T v, int n) { int i = threadIdx.x; if (i < n) out[i] = v; }
__global__ void plain_cpp(float* x) { x[0] = 1.0f; }
extern "C" __global__ void c_kernel(float* x, int n) { if (n) x[0] = 2.0f; }
"""
MIXED_NAMES = ("tile<64, float>", "outer::inner::scale<double>", "fill<int>", "fill<float>", "::fill<char>", "plain_cpp")


@pytest.mark.nvcc
@needs_nvrtc
@pytest.mark.parametrize("fmt", ["ptx", "cubin", "fatbin"])
def test_nvcc_objects_name_their_entries_as_nvrtc_does(tmp_path, fmt):
    source = tmp_path / "k.cu"
    source.write_text(MIXED_CU)
    options = CompileOptions(name_expressions=MIXED_NAMES)
    want = dict(NvrtcCompiler().compile(source, SM80, "ptx", options).lowered)
    nvcc = NvccCompiler()
    obj = nvcc.compile_fatbin(source, (SM80, Arch(9, 0)), options) if fmt == "fatbin" else nvcc.compile(source, SM80, fmt, options)
    assert dict(obj.lowered) == want and len(set(want.values())) == len(MIXED_NAMES)
    # Every named instance is in nvcc's object (none is instantiated in the source), and so
    # is the extern "C" kernel under its own name.
    ptx = nvcc.compile(source, SM80, "ptx", options).data.decode()
    assert set(want.values()) | {"c_kernel"} <= set(parse_entries(ptx))
    if fmt != "ptx":
        for entry in want.values():
            assert entry.encode() in obj.data
    # The unit the object came from is in the commands, to re-run by hand.
    assert obj.commands[0].startswith(f"# {cxx_names.ENTRIES_UNIT}: #include ")


@pytest.fixture
def no_nvrtc(monkeypatch, tmp_path):
    """NVRTC unusable: not found, not importable, its worker calls refused (and checked to be)."""
    def refuse(name, *args, **kwargs):
        if name.startswith("nvrtc"):
            raise AssertionError(f"NVRTC was used ({name})")
        return real_call(name, *args, **kwargs)

    real_call = compilers.POOL.call
    monkeypatch.setattr(compilers, "find_nvrtc", lambda: None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)
    monkeypatch.setattr(compilers.POOL, "call", refuse)
    source = tmp_path / "probe.cu"
    source.write_text('extern "C" __global__ void k(float* x) { x[0] = 1; }\n')
    with pytest.raises(KitError, match="NVRTC is not available"):
        NvrtcCompiler().compile(source, SM80, "ptx", CompileOptions())


@pytest.mark.nvcc
@needs_iree_compile
@pytest.mark.parametrize("fmt", ["ptx", "cubin", "fatbin"])
def test_an_nvcc_build_of_cpp_and_bridged_kernels_needs_no_nvrtc(no_nvrtc, tmp_path, fmt):
    result = kd.build(CXX, kd.BuildOptions.create("sm_80,sm_90", compiler="nvcc", format=fmt, use_cache=False), tmp_path / "out")
    assert result.names["sgemmVectorize<128, 128, 8, 8, 8>"]["entry"] == "_Z14sgemmVectorizeILi128ELi128ELi8ELi8ELi8EEviiifPfS0_fS0_"
    assert result.names["ops::shifted_axpy<float>"]["entry"] == "_ZN3ops12shifted_axpyIfEEvmlT_PKS1_PS1_"
    mlir = result.mlir.read_text()
    for names in result.names.values():
        assert f"hal.executable.export public @{names['entry']} ordinal(" in mlir


@pytest.mark.parametrize("compiler", COMPILERS)
@needs_iree_compile
def test_cpp_kernels_build_with_either_compiler_to_the_same_entries(compiler, tmp_path):
    result = kd.build(CXX, kd.BuildOptions.create("sm_80", compiler=compiler, use_cache=False), tmp_path / "out")
    assert result.names == {
        "sgemmVectorize<128, 128, 8, 8, 8>": {"function": "sgemm", "entry": "_Z14sgemmVectorizeILi128ELi128ELi8ELi8ELi8EEviiifPfS0_fS0_"},
        "ops::shifted_axpy<float>": {"function": "shifted_axpy", "entry": "_ZN3ops12shifted_axpyIfEEvmlT_PKS1_PS1_"},
        "fill<int>": {"function": "fill_i32", "entry": "_Z4fillIiEvPT_S0_i"},
    }
    # Bridged: the scalars before the pointers (and the 64-bit ones as words) come after them.
    assert "func.func @sgemm(%alpha: f32, %A: tensor<?x?xf32>, %B: tensor<?x?xf32>, %beta: f32, %C: tensor<?x?xf32>)" in result.mlir.read_text()


@pytest.mark.nvcc
def test_the_bridged_ptx_nvcc_ships_assembles(tmp_path):
    """nvcc's PTX declares each named kernel before the variable that holds its address; a
    bridged entry's declaration must take the rewritten parameters too, or ptxas (and the
    driver, loading the PTX) refuse it as inconsistent."""
    out = tmp_path / "out"
    result = kd.generate(CXX, kd.BuildOptions.create("sm_80", compiler="nvcc", format="ptx", use_cache=False), out)
    [ptx] = [o for o in result.objects if o.suffix == ".ptx"]
    text = ptx.read_text()
    entry = result.names["sgemmVectorize<128, 128, 8, 8, 8>"]["entry"]
    assert f".entry {entry}\n(" in text  # the declaration is there: the case this test is for
    ptxas = Path(shutil.which("nvcc")).with_name("ptxas")
    run = subprocess.run([str(ptxas), "-arch=sm_80", str(ptx), "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_a_bridged_entry_rewrites_its_declarations_with_it():
    ptx = (
        ".visible .entry k\n(\n\t.param .u64 k_param_0,\n\t.param .u64 k_param_1\n)\n;\n"
        ".global .align 8 .u64 __kitdispatch_entry_0 = k;\n"
        ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .u64 k_param_1\n)\n.maxntid 64, 1, 1\n{\n"
        "\tld.param.u64 \t%rd1, [k_param_0];\n\tld.param.u64 \t%rd2, [k_param_1];\n\tret;\n}\n"
    )
    out = rewrite_entry(ptx, "k", (1,))  # a 64-bit scalar, then the pointer
    header = "\n\t.param .u64 k_param_1,\n\t.param .u32 k_param_0_w0,\n\t.param .u32 k_param_0_w1\n)"
    assert out.count(header) == 2, out
    assert [e.params for e in parse_entries(out).values()] == [tuple(parse_entries(out)["k"].params)]
    assert "mov.b64 \t%rd1, {%kdw0, %kdw1};" in out


HOST_ONLY_CU = r"""
#include <numeric>
#include <vector>
// Host code beside the kernels, as in a .cu file of an application: nvcc compiles it, NVRTC
// (device code only, no C++ standard library from pip) cannot.
static int host_total(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }
template <typename T> __global__ void twice(T* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2; }
"""
HOST_ONLY_TOML = (
    '[[kernels]]\nname = "twice<float>"\nsource = "k.cu"\nworkgroup_size = [64]\nworkgroup_count = ["ceildiv(n, 64)"]\n'
    'shapes = { x = "f32[n]" }\ninout = ["x"]\n'
)


@pytest.mark.nvcc
@needs_nvrtc
def test_a_source_only_nvcc_compiles_builds_with_nvcc(tmp_path):
    root = write_kernel_project(tmp_path / "src", HOST_ONLY_CU, HOST_ONLY_TOML)
    with pytest.raises(CompileError, match="NVRTC failed to compile") as failed:
        kd.generate(root, kd.BuildOptions.create("sm_80", use_cache=False), tmp_path / "nvrtc")
    assert "cannot open source file" in failed.value.log
    result = kd.generate(root, kd.BuildOptions.create("sm_80", compiler="nvcc", use_cache=False), tmp_path / "nvcc")
    assert result.names["twice<float>"]["entry"] == "_Z5twiceIfEvPT_i"


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("name, why", [("over", "overloaded function"), ("tmpl", "function template")])
def test_a_name_the_source_defines_more_than_once_is_bad_input(compiler, name, why, tmp_path):
    cu = "__global__ void over(float* x, int n) {}\n__global__ void over(int* x, int n) {}\n"
    cu += "template <typename T> __global__ void tmpl(T* x, int n) {}\n"
    toml = f'[[kernels]]\nname = "{name}"\nsource = "k.cu"\nworkgroup_size = [32]\nworkgroup_count = [1]\nparams = [{{ name = "x", inout = "f32[n]" }}, {{ name = "n", scalar = "i32" }}]\n'
    root = write_kernel_project(tmp_path / "src", cu, toml)
    out, err = io.StringIO(), io.StringIO()
    code = main(["build", str(root), "--arch", "sm_80", "--compiler", compiler, "--no-cache", "-o", str(tmp_path / "out")], out, err)
    text = err.getvalue()
    assert code == 2, text
    assert text.startswith(f"kitdispatch build: error: {root / 'k.cu'}: {compiler.upper() if compiler == 'nvrtc' else compiler} finds no single kernel '{name}' in ")
    assert "a template with its arguments; an overloaded kernel by its mangled entry, with `params`" in text
    assert why in text and "Traceback" not in text
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.nvcc
def test_the_entries_unit_is_in_the_object_key(tmp_path, monkeypatch):
    source = tmp_path / "k.cu"
    source.write_text(MIXED_CU)
    named = CompileOptions(name_expressions=("fill<int>",))

    def key(options: CompileOptions) -> str:
        search = NvccCompiler().include_search(source, options)
        return object_key("nvcc", "13.0", "ptx", (SM80,), options, source, search)

    before = key(named)
    assert key(named) == before and key(CompileOptions()) != before
    unit = cxx_names.entries_unit
    monkeypatch.setattr(cxx_names, "entries_unit", lambda path, names: unit(path, names) + "// another unit\n")
    assert key(named) != before
    assert key(CompileOptions()) == key(CompileOptions())  # a source without C++ names compiles as it is


@pytest.mark.nvcc
def test_quoted_includes_resolve_beside_the_source(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "val.h").write_text("#define VAL 7\n")
    source = tmp_path / "k.cu"
    source.write_text('#include "inc/val.h"\ntemplate <int N> __global__ void k(int* x) { x[0] = N + VAL; }\n')
    obj = NvccCompiler().compile(source, SM80, "ptx", CompileOptions(name_expressions=("k<3>",)))
    assert dict(obj.lowered) == {"k<3>": "_Z1kILi3EEvPi"} and b"mov.u32 \t%r1, 10;" in obj.data


@pytest.mark.nvcc
def test_an_error_in_the_source_stays_the_sources(tmp_path):
    """Only an error on a line of the entries unit is the manifest's name; one in the source,
    even a source of the unit's file name, is the source's, with the unit in the log."""
    source = tmp_path / cxx_names.ENTRIES_UNIT
    source.write_text("template <typename T>\n__global__ void k(T* x) { x[0] = 1; }\nint broken = ;\n")
    with pytest.raises(CompileError) as failed:
        NvccCompiler().compile(source, SM80, "ptx", CompileOptions(name_expressions=("k<int>",)))
    assert type(failed.value) is CompileError and failed.value.where == f"{source}:3"
    assert failed.value.log.startswith(f"{cxx_names.ENTRIES_UNIT}, the unit nvcc compiled:\n#include \"{source}\"\n")


def test_a_source_path_the_unit_cannot_include_is_refused():
    with pytest.raises(KitError, match="its path holds a quote, backslash or line break"):
        cxx_names.entries_unit(Path('/tmp/a"b/k.cu'), ("k<int>",))


# ------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("compiler", COMPILERS)
def test_cpp_kernels_match_numpy_on_the_gpu(compiler, tmp_path_factory, prebuilt_dir):
    """Prebuilt on a machine without iree-compile: `kitdispatch build tests/data/cxx_kernels
    --arch sm_80,sm_90 [--compiler nvcc] -o prebuilt/cxx_kernels[.nvcc]`."""
    built = prebuilt_or_build(CXX, tmp_path_factory, prebuilt_dir, compiler=compiler)
    out, err = io.StringIO(), io.StringIO()
    assert main(["test", str(built)], out, err) == 0, out.getvalue() + err.getvalue()
    assert "3 passed, 0 failed" in out.getvalue()
