"""The whole build path for real: NVRTC objects, rendered MLIR, iree-compile to .vmfb."""

import json

import pytest

from kitdispatch import BuildOptions, IreeCompileError, KitError, ManifestError, generate, load_manifest
from kitdispatch import build
from kitdispatch.emit.render import ExecutableObjects, render_module
from kitdispatch.iree.tools import target_release

from conftest import kernel_toml, SAMPLES, needs_iree_compile, write_kernel_project

pytestmark = needs_iree_compile

TWO_ARCHS = BuildOptions.create("sm_80,sm_90", format="ptx")


def test_sample_builds_for_two_archs(tmp_path):
    result = build(SAMPLES / "simple_mul", TWO_ARCHS, tmp_path)
    assert result.vmfb.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "reference.py",
        "simple_mul.kitdispatch.json",
        "simple_mul.mlir",
        "simple_mul.sm_80.ptx",
        "simple_mul.sm_90.ptx",
        "simple_mul.vmfb",
    ]
    record = json.loads(result.record.read_text())
    assert record["archs"] == ["sm_90", "sm_80"]
    assert [f["name"] for f in record["functions"]] == ["simple_mul", "simple_mul_inplace", "mixed_invocation"]
    mlir = result.mlir.read_text()
    # Explicit variants, newest first, each guarded by the device's compute capability.
    assert mlir.index("@sm_90_ptx target(") < mlir.index("@sm_80_ptx target(")
    assert mlir.count("hal.executable.condition") == 2
    assert "{@simple_mul_executable::@sm_90_ptx::@simple_mul, @simple_mul_executable::@sm_80_ptx::@simple_mul}" in mlir
    assert record["ptx_isa"] == "9.0"


def test_single_arch_uses_an_objects_map(tmp_path):
    result = build(SAMPLES / "simple_mul", BuildOptions.create("sm_90", format="ptx"), tmp_path)
    mlir = result.mlir.read_text()
    assert "hal.executable.source private @simple_mul_executable <objects = #hal.executable.objects<{" in mlir
    assert "#hal.executable.target<\"cuda\", \"cuda-nvptx-fb\"> = [#hal.executable.object<{path = \"simple_mul.sm_90.ptx\"}>]" in mlir
    assert "<workgroup_size = [64 : index, 1 : index, 1 : index]>" in mlir
    # sm_90 has no IREE codegen target; the generated add falls back to the best older one.
    assert result.codegen_target == "sm_89"
    assert result.notes and "sm_89" in result.notes[0]


def test_gen_stops_before_the_vmfb(tmp_path):
    result = generate(SAMPLES / "simple_mul", BuildOptions.create("sm_80"), tmp_path)
    assert result.vmfb is None
    assert not list(tmp_path.glob("*.vmfb"))
    assert result.mlir.is_file() and result.objects[0].is_file()


def test_gen_needs_neither_programs_nor_the_reference(tmp_path):
    """gen's MLIR is for splicing: a [[programs]] file and a [test] reference that do not
    exist stop `build` with a clear error but not `gen`, which neither reads nor copies them."""
    toml = SCALE_TOML + (
        '\n[[programs]]\nsource = "missing.mlir"\nfunctions = [{ name = "prog", args = ["f32[n]"], results = ["f32[n]"] }]\n'
        '\n[test]\nreference = "missing_reference.py"\n'
    )
    root = write_kernel_project(tmp_path / "src", SCALE_CU, toml)
    result = generate(root, BuildOptions.create("sm_80", format="ptx"), tmp_path / "gen")
    assert "func.func @scale(" in result.mlir.read_text() and "@prog" not in result.mlir.read_text()
    record = json.loads(result.record.read_text())
    assert [f["name"] for f in record["functions"]] == ["scale"] and record["test"]["reference"] is None
    assert sorted(p.name for p in (tmp_path / "gen").iterdir()) == ["k.sm_80.ptx", "scale.kitdispatch.json", "scale.mlir"]
    with pytest.raises(ManifestError, match="missing.mlir does not exist"):
        build(root, BuildOptions.create("sm_80", format="ptx"), tmp_path / "built")
    assert not (tmp_path / "built").exists()


