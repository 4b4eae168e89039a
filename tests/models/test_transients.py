"""models/transients.py: each model function's NAME$async_transients twin (transient memory from
a buffer the caller passes, so that a call never blocks the host), made by build_model and
taken by the run side (run/model.py) where IREE sized its storage as a constant."""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest
from conftest import CPU_DEVICE, CPU_FLAGS, HAVE_IREE_COMPILE, REPO, cpu_model_build, make_embedding_model, make_sample_model

needs_iree = pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")

ASYNC = """  util.func public @f$async(%arg0: !hal.buffer_view, %arg1: !hal.fence, %arg2: !hal.fence) -> !hal.buffer_view attributes {inlining_policy = #util.inline.never, iree.abi.model = "coarse-fences", iree.abi.stub} {
    %0 = hal.tensor.import wait(%arg1) => %arg0 : !hal.buffer_view -> tensor<4x8xf32>
    %1 = arith.addf %0, %0 : tensor<4x8xf32>
    %2 = hal.tensor.barrier join(%1 : tensor<4x8xf32>) => %arg2 : !hal.fence
    %3 = hal.tensor.export %2 : tensor<4x8xf32> -> !hal.buffer_view
    util.return %3 : !hal.buffer_view
  }"""


def module_of(*functions: str) -> str:
    return "module {\n" + "\n".join(functions) + "\n}\n"


def test_a_coarse_fences_function_gets_a_twin_taking_storage_before_its_fences():
    from kitdispatch.models.transients import add_twins

    twins = add_twins(module_of(ASYNC))
    assert twins.names == ("f",) and twins.reasons == {}
    assert "util.func public @f$async(%arg0: !hal.buffer_view, %arg1: !hal.fence, %arg2: !hal.fence)" in twins.text  # as it was
    header = "util.func public @f$async_transients(%arg0: !hal.buffer_view, %kit_transients: !hal.buffer, %arg1: !hal.fence, %arg2: !hal.fence)"
    assert header in twins.text
    assert "%kit_transients_0 = hal.tensor.transients %1 : tensor<4x8xf32> from %kit_transients : !hal.buffer" in twins.text
    assert "hal.tensor.barrier join(%kit_transients_0 : tensor<4x8xf32>) => %arg2" in twins.text
    assert twins.text.count("hal.tensor.barrier join(%1 ") == 1  # the original's barrier unchanged


@pytest.mark.parametrize(
    "edit, reason",
    [
        (lambda t: t.replace("tensor<4x8xf32>", "tensor<?x8xf32>"), "dynamic shapes"),
        (lambda t: t.replace("    %2 = hal.tensor.barrier join(%1 : tensor<4x8xf32>) => %arg2 : !hal.fence\n", "").replace("export %2", "export %1"),
         "0 hal.tensor.barrier ops"),
        (lambda t: t.replace("=> %arg2 : !hal.fence\n", "=> %arg1 : !hal.fence\n"), "not the one that signals the function's fence"),
        (lambda t: t.replace("%1 = arith.addf", "%kit_transients = arith.addf").replace("join(%1", "join(%kit_transients"), "already uses"),
    ],
    ids=["dynamic", "no-barrier", "barrier-of-another-fence", "name-taken"],
)
def test_a_function_a_twin_cannot_serve_keeps_its_async_alone_with_the_reason(edit, reason):
    from kitdispatch.models.transients import add_twins

    text = module_of(edit(ASYNC))
    twins = add_twins(text)
    assert twins.names == () and reason in twins.reasons["f"], twins.reasons
    assert twins.text == text


def test_a_quoted_name_gets_a_quoted_twin():
    """An ONNX graph named "rms-norm v2" is @"rms-norm v2$async" in IREE's IR."""
    from kitdispatch.models.transients import add_twins

    twins = add_twins(module_of(ASYNC.replace("@f$async(", '@"rms-norm v2$async"(')))
    assert twins.names == ("rms-norm v2",) and '@"rms-norm v2$async_transients"(%arg0: !hal.buffer_view, %kit_transients' in twins.text


