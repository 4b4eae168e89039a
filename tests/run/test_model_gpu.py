"""On a CUDA GPU: a model build (tests/data/embedding with the library's row softmax, and IREE's
own baseline) called through load_module(DIR): host arrays, device arrays, torch tensors, out=,
prepared calls launched many times then waited for once, and compare's two whole-call timings.
Skipped where IREE's cuda driver finds no device; prebuilt as `embedding_model`
(tools/prebuild.py) for GPU machines without iree-compile."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import kitdispatch as kd
from kitdispatch.models.compare import compare_model
from kitdispatch.run.model import ModelEntry

from conftest import EMBEDDING, HAVE_IREE_COMPILE, REPO, make_embedding_model

pytestmark = pytest.mark.gpu
TOKENS, VOCAB, POSITIONS, HIDDEN = 8, 50, 12, 64


def _maker():
    spec = importlib.util.spec_from_file_location("make_embedding", EMBEDDING)
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    return maker


@pytest.fixture(scope="module")
def built(tmp_path_factory, prebuilt_dir):
    if prebuilt_dir is not None:
        return prebuilt_dir / "embedding_model"
    if not HAVE_IREE_COMPILE:
        pytest.skip("neither iree-compile nor KITDISPATCH_PREBUILT is available")
    tmp = tmp_path_factory.mktemp("embedding_gpu")
    make_embedding_model(tmp / "embed.onnx")
    return kd.build_model(REPO / "kernels" / "softmax", tmp / "embed.onnx", kd.BuildOptions.create("sm_90"), tmp / "out", with_baseline=True).out_dir


def inputs(seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, VOCAB, TOKENS), rng.integers(0, POSITIONS, TOKENS), rng.integers(0, 2, TOKENS))


def expected(args) -> np.ndarray:
    maker = _maker()
    return maker.reference(maker.make_model(), *args)


def test_the_model_and_its_baseline_agree_with_numpy(built):
    args = inputs(0)
    for baseline in (False, True):
        module = kd.load_module(built, baseline=baseline)
        assert isinstance(module.embed, ModelEntry) and module.embed.writes_into_outputs
        np.testing.assert_allclose(module.embed(*args), expected(args), rtol=1e-5, atol=1e-6)


def test_device_arrays_out_and_prepared_calls_on_the_gpu(built):
    module = kd.load_module(built)
    dev = module.device
    args = inputs(1)
    on_device = [dev.put(a) for a in args]
    got = module.embed(*on_device)
    assert isinstance(got, kd.DeviceArray)
    np.testing.assert_allclose(np.asarray(got), expected(args), rtol=1e-5, atol=1e-6)
    out = dev.empty((TOKENS, HIDDEN), np.float32)
    call = module.embed.prepare(*on_device, out=out)
    for _ in range(1000):  # queued without a wait; one at the end
        call.launch()
    dev.synchronize()
    np.testing.assert_allclose(out.to_host(), expected(args), rtol=1e-5, atol=1e-6)


def test_out_copies_run_after_their_call(built):
    """Each call's copy into a fresh out= array is queued after the call (which allocates the
    result in queue order): launched back to back, then one wait, every array holds its call's."""
    module = kd.load_module(built)
    dev = module.device
    calls = []
    for seed in range(20):
        args = inputs(10 + seed)
        out = dev.empty((TOKENS, HIDDEN), np.float32)
        module.embed.launch(*[dev.put(a) for a in args], out=out)
        calls.append((args, out))
    dev.synchronize()
    for args, out in calls:
        np.testing.assert_allclose(out.to_host(), expected(args), rtol=1e-5, atol=1e-6)


def test_a_failed_call_leaves_the_order_whole_on_the_gpu(built, monkeypatch):
    """A call IREE refuses passes its place on (Device.abandon: a fresh semaphore of the idle
    timeline device at its point), and a round of the ring of calls after it runs on the GPU."""
    from kitdispatch.run.device import RING

    module = kd.load_module(built)
    args = inputs(3)
    on_device = [module.device.put(a) for a in args]

    def fails(*a):
        raise ValueError("injected: INVALID_ARGUMENT")

    with monkeypatch.context() as patch:
        patch.setattr(module.embed, "_invoke", fails)
        with pytest.raises(kd.KitError, match="IREE refused the call: injected"):
            module.embed(*on_device)
    results = [module.embed(*on_device) for _ in range(RING + 1)]
    for got in results:
        np.testing.assert_allclose(np.asarray(got), expected(args), rtol=1e-5, atol=1e-6)


def test_torch_tensors_in_and_out(built):
    torch = pytest.importorskip("torch")
    module = kd.load_module(built)
    args = inputs(2)
    tensors = [torch.from_numpy(a).cuda() for a in args]
    got = module.embed(*tensors)  # IREE's own allocation: read back, but not exported to torch
    np.testing.assert_allclose(np.asarray(got), expected(args), rtol=1e-5, atol=1e-6)
    with pytest.raises(BufferError, match="pass out="):  # measured on an H100: cuda_allocator.c refuses the export
        torch.from_dlpack(got)
    out = torch.empty((TOKENS, HIDDEN), device="cuda")
    assert module.embed(*tensors, out=out) is out
    np.testing.assert_allclose(out.cpu().numpy(), expected(args), rtol=1e-5, atol=1e-6)


def test_compare_reports_the_whole_call_both_ways(built):
    """compare times the whole call as IREE alone calls it and through the kit's prepared call,
    for both modules (which is faster is a benchmark's figure, not a test's: benchmarks/hf_models.py)."""
    result = compare_model(built)
    assert result.agree, result.worst
    assert result.call_tool == "iree-benchmark-module"
    assert set(result.prepared_us) == set(result.call_us) == {"replaced", "baseline"}
    assert all(t > 0 for t in (*result.prepared_us.values(), *result.call_us.values()))
    assert any("indexes a gather of size 50" in n for n in result.notes)
