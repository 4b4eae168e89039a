"""run/model.py: a model build loaded with `load_module(DIR)` and called like a kernel module,
on the CPU: host and device arrays in, `out=`, prepared calls, the baseline, and the errors.

The folders are what build_model writes (a .vmfb, a baseline, the model record), compiled by
IREE alone for its local-task device (conftest.cpu_model_build) from a real ONNX model through
the real iree-import-onnx and iree-compile: the calls go through the model's `f$async` exactly
as on the GPU."""

from __future__ import annotations

import numpy as np
import pytest

import kitdispatch as kd
from kitdispatch import KitError, UsageError
from kitdispatch.run.model import ModelEntry

from conftest import CPU_DEVICE as DEVICE, EMBEDDING, LINALG_MODEL, cpu_model_build, make_embedding_model, needs_iree_compile

TOKENS, VOCAB, POSITIONS, HIDDEN = 8, 50, 12, 64


@pytest.fixture(scope="module")
def embedding(tmp_path_factory):
    """(model folder, the ONNX model) of tests/data/embedding, built for the CPU."""
    onnx = pytest.importorskip("onnx")
    tmp = tmp_path_factory.mktemp("embedding")
    make_embedding_model(tmp / "embed.onnx")
    return cpu_model_build(tmp / "embed.onnx", tmp / "out"), onnx.load(tmp / "embed.onnx")


@pytest.fixture(scope="module")
def model(embedding):
    return kd.load_module(embedding[0], device=DEVICE)


def inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, VOCAB, TOKENS).astype(np.int64), rng.integers(0, POSITIONS, TOKENS).astype(np.int64),
            rng.integers(0, 2, TOKENS).astype(np.int64))


def expected(embedding, args) -> np.ndarray:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_embedding", EMBEDDING)
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    return maker.reference(embedding[1], *args)


@needs_iree_compile
def test_a_model_folder_loads_with_its_functions_and_host_arrays_give_host_arrays(embedding, model):
    assert model.function_names == ("embed",)
    assert isinstance(model.embed, ModelEntry) and model.embed.writes_into_outputs  # embed$async is there
    args = inputs()
    got = model.embed(*args)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, expected(embedding, args), rtol=1e-5, atol=1e-6)


@needs_iree_compile
def test_device_arrays_in_give_device_arrays_out_and_out_receives_a_copy(embedding, model):
    dev = model.device
    args = inputs(1)
    on_device = [dev.put(a) for a in args]
    got = model.embed(*on_device)
    assert isinstance(got, kd.DeviceArray) and got.shape == (TOKENS, HIDDEN) and got.dtype == np.float32
    want = expected(embedding, args)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    out = dev.empty((TOKENS, HIDDEN), np.float32)
    assert model.embed(*on_device, out=out) is out
    np.testing.assert_allclose(out.to_host(), want, rtol=1e-5, atol=1e-6)
    launched = [model.embed.launch(*on_device) for _ in range(3)]  # each call its own result arrays
    assert len({id(a.buffer_view) for a in launched}) == 3
    for a in launched:
        np.testing.assert_allclose(np.asarray(a), want, rtol=1e-5, atol=1e-6)


@needs_iree_compile
def test_prepared_calls_run_again_on_the_arrays_they_were_given(embedding, model):
    dev = model.device
    args = inputs(2)
    on_device = [dev.put(a) for a in args]
    out = dev.empty((TOKENS, HIDDEN), np.float32)
    into = model.embed.prepare(*on_device, out=out)
    for _ in range(5):
        assert into.launch() is out
    dev.synchronize()
    want = expected(embedding, args)
    np.testing.assert_allclose(out.to_host(), want, rtol=1e-5, atol=1e-6)
    fresh = model.embed.prepare(*on_device)
    first, second = fresh(), fresh()
    assert first is not second  # IREE allocates each call's results
    np.testing.assert_allclose(np.asarray(second), want, rtol=1e-5, atol=1e-6)
    assert fresh.results is second


@needs_iree_compile
def test_the_record_the_vmfb_and_the_baseline_load_the_same_model(embedding):
    folder = embedding[0]
    args = inputs(3)
    want = expected(embedding, args)
    for target, options in ((folder / "model.model.json", {}), (folder / "model.vmfb", {}), (folder, {"baseline": True}),
                            (folder / "model.baseline.vmfb", {})):
        module = kd.load_module(target, device=DEVICE, **options)
        assert isinstance(module.embed, ModelEntry), target
        np.testing.assert_allclose(module.embed(*args), want, rtol=1e-5, atol=1e-6)
    assert kd.load_module(folder, device=DEVICE, baseline=True).path.name == "model.baseline.vmfb"