SCALE_CU = r"""
extern "C" __global__ void scale(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * x[i];
}
"""
SCALE_TOML = kernel_toml("scale", module="scale", body='shapes = { x = "f32[n]", out = "f32[n]" }\n')


def test_generated_mlir_is_reproducible(tmp_path):
    a = generate(SAMPLES / "simple_mul", TWO_ARCHS, tmp_path / "a").mlir.read_text()
    b = generate(SAMPLES / "simple_mul", TWO_ARCHS, tmp_path / "b").mlir.read_text()
    assert a == b


KERNELS_CU = r"""
// out first, then inputs: the common CUDA habit.
extern "C" __global__ void scale_add(float* __restrict__ out, const float* __restrict__ x,
                                     const float* __restrict__ y, float alpha, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = alpha * x[i] + y[i];
}
// A 2-D kernel: out[c][r] = in[r][c].
extern "C" __global__ void transpose(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
  int c = blockIdx.x * 16 + threadIdx.x, r = blockIdx.y * 16 + threadIdx.y;
  if (r < rows && c < cols) out[c * rows + r] = in[r * cols + c];
}
// A fixed grid that reads a literal.
extern "C" __global__ void fill(int* __restrict__ out, int value) { out[threadIdx.x] = value; }
"""

KERNELS_TOML = """
name = "various"
[[kernels]]
name = "scale_add"
source = "k.cu"
workgroup_size = [128]
workgroup_count = ["ceildiv(n, 128)"]
params = [
  { name = "out", out = "f32[n]" },
  { name = "x", in = "f32[n]" },
  { name = "y", in = "f32[n]" },
  { name = "alpha", scalar = "f32" },
  { name = "n", scalar = "i32" },
]
[[kernels]]
name = "transpose"
source = "k.cu"
workgroup_size = [16, 16]
workgroup_count = ["ceildiv(cols, 16)", "ceildiv(rows, 16)"]
params = [
  { name = "input", in = "f32[rows,cols]" },
  { name = "output", out = "f32[cols,rows]" },
  { name = "rows", scalar = "i32" },
  { name = "cols", scalar = "i32" },
]
[[kernels]]
name = "fill"
function = "fill_seven"
source = "k.cu"
workgroup_size = [32]
workgroup_count = [1]
params = [
  { name = "out", out = "i32[32]" },
  { name = "value", scalar = "i32", value = 7 },
]
"""


def test_varied_signatures_compile(tmp_path):
    root = write_kernel_project(tmp_path / "src", KERNELS_CU, KERNELS_TOML)
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out")
    mlir = result.mlir.read_text()
    # The output that precedes inputs keeps its binding slot through a tied alloca of its own.
    assert "%out_alloca = flow.tensor.alloca : tensor<?xf32>{%dim_n}" in mlir
    assert "-> (%out_alloca{%dim_n})" in mlir
    assert "arith.bitcast %alpha : f32 to i32" in mlir
    assert "count(%device: !hal.device, %cols: index, %rows: index)" in mlir
    assert "func.func @fill_seven() -> (tensor<32xi32>)" in mlir
    record = json.loads(result.record.read_text())
    assert {f["name"]: f["args"] for f in record["functions"]} == {
        "scale_add": ["f32[n]", "f32[n]", "f32"],
        "transpose": ["f32[rows,cols]"],
        "fill_seven": [],
    }


def _failing(tmp_path, cu, toml):
    root = write_kernel_project(tmp_path / "src", cu, toml)
    out = tmp_path / "out"
    return root, out


def test_compile_error_leaves_no_output(tmp_path):
    root, out = _failing(tmp_path, "this is not CUDA", KERNELS_TOML)
    with pytest.raises(KitError, match=r"k.cu:1"):
        build(root, BuildOptions.create("sm_80"), out)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_kernel_missing_from_object(tmp_path):
    toml = KERNELS_TOML.replace('name = "transpose"', 'name = "transpos"')
    root, out = _failing(tmp_path, KERNELS_CU, toml)
    with pytest.raises(KitError, match=r"'transpos' is not in the compiled object \(entries found: fill, scale_add, transpose\)"):
        build(root, BuildOptions.create("sm_80"), out)
    assert not out.exists()


