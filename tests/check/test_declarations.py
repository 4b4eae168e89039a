"""Pointer element types checked wherever C states them: vector types, typedefs, templates'
resolved types (spec.check_params, abi.pointee, signature aliases and compiled_signature)."""

import io
from pathlib import Path

import pytest
from conftest import DATA, needs_iree_compile, write_kernel_project

from kitdispatch import BuildOptions, generate, load_manifest
from kitdispatch import build
from kitdispatch.cli import main
from kitdispatch.errors import ManifestError
from kitdispatch.describe.record import read_record
from kitdispatch.describe.c_signature import compiled_signature, parse_kernels

HEADERS = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
TOML = ('[[kernels]]\nname = "{name}"\nsource = "k.cu"\nworkgroup_size = [64]\nworkgroup_count = ["ceildiv(n, 64)"]\n'
        'shapes = {{ out = "{out}", in = "{inp}" }}\nvalues = {{ n = "n" }}\n')


def _project(tmp_path: Path, cu: str, *, out: str, inp: str, name: str = "k") -> Path:
    return write_kernel_project(tmp_path / "src", HEADERS + cu, TOML.format(name=name, out=out, inp=inp))


def _cli(argv: list[str]) -> tuple[int, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(argv, stdout, stderr)
    return code, stderr.getvalue()


def test_a_half2_pointer_declared_f32_is_an_error(tmp_path):
    """The issue's case: `const half2* in` declared f32[n] built silently."""
    cu = 'extern "C" __global__ void k(half2* out, const half2* in, int n) { out[threadIdx.x] = in[threadIdx.x]; }\n'
    root = _project(tmp_path, cu, out="f16[n]", inp="f32[n]")
    code, err = _cli(["gen", str(root), "--arch", "sm_80", "-o", str(tmp_path / "out")])
    assert code == 2 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert "kernel 'k' parameter 'in': the manifest declares in f32[n]" in line
    assert "'const half2 *' (elements of type f16, 2 at a time)" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("shape, ok", [("f16[n]", True), ("f16[n,2]", True), ("f16[64]", True), ("f16[7]", False), ("f16[]", False)])
def test_a_vector_type_folds_its_lanes_into_the_innermost_dimension(tmp_path, shape, ok):
    cu = 'extern "C" __global__ void k(half2* out, const half2* in, int n) { out[threadIdx.x] = in[threadIdx.x]; }\n'
    root = _project(tmp_path, cu, out="f16[n]", inp=shape)
    if ok:
        load_manifest(root)
        return
    with pytest.raises(ManifestError, match=r"innermost dimension of f16\[.*\] is (7|1), not a multiple of 2"):
        load_manifest(root)


VECTORS = [  # C type, its element type, another element type of the same size (wrong)
    ("float4", "f32", "i32"),
    ("float2", "f32", "f16"),
    ("double2", "f64", "i64"),
    ("int2", "i32", "f32"),
    ("uint4", "u32", "f32"),
    ("uchar4", "u8", "f32"),
    ("short2", "i16", "i32"),
    ("__nv_bfloat162", "bf16", "f16"),
    ("__half2", "f16", "bf16"),
]


@pytest.mark.parametrize("c_type, element, wrong", VECTORS)
def test_vector_types_map_to_their_element_type(tmp_path, c_type, element, wrong):
    cu = f'extern "C" __global__ void k({c_type}* out, const {c_type}* in, int n) {{ out[threadIdx.x] = in[threadIdx.x]; }}\n'
    assert load_manifest(_project(tmp_path / "ok", cu, out=f"{element}[n]", inp=f"{element}[n]"))
    with pytest.raises(ManifestError, match=rf"parameter 'in': the manifest declares in {wrong}\[n\].*'const {c_type} \*' \(elements of type {element}"):
        load_manifest(_project(tmp_path / "bad", cu, out=f"{element}[n]", inp=f"{wrong}[n]"))


@pytest.mark.parametrize(
    "c_type, declared, ok",
    [
        ("uint16_t", "f16", True), ("unsigned short", "bf16", True), ("uint8_t", "f8e4m3", True),  # bits of a float C lacks
        ("unsigned int", "i32", True),  # integers of one size
        ("unsigned int", "f32", False), ("int", "f32", False), ("float", "i32", False), ("uint16_t", "f32", False),
    ],
)
def test_integers_hold_the_bits_of_the_floats_c_has_no_type_for(tmp_path, c_type, declared, ok):
    cu = f'#include <cstdint>\nextern "C" __global__ void k({c_type}* out, const {c_type}* in, int n) {{ out[0] = in[0]; }}\n'
    root = _project(tmp_path, cu, out=f"{declared}[n]", inp=f"{declared}[n]")
    if ok:
        load_manifest(root)
    else:
        with pytest.raises(ManifestError, match=rf"parameter 'out': the manifest declares out {declared}\[n\]"):
            load_manifest(root)


@pytest.mark.parametrize(
    "alias",
    ["typedef __nv_bfloat16 floatX;", "using floatX = __nv_bfloat16;", "typedef __nv_bfloat16 bf; typedef bf floatX;"],
)
def test_typedefs_are_resolved(tmp_path, alias):
    cu = alias + '\nextern "C" __global__ void k(floatX* out, const floatX* in, floatX alpha, int n) { out[0] = in[0] * alpha; }\n'
    spec = load_manifest(_project(tmp_path / "ok", cu, out="bf16[n]", inp="bf16[n]"))
    assert spec.kernels[0].params[2].dtype == "bf16"  # a scalar's type through the typedef, too
    with pytest.raises(ManifestError, match=r"'const floatX \*' \(a typedef of __nv_bfloat16: elements of type bf16\)"):
        load_manifest(_project(tmp_path / "bad", cu, out="bf16[n]", inp="f32[n]"))


def test_a_typedef_that_preprocessor_branches_define_differently_is_left_to_the_compiler():
    src = HEADERS + ("#if defined(FP32)\ntypedef float floatX;\n#else\ntypedef __nv_bfloat16 floatX;\n#endif\n"
                     'extern "C" __global__ void k(floatX* out) {}\n')
    assert parse_kernels(src)["k"].params[0].base_type == "floatX"  # not guessed


IF_TYPEDEF_CU = ("#if defined(FP32)\ntypedef float floatX;\n#else\ntypedef __nv_bfloat16 floatX;\n#endif\n"
                 'extern "C" __global__ void k(floatX* out, const floatX* in, int n) { out[threadIdx.x] = in[threadIdx.x]; }\n')


def test_an_extern_c_kernel_is_checked_on_the_types_the_compiler_chose(tmp_path):
    """floatX as `-D FP32` (or its absence) makes it: NVRTC's probe of decltype(&k) says which."""
    root = _project(tmp_path, IF_TYPEDEF_CU, out="f32[n]", inp="f32[n]")
    code, err = _cli(["gen", str(root), "--arch", "sm_80", "-o", str(tmp_path / "out")])
    assert code == 2 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert "kernel 'k' parameter 'out': the manifest declares out f32[n], the compiled kernel has '__nv_bfloat16 *' (elements of type bf16)" in line
    assert not (tmp_path / "out").exists()
    code, err = _cli(["gen", str(root), "--arch", "sm_80", "-o", str(tmp_path / "out"), "-D", "FP32"])
    assert code == 0, err


def test_a_type_behind_a_macro_is_checked_after_compiling(tmp_path):
    cu = '#define floatX __half\nextern "C" __global__ void k(floatX* out, const floatX* in, int n) { out[threadIdx.x] = in[threadIdx.x]; }\n'
    with pytest.raises(ManifestError, match=r"parameter 'out'.*the compiled kernel has '__half \*' \(elements of type f16\)"):
        generate(_project(tmp_path, cu, out="f32[n]", inp="f32[n]"), BuildOptions.create("sm_80"), tmp_path / "out")
    assert generate(_project(tmp_path / "ok", cu, out="f16[n]", inp="f16[n]"), BuildOptions.create("sm_80"), tmp_path / "ok_out")


@pytest.mark.nvcc
def test_the_probe_serves_nvcc_builds_too(tmp_path):
    root = _project(tmp_path, IF_TYPEDEF_CU, out="f32[n]", inp="f32[n]")
    with pytest.raises(ManifestError, match=r"the compiled kernel has '__nv_bfloat16 \*'"):
        generate(root, BuildOptions.create("sm_80", compiler="nvcc"), tmp_path / "out")


TEMPLATE_CU = "template <typename T> __global__ void scale(T* out, const T* in, int n) { out[threadIdx.x] = in[threadIdx.x]; }\n"


def test_a_template_kernel_is_checked_on_its_resolved_types(tmp_path):
    root = _project(tmp_path, TEMPLATE_CU, out="f32[n]", inp="f32[n]", name="scale<__half>")
    code, err = _cli(["gen", str(root), "--arch", "sm_80", "-o", str(tmp_path / "out")])
    assert code == 2 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert "kernel 'scale<__half>' parameter 'out': the manifest declares out f32[n], the compiled kernel has '__half *'" in line
    assert not (tmp_path / "out").exists()
    ok = _project(tmp_path / "ok", TEMPLATE_CU, out="f16[n]", inp="f16[n]", name="scale<__half>")
    assert generate(ok, BuildOptions.create("sm_80"), tmp_path / "out_ok").mlir.is_file()


@pytest.mark.nvcc
def test_a_template_kernel_is_checked_on_its_resolved_types_with_nvcc(tmp_path):
    cu = TEMPLATE_CU + "template __global__ void scale<float4>(float4*, const float4*, int);\n"
    root = _project(tmp_path, cu, out="f32[n]", inp="f16[n]", name="scale<float4>")
    with pytest.raises(ManifestError, match=r"parameter 'in'.*the compiled kernel has 'const float4 \*' \(elements of type f32, 4 at a time\)"):
        generate(root, BuildOptions.create("sm_80", compiler="nvcc"), tmp_path / "out")
    ok = _project(tmp_path / "ok", cu, out="f32[n]", inp="f32[n,4]", name="scale<float4>")
    assert generate(ok, BuildOptions.create("sm_80", compiler="nvcc"), tmp_path / "out_ok").mlir.is_file()


def test_compiled_signature_reads_a_mangled_entry():
    sig = compiled_signature("scale<float, 4>", "_Z5scaleIfLi4EEvPT_PKS0_PK7__half2P14__nv_bfloat162P6float4j")
    assert [(c.type, c.base_type, c.is_const_pointee) for c in sig.params] == [
        ("float *", "float", False), ("const float *", "float", True), ("const __half2 *", "__half2", True),
        ("__nv_bfloat162 *", "__nv_bfloat162", False), ("float4 *", "float4", False), ("unsigned int", "unsigned int", False),
    ]
    assert compiled_signature("k", "k") is None  # extern "C": nothing to read


@needs_iree_compile
def test_a_half2_kernel_builds_as_a_function_of_f16_tensors(tmp_path):
    result = build(DATA / "pointer_roles", BuildOptions.create("sm_80"), tmp_path / "out")
    [f] = [f for f in read_record(result.record).functions if f.name == "scale_half2"]
    assert (f.to_json()["args"], f.to_json()["results"]) == (["f16[n]"], ["f16[n]"])
