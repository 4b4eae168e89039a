"""The kernel ABI: layouts inferred from the C signature, explicit ones cross-checked,
every scalar type through IREE's 32-bit push constants, C++ kernels by their mangled
names, and the CUDA headers under NVRTC from pip. Each layout is compiled for real."""

import dataclasses
import json
import shutil
import struct

import pytest

from kitdispatch import BuildOptions, KitError, ManifestError, generate, load_manifest
from kitdispatch import build
from kitdispatch.compile.compilers import CompileOptions, NvrtcCompiler
from kitdispatch.describe.record import read_record
from kitdispatch.compile.toolchain import find_nvrtc
from kitdispatch.compile.archs import Arch
from kitdispatch.check.ptx import check_kernel_against_ptx, parse_entries
from kitdispatch.run.arguments import scalar_argument
from kitdispatch.describe.kernel import Buffer, Scalar
from kitdispatch.describe.types import float_bits

from conftest import kernel_toml, REPO, DATA, library_spec, needs_iree_compile, write_kernel_project

ABI_SCALARS = DATA / "abi_scalars"

SAXPY_CU = r"""
extern "C" __global__ void saxpy(const float* __restrict__ x, float* __restrict__ y,
                                 float alpha, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = alpha * x[i] + y[i];
}
"""
SAXPY_HEAD = kernel_toml("saxpy")


def manifest(tmp_path, cu, body):
    return load_manifest(write_kernel_project(tmp_path, cu, body))


# ------------------------------------------------------------------------- inference


def test_inferred_layout_needs_only_shapes_and_results(tmp_path):
    spec = manifest(tmp_path, SAXPY_CU, SAXPY_HEAD + 'shapes = { x = "f32[n]", y = "f32[n]" }\ninout = ["y"]\n')
    k = spec.kernels[0]
    assert k.params == (
        Buffer("x", "in", k.params[0].type),
        Buffer("y", "inout", k.params[1].type),
        Scalar("alpha", "f32"),
        Scalar("n", "i32"),
    )
    assert [str(a) for a in k.signature().args] == ["f32[n]", "f32[n]", "f32"]


def test_non_const_pointer_is_an_out_buffer_unless_listed(tmp_path):
    spec = manifest(tmp_path, SAXPY_CU, SAXPY_HEAD + 'shapes = { x = "f32[n]", y = "f32[n]" }\n')
    assert [getattr(p, "access", None) for p in spec.kernels[0].params] == ["in", "out", None, None]
    with pytest.raises(ManifestError, match="no result buffer"):
        manifest(tmp_path, SAXPY_CU, SAXPY_HEAD + 'shapes = { x = "f32[n]", y = "f32[n]" }\nin = ["y"]\n')


def test_inferred_and_explicit_layouts_are_the_same(tmp_path):
    inferred = manifest(tmp_path / "a", SAXPY_CU, SAXPY_HEAD + 'shapes = { x = "f32[n]", y = "f32[n]" }\ninout = ["y"]\n')
    explicit = manifest(
        tmp_path / "b",
        SAXPY_CU,
        SAXPY_HEAD
        + 'params = [{ name = "x", in = "f32[n]" }, { name = "y", inout = "f32[n]" }, '
        '{ name = "alpha", scalar = "f32" }, { name = "n", scalar = "i32" }]\n',
    )
    assert inferred.kernels[0].params == explicit.kernels[0].params


