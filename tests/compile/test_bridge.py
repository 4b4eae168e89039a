"""Kernels that IREE cannot call as compiled (64-bit scalars, structs by value, scalars before
pointers) are bridged by rewriting their PTX entry (kitdispatch/compile/bridge.py): the rewrite on
PTX text, then real builds with NVRTC + nvJitLink and nvcc + ptxas, checked by reading the
objects' entries and compiling the MLIR. The GPU run is in test_gpu_bridge.py."""

import shutil

import pytest

from kitdispatch import BuildOptions, KitError, generate, load_manifest
from kitdispatch import build
from kitdispatch.compile.bridge import rewrite_entry
from kitdispatch.errors import AbiError
from kitdispatch.check.ptx import parse_entries

from conftest import DATA, needs_iree_compile, write_kernel_project

BRIDGE = DATA / "abi_bridge"

PTX = """
.version 9.0
.target sm_90
.address_size 64

.visible .entry k(
	.param .u64 k_param_0,
	.param .u64 .ptr .align 1 k_param_1,
	.param .align 8 .b8 k_param_2[16],
	.param .f64 k_param_3,
	.param .u32 k_param_4
)
.maxntid 128, 1, 1
{
	.reg .b32 	%r<4>;
	.reg .f32 	%f<3>;
	.reg .f64 	%fd<3>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u64 	%rd2, [k_param_1];
	ld.param.v2.f32 	{%f1, %f2}, [k_param_2];
	ld.param.u8 	%r3, [k_param_2+5];
	ld.param.f64 	%fd1, [k_param_2+8];
	ld.param.f64 	%fd2, [k_param_3];
	ld.param.u32 	%r1, [k_param_4];
	ret;
}
"""


def test_rewrite_puts_pointers_first_and_splits_wide_scalars_into_words():
    out = rewrite_entry(PTX, "k", (1,))
    entry = parse_entries(out)["k"]
    assert [(p.name, p.size) for p in entry.params] == [
        ("k_param_1", 8),
        ("k_param_0_w0", 4), ("k_param_0_w1", 4),
        ("k_param_2_w0", 4), ("k_param_2_w1", 4), ("k_param_2_w2", 4), ("k_param_2_w3", 4),
        ("k_param_3_w0", 4), ("k_param_3_w1", 4),
        ("k_param_4", 4),
    ]
    assert entry.maxntid == (128, 1, 1)  # directives are kept
    assert "mov.b64 \t%rd1, {%kdw0, %kdw1};" in out
    assert "ld.param.f32 \t%f1, [k_param_2_w0];" in out and "ld.param.f32 \t%f2, [k_param_2_w1];" in out
    assert "ld.param.u8 \t%r3, [k_param_2_w1+1];" in out
    assert "ld.param.u32 \t%kdw2, [k_param_2_w2];" in out and "mov.b64 \t%fd1, {%kdw2, %kdw3};" in out
    assert ".reg .b32 \t%kdw<6>;" in out
    assert "ld.param.u64 \t%rd2, [k_param_1];" in out and "ld.param.u32 \t%r1, [k_param_4];" in out


def test_rewritten_ptx_assembles(tmp_path):
    if not shutil.which("ptxas"):
        pytest.skip("ptxas is not on PATH")
    from kitdispatch.compile.archs import Arch
    from kitdispatch.compile.bridge import assemble

    cubin, _ = assemble(rewrite_entry(PTX, "k", (1,)).encode(), Arch.parse("sm_90"), "nvrtc")
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize(
    "line, message",
    [
        ("\tmov.b64 \t%rd1, k_param_0;", "other than by loading it"),
        ("\tld.param.u32 \t%r2, [k_param_2+2];", "across two 32-bit push constants"),
    ],
)
def test_a_parameter_that_cannot_be_split_is_refused_with_the_reason(line, message):
    ptx = PTX.replace("\tld.param.u64 \t%rd1, [k_param_0];", line)
    with pytest.raises(AbiError, match=message):
        rewrite_entry(ptx, "k", (1,))


def test_the_manifest_describes_bridged_kernels_from_their_signature():
    spec = load_manifest(BRIDGE)
    k = {k.name: k for k in spec.kernels}
    assert [p.name for p in k["add_i64"].params] == ["offset", "x", "out", "big", "n"]
    assert all(kernel.needs_bridge for name, kernel in k.items() if name not in ("narrow", "fp8_ops"))
    assert [(s.name, s.dtype) for s in k["narrow"].scalars] == [("s", "i8"), ("t", "i16"), ("u", "u8"), ("n", "i32")]
    assert [str(a) for a in k["affine"].signature().args] == ["f32[n]", "struct16"]
    assert dict(spec.test.scalars)["offset"] == -5000000123


@pytest.mark.parametrize("compiler", ["nvrtc", pytest.param("nvcc", marks=pytest.mark.nvcc)])
@pytest.mark.parametrize("fmt", ["fatbin", "cubin", "ptx"])
def test_bridged_objects_take_bindings_then_32_bit_constants(tmp_path, compiler, fmt):
    result = generate(BRIDGE, BuildOptions.create("sm_80,sm_90", compiler=compiler, format=fmt), tmp_path / "out")
    mlir = result.mlir.read_text()
    assert "func.func @add_i64(%offset: i64, %x: tensor<?xi64>) -> (tensor<?xi64>)" in mlir
    assert "(%offset_lo, %offset_hi, %big_lo, %big_hi, %n_i32, %x)" in mlir
    assert "func.func @affine(%x: tensor<?xf32>, %p_w0: i32, %p_w1: i32, %p_w2: i32, %p_w3: i32)" in mlir
    assert "func.func @xor_u64(%x: tensor<?xui64>, %mask: i64) -> (tensor<?xui64>)" in mlir
    if fmt == "ptx":
        entries = parse_entries((tmp_path / "out" / "bridge.sm_90.ptx").read_text())
        assert [p.size for p in entries["add_i64"].params] == [8, 8, 4, 4, 4, 4, 4]
        assert [p.size for p in entries["affine"].params] == [8, 8, 4, 4, 4, 4, 4]


def test_a_bridged_build_is_cached_like_any_other(tmp_path):
    options = BuildOptions.create("sm_80,sm_90")
    assert generate(BRIDGE, options, tmp_path / "a").compiler_runs == 1
    assert generate(BRIDGE, options, tmp_path / "b").compiler_runs == 0


def test_a_struct_of_the_wrong_size_is_refused_by_the_ptx_check(tmp_path):
    cu = 'struct S { float a; double b; };\nextern "C" __global__ void k(float* out, S s) { out[0] = s.a + s.b; }\n'
    toml = ('[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [1]\nworkgroup_count = [1]\n'
            'shapes = { out = "f32[1]" }\nscalars = { s = "struct12" }\n')
    root = write_kernel_project(tmp_path / "src", cu, toml)
    with pytest.raises(KitError, match=r"declared as struct12 \(12 bytes\) but the compiled kernel takes 16 bytes"):
        generate(root, BuildOptions.create("sm_80", format="ptx"), tmp_path / "out")


@needs_iree_compile
def test_bridged_module_links_with_every_function(tmp_path):
    result = build(BRIDGE, BuildOptions.create("sm_80,sm_90"), tmp_path / "out")
    assert {f.name for f in load_manifest(BRIDGE).signatures} == {"add_i64", "xor_u64", "axpb_f64", "affine", "narrow", "fp8_ops"}
    assert result.vmfb.stat().st_size > 0
