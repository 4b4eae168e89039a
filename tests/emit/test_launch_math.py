"""Launch math as host code states it (issue 23, item 2): index expressions with products of
sizes, divisors over sizes, min/max and sizeof in workgroup_count, scalar values and
dynamic_shared_memory; include_dirs and defines per manifest and per kernel.

Real NVRTC, nvcc, iree-compile and IREE's CPU runtime; the GPU tests run the kernels of
tests/data/launch_math (llm.c's layernorm shape) against numpy."""

import io
import subprocess

import numpy as np
import pytest

import kitdispatch as kd
from kitdispatch import BuildOptions, KitError, ManifestError, load_manifest
from kitdispatch import build
from kitdispatch.compile.archs import Arch
from kitdispatch.builder.pipeline import compile_options_for
from kitdispatch.compile.cache import object_key
from kitdispatch.cli import main
from kitdispatch.compile.compilers import CompileOptions, NvccCompiler, NvrtcCompiler
from kitdispatch.emit.index_ops import IndexOps
from kitdispatch.iree.tools import find_iree_compile
from kitdispatch.emit.render import _SsaNames
from kitdispatch.describe.index_expr import IndexExpr
from kitdispatch.compile.toolchain import find_nvrtc

from conftest import DATA, needs_iree_compile, prebuilt_or_build

LAUNCH_MATH = DATA / "launch_math"
SM80 = Arch(8, 0)
needs_nvrtc = pytest.mark.skipif(find_nvrtc() is None, reason="NVRTC is not installed")


# ------------------------------------------------------------------ parsing and rendering


@pytest.mark.parametrize(
    "text, affine",
    [
        ("ceildiv(n, 64)", True),
        ("n // 32 + 1", True),
        ("4 * n - 1", True),
        ("n * sizeof(float)", True),  # sizeof is a constant: still an affine map
        ("(2 + 8) * C * sizeof(float)", True),
        ("ceildiv(B * T, 256)", False),
        ("min(n, 1024)", False),
        ("max(ceildiv(n, 256), 1)", False),
        ("n // m", False),
        ("n % m", False),
        ("(2 + block_y) * C * sizeof(float)", False),
    ],
)
def test_affine_expressions_stay_affine_maps_and_others_become_index_arithmetic(text, affine):
    expr = IndexExpr.parse(text, "test")
    assert expr.is_affine == affine
    index = IndexOps(_SsaNames().take, {s: s for s in expr.symbols}, checked=True)
    index.value(expr, "r")
    ops = "\n".join(op.text for op in index.ops)
    assert ("affine.apply" in ops) == affine
    if not affine:
        assert "arith." in ops and "affine" not in ops


def test_products_min_and_ceildiv_of_symbols_render_their_arith_ops():
    index = IndexOps(_SsaNames().take, {"B": "B", "T": "T", "n": "n"}, checked=False)
    index.value(IndexExpr.parse("ceildiv(B * T, 256)", "t"), "x")
    index.value(IndexExpr.parse("min(n, 1024, T)", "t"), "y")
    index.value(IndexExpr.parse("max(n % T, 1)", "t"), "z")
    text = "\n".join(op.text for op in index.ops)
    assert "= arith.muli %B, %T : index" in text
    assert "%x = arith.ceildivsi %v, %c256 : index" in text
    assert "%min = arith.minsi %n, %c1024 : index" in text and "%y = arith.minsi %min, %T : index" in text
    assert "arith.floordivsi %n, %T" in text and "%z = arith.maxsi" in text
    assert "cf.assert" not in text  # a count region cannot fail a call: its function checks first


# A function over index arguments computing one expression with the ops the kit generates,
# compiled for IREE's CPU device and called: the arithmetic must agree with IndexExpr.evaluate
# (Python's floor division and %), and a divisor of 0 must fail the call with a clear message.
SEMANTICS = [
    ("ceildiv(a * b, 7)", [(3, 5), (-3, 5), (0, 9), (100000, 3000000)]),
    ("a // b + a % b", [(17, 5), (-17, 5), (17, -5), (-17, -5)]),
    ("ceildiv(a, b)", [(17, 5), (-17, 5), (17, -5), (16, 4)]),
    ("min(a, b, 1024) + max(a - b, 3)", [(5, 2000), (2000, 5), (-7, -9)]),
    ("(2 + b) * a * sizeof(float)", [(768, 8), (1, 0)]),
    ("-(a * b) // 3", [(5, 7), (2, 3)]),
]