@pytest.mark.parametrize(
    "body, message",
    [
        # inference
        ('shapes = { x = "f32[n]" }', "pointer 'y' of kernel 'saxpy' has no shape"),
        ('shapes = { x = "f32[n]", y = "f32[n]", z = "f32[n]" }', "shapes names 'z', which is not a pointer"),
        ('shapes = { x = "f32[n]", y = "f32[n]" }\ninout = ["x"]', "parameter 'x': the manifest declares inout"),
        ('shapes = { x = "f32[n]", y = "f32[n]" }\nscalars = { alpha = "i32" }', "'alpha': the manifest declares scalar i32"),
        ('shapes = { x = "f16[n]", y = "f32[n]" }', "'x': the manifest declares in f16[n], the source (line 2) has 'const float *' (elements of type f32)"),
        ('shapes = { x = "f32[n]", y = "f32[n]" }\nvalues = { beta = 1 }', "values names 'beta'"),
        ('shapes = { x = "f32[n]", y = "f32[n]" }\nparams = []', "both describe the parameters"),
        # explicit params, cross-checked
        ('params = [{ name = "x", in = "f32[n]" }, { name = "y", inout = "f32[n]" }, { name = "alpha", scalar = "f32" }]',
         "takes 4 parameters in its source (x, y, alpha, n) but the manifest fills 3"),
        ('params = [{ name = "y", inout = "f32[n]" }, { name = "x", in = "f32[n]" }, { name = "alpha", scalar = "f32" }, { name = "n", scalar = "i32" }]',
         "parameter 'y': the manifest declares inout f32[n] named 'y' at position 0, the source (line 2) has 'const float * x' there and 'y' at position 1"),
        ('params = [{ name = "x", out = "f32[n]" }, { name = "y", inout = "f32[n]" }, { name = "alpha", scalar = "f32" }, { name = "n", scalar = "i32" }]',
         "const: the kernel cannot write it"),
        ('params = [{ name = "x", in = "f32[n]" }, { name = "y", inout = "f32[n]" }, { name = "alpha", scalar = "u32" }, { name = "n", scalar = "i32" }]',
         "parameter 'alpha': the manifest declares scalar u32 ('unsigned int' or 'uint32_t'), the source (line 2) has 'float'"),
        ('params = [{ name = "x", in = "f32[n]" }, { name = "y", inout = "f32[n]" }, { name = "alpha", in = "f32[n]" }, { name = "n", scalar = "i32" }]',
         "parameter 'alpha': the manifest declares in f32[n], the source (line 2) has 'float' (by value)"),
        ('params = [{ name = "x", in = "i32[n]" }, { name = "y", inout = "f32[n]" }, { name = "alpha", scalar = "f32" }, { name = "n", scalar = "i32" }]',
         "(elements of type f32)"),
    ],
)
def test_layout_mismatches_name_kernel_parameter_and_both_sides(tmp_path, body, message):
    with pytest.raises(ManifestError) as err:
        manifest(tmp_path, SAXPY_CU, SAXPY_HEAD + body + "\n")
    assert message in str(err.value)
    assert "kitdispatch.toml" in str(err.value) and "fix:" in str(err.value)


def test_a_64_bit_c_parameter_is_one_scalar_the_bridge_adapts(tmp_path):
    cu = 'extern "C" __global__ void k(float* out, const long long seed, double d, size_t n) {}'
    toml = '[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [1]\nworkgroup_count = [1]\nshapes = { out = "f32[4]" }\n'
    k = manifest(tmp_path, cu, toml).kernels[0]
    assert [(s.name, s.dtype, s.split) for s in k.scalars] == [("seed", "i64", False), ("d", "f64", False), ("n", "u64", False)]
    assert [s.size for s in k.c_slots] == [8, 8, 8, 8] and k.needs_bridge
    assert [str(a) for a in k.signature().args] == ["i64", "f64", "u64"]


def test_scalars_before_pointers_are_accepted_and_bridged(tmp_path):
    cu = 'extern "C" __global__ void k(int n, const float* x, float* y) {}'
    toml = '[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [1]\nworkgroup_count = [1]\nshapes = { x = "f32[n]", y = "f32[n]" }\n'
    k = manifest(tmp_path, cu, toml).kernels[0]
    assert [p.name for p in k.params] == ["n", "x", "y"] and k.needs_bridge
    assert not manifest(tmp_path / "b", SAXPY_CU, SAXPY_HEAD + 'shapes = { x = "f32[n]", y = "f32[n]" }\n').kernels[0].needs_bridge


def test_explicit_params_of_a_missing_source_are_left_to_the_build(tmp_path):
    (tmp_path / "kitdispatch.toml").write_text(
        SAXPY_HEAD + 'params = [{ name = "y", out = "f32[n]" }, { name = "n", scalar = "i32" }]\n'
    )
    assert load_manifest(tmp_path).kernels[0].name == "saxpy"
    (tmp_path / "kitdispatch.toml").write_text(SAXPY_HEAD + 'shapes = { y = "f32[n]" }\n')
    with pytest.raises(ManifestError, match="cannot read kernel source"):
        load_manifest(tmp_path)