@needs_iree_compile
def test_calls_the_model_cannot_take_are_refused_with_what_it_takes(model):
    ids, positions, mask = inputs()
    with pytest.raises(KitError, match=r"embed takes 3 arguments \(i64\[8\], i64\[8\], i64\[8\]\), got 2"):
        model.embed(ids, positions)
    with pytest.raises(KitError, match=r"embed argument 2 \(i64\[8\]\): got dtype int32"):
        model.embed(ids, positions, mask.astype(np.int32))
    dev = model.device
    with pytest.raises(KitError, match=r"result 0 \(f32\[8,64\]\) out=: got shape \(8, 63\)"):
        model.embed(dev.put(ids), dev.put(positions), dev.put(mask), out=dev.empty((TOKENS, HIDDEN - 1), np.float32))
    with pytest.raises(KitError, match="out= takes device arrays"):
        model.embed(ids, positions, mask, out=np.zeros((TOKENS, HIDDEN), np.float32))
    with pytest.raises(KitError, match="has no function 'nope'"):
        model.nope(ids)


@needs_iree_compile
def test_baseline_needs_a_model_folder_built_with_one(tmp_path):
    make_embedding_model(tmp_path / "embed.onnx")
    alone = cpu_model_build(tmp_path / "embed.onnx", tmp_path / "out", baseline=False)
    with pytest.raises(UsageError, match="has no baseline module"):
        kd.load_module(alone, device=DEVICE, baseline=True)
    with pytest.raises(UsageError, match="is not a model build folder, so it has no baseline"):
        kd.load_module(tmp_path / "embed.onnx", device=DEVICE, baseline=True)


@needs_iree_compile
def test_a_model_without_async_functions_runs_through_the_synchronous_call(tmp_path):
    """An MLIR model's func.func gets only IREE's synchronous `forward`: calls work, out= and
    prepare say why they cannot."""
    model = tmp_path / "linalg.mlir"
    model.write_text(LINALG_MODEL)
    module = kd.load_module(cpu_model_build(model, tmp_path / "out", baseline=False), device=DEVICE)
    x = np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((256, 1000)).astype(np.float32) / 16
    first, second = module.forward(x, w)
    e = np.exp((x @ w) - (x @ w).max(axis=1, keepdims=True))
    np.testing.assert_allclose(first, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-6)
    assert second.shape == (1000, 512)
    assert not module.forward.writes_into_outputs
    dev = module.device
    with pytest.raises(KitError, match=r"has no forward\$async form .* so it cannot write into out="):
        module.forward(dev.put(x), dev.put(w), out=(dev.empty((512, 1000), np.float32), dev.empty((1000, 512), np.float32)))
    with pytest.raises(KitError, match="so it cannot be prepared"):
        module.forward.prepare(dev.put(x), dev.put(w))


@needs_iree_compile
def test_out_copies_go_through_the_queue_and_a_part_of_a_larger_buffer_through_a_recorded_copy(embedding, model):
    """IREE's result buffers hold the result alone here, so out= is a queue-ordered copy; a
    result inside a larger buffer is copied by its bytes (the path kept for that case)."""
    dev = model.device
    args = [dev.put(a) for a in inputs(4)]
    result = model.embed(*args)
    assert result.buffer_view.get_buffer().byte_length() == result.buffer_view.byte_length
    target = dev.empty(result.shape, result.dtype)
    dev.wait_for(model.embed._copy_part(result, target))
    np.testing.assert_array_equal(target.to_host(), result.to_host())


@needs_iree_compile
def test_a_dynamic_number_of_tokens_gives_results_of_the_size_each_call_has(embedding, tmp_path):
    """Dynamic sizes are checked only against themselves; the results have the shapes IREE
    returns, and out= must match them."""
    make_embedding_model(tmp_path / "dyn.onnx", "--dynamic")
    module = kd.load_module(cpu_model_build(tmp_path / "dyn.onnx", tmp_path / "out", baseline=False), device=DEVICE)
    assert str(module.embed.signature.args[0]) == "i64[input0_d0]"
    dev = module.device
    for tokens in (3, 11):
        ids, positions, mask = _some(tokens)
        got = module.embed(*(dev.put(a) for a in (ids, positions, mask)))
        assert got.shape == (tokens, HIDDEN)
        np.testing.assert_allclose(got.to_host(), expected(embedding, (ids, positions, mask)), rtol=1e-5, atol=1e-6)
    with pytest.raises(KitError, match="result 0 is"):
        module.embed(*(dev.put(a) for a in inputs()), out=dev.empty((TOKENS + 1, HIDDEN), np.float32))


