"""Results never alias: every `out` pointer gets a buffer of its own, whatever the parameter
order and shapes. IREE's flow stage folds identical `tensor.empty`s, so two same-shape `out`
buffers before an input once shared one buffer (llm.c's layernorm: mean and rstd both held
rstd). Checked in the IR real iree-compile makes after flow and after stream; on a GPU, each
result against numpy."""

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kitdispatch as kd
from kitdispatch.compile.archs import Arch
from kitdispatch.iree.tools import choose_codegen_target, find_iree_compile, iree_flags, target_release
from kitdispatch.emit.render import ExecutableObjects, VariantObject, render_module

from conftest import DATA, HAVE_IREE_COMPILE, needs_iree_compile, prebuilt_or_build

DISTINCT = DATA / "distinct_results"


def compile_to(mlir: Path, stage: str) -> str:
    """The module after IREE's `stage` (flow, stream), as iree-compile prints it."""
    codegen = choose_codegen_target([Arch.parse("sm_80")]).target
    argv = [find_iree_compile(), str(mlir), *iree_flags(codegen), f"--iree-hal-executable-object-search-path={mlir.parent}", f"--compile-to={stage}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def function_bodies(ir: str) -> dict[str, str]:
    """Each public function's text, by name (the stub IREE wraps around each one)."""
    bodies = {}
    for m in re.finditer(r"^  (?:util\.func|func\.func) public @(\S+?)\(.*?^  }$", ir, re.M | re.S):
        bodies[m.group(1)] = m.group(0)
    return bodies


def tied_results(flow_ir: str) -> list[list[str]]:
    """The values each `flow.dispatch` ties its results to, dispatch by dispatch."""
    out = []
    for results in re.findall(r"flow\.dispatch @.*-> \((.*)\)$", flow_ir, re.M):
        out.append([r for r in re.sub(r"\{[^}]*\}", "", results).split(", ") if r.startswith("%")])
    return out


def stream_bindings(stream_ir: str) -> list[list[tuple[str, str, str]]]:
    """(access, resource, offset) of each binding of each `stream.cmd.dispatch`."""
    blocks = re.findall(r"stream\.cmd\.dispatch [^{]*\{\n(.*?)\n\s*\}", stream_ir, re.S)
    return [re.findall(r"(ro|rw|wo) (%\w+)\[(%\w+) for", block) for block in blocks]


def assert_written_ranges_distinct(stream_ir: str, writes_per_dispatch: int) -> None:
    dispatches = stream_bindings(stream_ir)
    assert dispatches
    for bindings in dispatches:
        written = [(r, o) for access, r, o in bindings if access != "ro"]
        assert len(written) == writes_per_dispatch, bindings
        assert len(set(written)) == len(written), f"results share a buffer range: {bindings}"
        assert not set(written) & {(r, o) for access, r, o in bindings if access == "ro"}, bindings


@needs_iree_compile
def test_same_shape_results_before_inputs_are_distinct_after_flow_and_stream(tmp_path):
    result = kd.generate(DISTINCT, kd.BuildOptions.create("sm_80"), tmp_path / "out")
    flow = compile_to(result.mlir, "flow")
    ties = tied_results(flow)
    assert ties and all(len(t) == 3 for t in ties), ties  # layernorm: out, mean, rstd; three_of_one
    for values in ties:
        assert len(set(values)) == len(values), f"results tied to one value: {values}"
    stream = compile_to(result.mlir, "stream")
    bodies = function_bodies(stream)
    for name in ("layernorm", "three_of_one", "layernorm$async", "three_of_one$async"):
        assert_written_ranges_distinct(bodies[name], 3)
    # No cost: the allocating functions dispatch straight into their result buffer, no copy.
    for name in ("layernorm", "three_of_one"):
        assert "stream.cmd.copy" not in bodies[name] and "stream.cmd.fill" not in bodies[name]
    assert result.mlir.read_text().count("flow.tensor.alloca") == 2 * 6  # NAME and NAME$async, 3 + 3 each


# A kernel's pointers in any order: three `out` buffers of one shape, an `inout`, two inputs;
# shapes all dynamic or all static.
PARAMS = ("a", "b", "c", "io", "x", "y")
ACCESS = {"a": "out", "b": "out", "c": "out", "io": "inout", "x": "in", "y": "in"}


def _kernel(order: tuple[str, ...], static: bool, with_inout: bool) -> kd.Kernel:
    shape = (64,) if static else ("n",)
    names = [p for p in order if with_inout or p != "io"]
    params = [kd.Buffer(p, ACCESS[p], kd.TensorType("f32", shape)) for p in names]
    if not static:
        params.append(kd.Scalar("n", "i32"))
    return kd.Kernel.create("k", "k.cu", params, workgroup_size=[64], workgroup_count=["ceildiv(n, 64)" if not static else 1])


@pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(order=st.permutations(PARAMS), static=st.booleans(), with_inout=st.booleans())
def test_every_result_has_its_own_buffer_in_any_parameter_order(tmp_path, order, static, with_inout):
    kernel = _kernel(tuple(order), static, with_inout)
    spec = kd.ModuleSpec.create("orders", [kernel], root=tmp_path)
    # IREE reads the object only when it serializes the executable, after stream.
    objects = [ExecutableObjects(kernel.source, "ptx", (VariantObject(Arch.parse("sm_80"), "ptx", "k.sm_80.ptx"),))]
    mlir = tmp_path / f"orders-{'-'.join(order)}-{static}-{with_inout}.mlir"
    mlir.write_text(render_module(spec, objects, spelling=target_release().spelling).text)
    stream = compile_to(mlir, "stream")
    results = 3 + with_inout
    bodies = function_bodies(stream)
    for name in ("k", "k$async"):
        assert_written_ranges_distinct(bodies[name], results)
        # Bindings follow the C order: read-only exactly where the kernel has an input.
        for bindings in stream_bindings(bodies[name]):
            c_order = [p for p in order if with_inout or p != "io"]
            assert [access == "ro" for access, _, _ in bindings] == [ACCESS[p] == "in" for p in c_order]


SOFTMAX_OUT_FIRST = """extern "C" __global__ void softmax_out_first(float* out, const float* x, int rows, int cols) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float m = -1e30f, s = 0.0f;
  for (int c = 0; c < cols; ++c) m = fmaxf(m, x[r * cols + c]);
  for (int c = 0; c < cols; ++c) s += __expf(x[r * cols + c] - m);
  for (int c = 0; c < cols; ++c) out[r * cols + c] = __expf(x[r * cols + c] - m) / s;
}
"""
SOFTMAX_MODEL = """func.func @forward(%x: tensor<64x100xf32>) -> tensor<64x100xf32> {
  %e = tensor.empty() : tensor<64x100xf32>
  %sm = linalg.softmax dimension(1) ins(%x : tensor<64x100xf32>) outs(%e : tensor<64x100xf32>) -> tensor<64x100xf32>
  return %sm : tensor<64x100xf32>
}
"""


@needs_iree_compile
def test_a_model_takes_a_kernel_whose_result_precedes_its_input(tmp_path):
    # The spec's wrapper is the kernel function's body: its result is an alloca of its own there too.
    from kitdispatch.models.pipeline import build_model

    root = tmp_path / "project"
    root.mkdir()
    (root / "sm.cu").write_text(SOFTMAX_OUT_FIRST)
    (root / "kitdispatch.toml").write_text(
        'name = "smf"\n[[kernels]]\nname = "softmax_out_first"\nsource = "sm.cu"\nworkgroup_size = [64]\n'
        'workgroup_count = ["ceildiv(rows, 64)"]\nshapes = { out = "f32[rows,cols]", x = "f32[rows,cols]" }\n'
        'replaces = ["linalg.softmax"]\n'
    )
    model = tmp_path / "model.mlir"
    model.write_text(SOFTMAX_MODEL)
    result = build_model(root, model, kd.BuildOptions.create("sm_80"), tmp_path / "out")
    spec = (tmp_path / "out" / "model.spec.mlir").read_text()
    assert "flow.tensor.alloca" in spec and "tensor.empty" not in spec
    assert result.vmfb.exists()
    import json

    [replaced] = json.loads(result.report.read_text())["replaced"]
    assert replaced["kernel"] == "softmax_out_first"


# ------------------------------------------------------------------------------ on a GPU


@pytest.fixture(scope="module")
def distinct_build(tmp_path_factory, prebuilt_dir):
    return prebuilt_or_build(DISTINCT, tmp_path_factory, prebuilt_dir)


def _layernorm(inp, weight, bias):
    x = inp.astype(np.float64)
    mean = x.mean(axis=1)
    rstd = 1.0 / np.sqrt(x.var(axis=1) + 1e-5)
    return (x - mean[:, None]) * rstd[:, None] * weight + bias, mean, rstd


@pytest.mark.gpu
def test_each_result_holds_its_own_values_on_the_gpu(distinct_build):
    module = kd.load_module(distinct_build / "distinct_results.vmfb")
    rng = np.random.default_rng(21)
    inp = rng.standard_normal((300, 77), dtype=np.float32) * 3 + 2
    weight, bias = rng.standard_normal(77, dtype=np.float32), rng.standard_normal(77, dtype=np.float32)
    want = _layernorm(inp, weight, bias)
    got = module.layernorm(inp, weight, bias)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # Through NAME$async into given device arrays, and through the recorded call.
    device = module.device
    outs = (device.empty((300, 77), np.float32), device.empty((300,), np.float32), device.empty((300,), np.float32))
    args = (device.put(inp), device.put(weight), device.put(bias))
    for _ in range(3):  # the second call on the same arrays on runs NAME$record's command buffer
        module.layernorm.launch(*args, out=outs)
        for g, w in zip(outs, want):
            np.testing.assert_allclose(g.to_host(), w, rtol=1e-5, atol=1e-6)
    x = rng.standard_normal(64, dtype=np.float32)
    plus, times, minus = module.three_of_one(x)
    np.testing.assert_allclose(plus, x + 1)
    np.testing.assert_allclose(times, x * 2)
    np.testing.assert_allclose(minus, x - 3)


@pytest.mark.gpu
def test_distinct_results_suite_passes(distinct_build):
    import io

    from kitdispatch.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = main(["test", str(distinct_build)], out, err)
    assert code == 0, out.getvalue() + err.getvalue()
    assert "2 passed, 0 failed, 0 skipped" in out.getvalue()