# ----------------------------------------------------------------------------- scalars


def test_scalar_layout_of_every_type():
    spec = load_manifest(ABI_SCALARS)
    by_name = {k.function: k for k in spec.kernels}
    assert [(s.name, s.size) for s in by_name["add_i64"].c_slots] == [
        ("x", 8), ("out", 8), ("offset_lo", 4), ("offset_hi", 4), ("big_lo", 4), ("big_hi", 4), ("n", 4),
    ]
    assert [(s.name, s.size) for s in by_name["half_ops"].c_slots][2:] == [("scale", 2), ("bias", 2), ("negate", 1), ("n", 4)]
    assert [str(a) for a in by_name["half_ops"].signature().args] == ["f16[n]", "f16", "bool"]


def test_ptx_check_accepts_exactly_the_sizes_iree_fills():
    spec = load_manifest(ABI_SCALARS)
    cpp = tuple(k.name for k in spec.kernels if k.cpp_name)  # C++ kernels: entries from the compile
    obj = NvrtcCompiler().compile(ABI_SCALARS / "abi_scalars.cu", Arch.parse("sm_80"), "ptx", CompileOptions(name_expressions=cpp))
    ptx, lowered = obj.ptx, dict(obj.lowered)
    entries = parse_entries(ptx.decode())
    for k in spec.kernels:
        check_kernel_against_ptx(dataclasses.replace(k, symbol=lowered[k.name]) if k.cpp_name else k, entries, "test")
    # A kernel taking a real 64-bit parameter where a half is declared: refused, with the reason.
    bad = ptx.decode().replace(".param .u32 add_i64_param_3", ".param .u64 add_i64_param_3")
    with pytest.raises(KitError, match=r"parameter 3 \('offset_hi'\) .* takes 8 bytes there; a 64-bit scalar is declared i64, u64 or f64"):
        check_kernel_against_ptx(spec.kernels[0], parse_entries(bad), "test")


@pytest.mark.parametrize(
    "dtype, value, expected",
    [
        ("i32", -3, -3),
        ("u32", 2**32 - 1, -1),
        ("i64", -(2**40), -(2**40)),
        ("u64", 2**64 - 1, -1),
        ("f32", 1.5, 1.5),
        ("f64", 1.5, struct.unpack("<q", struct.pack("<d", 1.5))[0]),
        ("f16", 1.5, 0x3E00),
        ("bf16", 1.5, 0x3FC0),
        ("bool", True, 1),
    ],
)
def test_python_scalars_become_what_the_function_takes(dtype, value, expected):
    assert scalar_argument(dtype, value) == expected


@pytest.mark.parametrize("dtype, value", [("i32", 2**31), ("u32", -1), ("i64", 0.5), ("f16", 1e6), ("f32", "x")])
def test_out_of_range_scalars_are_refused(dtype, value):
    with pytest.raises(KitError, match=f"fits {dtype}"):
        scalar_argument(dtype, value)


def test_bf16_bits_round_to_nearest_even():
    assert float_bits("bf16", 1.0) == 0x3F80
    assert float_bits("bf16", 1.0 + 2**-8) == 0x3F80  # a tie: stays even
    assert float_bits("bf16", 1.0 + 3 * 2**-8) == 0x3F82


@needs_iree_compile
def test_every_scalar_type_compiles_and_is_split_into_32_bit_constants(tmp_path):
    result = build(ABI_SCALARS, BuildOptions.create("sm_80,sm_90"), tmp_path)
    mlir = result.mlir.read_text()
    assert mlir.count("constants = 5") == 3  # add_i64, xor_u64, axpb_f64: two wide scalars + n
    assert "%offset_hi = arith.trunci %offset_shifted : i64 to i32" in mlir
    # Literals become their bits in Python: IREE would demote an f64 constant to f32.
    lo, hi = struct.unpack("<ii", struct.pack("<d", 0.1))
    assert f"%b_lo_bits = arith.constant {lo} : i32" in mlir and f"%b_hi_bits = arith.constant {hi} : i32" in mlir
    assert "%bias_bits = arith.constant 16128 : i32" in mlir  # bf16 0.5
    assert "func.func @half_ops(%x: tensor<?xf16>, %scale: i32, %negate: i1)" in mlir
    record = json.loads(result.record.read_text())
    assert {f["name"]: f["args"] for f in record["functions"]}["axpb_f64"] == ["f32[n]", "f64"]