def test_a_coarse_fences_function_the_kit_cannot_read_says_so():
    from kitdispatch.models.transients import add_twins

    odd = ASYNC.replace("@f$async(", "@f(")  # coarse fences, without IREE's $async name
    twins = add_twins(module_of(odd))
    assert twins.names == () and twins.reasons == {"f": "its first line is not in the form the kit reads"}


def test_functions_of_another_abi_are_left_alone():
    from kitdispatch.models.transients import add_twins

    sync = ASYNC.replace('iree.abi.model = "coarse-fences", ', "")
    twins = add_twins(module_of(sync))
    assert twins.names == () and twins.reasons == {} and twins.text == module_of(sync)


# ------------------------------------------------------------------- with the real tools


@needs_iree
def test_the_twin_compiles_without_a_dealloca_and_the_async_keeps_its_own(tmp_path):
    """What the twin is for: compiled (here for IREE's CPU device), NAME$async frees its
    transients with a queue dealloca (which IREE's CUDA HAL waits for on the host) and the twin
    has none; the twin's storage size is a constant in its reflection."""
    from kitdispatch.iree.tools import find_tool
    from kitdispatch.models.pipeline import STAGE, import_model
    from kitdispatch.models.transients import FLAGS, add_twins

    make_embedding_model(tmp_path / "m.onnx")
    imported = import_model(tmp_path / "m.onnx", tmp_path / "m.mlir")
    stage = tmp_path / "stage.mlir"
    compile_ = [find_tool("iree-compile"), *CPU_FLAGS]
    subprocess.run([*compile_, str(imported), f"--compile-to={STAGE}", "-o", str(stage)], check=True, timeout=300)
    twins = add_twins(stage.read_text())
    assert twins.names == ("embed",), twins.reasons
    (tmp_path / "twins.mlir").write_text(twins.text)
    vm = tmp_path / "vm.mlir"
    subprocess.run([*compile_, *FLAGS, str(tmp_path / "twins.mlir"), f"--compile-from={STAGE}", "--compile-to=vm", "-o", str(vm)],
                   check=True, timeout=300)
    text = vm.read_text()

    def body(name: str) -> str:
        start = text.index(f"vm.func private @{name}(")
        return text[start:text.index("vm.return", start)]

    assert "hal.device.queue.dealloca" in body("embed$async")
    assert "hal.device.queue.dealloca" not in body("embed$async_transients")
    assert re.search(r"vm.export @embed\$async_transients attributes \{.*iree.abi.transients.size.constant = \d+ : index", text)


@pytest.fixture(scope="module")
def embedding_build(tmp_path_factory):
    pytest.importorskip("onnx")
    tmp = tmp_path_factory.mktemp("transients")
    make_embedding_model(tmp / "embed.onnx")
    return cpu_model_build(tmp / "embed.onnx", tmp / "out"), tmp


