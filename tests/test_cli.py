"""The CLI, driven in process through main(argv, stdout, stderr)."""

import io
import json

import pytest

from kitdispatch.cli import main

from conftest import HAVE_CUDA, SAMPLES, needs_iree_compile, write_kernel_project


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("command", ["build", "gen", "run", "test", "doctor", "cache"])
def test_every_command_has_help(command):
    code, out, _ = run(command, "--help")
    assert code == 0
    assert "usage: kitdispatch" in out


def test_usage_error_exits_2(capsys):
    assert run("build")[0] == 2


@needs_iree_compile
def test_build_then_json_summary(tmp_path):
    code, out, err = run("build", str(SAMPLES / "simple_mul"), "--arch", "sm_80,sm_90", "-o", str(tmp_path), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["vmfb"].endswith("simple_mul.vmfb")
    assert "[2/2] iree-compile" in err  # progress: one fatbin + the link step


@needs_iree_compile
def test_gen_quiet(tmp_path):
    code, out, err = run("gen", str(SAMPLES / "simple_mul"), "-o", str(tmp_path), "-q")
    assert code == 0 and err == ""
    assert out.startswith("generated ") and len(out.splitlines()) == 1
    assert (tmp_path / "simple_mul.mlir").is_file()


@pytest.mark.parametrize(
    "argv, message, exit_code",
    [
        (["build", "nowhere", "-o", "x"], "no manifest at nowhere", 2),
        (["build", str(SAMPLES / "simple_mul"), "--arch", "sm_8", "-o", "x"], "unknown architecture 'sm_8'", 2),
        (["build", str(SAMPLES / "simple_mul"), "--arch", "sm_60", "-o", "x"], "nvrtc cannot target sm_60", 2),
        (["run", "missing.vmfb", "--function", "f"], "no module at missing.vmfb", 1),
        (["test", "nowhere"], "nothing to test in nowhere", 1),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, monkeypatch, argv, message, exit_code):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(*argv)
    assert code == exit_code
    assert message in err
    assert "fix:" in err
    assert not (tmp_path / "x").exists()


@needs_iree_compile
def test_compile_error_through_the_cli(tmp_path):
    root = write_kernel_project(
        tmp_path / "src",
        'extern "C" __global__ void k(float* x, int n) {\n  x[0] = oops;\n}\n',
        '[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [1]\nworkgroup_count = [1]\n'
        'params = [{ name = "x", inout = "f32[n]" }, { name = "n", scalar = "i32" }]\n',
    )
    code, _, err = run("build", str(root), "-o", str(tmp_path / "out"))
    assert code == 1
    assert "k.cu:2" in err and "oops" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(HAVE_CUDA, reason="checks the no-GPU path")
@needs_iree_compile
def test_test_command_without_a_gpu_says_nothing_was_checked():
    # Green must mean checked: with every case skipped, the command exits 5, as pytest does.
    code, out, err = run("test", str(SAMPLES / "simple_mul"), "-q")
    assert code == 5
    assert "0 passed, 0 failed, 3 skipped (nothing was checked)" in out
    assert "no CUDA device" in out
    assert "nothing was checked" in err


def test_doctor_json():
    code, out, _ = run("doctor", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["nvrtc"]["ptx_isa"] == {13: "9.0", 12: "8.8"}[report["nvrtc"]["cuda_major"]]  # NVRTC 13.0 or 12.9
    assert "sm_89" in report["iree_codegen_targets"] and "sm_90" not in report["iree_codegen_targets"]