@pytest.fixture(scope="module")
def cpu_semantics(tmp_path_factory):
    if not find_iree_compile():
        pytest.skip("iree-compile is not installed")
    functions = []
    for i, (text, _) in enumerate(SEMANTICS):
        names = _SsaNames()
        args = {s: names.take(s) for s in ("a", "b")}
        index = IndexOps(names.take, args, checked=True)
        index.check_divisors(IndexExpr.parse(text, "t"), f"test: '{text}'")
        index.value(IndexExpr.parse(text, "t"), names.take("r"), what=f"test: '{text}'")
        index.check_at_most("r", 10**12, f"expression {i} is above 10**12")
        body = "\n".join(f"  {op.text}" for op in index.ops)
        functions.append(f"func.func @f{i}(%a: index, %b: index) -> index {{\n{body}\n  return %r : index\n}}")
    out = tmp_path_factory.mktemp("index_ops")
    (out / "m.mlir").write_text("\n".join(functions) + "\n")
    subprocess.run(
        [find_iree_compile(), str(out / "m.mlir"), "--iree-hal-target-device=local",
         "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=generic", "-o", str(out / "m.vmfb")],
        check=True, timeout=300,
    )
    import iree.runtime as rt

    config = rt.Config("local-task")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.mmap(config.vm_instance, str(out / "m.vmfb")))
    return ctx.modules.module


@pytest.mark.parametrize("i", range(len(SEMANTICS)), ids=[t for t, _ in SEMANTICS])
def test_generated_index_arithmetic_computes_what_the_expression_says(cpu_semantics, i):
    text, cases = SEMANTICS[i]
    expr = IndexExpr.parse(text, "t")
    for a, b in cases:
        assert int(cpu_semantics[f"f{i}"](a, b)) == expr.evaluate({"a": a, "b": b}), (text, a, b)


def test_a_divisor_of_zero_fails_the_call_with_its_expression(cpu_semantics):
    with pytest.raises(Exception, match=r"test: 'a // b \+ a % b' divides by a value that is 0 in this call"):
        cpu_semantics["f1"](5, 0)
    with pytest.raises(Exception, match=r"expression 0 is above 10\*\*12"):
        cpu_semantics["f0"](10**6, 10**7)


# ------------------------------------------------------------------- the generated module


@pytest.fixture(scope="module")
def launch_math_build(tmp_path_factory, prebuilt_dir):
    return prebuilt_or_build(LAUNCH_MATH, tmp_path_factory, prebuilt_dir)


@needs_iree_compile
def test_launch_math_compiles_to_a_module_with_index_arithmetic_and_checks(launch_math_build):
    mlir = (launch_math_build / "launch_math.mlir").read_text()
    # The count region computes ceildiv(B * T, 8) and min(ceildiv(n, 256), 64) itself.
    assert "count(%device: !hal.device, %B: index, %T: index)" in mlir
    assert "%v = arith.muli %B, %T : index" in mlir and "%count_x = arith.ceildivsi %v, %c8 : index" in mlir
    assert "%count_x = arith.minsi %v, %c64 : index" in mlir
    # N = B * T for the kernel; the shared memory need of each call, checked before the dispatch.
    assert mlir.count("%N_index = arith.muli %dim_B, %dim_T : index") == 3  # NAME, NAME$async, NAME$record
    assert "workgroup_local_memory = 98304>" in mlir
    message = "kernel layernorm_forward: dynamic_shared_memory = (2 + 8) * C * sizeof(float)"
    assert mlir.count(message) == 3
    assert mlir.index(message) < mlir.index("flow.dispatch @layernorm_executable")
    # The check survives into the module IREE runs.
    assert message.encode() in (launch_math_build / "launch_math.vmfb").read_bytes()


# ------------------------------------------------------------ include_dirs and defines


def test_include_dirs_and_defines_reach_each_source_in_order():
    spec = load_manifest(LAUNCH_MATH)
    build_options = BuildOptions.create("sm_80", compile_options=CompileOptions(include_dirs=("/cli",), defines=("FROM_CLI=1",)))
    layernorm = compile_options_for(spec, LAUNCH_MATH / "layernorm.cu", build_options)
    assert layernorm.include_dirs == (str(LAUNCH_MATH / "include"), "/cli")
    assert layernorm.defines == ("LN_EPS=1e-5f", "FROM_CLI=1")
    grid = compile_options_for(spec, LAUNCH_MATH / "grid_stride.cu", build_options)
    assert grid.include_dirs == (str(LAUNCH_MATH / "include"), str(LAUNCH_MATH / "config"), "/cli")
    assert grid.defines == ("LN_EPS=1e-5f", "SCALE=2.0f", "FROM_CLI=1")
    assert f"-I{LAUNCH_MATH / 'config'}" in grid.flags() and "-DSCALE=2.0f" in grid.flags()


