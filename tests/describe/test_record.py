"""No hang: every file the kit opens (build records, journals, model records, modules, the
files a record names) is checked to be a regular file before it is read, the walk of
`kitdispatch test DIR` ends on symlink loops, and `--timeout` bounds every step of
`build --model`. Each command runs in a subprocess with a hard time limit, so a regression
fails the test instead of hanging the suite."""

import faulthandler
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DOUBLING_CU, DOUBLING_TOML, REPO, needs_iree_compile, write_kernel_project

CU, TOML = DOUBLING_CU, DOUBLING_TOML
LIMIT_S = 120  # far beyond what any of these commands needs; a hang is what it catches


def cli(*argv, env=None) -> tuple[int, str, float]:
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kitdispatch", *map(str, argv)],
            cwd=REPO, capture_output=True, text=True, timeout=LIMIT_S, env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"kitdispatch {' '.join(map(str, argv))} hung (no answer in {LIMIT_S} s)")
    err = proc.stderr
    assert "Traceback" not in err and "internal error" not in err, err
    return proc.returncode, err, time.monotonic() - start


@pytest.fixture(scope="module")
def build_folder(tmp_path_factory):
    """A built module to copy and damage."""
    if not __import__("conftest").HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    root = write_kernel_project(tmp_path_factory.mktemp("p") / "proj", CU, TOML)
    out = tmp_path_factory.mktemp("built") / "out"
    code, err, _ = cli("build", root, "--arch", "sm_80", "--format", "ptx", "-o", out)
    assert code == 0, err
    return root, out


def copy_of(folder: Path, dest: Path) -> Path:
    dest.mkdir()
    for p in folder.iterdir():
        (dest / p.name).write_bytes(p.read_bytes())
    return dest


def replace_with(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


@needs_iree_compile
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "folder"])
@pytest.mark.parametrize(
    "victim, command, code_wanted, message",
    [
        ("proj.kitdispatch.json", "run", 1, "cannot read the build record"),
        ("proj.kitdispatch.json", "build", 2, "is not a build record kitdispatch can show it wrote"),
        (".proj.kitdispatch-publishing", "build", 2, "is not a publishing journal kitdispatch can show it wrote"),
        (".proj.kitdispatch-publishing", "test", 1, "was interrupted"),
        ("proj.vmfb", "test", 1, "proj.vmfb cannot be read"),
        ("proj.vmfb", "run", 1, ""),
    ],
)
def test_a_record_journal_or_module_that_is_not_a_regular_file_never_blocks(build_folder, tmp_path, kind, victim, command, code_wanted, message):
    root, built = build_folder
    out = copy_of(built, tmp_path / "out")
    replace_with(out / victim, kind)
    argv = {
        "run": ["run", out / "proj.vmfb", "--function", "k", "--input", "4xf32=1", "--input", "4xf32=0", "--input", "4"],
        "build": ["build", root, "--arch", "sm_80", "--format", "ptx", "-o", out],
        "test": ["test", out],
    }[command]
    code, err, seconds = cli(*argv)
    assert code == code_wanted and message in err, err
    assert seconds < LIMIT_S


@needs_iree_compile
def test_a_fifo_in_place_of_a_record_is_passed_over_by_test(build_folder, tmp_path):
    _, built = build_folder
    out = copy_of(built, tmp_path / "out")
    replace_with(out / "proj.kitdispatch.json", "fifo")
    code, err, _ = cli("test", out)
    assert code == 1 and "nothing to test" in err
    code, err, _ = cli("test", out / "proj.kitdispatch.json")
    assert code == 1 and "nothing to test" in err


@needs_iree_compile
def test_test_walks_no_symlink_loop_and_finds_each_build_once(build_folder, tmp_path):
    _, built = build_folder
    tree = tmp_path / "tree"
    copy_of(built, tree.mkdir() or tree / "a")
    (tree / "a" / "up").symlink_to(tree)  # a link back up the tree
    (tree / "loop").symlink_to(tree / "loop")  # a link to itself
    (tree / "b").mkdir()
    (tree / "b" / "again").symlink_to(tree / "a")  # the same build under a second name
    proc = subprocess.run([sys.executable, "-m", "kitdispatch", "test", str(tree), "--json"], cwd=REPO, capture_output=True, text=True, timeout=LIMIT_S)
    assert proc.returncode in (0, 1, 5) and "Traceback" not in proc.stderr, proc.stderr  # 5: no GPU, all skipped
    cases = json.loads(proc.stdout)["cases"]
    assert [(c["module"], c["function"]) for c in cases] == [("proj", "k")]  # found once, not per link


def test_an_input_file_that_is_a_fifo_is_refused_at_once(tmp_path):
    """`run --input @FILE.npy` and `compare/profile --inputs FILE.npz` open user-named files:
    a FIFO there would block numpy's reader forever."""
    from kitdispatch.models.compare import load_inputs
    from kitdispatch.errors import KitError
    from kitdispatch.describe.types import TensorType
    from kitdispatch.run.text_forms import parse_input

    fifo = tmp_path / "inputs.npz"
    os.mkfifo(fifo)
    faulthandler.dump_traceback_later(LIMIT_S, exit=True)  # a hang ends the run with a traceback
    try:
        with pytest.raises(KitError, match="is a FIFO"):
            load_inputs(fifo, {"name": "f", "inputs": [{"dtype": "f32", "shape": [4]}]})
        with pytest.raises(KitError, match="is a FIFO"):
            parse_input(f"@{fifo}", TensorType("f32", (4,)), "input 0")
    finally:
        faulthandler.cancel_dump_traceback_later()