# ------------------------------------------------------------------------ C++ kernels


def test_cpp_kernels_resolve_to_their_mangled_entries(tmp_path):
    # Loading a manifest compiles nothing: the entry comes from the build's own compile, and
    # the build reports (and records) the names it chose.
    spec = load_manifest(ABI_SCALARS)
    k = next(k for k in spec.kernels if k.name == "scale_t<float>")
    assert k.cpp_name and k.symbol is None and k.function == "scale_float"
    result = generate(ABI_SCALARS, BuildOptions.create("sm_80", format="ptx"), tmp_path / "abi")
    assert result.names["scale_t<float>"] == {"function": "scale_float", "entry": "_Z7scale_tIfEvPT_PKS0_S0_i"}
    assert read_record(result.record).names == result.names
    cu = "namespace ns { __global__ void fill(int* out, int v) { out[threadIdx.x] = v; } }\n"
    toml = '[[kernels]]\nname = "ns::fill"\nsource = "k.cu"\nworkgroup_size = [32]\nworkgroup_count = [1]\nshapes = { out = "i32[32]" }\n'
    root = write_kernel_project(tmp_path / "ns", cu, toml)
    result = generate(root, BuildOptions.create("sm_80", format="ptx"), tmp_path / "ns_out")
    assert result.names["ns::fill"] == {"function": "ns_fill", "entry": "_ZN2ns4fillEPii"}


@needs_iree_compile
def test_a_cpp_kernel_missing_from_the_object_lists_the_entries(tmp_path):
    cu = "__global__ void a(int* out, int v) { out[0] = v; }\n__global__ void b(int* out, int v) { out[0] = v; }\n"
    toml = '[[kernels]]\nname = "a"\nsource = "k.cu"\nworkgroup_size = [32]\nworkgroup_count = [1]\nshapes = { out = "i32[32]" }\n'
    root = write_kernel_project(tmp_path / "src", cu, toml)
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out")
    assert "hal.executable.export public @_Z1aPii ordinal(0)" in result.mlir.read_text()
    # A template without an explicit instantiation: the name instantiates it, with NVRTC (a
    # name expression) and with nvcc (the entries unit); tests/compile/test_cxx_names.py has more.
    cu += "template <typename T> __global__ void t(T* out, T v) { out[0] = v; }\n"
    toml += toml.replace('name = "a"', 'name = "t<int>"') + 'scalars = { v = "i32" }\n'
    root = write_kernel_project(tmp_path / "src2", cu, toml)
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out2")
    assert "hal.executable.export public @_Z1tIiEvPT_S0_" in result.mlir.read_text()
    if shutil.which("nvcc"):
        result = build(root, BuildOptions.create("sm_80", compiler="nvcc"), tmp_path / "out3")
        assert "hal.executable.export public @_Z1tIiEvPT_S0_" in result.mlir.read_text()
    # An entry the object lacks (a mangled name, with its params) is refused with the entries there are.
    toml = ('[[kernels]]\nname = "_Z1tIlEvPT_S0_"\nsource = "k.cu"\nworkgroup_size = [32]\nworkgroup_count = [1]\n'
            'params = [{ name = "out", out = "i32[32]" }, { name = "v", scalar = "i32" }]\n')
    root = write_kernel_project(tmp_path / "src3", cu, toml)
    with pytest.raises(KitError, match=r"'_Z1tIlEvPT_S0_' is not in the compiled object \(entries found: _Z1aPii, _Z1bPii\)"):
        build(root, BuildOptions.create("sm_80"), tmp_path / "out4")


# ---------------------------------------------------------------------------- headers