@pytest.mark.parametrize("compiler", ["nvrtc", pytest.param("nvcc", marks=pytest.mark.nvcc)])
def test_kernels_that_need_their_include_dirs_and_defines_compile(compiler, tmp_path):
    if compiler == "nvrtc" and find_nvrtc() is None:
        pytest.skip("NVRTC is not installed")
    spec = load_manifest(LAUNCH_MATH)
    backend = NvrtcCompiler() if compiler == "nvrtc" else NvccCompiler()
    for source in ("layernorm.cu", "grid_stride.cu"):
        options = compile_options_for(spec, LAUNCH_MATH / source, BuildOptions.create("sm_80"))
        obj = backend.compile(LAUNCH_MATH / source, SM80, "ptx", options)
        assert b".entry" in obj.data
        # Without the manifest's flags the same source does not compile: they are what reached it.
        with pytest.raises(KitError):
            backend.compile(LAUNCH_MATH / source, SM80, "ptx", CompileOptions(bridges=options.bridges))


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace('defines = ["SCALE=2.0f"]', 'defines = ["SCALE=3.0f"]'),
        lambda t: t.replace('defines = ["LN_EPS=1e-5f"]', 'defines = ["LN_EPS=1e-6f"]'),
        lambda t: t.replace('include_dirs = ["config"]', 'include_dirs = ["config2"]'),
    ],
    ids=["kernel define", "module define", "kernel include dir"],
)
def test_include_dirs_and_defines_are_in_the_cache_key(tmp_path, change):
    import shutil

    root = tmp_path / "p"
    shutil.copytree(LAUNCH_MATH, root)
    shutil.copytree(root / "config", root / "config2")
    (root / "config2" / "scale_config.h").write_text((root / "config" / "scale_config.h").read_text() + "// another header\n")
    source = root / "grid_stride.cu"

    def key() -> str:
        options = compile_options_for(load_manifest(root), source, BuildOptions.create("sm_80"))
        search = NvrtcCompiler().include_search(source, options) if find_nvrtc() else NvccCompiler().include_search(source, options)
        return object_key("nvrtc", "13", "ptx", [SM80], options, source, search)

    before = key()
    assert key() == before
    toml = root / "kitdispatch.toml"
    toml.write_text(change(toml.read_text()))
    assert key() != before


def test_conflicting_defines_of_one_source_and_missing_include_dirs_are_refused(tmp_path):
    import shutil

    root = tmp_path / "p"
    shutil.copytree(LAUNCH_MATH, root)
    toml = root / "kitdispatch.toml"
    text = toml.read_text()
    toml.write_text(text.replace('defines = ["SCALE=2.0f"]', 'defines = ["LN_EPS=1e-3f"]'))
    with pytest.raises(ManifestError, match=r"defines 'LN_EPS=1e-5f' and 'LN_EPS=1e-3f' disagree"):
        compile_options_for(load_manifest(root), root / "grid_stride.cu", BuildOptions.create("sm_80"))
    toml.write_text(text.replace('include_dirs = ["config"]', 'include_dirs = ["confgi"]'))
    out, err = io.StringIO(), io.StringIO()
    assert main(["build", str(root), "--arch", "sm_80", "-o", str(tmp_path / "out")], out, err) == 2
    assert f"include directory {root / 'confgi'} (for grid_stride.cu) is not a folder" in err.getvalue()
    assert "Traceback" not in err.getvalue() and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------- on a GPU


def _layernorm(inp, weight, bias):
    from importlib import util

    spec = util.spec_from_file_location("launch_math_reference", LAUNCH_MATH / "reference.py")
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.layernorm(inp, weight, bias)


@pytest.mark.gpu
def test_launch_math_passes_its_suite_on_the_gpu(launch_math_build):
    out, err = io.StringIO(), io.StringIO()
    assert main(["test", str(launch_math_build)], out, err) == 0, out.getvalue() + err.getvalue()
    assert "1 passed, 0 failed" in out.getvalue()  # scale_grid_stride; layernorm_forward below


