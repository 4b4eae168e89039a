"""The CLI, driven in process through main(argv, stdout, stderr)."""

import json

import pytest


from conftest import HAVE_CUDA, SAMPLES, needs_iree_compile, run_cli, write_kernel_project


run = run_cli


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


# --------------------------------------------------------- issue 21: usage, devices, interrupts

@pytest.mark.parametrize(
    "argv, message",
    [
        (["build", str(SAMPLES / "simple_mul"), "-o", ""], "-o/--output is an empty path"),
        (["gen", str(SAMPLES / "simple_mul"), "--output="], "-o/--output is an empty path"),
        (["build", str(SAMPLES / "simple_mul"), "--with-baseline", "-o", "x"], "--with-baseline needs --model"),
        (["build", str(SAMPLES / "simple_mul"), "--tf32", "-o", "x"], "--tf32 needs --model"),
        (["build", "", "-o", "x"], "manifest: an empty path"),
        (["build", str(SAMPLES / "simple_mul"), "-I", "", "-o", "x"], "-I: an empty path"),
        (["build", str(SAMPLES / "simple_mul"), "--model", "", "-o", "x"], "--model is an empty path"),
        (["build", str(SAMPLES / "simple_mul"), "--jobs", "0", "-o", "x"], "--jobs 0: give at least 1"),
        (["build", str(SAMPLES / "simple_mul"), "--timeout", "-1", "-o", "x"], "--timeout -1.0: give a positive number"),
        (["build", str(SAMPLES / "simple_mul"), "--timeout", "nan", "-o", "x"], "--timeout nan: give a positive number"),
        (["build", str(SAMPLES / "simple_mul"), "--timeout", "1e308", "-o", "x"], "--timeout 1e+308: give a positive number of seconds below 1e+07"),
        (["run", "", "--function", "f"], "vmfb is an empty path"),
        (["run", "m.vmfb", "--function", "f", "--benchmark", "-1"], "--benchmark -1: give the number of calls"),
        (["test", ""], "paths: an empty path"),
        (["compare", ""], "built is an empty path"),
    ],
)
def test_usage_errors_exit_2_and_write_nothing(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(*argv)
    assert code == 2, err
    assert message in err and "usage: kitdispatch" in err
    assert list(tmp_path.iterdir()) == []  # `-o ''` would have been the current folder


@needs_iree_compile
@pytest.mark.parametrize("command", ["run", "test"])
@pytest.mark.parametrize(
    "device, message",
    [
        ("local-task", "was compiled for IREE's cuda device and cannot run on 'local-task'"),
        ("bogus", "IREE's runtime has no device 'bogus'"),
        ("local-task://7", "IREE cannot open device 'local-task://7'"),
    ],
)
def test_a_device_that_cannot_run_the_module_is_a_clear_error(simple_mul_build, command, device, message):
    """IREE's CPU device opens on any machine: the module's load refuses it (exit 2, one error)."""
    argv = ["run", str(simple_mul_build / "simple_mul.vmfb"), "--function", "simple_mul", "--input", "4xf32=1", "--input", "4xf32=2"]
    code, out, err = run(*(argv if command == "run" else ["test", str(simple_mul_build)]), "--device", device)
    assert code == 2, err
    assert message in err and "fix:" in err
    assert "internal error" not in err and "Traceback" not in err


# Injects a Ctrl-C into a real `kitdispatch` process: while a module of the package is being
# imported (KD_INTERRUPT_AT), or from an atexit hook, after the command has finished.
SITECUSTOMIZE = '''
import atexit, os, signal, sys, time

class _Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("KD_INTERRUPT_AT"):
            raise KeyboardInterrupt
        return None

if os.environ.get("KD_INTERRUPT_AT"):
    sys.meta_path.insert(0, _Interrupt())
if os.environ.get("KD_INTERRUPT_AT_EXIT"):
    def _late():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2)
    atexit.register(_late)
'''
# What pip writes as the `kitdispatch` console script.
CONSOLE_SCRIPT = """import sys
from kitdispatch.cli import console_main
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(console_main())
"""


def _interrupted_run(tmp_path, argv, entry, **env):
    import os
    import subprocess
    import sys

    from conftest import REPO

    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    script = tmp_path / "bin" / "kitdispatch"
    script.parent.mkdir(exist_ok=True)
    script.write_text(CONSOLE_SCRIPT)
    start = [sys.executable, "-m", "kitdispatch"] if entry == "module" else [sys.executable, str(script)]
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hooks), str(REPO)]), **env)
    return subprocess.run(start + argv, capture_output=True, text=True, timeout=300, env=environ, cwd=tmp_path)


@pytest.mark.parametrize("entry", ["module", "console-script"])
@pytest.mark.parametrize("module", ["kitdispatch.compile.toolchain", "kitdispatch.cli", "numpy"])
def test_ctrl_c_while_the_package_imports_exits_130_without_a_traceback(tmp_path, entry, module):
    res = _interrupted_run(tmp_path, ["doctor"], entry, KD_INTERRUPT_AT=module)
    assert res.returncode == 130, res.stderr
    assert res.stderr.strip() == "kitdispatch: interrupted"


def test_a_program_importing_the_package_still_gets_its_keyboard_interrupt(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import REPO

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hooks), str(REPO)]), KD_INTERRUPT_AT="kitdispatch.builder.pipeline")
    res = subprocess.run([sys.executable, "-c", "from kitdispatch import build"], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode != 0 and "KeyboardInterrupt" in res.stderr


@needs_iree_compile
@pytest.mark.parametrize("entry", ["module", "console-script"])
def test_ctrl_c_as_a_finished_build_exits_is_130_without_a_traceback(tmp_path, entry):
    res = _interrupted_run(tmp_path, ["gen", str(SAMPLES / "simple_mul"), "-o", str(tmp_path / "out")], entry, KD_INTERRUPT_AT_EXIT="1")
    assert res.returncode == 130, res.stderr
    assert "Traceback" not in res.stderr and "KeyboardInterrupt" not in res.stderr
    assert res.stdout.startswith("generated ") and (tmp_path / "out" / "simple_mul.kitdispatch.json").is_file()


@pytest.mark.parametrize(
    "text, dtype, message",
    [
        ("2xf16=1e10 1", "f16", "a number is too large for f16 (it would be infinity)"),
        ("2xf32=1e300", "f32", "a number is too large for f32"),
        ("2xi32=4294967296 1", "i32", "out of bounds for int32"),
        ("99999999999999999999xf32=1", "f32", "does not fit in memory"),
    ],
)
def test_run_inputs_that_do_not_fit_their_type_or_memory(text, dtype, message):
    """`run --input`: numbers beyond the element type, and shapes beyond memory, are one error."""
    from kitdispatch import KitError
    from kitdispatch.describe.types import TensorType
    from kitdispatch.run.text_forms import parse_input

    with pytest.raises(KitError) as err:
        parse_input(text, TensorType(dtype, ("n",)), "--input 1")
    assert message in err.value.render()
    assert parse_input("2xf16=inf 1", TensorType("f16", ("n",)), "--input 1")[0] == float("inf")  # infinity itself is fine