def _args(seed: int):
    """The embedding model's token ids, position ids and mask (tests/data/embedding: 8 of each,
    within its vocabulary of 50 and 12 positions)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 50, 8, dtype=np.int64), rng.integers(0, 12, 8, dtype=np.int64), rng.integers(0, 2, 8, dtype=np.int64)


@needs_iree
def test_off_cuda_calls_run_iree_s_async_and_agree_with_the_baseline(embedding_build):
    """On IREE's CPU device calls may overlap as far as their fences allow, and IREE may write a
    twin's storage (a copy into it that waits on nothing) while the call before still reads it:
    the twin serves on CUDA only. The module has it, and its calls run NAME$async."""
    import iree.runtime as rt

    import kitdispatch as kd

    folder, _ = embedding_build
    assert rt.VmModule.mmap(rt.VmInstance(), str(folder / "model.vmfb")).lookup_function("embed$async_transients") is not None
    model = kd.load_module(folder, device=CPU_DEVICE)
    base = kd.load_module(folder, device=CPU_DEVICE, baseline=True)
    assert not model.function("embed").takes_transients and not base.function("embed").takes_transients
    for seed in range(2):
        args = _args(seed)
        np.testing.assert_array_equal(np.asarray(model.embed(*args)), np.asarray(base.embed(*args)))


@pytest.mark.gpu
def test_on_cuda_calls_pass_one_storage_and_agree_with_the_baseline(request, prebuilt_dir, tmp_path):
    """On CUDA the kit's build calls the twin, passing one buffer it allocated once; launches
    queued back to back without a wait (each on other inputs) give what the same module's
    NAME$async gives through IREE's own synchronous call, bit for bit, and agree with the
    baseline (IREE alone) within f32 rounding."""
    import kitdispatch as kd

    if prebuilt_dir is not None:
        folder = prebuilt_dir / "embedding_model"
        if not folder.is_dir():
            pytest.skip(f"{folder} was not prebuilt")
    else:
        pytest.importorskip("onnx")
        if not HAVE_IREE_COMPILE:
            pytest.skip("iree-compile is not installed")
        from kitdispatch import BuildOptions
        from kitdispatch.models.pipeline import build_model

        make_embedding_model(tmp_path / "embed.onnx")
        folder = build_model(REPO / "kernels" / "softmax", tmp_path / "embed.onnx", BuildOptions.create("sm_90"), tmp_path / "out",
                             with_baseline=True).out_dir
    model = kd.load_module(folder)
    base = kd.load_module(folder, baseline=True)
    entry = model.function("embed")
    assert entry.takes_transients and not base.function("embed").takes_transients
    dev = model.device
    seeds = range(6)
    prepared = [entry.prepare(*[dev.put(a) for a in _args(seed)]) for seed in seeds]
    launched = [p.launch() for p in prepared]  # no wait between them
    storage = entry._transients
    iree_call = model.raw("embed")
    for seed, result in zip(seeds, launched):
        got = np.asarray(result)
        np.testing.assert_array_equal(got, np.asarray(iree_call(*_args(seed))))
        np.testing.assert_allclose(got, np.asarray(base.embed(*_args(seed))), rtol=1e-5, atol=1e-7)
    assert storage is not None and entry._transients is storage


def test_a_twin_whose_storage_iree_sizes_at_run_time_is_not_recorded(tmp_path):
    """A dynamic input (x [n, 64]) with a static result: the twin compiles, but IREE sizes its
    storage at run time (no constant in its reflection), so the record says no twin."""
    pytest.importorskip("onnx")
    if not HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    from onnx import TensorProto, helper

    from kitdispatch.describe.model_record import model_record_name, read_model_record
    from kitdispatch.models.transients import constant_sizes
    from models.epilogue_models import save_model

    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Transpose", ["e"], ["et"], perm=[1, 0]),
             helper.make_node("MatMul", ["et", "e"], ["y"])]
    save_model(tmp_path / "dyn.onnx", "dyn", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [], opset=18)
    folder = cpu_model_build(tmp_path / "dyn.onnx", tmp_path / "out", baseline=False)
    assert constant_sizes(folder / "model.vmfb", ["dyn"]) == {"dyn": None}
    _, record = read_model_record(folder / model_record_name("model"))
    assert [f.transients for f in record.functions] == [False]


@needs_iree
def test_a_record_that_promises_a_twin_the_module_lacks_is_refused(embedding_build, tmp_path):
    """A model record saying a function has its twin, over a module without it (a build edited
    by hand, or a record of another build): the call is refused, saying to rebuild."""
    import kitdispatch as kd
    from kitdispatch.describe.model_record import model_record_name
    from kitdispatch.errors import KitError

    _, tmp = embedding_build
    folder = cpu_model_build(tmp / "embed.onnx", tmp_path / "plain", transients=False)
    path = folder / model_record_name("model")
    data = json.loads(path.read_text())
    data["functions"] = [f | {"transients": True} for f in data["functions"]]
    path.write_text(json.dumps(data))
    model = kd.load_module(folder, device=CPU_DEVICE)
    with pytest.raises(KitError, match=r"has no function embed\$async_transients, which its model record says it has"):
        model.function("embed")


@pytest.mark.parametrize("text", ["abc", str(1 << 41), "-5"])
def test_a_storage_size_that_is_no_size_is_refused(text):
    from kitdispatch.errors import KitError
    from kitdispatch.run.module import transients_size

    class Function:
        reflection = {"iree.abi.transients.size.constant": text}

    with pytest.raises(KitError, match="is not a size in bytes"):
        transients_size(Function(), "m.vmfb: f$async_transients")


def test_no_constant_size_means_no_storage():
    from kitdispatch.run.module import transients_size

    class Function:
        reflection = {"iree.abi.transients.size": "f$async_transients_transients_size"}

    assert transients_size(Function(), "m.vmfb: f") is None


@pytest.mark.parametrize("value, ok", [(True, True), (False, True), ("yes", False), (1, False)])
def test_the_record_s_transients_flag_is_a_bool(value, ok):
    from kitdispatch.describe.model_record import _is_function_json

    f = {"name": "f", "inputs": [], "outputs": [], "transients": value}
    assert _is_function_json(f) is ok


# ------------------------------------------------------------------- build_model (CUDA target)


@pytest.fixture(scope="module")
def softmax_build(tmp_path_factory):
    pytest.importorskip("onnx")
    if not HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    tmp = tmp_path_factory.mktemp("softmax_transients")
    make_sample_model("onnx_softmax", tmp / "m.onnx")
    return build_model(REPO / "samples" / "onnx_softmax", tmp / "m.onnx", BuildOptions.create("sm_90"), tmp / "out", library=False)


def test_a_model_build_has_the_twins_and_says_so(softmax_build):
    import iree.runtime as rt

    from kitdispatch.describe.model_record import read_model_record

    _, record = read_model_record(softmax_build.record)
    assert [f.transients for f in record.functions] == [True]
    assert "--iree-hal-force-indirect-command-buffers=true" in record.iree_flags
    report = json.loads(softmax_build.report.read_text())
    name = record.functions[0].name
    assert report["transients"] == {"functions": [f"{name}$async_transients"], "not": {}}
    module = rt.VmModule.mmap(rt.VmInstance(), str(softmax_build.vmfb))
    twin = module.lookup_function(f"{name}$async_transients")
    assert twin is not None and int(twin.reflection["iree.abi.transients.size.constant"]) >= 0


@needs_iree
def test_a_module_iree_rejects_with_twins_is_built_without_them(tmp_path, monkeypatch):
    """Fault injected: twins IREE cannot compile. The build is the model's all the same (its
    functions without twins, IREE's NAME$async alone), and the report says why."""
    pytest.importorskip("onnx")
    from kitdispatch import BuildOptions
    from kitdispatch.describe.model_record import read_model_record
    from kitdispatch.models import pipeline, transients

    real = transients.add_twins

    def broken(text: str) -> transients.Twins:
        made = real(text)
        return transients.Twins(made.text.replace("from %kit_transients : !hal.buffer", "from %kit_transients : !hal.fence"), made.names, made.reasons)

    monkeypatch.setattr(pipeline, "add_twins", broken)
    make_sample_model("onnx_softmax", tmp_path / "m.onnx")
    built = pipeline.build_model(REPO / "samples" / "onnx_softmax", tmp_path / "m.onnx", BuildOptions.create("sm_90"), tmp_path / "out", library=False)
    _, record = read_model_record(built.record)
    assert [f.transients for f in record.functions] == [False]
    assert "--iree-hal-force-indirect-command-buffers=true" not in record.iree_flags
    reasons = json.loads(built.report.read_text())["transients"]["not"]
    assert list(reasons) == [record.functions[0].name] and "iree-compile rejected the module with them" in reasons[record.functions[0].name]
    assert "$async_transients" not in built.vmfb.read_bytes().decode("latin-1")