def _some(tokens: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(tokens)
    return (rng.integers(0, VOCAB, tokens), rng.integers(0, POSITIONS, tokens), rng.integers(0, 2, tokens))


def f64_output_model_build(tmp_path) -> object:
    """An ONNX model of an f32 input and an f64 output, built for the CPU (IREE demotes f64 to
    f32 inside: the export says `tensor<4xf64> as tensor<4xf32>`)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Cast", ["sq"], ["z"], to=TensorProto.DOUBLE)]
    graph = helper.make_graph(nodes, "f64out", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("z", TensorProto.DOUBLE, [4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "f64out.onnx")
    return cpu_model_build(tmp_path / "f64out.onnx", tmp_path / "out")


@needs_iree_compile
def test_an_iree_error_of_any_status_fails_the_call_alone(tmp_path, embedding, monkeypatch):
    """IREE raises IndexError for OUT_OF_RANGE (ValueError, RuntimeError for other codes): each
    is the call's KitError, and the call gives its place in the order on, so later calls on the
    device run. An f64 output IREE 3.13 demotes to f32 storage fails in IREE after the
    function's barrier signalled the call's fence, making the result's buffer view; it once escaped as an IndexError traceback and left every later call on the device
    failing. A failure before the call's work is queued (injected) has its fence signalled by
    the kit."""
    folder = f64_output_model_build(tmp_path)
    model, other = kd.load_module(folder, device=DEVICE), kd.load_module(embedding[0], device=DEVICE)
    args = inputs()
    before = other.embed(*args)
    with pytest.raises(KitError, match="IREE refused the call: .*OUT_OF_RANGE"):
        model.f64out(np.ones(4, np.float32))
    np.testing.assert_array_equal(other.embed(*args), before)

    def fails(*a):
        raise IndexError("injected: OUT_OF_RANGE")

    with monkeypatch.context() as patch:
        patch.setattr(other.embed, "_invoke", fails)  # a ModelEntry is the model's Function
        with pytest.raises(KitError, match="IREE refused the call: injected"):
            other.embed(*args)
    np.testing.assert_array_equal(other.embed(*args), before)


@needs_iree_compile
def test_a_failed_call_whose_work_runs_late_leaves_the_order_whole(tmp_path, embedding):
    """The f64 call's work is queued before IREE fails the call, and here it runs only after
    the failure is reported (the call before it waits on a gate opened later, as on a busy
    machine): the kit once signalled the call's point itself too, and the second signal failed
    that semaphore of the device's ring: every call that came to it later failed."""
    import threading

    import iree.runtime as rt

    from kitdispatch.run.device import RING

    folder = f64_output_model_build(tmp_path)
    model, other = kd.load_module(folder, device=DEVICE), kd.load_module(embedding[0], device=DEVICE)
    device, args = model.device, inputs()
    before = other.embed(*args)
    gate = device.hal.create_semaphore(0)
    empty = rt.HalCommandBuffer(device.hal)
    empty.end()
    device._queue(lambda commands, wait, done: device.hal.queue_execute(commands, rt.HalFence.create_at(gate, 1), done), empty)
    threading.Timer(0.3, gate.signal, (1,)).start()
    with pytest.raises(KitError, match="IREE refused the call: .*OUT_OF_RANGE"):
        model.f64out(np.ones(4, np.float32))
    for _ in range(RING + 1):  # round the ring, past the failed call's semaphore
        np.testing.assert_array_equal(other.embed(*args), before)


def test_a_function_with_an_element_type_the_kit_cannot_pass_says_so():
    from kitdispatch.describe.model_record import ModelFunction, ModelTensor
    from kitdispatch.run.model import model_signature

    assert model_signature(ModelFunction("f", (ModelTensor("i64", (2,)), ModelTensor("i4", (2,))), ())) == (
        "its input 1 is 2xi4, an element type kitdispatch cannot pass"
    )
    signature = model_signature(ModelFunction("f", (ModelTensor("f16", (None, 8)),), (ModelTensor("i1", (None,)),)))
    assert [str(t) for t in (*signature.args, *signature.results)] == ["f16[input0_d0,8]", "bool[output0_d0]"]


@needs_iree_compile
def test_a_model_with_externalized_weights_loads_with_its_parameter_file(embedding, tmp_path):
    """iree-import-onnx --externalize-params: the module reads its weights from IREE's
    io_parameters module, served from the .irpa given (scope "model", the importer's default)."""
    import subprocess
    import sys

    make_embedding_model(tmp_path / "embed.onnx")
    mlir, irpa = tmp_path / "embed.mlir", tmp_path / "weights.irpa"
    subprocess.run([sys.executable, "-m", "iree.compiler.tools.import_onnx", str(tmp_path / "embed.onnx"), "--externalize-params",
                    "--num-elements-threshold", "32", "--save-params-to", str(irpa), "-o", str(mlir)], check=True, timeout=300)
    assert "#stream.parameter.named<\"model\"::\"tokens_table\">" in mlir.read_text()
    folder = cpu_model_build(mlir, tmp_path / "out")
    with pytest.raises(UsageError, match="reads its weights from a parameter file"):
        kd.load_module(folder, device=DEVICE)
    with pytest.raises(UsageError, match="no parameter file at"):
        kd.load_module(folder, device=DEVICE, parameters=tmp_path / "missing.irpa")
    args = inputs(6)
    module = kd.load_module(folder, device=DEVICE, parameters=irpa)
    np.testing.assert_allclose(module.embed(*args), expected(embedding, args), rtol=1e-5, atol=1e-6)
    from kitdispatch.models.compare import compare_model

    result = compare_model(folder, device=DEVICE, parameters=irpa, repetitions=2)
    assert result.agree and set(result.prepared_us) == {"replaced", "baseline"}
