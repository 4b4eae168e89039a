"""`tune`: probes of a model build (models/probes.py), the capture route, the tune record and
a build that follows it (`--tuned`). Real iree-import-onnx, iree-compile and the library's
kernels; the capture runs for real on IREE's CPU device; `tune` itself needs the GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import CPU_DEVICE, CPU_FLAGS, HAVE_IREE_COMPILE, REPO, run_cli

from kitdispatch import BuildOptions, UsageError
from kitdispatch.builder.publish import OutputError
from kitdispatch.describe.probe_record import read_probe_record, read_tune_record
from kitdispatch.describe.record import DamagedRecord, RecordError

pytestmark = pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")

ROWS, FEATURES, HIDDEN = 128, 256, 512


def make_model(path: Path) -> None:
    """y1 = softmax(layernorm(gelu_tanh(x @ W + b))), y2 = softmax(gelu_tanh(x @ W + b)), f32,
    opset 17 as exporters write it: the two softmaxes are one chain (one probe)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    f32 = np.float32
    consts = {"w": rng.standard_normal((FEATURES, HIDDEN)) / 16, "b": rng.standard_normal(HIDDEN), "gamma": 1 + rng.standard_normal(HIDDEN) / 10,
              "beta": rng.standard_normal(HIDDEN) / 10, "three": 3.0, "cubic": 0.044715, "k": np.sqrt(2 / np.pi), "one": 1.0, "half": 0.5}
    inits = [numpy_helper.from_array(np.asarray(v, f32), k) for k, v in consts.items()]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w"], ["h"]), n("Add", ["h", "b"], ["z"]),
        n("Pow", ["z", "three"], ["z3"]), n("Mul", ["z3", "cubic"], ["t0"]), n("Add", ["z", "t0"], ["t1"]), n("Mul", ["t1", "k"], ["t2"]),
        n("Tanh", ["t2"], ["t3"]), n("Add", ["t3", "one"], ["t4"]), n("Mul", ["t4", "half"], ["t5"]), n("Mul", ["z", "t5"], ["g"]),
        n("LayerNormalization", ["g", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        n("Softmax", ["ln"], ["y1"], axis=-1), n("Softmax", ["g"], ["y2"], axis=-1),
    ]
    info = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "tune_model", [info("x", TensorProto.FLOAT, [ROWS, FEATURES])],
                              [info("y1", TensorProto.FLOAT, [ROWS, HIDDEN]), info("y2", TensorProto.FLOAT, [ROWS, HIDDEN])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from kitdispatch.models.pipeline import build_model

    tmp = tmp_path_factory.mktemp("tune")
    model = tmp / "m.onnx"
    make_model(model)
    out = tmp / "out"
    result = build_model(None, model, BuildOptions.create("sm_90"), out, probes=True, with_baseline=True)
    return result, model, out


def probes_json(out: Path) -> dict:
    return json.loads((out / "m.probes.json").read_text())


def replaced_at(out: Path) -> dict[str, str]:
    report = json.loads((out / "m.replace.json").read_text())
    return {r["location"]: r["kernel"] for r in report["replaced"]}


# ------------------------------------------------------------------------ the build side


def test_one_probe_per_distinct_chain_and_identical_chains_share_one(probed):
    result, _, out = probed
    probes = probes_json(out)["probes"]
    assert [p["op"] for p in probes] == ["linalg.matmul", "layer_norm", "linalg.softmax"]
    assert [len(p["locations"]) for p in probes] == [1, 1, 2]  # the two softmaxes: one probe
    assert sorted(loc for p in probes for loc in p["locations"]) == sorted(d.op.location for d in result.replaced)
    assert all(p["status"] == "built" and p["note"] == "" for p in probes)
    assert result.probes == out / "m.probes.json"


def test_each_probe_is_replaced_by_the_models_kernel_and_its_baseline_is_iree_alone(probed):
    _, _, out = probed
    replaced = replaced_at(out)
    for p in probes_json(out)["probes"]:
        assert {replaced[loc] for loc in p["locations"]} == {p["kernel"]}
        kit, iree = (out / p["vmfb"]).read_bytes(), (out / p["baseline_vmfb"]).read_bytes()
        assert p["kernel_entry"].encode() in kit and p["kernel_entry"].encode() not in iree
        assert b"probe" in iree


def test_kinds_iree_fuses_in_a_model_get_the_model_without_them_to_be_timed_against(probed):
    """The layer norm's and the softmaxes' probes (OpKind.timed_in_model) each have a held-out
    build: the whole model with that probe's ops left to IREE and every other op replaced as in
    the model's build. The matmul's probe has none (a probe alone judges it)."""
    _, _, out = probed
    probes = probes_json(out)["probes"]
    record = read_probe_record(out / "m.probes.json")
    assert [p["heldout_vmfb"] for p in probes] == [None, "m.heldout_0.vmfb", "m.heldout_1.vmfb"]  # two kinds: two builds
    assert probes[0]["heldout_note"] == "" and probes[1]["heldout_note"] == ""
    entries = {p["probe"]: p["kernel_entry"].encode() for p in probes}
    for p in probes[1:]:
        assert p["heldout_vmfb"] in record.files
        held_out = record.check_file(out, p["heldout_vmfb"]).read_bytes()
        assert entries[p["probe"]] not in held_out
        assert all(kernel in held_out for probe, kernel in entries.items() if probe != p["probe"])
    assert not list(out.glob("*heldout.replace.json"))  # only the module is published


def test_probes_of_one_kind_kernel_and_shape_share_one_held_out_build(tmp_path):
    """A model's layers give one probe each (their norms' weights differ): one held-out build
    leaves all of them to IREE. Another shape gets its own; kinds a probe alone judges, none; a
    build that fails leaves its probes without one, with the reason."""
    from kitdispatch.describe.model_record import ModelTensor
    from kitdispatch.describe.probe_record import Probe
    from kitdispatch.models.probes import held_out_builds

    def probe(pid, op, shape, status="built"):
        x = ModelTensor("f16", shape)
        return Probe(pid, f"digest-{pid}", op, (f"loc-{pid}",), "k", f"{op}_entry", None, (x,), x, status)

    probes = [probe("probe_0", "rms_norm", (512, 2048)), probe("probe_1", "linalg.matmul", (512, 2048)),
              probe("probe_2", "rms_norm", (512, 2048)), probe("probe_3", "rms_norm", (1, 2048)),
              probe("probe_4", "rms_norm", (512, 2048), status="unmatched")]
    asked = []

    def build(folder, digests):
        asked.append(digests)
        return (None, "the model without it could not be built: no op left") if len(asked) == 2 else (b"module", "")

    files = {}
    out = held_out_builds("m", probes, tmp_path, build, files)
    assert asked == [frozenset({"digest-probe_0", "digest-probe_2"}), frozenset({"digest-probe_3"})]
    assert [p.heldout_vmfb for p in out] == ["m.heldout_0.vmfb", None, "m.heldout_0.vmfb", None, None]
    assert out[3].heldout_note == "the model without it could not be built: no op left" and files == {"m.heldout_0.vmfb": b"module"}


def test_a_probe_takes_the_chains_inputs_and_clones_its_constants(probed):
    _, _, out = probed
    probes = probes_json(out)["probes"]
    # The matmul's chain reads x alone: W, b, the fill of its outs and GELU's constants are cloned in.
    matmul = (out / probes[0]["mlir"]).read_text()
    assert "func.func @probe(%arg0: tensor<128x256xf32>) -> tensor<128x512xf32>" in matmul
    assert "linalg.matmul" in matmul and "linalg.fill" in matmul and "math.tanh" in matmul
    softmax = (out / probes[2]["mlir"]).read_text()
    assert "math.tanh" not in softmax and "loc(" not in softmax  # nothing outside the chain, no locations
    assert [p["trace_keys"] for p in probes] == [["probe_0/arg0"], ["probe_1/arg0"], ["probe_2/arg0"]]
    assert probes[0]["arithmetic"] == "3xtf32" and probes[2]["arithmetic"] is None


def test_the_capture_module_traces_every_probe_argument_and_the_record_lists_every_probe_file(probed):
    _, _, out = probed
    record = read_probe_record(out / "m.probes.json")
    capture = (out / record.capture_vmfb).read_bytes()
    for probe in record.probes:
        for key in probe.trace_keys():
            assert key.encode() in capture
    model = json.loads((out / "m.model.json").read_text())
    assert set(record.files) | {"m.probes.json"} <= set(model["files"])
    for name in record.files:
        record.check_file(out, name)


def test_the_capture_route_runs_for_real_on_the_cpu(probed, tmp_path):
    """The chains of the model at IREE's matching stage for IREE's CPU device, traced as the
    build traces them, compiled from that stage and run through IREE's debug sink: the matmul's
    probe sees the model's input, and the softmax probe, compiled for the CPU, gives the model's
    first output on the activations it captured."""
    from kitdispatch.iree.tools import find_tool
    from kitdispatch.models.ops import OP_KINDS
    from kitdispatch.models.pipeline import import_model
    from kitdispatch.models.probes import chains, insert_traces
    from kitdispatch.models.projects import model_projects
    from kitdispatch.models.replace import decide, read_ops, replacing_kernels, settle
    from kitdispatch.models.spec import parse_mlir
    from kitdispatch.models.tune import capture_activations

    _, model, _ = probed
    compile_ = [find_tool("iree-compile"), *CPU_FLAGS]
    imported = import_model(model, tmp_path / "m.mlir")
    staged = tmp_path / "stage.mlir"
    subprocess.run([*compile_, str(imported), "--compile-to=global-optimization", "-o", str(staged)], check=True, timeout=300)
    kernels = replacing_kernels(model_projects(None, library=True).module)
    kinds = sorted({k for kernel in kernels for k in kernel.replaces.ops})
    for n, step in enumerate(dict.fromkeys(OP_KINDS[k].prepare for k in kinds if OP_KINDS[k].prepare)):
        fused = tmp_path / f"fused{n}.mlir"
        subprocess.run([find_tool("iree-opt"), str(staged), f"--pass-pipeline={step.pipeline}", "-o", str(fused)], check=True, timeout=300)
        staged = fused
    context, module = parse_mlir(staged)
    found = read_ops(module, kinds)
    decisions = settle(found, decide([f for _, f in found], kernels))
    found_chains = chains(found, decisions, context)
    firsts = {}
    for chain in found_chains:
        firsts.setdefault(chain.text, chain)
    by_probe = {f"probe_{k}": c for k, c in enumerate(firsts.values())}
    insert_traces(by_probe)
    (tmp_path / "capture.mlir").write_text(module.operation.get_asm(enable_debug_info=True))
    capture = tmp_path / "capture.vmfb"
    subprocess.run([*compile_, str(tmp_path / "capture.mlir"), "--compile-from=global-optimization", "-o", str(capture)], check=True, timeout=300)
    x = np.random.default_rng(1).uniform(-2, 2, (ROWS, FEATURES)).astype(np.float32)
    captured = capture_activations(capture, "tune_model", [x], device=CPU_DEVICE)
    assert set(captured) == {"probe_0/arg0", "probe_1/arg0", "probe_2/arg0"}
    np.testing.assert_array_equal(captured["probe_0/arg0"][0], x)
    # The softmax probe on its captured input is the model's first output.
    (tmp_path / "probe.mlir").write_text(by_probe["probe_2"].text)
    subprocess.run([*compile_, str(tmp_path / "probe.mlir"), "-o", str(tmp_path / "probe.vmfb")], check=True, timeout=300)
    import iree.runtime as rt

    whole = rt.load_vm_flatbuffer_file(str(_cpu_model(compile_, imported, tmp_path)), driver=CPU_DEVICE)
    y1 = np.asarray(whole.tune_model(x)[0])
    probe = rt.load_vm_flatbuffer_file(str(tmp_path / "probe.vmfb"), driver=CPU_DEVICE)
    np.testing.assert_allclose(np.asarray(probe.probe(captured["probe_2/arg0"][0])), y1, rtol=1e-5, atol=1e-6)


def _cpu_model(compile_: list[str], imported: Path, tmp: Path) -> Path:
    vmfb = tmp / "model.cpu.vmfb"
    subprocess.run([*compile_, str(imported), "-o", str(vmfb)], check=True, timeout=300)
    return vmfb


# ------------------------------------------------------------------------ the records


def test_a_probe_record_reaching_outside_its_folder_is_refused(probed, tmp_path):
    _, _, out = probed
    data = probes_json(out)
    data["files"]["../evil.vmfb"] = "0" * 64
    bad = tmp_path / "m.probes.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="'../evil.vmfb', which is not a file name of its folder"):
        read_probe_record(bad)
    data = probes_json(out)
    data["probes"][0]["probe"] = "../probe_0"
    bad.write_text(json.dumps(data))
    with pytest.raises(DamagedRecord, match="probe name"):
        read_probe_record(bad)
    data = probes_json(out)
    data["probes"][1]["heldout_vmfb"] = "../m.heldout_0.vmfb"  # tune would load it: only files the record lists
    bad.write_text(json.dumps(data))
    with pytest.raises(DamagedRecord, match="probe_1: 'heldout_vmfb' is not a file it lists"):
        read_probe_record(bad)
    for name in ("../escaped", str(tmp_path / "abs"), ""):  # tune would write NAME.tune.json there
        data = probes_json(out)
        data["name"] = name
        bad.write_text(json.dumps(data))
        with pytest.raises(RecordError, match="which is not a file name of its folder"):
            read_probe_record(bad)


def test_a_linked_or_oversize_record_and_a_linked_probe_file_are_refused(probed, tmp_path):
    _, _, out = probed
    link = tmp_path / "m.probes.json"
    link.symlink_to(out / "m.probes.json")
    with pytest.raises(RecordError, match="symbolic link"):
        read_probe_record(link)
    big = tmp_path / "big.probes.json"
    with open(big, "wb") as f:
        f.truncate(65 << 20)  # sparse: over the 64 MiB a record may have
    with pytest.raises(RecordError, match="cannot read the probe record"):
        read_probe_record(big)
    record = read_probe_record(out / "m.probes.json")
    for name in record.files:
        (tmp_path / name).symlink_to(out / name)
    with pytest.raises(RecordError, match="symbolic link"):
        record.check_file(tmp_path, record.capture_vmfb)


def write_tune(out: Path, path: Path, decisions: dict[str, tuple[str, float, float]], **changes: object) -> Path:
    """A tune record as tune writes one, by hand: probe id -> (decision, kit_us, iree_us)."""
    probes = probes_json(out)
    model = json.loads((out / "m.model.json").read_text())
    entries = [
        {"probe": p["probe"], "digest": p["digest"], "op": p["op"], "locations": p["locations"], "kernel": p["kernel"],
         "kit_us": decisions[p["probe"]][1], "iree_us": decisions[p["probe"]][2], "max_abs_error": 1e-6, "tolerance": "rtol 1e-05",
         "agree": True, "decision": decisions[p["probe"]][0], "reason": "by hand"}
        for p in probes["probes"] if p["probe"] in decisions
    ]
    data = {"schema": 1, "name": "m", "model": probes["model"], "model_sha256": probes["model_sha256"],
            "probes_sha256": model["files"]["m.probes.json"], "function": "tune_model", "device": "cuda", "timed": "by hand",
            "inputs": "random (seed 0)", "probes": entries} | changes
    path.write_text(json.dumps(data))
    return path


def test_tuned_keeps_exactly_the_ops_its_file_says_with_the_reason(probed, tmp_path):
    from kitdispatch.models.pipeline import build_model

    _, model, out = probed
    tune = write_tune(out, tmp_path / "m.tune.json", {"probe_0": ("replace", 20.0, 30.0), "probe_2": ("keep", 12.3, 10.1)})
    rebuilt = tmp_path / "rebuilt"
    result = build_model(None, model, BuildOptions.create("sm_90"), rebuilt, tuned=tune)
    softmaxes = [d for d in result.decisions if d.op.kind == "linalg.softmax"]
    assert len(softmaxes) == 2 and all(d.kernel is None for d in softmaxes)
    assert all(d.reasons == ("tune: kit 12.3 us vs IREE 10.1 us on the model's activations",) for d in softmaxes)
    assert {d.op.kind for d in result.replaced} == {"linalg.matmul", "layer_norm"}  # the matmul by tune, the norm by rule
    report = json.loads((rebuilt / "m.replace.json").read_text())
    assert [t["decision"] for t in report["tune"]["tuned"]] == ["replace", "keep", "keep"]
    assert len(report["tune"]["untuned"]) == 1  # the layer norm: not in the file, by rule
    text = (rebuilt / "m.replace.txt").read_text()
    assert "tune: kit 12.3 us vs IREE 10.1 us on the model's activations" in text and "follow the rule" in text


def test_a_tune_file_of_another_model_or_another_build_is_refused_and_nothing_is_written(probed, tmp_path):
    _, model, out = probed
    other = write_tune(out, tmp_path / "other.tune.json", {"probe_2": ("keep", 1.0, 2.0)}, model_sha256="0" * 64)
    code, _, err = run_cli("build", "--model", str(model), "--arch", "sm_90", "-o", str(tmp_path / "a"), "--tuned", str(other))
    assert code == 2 and "was measured on another model" in err
    stray = write_tune(out, tmp_path / "stray.tune.json", {"probe_2": ("keep", 1.0, 2.0)})
    data = json.loads(stray.read_text())
    data["probes"][0]["digest"] = "f" * 64
    stray.write_text(json.dumps(data))
    code, _, err = run_cli("build", "--model", str(model), "--arch", "sm_90", "-o", str(tmp_path / "b"), "--tuned", str(stray))
    assert code == 2 and "does not match this build: its probe_2 match no replaced op" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    damaged = tmp_path / "damaged.tune.json"
    damaged.write_text('{"schema": 1, "probes": 3}')
    with pytest.raises(DamagedRecord):
        read_tune_record(damaged)


@pytest.mark.parametrize("users", ["m.capture.vmfb", "m.heldout_0.vmfb"])
def test_probes_never_take_the_place_of_a_users_file(probed, tmp_path, users):
    from kitdispatch.models.pipeline import build_model

    _, model, _ = probed
    out = tmp_path / "out"
    out.mkdir()
    (out / users).write_bytes(b"mine")
    with pytest.raises(OutputError, match="was not written by kitdispatch"):
        build_model(None, model, BuildOptions.create("sm_90"), out, probes=True)
    assert sorted(p.name for p in out.iterdir()) == [users] and (out / users).read_bytes() == b"mine"


def test_a_build_with_probes_killed_midway_publishes_nothing_and_the_next_one_finishes(probed, tmp_path):
    _, model, _ = probed
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "kitdispatch", "build", "--model", str(model), "--arch", "sm_90", "-o", str(out), "--probes"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(out.glob(".kitdispatch-staging-*/probe_0")):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # its own session: the build and the tools it runs
    proc.wait()
    assert not [p for p in out.iterdir() if not p.name.startswith(".kitdispatch-")]  # nothing published
    code, _, err = run_cli("build", "--model", str(model), "--arch", "sm_90", "-o", str(out), "--probes")
    assert code == 0, err
    assert (out / "m.probes.json").is_file() and not list(out.glob(".kitdispatch-*"))


# ------------------------------------------------------------------------ without a GPU


def test_tune_without_a_gpu_is_a_clear_error_and_writes_nothing(probed):
    from conftest import HAVE_CUDA

    if HAVE_CUDA:
        pytest.skip("this machine has a GPU")
    _, _, out = probed
    before = sorted(p.name for p in out.iterdir())
    code, _, err = run_cli("tune", str(out))
    assert code == 3 and "no CUDA device" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == before


def test_tune_needs_a_build_with_probes_and_never_overwrites_a_users_file(probed, tmp_path):
    from kitdispatch.models.tune import tune_model

    _, model, out = probed
    plain = tmp_path / "plain"
    code, _, err = run_cli("build", "--model", str(model), "--arch", "sm_90", "-o", str(plain))
    assert code == 0, err
    code, _, err = run_cli("tune", str(plain))
    assert code == 2 and "has no probes" in err and "--probes" in err
    (out / "m.tune.json").write_text("my notes")
    try:  # the CPU device passes the GPU check: the target is checked before anything runs
        with pytest.raises(UsageError, match="is in the way of the tune record"):
            tune_model(out, device=CPU_DEVICE)
        assert (out / "m.tune.json").read_text() == "my notes"
    finally:
        (out / "m.tune.json").unlink()


def test_build_tune_without_a_gpu_builds_by_rule_and_says_so(probed, tmp_path):
    from conftest import HAVE_CUDA

    if HAVE_CUDA:
        pytest.skip("this machine has a GPU")
    _, model, _ = probed
    out = tmp_path / "out"
    code, stdout, err = run_cli("build", "--model", str(model), "--arch", "sm_90", "-o", str(out), "--tune", "--json")
    assert code == 0, err
    assert "note: --tune needs a GPU" in err and "the build replaces by rule" in err
    report = json.loads((out / "m.replace.json").read_text())
    assert report["tune"]["status"] == "not tuned" and len(report["replaced"]) == 4
    assert "not tuned: --tune needs a GPU" in (out / "m.replace.txt").read_text()


@pytest.mark.parametrize("flag", ["--probes", "--tune"])
def test_tune_flags_need_a_model(flag, tmp_path):
    code, _, err = run_cli("build", str(tmp_path), "-o", str(tmp_path / "o"), flag)
    assert code == 2 and "needs --model" in err


# ------------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
def test_tune_end_to_end_and_a_rebuild_follows_it(probed, tmp_path):
    """tune on the GPU: every probe measured, each decision consistent with its times and
    agreement, the rebuild replaces exactly the ops tune said to replace."""
    import shutil

    from kitdispatch.models.pipeline import build_model
    from kitdispatch.models.tune import tune_model

    _, model, out = probed
    folder = tmp_path / "built"
    shutil.copytree(out, folder)
    result = tune_model(folder)
    record = read_tune_record(folder / "m.tune.json")
    assert [e.probe for e in record.entries] == ["probe_0", "probe_1", "probe_2"] and not result.untuned
    for e in record.entries:
        assert e.kit_us > 0 and e.iree_us > 0 and e.agree is not None
        assert e.timed_in_model == (e.op != "linalg.matmul"), e  # the norm and the softmaxes: the model both ways
        faster = e.model_us < e.heldout_us if e.timed_in_model else e.kit_us < e.iree_us
        assert e.heldout == ({"linalg.matmul": None, "layer_norm": "m.heldout_0.vmfb"}.get(e.op, "m.heldout_1.vmfb")), e
        assert (e.decision == "replace") == (e.agree and faster), e
    assert "CUPTI" in record.timed
    rebuilt = build_model(None, model, BuildOptions.create("sm_90"), tmp_path / "rebuilt", tuned=folder / "m.tune.json")
    line = lambda loc: loc.rsplit('"', 1)[-1]  # noqa: E731  (":24:11": the folder in the location differs)
    replaced = {line(d.op.location) for d in rebuilt.replaced}
    for e in record.entries:  # an op tune kept may free its epilogue for another kernel, by rule: only the tuned ops are checked
        assert all((line(loc) in replaced) == (e.decision == "replace") for loc in e.locations), e
    code, stdout, err = run_cli("tune", str(folder), "--json")
    assert code == 0, err
    assert len(json.loads(stdout)["probes"]) == 3


def test_a_probe_whose_own_build_chose_another_kernel_is_unmatched(probed):
    from kitdispatch.models.probes import same_kernel

    result, _, _ = probed
    matmul, norm = result.replaced[0], result.replaced[1]
    assert same_kernel(matmul, [matmul]) == ""
    assert "chose layer_norm_f32" in same_kernel(matmul, [norm]) and matmul.kernel.name in same_kernel(matmul, [norm])
    assert same_kernel(matmul, []) == "the probe's own build replaced 0 op(s), not 1"


def test_the_tune_table_says_what_was_timed_and_why_each_decision():
    from kitdispatch.describe.probe_record import TuneEntry, TuneRecord
    from kitdispatch.models.tune import TuneResult, format_tune, timed_text

    entries = (
        TuneEntry("probe_0", "d0", "linalg.matmul", ("a", "b"), "mm", 20.0, 30.0, 1e-6, "rtol 1e-05", True, "replace", "faster"),
        TuneEntry("probe_1", "d1", "linalg.softmax", ("c",), "sm", 12.3, 10.1, 1e-7, "rtol 1e-05", True, "replace", "faster in the model",
                  model_us=400.0, heldout_us=412.5),
    )
    record = TuneRecord("m", "m.onnx", "0", "1", "f", "cuda", timed_text(20), "random (seed 0)", entries)
    text = format_tune(TuneResult(Path("m.tune.json"), record, (("probe_2", "its own build failed"),)))
    assert "probe_1  linalg.softmax  12.3    10.1     400.0           412.5" in text and "probe_1: replace: faster in the model" in text
    assert "probe_0  linalg.matmul   20.0    30.0     -               -" in text
    assert "probe_2: not tuned (its ops follow the rule): its own build failed" in text
    assert "CUPTI" in text and "median of 20 calls" in text


@pytest.mark.parametrize("measured", [False, True], ids=["nothing-measured", "one-measured"])
def test_kitdispatch_tune_exits_non_zero_where_it_measured_no_probe(monkeypatch, tmp_path, measured):
    """A tune whose capture reached no probe (--function naming one that never reaches them,
    say) writes a record of keeps without times: the command says so and exits 1, not 0. The
    measurement itself (CUPTI on the GPU) is stood in for; the CLI's verdict is what is tested."""
    import io

    from kitdispatch.cli import main
    from kitdispatch.describe.probe_record import TuneEntry, TuneRecord
    from kitdispatch.models import tune
    from kitdispatch.models.tune import TuneResult, timed_text

    times = (20.0, 30.0) if measured else (None, None)
    entry = TuneEntry("probe_0", "d0", "linalg.softmax", ("a",), "sm", *times, None, "rtol 1e-05", None, "keep", "no activations captured")
    record = TuneRecord("m", "m.onnx", "0", "1", "f", "cuda", timed_text(20), "random (seed 0)", (entry,))
    monkeypatch.setattr(tune, "tune_model", lambda *a, **k: TuneResult(tmp_path / "m.tune.json", record, ()))
    err = io.StringIO()
    code = main(["tune", str(tmp_path)], io.StringIO(), err)
    assert code == (0 if measured else 1), err.getvalue()
    assert ("no probe was measured" in err.getvalue()) != measured


def test_the_run_side_of_tune_loads_nothing_of_the_build_side():
    code = (
        "import sys, kitdispatch.models.tune; "
        "print([m for m in sys.modules if m.startswith(('kitdispatch.models.pipeline', 'kitdispatch.models.probes', "
        "'kitdispatch.models.replace', 'kitdispatch.models.spec', 'kitdispatch.builder', 'iree.compiler'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