@pytest.mark.parametrize("header", ["cuda_fp16.h", "cuda_bf16.h", "mma.h"])
def test_cuda_headers_work_under_nvrtc_from_pip(tmp_path, header):
    assert find_nvrtc() is not None and not find_nvrtc().missing_headers
    src = tmp_path / "k.cu"
    src.write_text(f'#include <{header}>\nextern "C" __global__ void k(float* o) {{ o[0] = 1.0f; }}\n')
    obj = NvrtcCompiler().compile(src, Arch.parse("sm_80"), "ptx", CompileOptions())
    assert "k" in parse_entries(obj.ptx.decode())


# ------------------------------------------------------ stores through pointers (roles: test_roles.py)

@pytest.mark.parametrize("project", sorted(p.parent.name for p in (REPO / "kernels").glob("*/kitdispatch.toml")))
def test_the_store_analysis_finds_exactly_the_results_of_the_library(project):
    from kitdispatch.check.ptx import written_params

    spec = library_spec(REPO / "kernels" / project)  # kernels/matmul: its representative subset
    names = tuple(k.name for k in spec.kernels if k.cpp_name)
    for source in {spec.source_path(k.source) for k in spec.kernels}:
        defines = spec.source_flags(source)[1]  # kernels/matmul compiles each generated entry only with its define
        obj = NvrtcCompiler().compile(source, Arch.parse("sm_90"), "ptx", CompileOptions(name_expressions=names, defines=defines))
        lowered = dict(obj.lowered)
        for k in (k for k in spec.kernels if spec.source_path(k.source) == source):
            slots = k.c_slots
            results = tuple(i for i, s in enumerate(slots) if isinstance(s.param, Buffer) and s.param.is_result)
            assert written_params(obj.ptx.decode(), lowered.get(k.name, k.name)) == results, k.name


# --------------------------------------------------------------- what the tools say

@pytest.mark.parametrize(
    "arch, why",
    [
        ("sm_50", "nvrtc cannot target sm_50: nvrtc no longer supports GPUs older than sm_75"),
        ("sm_10", "nvrtc cannot target sm_10: no NVIDIA GPU has that compute capability"),
    ],
)
def test_an_architecture_the_compiler_cannot_target_says_why(tmp_path, arch, why):
    import io

    from kitdispatch.cli import main

    out, err = io.StringIO(), io.StringIO()
    assert main(["build", str(ABI_SCALARS), "--arch", arch, "--no-cache", "-o", str(tmp_path / "o")], out, err) == 2
    assert why in err.getvalue() and "choose from what nvrtc supports: sm_75, sm_80" in err.getvalue()
    assert not (tmp_path / "o").exists()


@needs_iree_compile
def test_verbose_shows_the_commands_that_ran(tmp_path):
    import io

    from kitdispatch.cli import main

    out, err = io.StringIO(), io.StringIO()
    assert main(["build", str(ABI_SCALARS), "--arch", "sm_80", "-o", str(tmp_path / "o"), "-v"], out, err) == 0
    text = out.getvalue() + err.getvalue()
    assert "ran: nvcc --cubin -arch=sm_80 -std=c++17" in text and "abi_scalars.cu" in text
    assert f"--iree-hal-executable-object-search-path={tmp_path / 'o'} -o {tmp_path / 'o' / 'abi_scalars.vmfb'}" in text
    out, err = io.StringIO(), io.StringIO()
    assert main(["build", str(ABI_SCALARS), "--arch", "sm_80", "-o", str(tmp_path / "o"), "-v"], out, err) == 0
    assert "ran:" not in out.getvalue() + err.getvalue()  # everything came from the cache


def test_test_scalars_are_checked_and_recorded(tmp_path):
    body = SAXPY_HEAD + 'shapes = { x = "f32[n]", y = "f32[n]" }\ninout = ["y"]\n[test]\nscalars = { alpha = 2.5 }\n'
    root = write_kernel_project(tmp_path / "src", SAXPY_CU, body)
    assert load_manifest(root).test.scalars == (("alpha", 2.5),)
    result = generate(root, BuildOptions.create("sm_80", format="ptx"), tmp_path / "out")
    record = read_record(result.record)
    assert record.test.scalars == (("alpha", 2.5),)
    assert record.functions[0].arg_names == ("x", "y", "alpha")
    with pytest.raises(ManifestError, match="names 'beta', which is no scalar argument"):
        manifest(tmp_path / "bad", SAXPY_CU, body.replace("alpha = 2.5", "beta = 1"))