def test_iree_compile_failure_shows_the_mlir_and_the_command(tmp_path):
    root = write_kernel_project(tmp_path / "src", KERNELS_CU, KERNELS_TOML + '\n[[programs]]\nsource = "bad.mlir"\nfunctions = []\n')
    (root / "bad.mlir").write_text("func.func @bad(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %nope : tensor<4xf32>\n}\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("untouched")
    with pytest.raises(IreeCompileError) as err:
        build(root, BuildOptions.create("sm_80"), out)
    text = str(err.value)
    assert "use of undeclared SSA value name" in text
    assert "return %nope" in text and " | " in text  # the excerpt, with line numbers
    assert "re-run: " in text and "iree-compile" in text
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    # The command printed can be re-run as it stands.
    kept = text.split("kept in ")[1].split()[0]
    assert (tmp_path / kept).exists() or __import__("pathlib").Path(kept).exists()


def test_program_with_module_wrapper_is_refused(tmp_path):
    root = write_kernel_project(tmp_path / "src", KERNELS_CU, KERNELS_TOML + '\n[[programs]]\nsource = "p.mlir"\nfunctions = []\n')
    (root / "p.mlir").write_text("module {\n}\n")
    with pytest.raises(ManifestError, match=r"p.mlir:1"):
        build(root, BuildOptions.create("sm_80"), tmp_path / "out")


def test_missing_program_file(tmp_path):
    root = write_kernel_project(tmp_path / "src", KERNELS_CU, KERNELS_TOML + '\n[[programs]]\nsource = "none.mlir"\nfunctions = []\n')
    with pytest.raises(ManifestError, match="none.mlir does not exist"):
        build(root, BuildOptions.create("sm_80"), tmp_path / "out")


def test_render_without_compiling():
    from kitdispatch.compile.archs import Arch
    from kitdispatch.emit.render import VariantObject

    spec = load_manifest(SAMPLES / "simple_mul")
    objs = [ExecutableObjects(spec.kernels[0].source, "ptx", (VariantObject(Arch.parse("sm_80"), "ptx", "x.ptx"),))]
    text = render_module(spec, objs, spelling=target_release().spelling).text
    assert text.count("hal.executable.export public") == 2
    assert "ordinal(0)" in text and "ordinal(1)" in text


def _variant_ranges(mlir: str) -> list[tuple[str, int, int]]:
    import re

    names = re.findall(r"hal.executable.variant public @(\w+)", mlir)
    mins = [int(v) for v in re.findall(r"%min_capability = arith.constant (\d+)", mlir)]
    maxs = [int(v) for v in re.findall(r"%max_capability = arith.constant (\d+)", mlir)]
    return list(zip(names, mins, maxs))


PROBE = SAMPLES.parent / "tests" / "data" / "arch_probe"


def test_default_format_is_one_fatbin(tmp_path):
    result = build(PROBE, BuildOptions.create("sm_80,sm_90"), tmp_path)
    assert [o.name for o in result.objects] == ["arch_probe.sm_90_sm_80.fatbin"]
    assert "hal.executable.source" in result.mlir.read_text()
    assert result.objects[0].read_bytes()[:4] == b"\x50\xed\x55\xba"  # fatbin magic


def test_cubin_variants_stay_within_their_major_and_fall_back_to_ptx(tmp_path):
    result = build(PROBE, BuildOptions.create("sm_100,sm_90,sm_80", format="cubin"), tmp_path)
    big = 2**31 - 1
    assert _variant_ranges(result.mlir.read_text()) == [
        ("sm_100_cubin", 100, 110),
        ("sm_90_cubin", 90, 100),
        ("sm_80_cubin", 80, 90),
        ("sm_100_ptx", 100, big),
        ("sm_80_ptx", 80, big),
    ]


def test_arch_specific_targets_run_only_on_that_arch(tmp_path):
    result = build(PROBE, BuildOptions.create("sm_90a,sm_80", format="ptx"), tmp_path)
    assert _variant_ranges(result.mlir.read_text()) == [("sm_90a_ptx", 90, 91), ("sm_80_ptx", 80, 2**31 - 1)]


def test_per_kernel_format_overrides_the_build(tmp_path):
    toml = KERNELS_TOML.replace('name = "fill"', 'name = "fill"\nformat = "cubin"')
    root = write_kernel_project(tmp_path / "src", KERNELS_CU, toml)
    result = build(root, BuildOptions.create("sm_80", format="ptx"), tmp_path / "out")
    mlir = result.mlir.read_text()
    assert "@k_ptx_executable" in mlir and "@k_cubin_executable" in mlir
    assert sorted(o.name for o in result.objects) == ["k.sm_80.cubin", "k.sm_80.ptx"]


def test_ptx_newer_than_the_minimum_driver_fails_early(tmp_path):
    from kitdispatch.run.driver_ptx import PreflightError

    with pytest.raises(PreflightError) as err:
        build(PROBE, BuildOptions.create("sm_80", format="ptx", min_driver="12.4"), tmp_path)
    text = str(err.value)
    assert "PTX (nvrtc, ISA 9.0) would not load on CUDA driver 12.4, which loads PTX ISA 8.4 at most" in text
    assert "--format cubin" in text and "'nvidia-cuda-nvrtc-cu12==12.4.*'" in text  # a wheel that exists
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    # cubin needs no PTX JIT on its targets: the fallback PTX only earns a note.
    result = build(PROBE, BuildOptions.create("sm_80", format="cubin", min_driver="12.4"), tmp_path)
    assert any("PTX fallback" in n for n in result.notes)
    build(PROBE, BuildOptions.create("sm_80", format="ptx", min_driver="13.0"), tmp_path / "ok")


def test_in_process_link_matches_the_subprocess(tmp_path):
    """Same module both ways; only the embedded source name differs (the subprocess sees
    the staging folder's path)."""
    import re

    fast = build(SAMPLES / "simple_mul", BuildOptions.create("sm_80", use_cache=False), tmp_path / "a")
    slow = build(SAMPLES / "simple_mul", BuildOptions.create("sm_80", use_cache=False, iree_in_process=False), tmp_path / "b")
    strings = lambda p: set(re.findall(rb"[\x20-\x7e]{12,}", p.read_bytes()))  # noqa: E731
    differ = strings(fast.vmfb) ^ strings(slow.vmfb)
    assert all(s.endswith(b"simple_mul.mlir") for s in differ), differ
    assert (fast.iree_compile_runs, slow.iree_compile_runs) == (1, 1)
    assert b".staging" not in fast.vmfb.read_bytes()


def test_f64_tensors_stay_f64(tmp_path):
    """IREE would demote f64 to f32 by default; a double* kernel must get f64 buffers."""
    result = build(SAMPLES.parent / "tests" / "data" / "f64_tensor", BuildOptions.create("sm_80"), tmp_path)
    assert "tensor<?xf64>" in result.mlir.read_text()
    assert result.vmfb.is_file()


def test_dynamic_shared_memory_becomes_workgroup_local_memory(tmp_path):
    result = build(SAMPLES.parent / "tests" / "data" / "dynamic_shared", BuildOptions.create("sm_80"), tmp_path)
    assert "<workgroup_size = [64 : index, 1 : index, 1 : index], workgroup_local_memory = 256>" in result.mlir.read_text()


def test_dynamic_shared_memory_must_be_a_byte_count(tmp_path):
    root = write_kernel_project(tmp_path / "src", KERNELS_CU, KERNELS_TOML.replace('name = "fill"', 'name = "fill"\ndynamic_shared_memory = -1'))
    with pytest.raises(ManifestError, match="dynamic_shared_memory -1 is not a byte count"):
        build(root, BuildOptions.create("sm_80"), tmp_path / "out")


PER_ARCH = SAMPLES.parent / "tests" / "data" / "shared_per_arch"


def _variant_shared_memory(mlir: str) -> dict[str, int]:
    import re

    variants = re.split(r"hal.executable.variant public @", mlir)[1:]
    return {v.split(" ", 1)[0]: int(re.search(r"workgroup_local_memory = (\d+)", v).group(1)) for v in variants}


def test_shared_memory_per_arch_makes_a_fatbin_and_a_variant_per_arch(tmp_path):
    """IREE launches an export with one size, so each size gets its own object and variant;
    the objects are linked by iree-compile (the build runs it)."""
    result = build(PER_ARCH, BuildOptions.create("sm_90a,sm_80"), tmp_path)
    mlir = result.mlir.read_text()
    assert [o.name for o in result.objects] == ["reserved.sm_90a.fatbin", "reserved.sm_80.fatbin"]
    assert _variant_ranges(mlir) == [("sm_90a_fatbin", 90, 91), ("sm_80_fatbin", 80, 2**31 - 1)]
    assert _variant_shared_memory(mlir) == {"sm_90a_fatbin": 200000, "sm_80_fatbin": 4096}
    assert result.vmfb.is_file()


def test_shared_memory_per_arch_that_agrees_keeps_one_fatbin(tmp_path):
    """A build whose architectures all take the same size (here the default) is built as before."""
    result = build(PER_ARCH, BuildOptions.create("sm_90,sm_80"), tmp_path)
    assert [o.name for o in result.objects] == ["reserved.sm_90_sm_80.fatbin"]
    assert "<workgroup_size = [64 : index, 1 : index, 1 : index], workgroup_local_memory = 4096>" in result.mlir.read_text()


def test_shared_memory_per_arch_with_cubins_gives_each_variant_its_own(tmp_path):
    result = build(PER_ARCH, BuildOptions.create("sm_90a,sm_80", format="cubin"), tmp_path)
    assert _variant_shared_memory(result.mlir.read_text()) == {"sm_90a_cubin": 200000, "sm_80_cubin": 4096, "sm_80_ptx": 4096}


def test_a_users_file_named_like_a_per_arch_fatbin_is_never_overwritten(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "reserved.sm_90a.fatbin").write_text("my own work\n")
    with pytest.raises(KitError, match="reserved.sm_90a.fatbin exists and was not written by kitdispatch"):
        build(PER_ARCH, BuildOptions.create("sm_90a,sm_80"), out)
    assert (out / "reserved.sm_90a.fatbin").read_text() == "my own work\n"
    assert [p.name for p in out.iterdir()] == ["reserved.sm_90a.fatbin"]


def test_a_rebuild_that_splits_the_fatbin_removes_only_the_kits_own_earlier_one(tmp_path):
    """The folder held the kit's one fatbin (sm_90, sm_80) and a user's file; the build for
    sm_90a, sm_80 writes a fatbin per architecture and removes the earlier fatbin, nothing else."""
    out = tmp_path / "out"
    build(PER_ARCH, BuildOptions.create("sm_90,sm_80"), out)
    (out / "notes.txt").write_text("mine\n")
    result = build(PER_ARCH, BuildOptions.create("sm_90a,sm_80"), out)
    assert result.removed == ("reserved.sm_90_sm_80.fatbin",)
    names = {p.name for p in out.iterdir()}
    assert {"reserved.sm_90a.fatbin", "reserved.sm_80.fatbin", "notes.txt"} <= names
    assert "reserved.sm_90_sm_80.fatbin" not in names
    assert (out / "notes.txt").read_text() == "mine\n"


def test_three_dimensional_grid(tmp_path):
    result = build(SAMPLES.parent / "tests" / "data" / "grid3d", BuildOptions.create("sm_80"), tmp_path)
    mlir = result.mlir.read_text()
    assert "count(%device: !hal.device, %X: index, %Y: index, %Z: index)" in mlir
    assert "<workgroup_size = [8 : index, 4 : index, 2 : index]>" in mlir