@pytest.mark.gpu
@pytest.mark.parametrize("B, T, C", [(3, 41, 768), (2, 37, 2048), (1, 5, 2457)])
def test_layernorm_shared_memory_follows_c(launch_math_build, B, T, C):
    """(2 + 8) * C floats per block: C = 2048 needs 80 KiB, more than a constant written for
    GPT-2's C = 768 (30 KiB) or the 48 KiB a block gets without opting in."""
    module = kd.load_module(launch_math_build / "launch_math.vmfb")
    rng = np.random.default_rng(C)
    inp = rng.standard_normal((B, T, C), dtype=np.float32)
    weight, bias = rng.standard_normal(C, dtype=np.float32), rng.standard_normal(C, dtype=np.float32)
    got = [r.to_host() if hasattr(r, "to_host") else np.asarray(r) for r in module.layernorm_forward(inp, weight, bias)]
    for g, want in zip(got, _layernorm(inp, weight, bias)):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_a_call_needing_more_shared_memory_than_reserved_fails_clearly(launch_math_build):
    module = kd.load_module(launch_math_build / "launch_math.vmfb")
    C = 2458  # (2 + 8) * 2458 * 4 = 98320 bytes > 98304
    inp = np.zeros((1, 4, C), np.float32)
    with pytest.raises(KitError, match=r"kernel layernorm_forward: dynamic_shared_memory = \(2 \+ 8\) \* C \* sizeof\(float\)") as err:
        module.layernorm_forward(inp, np.ones(C, np.float32), np.zeros(C, np.float32))
    assert "98304" in str(err.value) and "dynamic_shared_memory_max" in str(err.value)


@pytest.mark.gpu
@pytest.mark.parametrize("n, blocks", [(1000, 4), (16384, 64), (100000, 64)])
def test_grid_stride_kernel_gets_min_of_its_count(launch_math_build, n, blocks):
    module = kd.load_module(launch_math_build / "launch_math.vmfb")
    x = np.random.default_rng(n).standard_normal(n, dtype=np.float32)
    y, got_blocks = (r.to_host() if hasattr(r, "to_host") else np.asarray(r) for r in module.scale_grid_stride(x))
    np.testing.assert_array_equal(y, x * np.float32(2.0))
    assert int(got_blocks[0]) == blocks


TILES_CU = r"""
extern "C" __global__ void tiles(const float* __restrict__ x, float* __restrict__ y, int n, int tile, int total) {
  extern __shared__ float buffer[];
  int i = blockIdx.x * tile + threadIdx.x;
  if (threadIdx.x < tile && i < n) { buffer[threadIdx.x] = x[i]; y[i] = buffer[threadIdx.x] + total; }
}
"""
TILES_TOML = """
name = "tiles"
[[kernels]]
name = "tiles"
source = "k.cu"
workgroup_size = [256]
workgroup_count = ["ceildiv(n, tile)"]
shapes = { x = "f32[n]", y = "f32[n]" }
values = { total = "ceildiv(n, tile) * tile" }
dynamic_shared_memory = "tile * sizeof(float)"
"""


@needs_iree_compile
@needs_nvrtc
def test_integer_scalar_arguments_in_counts_values_and_shared_memory(tmp_path):
    """`tile` is an argument of the function: the grid divides by it, `total` multiplies by it,
    the shared memory grows with it. The function checks tile != 0 and the need against the
    48 KiB default before the dispatch; the whole module compiles."""
    from conftest import write_kernel_project

    root = write_kernel_project(tmp_path / "src", TILES_CU, TILES_TOML)
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out")
    mlir = result.mlir.read_text()
    assert "func.func @tiles(%x: tensor<?xf32>, %tile: i32) -> (tensor<?xf32>)" in mlir
    assert "count(%device: !hal.device, %n: index, %tile: index)" in mlir
    assert "%count_x = arith.ceildivsi %n, %tile : index" in mlir
    body = mlir[mlir.index("func.func @tiles"):]
    body = body[: body.index("flow.dispatch")]
    assert "tiles: workgroup_count x 'ceildiv(n, tile)' divides by a value that is 0 in this call" in body
    assert "%total_index = arith.muli" in body and "workgroup_local_memory = 49152>" in mlir
    assert "kernel tiles: dynamic_shared_memory = tile * sizeof(float) bytes for this call's tile is more than the 49152 bytes" in body
    assert result.vmfb.is_file()
