"""Output folders under attack and under faults (outputs.py): planted journals and records,
building into the project's own folder, modules sharing a folder, staging folders of live and
dead builds, SIGKILL at every step of a publish, SIGTERM, full disks, `cache clear` beside a
build. Each test plants one fault and checks what must hold: nothing of the user's changed or
removed anywhere, the exit code, and a one-line error that says what and where."""

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kitdispatch.cli import main
from kitdispatch.builder.publish import STAGING_MARKER, STAGING_PREFIX, TRANSIT_PREFIX
from kitdispatch.describe.record import journal_name, read_record

from conftest import DOUBLING_CU, DOUBLING_TOML, REPO, doubling_project, needs_iree_compile

CU, TOML = DOUBLING_CU, DOUBLING_TOML
PTX = ["--arch", "sm_80", "--format", "ptx"]
OTHER_USER = 54321


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in argv], out, err)
    return code, out.getvalue(), err.getvalue()


project = doubling_project


def tree(folder: Path) -> dict[str, bytes]:
    """Every file and link under `folder` with its content (links: their target)."""
    found = {}
    for p in folder.rglob("*"):
        rel = str(p.relative_to(folder))
        found[rel] = b"->" + os.readlink(p).encode() if p.is_symlink() else p.read_bytes() if p.is_file() else b"<dir>"
    return found


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def one_line_error(err: str, *needles: str) -> None:
    first = next((line for line in err.splitlines() if "error:" in line), "")  # progress lines aside
    assert all(n in first for n in needles), err
    assert "Traceback" not in err and "internal error" not in err, err


@pytest.fixture
def built(tmp_path):
    """A project built into `out`, beside the user's own files in and around the folder."""
    root = project(tmp_path / "proj")
    out = tmp_path / "out"
    code, _, err = run("build", root, *PTX, "-o", out)
    assert code == 0, err
    (out / "notes.txt").write_text("the user's notes\n")
    (tmp_path / "victim.txt").write_text("outside the folder\n")
    return root, out


# ------------------------------------------------------- planted journals and records


HOSTILE_NAMES = ["../victim.txt", "/etc/hostname", "sub/../../victim.txt", "..", ".", "", "a\0b", "x\\..\\y",
                 f"{STAGING_PREFIX}1.a", ".proj.vmfb.1.abc.kdtmp", "a" * 300]


@needs_iree_compile
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_planted_journal_with_a_hostile_name_is_reported_and_nothing_is_deleted(built, tmp_path, name):
    root, out = built
    victim = tmp_path / "victim.txt"
    (out / journal_name("proj")).write_text(json.dumps({"files": {name: sha(victim.read_bytes()), "notes.txt": sha(b"the user's notes\n")}}))
    (root / "k.cu").write_text(CU.replace("2 *", "3 *"))  # a new build: it would publish and clean
    before, outside = tree(out), tree(tmp_path / "proj")
    code, _, err = run("build", root, *PTX, "-o", out)
    assert code == 2
    one_line_error(err, journal_name("proj"), "not a plain file name", "nothing in the folder was changed")
    assert tree(out) == before and tree(tmp_path / "proj") == outside
    assert victim.read_text() == "outside the folder\n"


@needs_iree_compile
@pytest.mark.parametrize("damage", ["not json", "[]", '{"files": ["notes.txt"]}', '{"files": {"notes.txt": 1}}'])
def test_a_journal_the_kit_did_not_write_whole_is_reported(built, damage):
    root, out = built
    (out / journal_name("proj")).write_text(damage)
    before = tree(out)
    code, _, err = run("build", root, *PTX, "-o", out)
    assert code == 2
    one_line_error(err, journal_name("proj"), "not a publishing journal kitdispatch wrote")
    assert tree(out) == before


@needs_iree_compile
@pytest.mark.parametrize("which", ["journal", "record"])
@pytest.mark.parametrize("how", ["another user", "hard link", "symlink"])
def test_a_journal_or_record_the_kit_cannot_show_it_wrote_is_never_acted_on(built, tmp_path, which, how):
    """A shared folder: another user plants a journal that claims the user's notes.txt with
    its hash (or the record is someone else's). The next build would delete notes.txt as a
    stale file of the previous build: it must refuse and touch nothing."""
    root, out = built
    path = out / (journal_name("proj") if which == "journal" else "proj.kitdispatch.json")
    if which == "journal":
        path.write_text(json.dumps({"files": {"notes.txt": sha(b"the user's notes\n")}}))
    if how == "another user":
        os.chown(path, OTHER_USER, OTHER_USER)
    elif how == "hard link":
        os.link(path, tmp_path / "second-name")
    else:
        real = tmp_path / "elsewhere.json"
        real.write_bytes(path.read_bytes())
        path.unlink()
        path.symlink_to(real)
    (root / "k.cu").write_text(CU.replace("2 *", "3 *"))
    before = tree(out)
    code, _, err = run("build", root, *PTX, "-o", out)
    assert code == 2
    one_line_error(err, path.name, "kitdispatch can show it wrote", "nothing in the folder was changed")
    assert tree(out) == before
    assert (out / "notes.txt").read_text() == "the user's notes\n"


# ------------------------------------------------------- the project's own folder as -o


@needs_iree_compile
def test_building_into_the_project_folder_never_adopts_or_deletes_its_files(tmp_path):
    root = project(tmp_path / "proj", toml=TOML + '\n[test]\nreference = "reference.py"\nsizes = { n = 7 }\n')
    (root / "reference.py").write_text("def k(x):\n    return 2 * x\n")
    sources = {n: (root / n).read_bytes() for n in ("k.cu", "kitdispatch.toml", "reference.py")}
    inode = (root / "reference.py").stat().st_ino
    code, _, err = run("build", root, "--arch", "sm_80,sm_86", "--format", "ptx", "-o", root)
    assert code == 0, err
    record = read_record(root / "proj.kitdispatch.json")
    assert not set(sources) & set(record.files)  # none of them is claimed as the kit's
    assert record.test.reference == Path("reference.py")
    record.check_file(root, "reference.py")  # still checked by its hash, for `kitdispatch test`
    assert (root / "reference.py").stat().st_ino == inode  # not replaced by a copy of itself
    # The manifest drops the reference, another arch: a rebuild removes stale objects only.
    (root / "kitdispatch.toml").write_text(TOML)
    code, _, err = run("build", root, "--arch", "sm_90", "--format", "ptx", "-o", root)
    assert code == 0, err
    assert (root / "reference.py").read_bytes() == sources["reference.py"]
    assert (root / "k.cu").read_bytes() == sources["k.cu"]
    assert not (root / "k.sm_80.ptx").exists() and (root / "k.sm_90.ptx").exists()


@needs_iree_compile
def test_an_output_never_takes_the_place_of_a_project_file_in_its_folder(tmp_path):
    """A [[programs]] source named like the module's generated MLIR, in the folder built into."""
    program = "func.func @twice(%x: tensor<?xf32>) -> tensor<?xf32> {\n  %y = call @k(%x) : (tensor<?xf32>) -> tensor<?xf32>\n  return %y : tensor<?xf32>\n}\n"
    root = project(tmp_path / "proj", toml=TOML + '\n[[programs]]\nsource = "proj.mlir"\nfunctions = [{ name = "twice", args = ["f32[n]"], results = ["f32[n]"] }]\n')
    (root / "proj.mlir").write_text(program)
    before = tree(root)
    code, _, err = run("build", root, *PTX, "-o", root)
    assert code == 2
    one_line_error(err, "would take the place of the project's own file", "proj.mlir")
    assert tree(root) == before


@needs_iree_compile
@pytest.mark.parametrize("reference", ["proj.mlir", "proj.vmfb", "proj.kitdispatch.json", "k.sm_80.ptx", ".proj.kitdispatch-publishing"])
def test_a_reference_named_like_an_output_is_refused(tmp_path, reference):
    root = project(tmp_path / "proj", toml=TOML + f'\n[test]\nreference = "{reference}"\n')
    (root / reference).write_text("def k(x):\n    return 2 * x\n")
    code, _, err = run("build", root, *PTX, "-o", tmp_path / "out")
    assert code == 2
    one_line_error(err, f"[test] reference {reference!r} has the name of one of the build's outputs")
    assert not (tmp_path / "out").exists()


@needs_iree_compile
def test_two_modules_built_into_one_folder_never_share_a_file(tmp_path):
    a = project(tmp_path / "a", toml='name = "a"\n' + TOML)
    b = project(tmp_path / "b", toml='name = "b"\n' + TOML)  # its object is named k.sm_80.ptx too
    out = tmp_path / "out"
    assert run("build", a, *PTX, "-o", out)[0] == 0
    before = tree(out)
    code, _, err = run("build", b, *PTX, "-o", out)
    assert code == 2
    one_line_error(err, "k.sm_80.ptx", "a.kitdispatch.json", "must not share a file")
    assert tree(out) == before
    code, _, err = run("build", a, b, *PTX, "-o", tmp_path / "both")  # one folder per module
    assert code == 0, err


# ------------------------------------------------------------------ staging folders


def _hold_lock(path: Path) -> subprocess.Popen:
    """A process that holds the flock of `path` until killed: a live build elsewhere (another
    pid namespace: its pid means nothing here)."""
    script = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); print('ok', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ok"
    return proc


def _plant_staging(out: Path, pid: int, tag: str, marker: str = STAGING_MARKER, prefix: str = STAGING_PREFIX) -> Path:
    stage = out / f"{prefix}{pid}.{tag}"
    stage.mkdir(parents=True)
    (stage / marker).write_bytes(b"")
    (stage / "half.vmfb").write_bytes(b"half")
    return stage


@pytest.mark.parametrize("prefix", [STAGING_PREFIX, TRANSIT_PREFIX])  # in use, or being made or removed
def test_a_live_builds_staging_folder_is_never_removed_whatever_its_pid(tmp_path, prefix):
    out = tmp_path / "out"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    foreign = _plant_staging(out, dead.pid, "container", prefix=prefix)  # a pid dead here, its build alive
    holder = _hold_lock(foreign / STAGING_MARKER)
    stale = _plant_staging(out, os.getppid(), "killed", prefix=prefix)  # a pid alive here, its build dead
    unmarked = _plant_staging(out, dead.pid, "mine", "notes.txt", prefix)  # no marker: not the kit's
    try:
        code, _, err = run("gen", project(tmp_path / "proj"), *PTX, "-o", out)
        assert code == 0, err
        assert foreign.is_dir() and (foreign / "half.vmfb").read_bytes() == b"half"
        assert not stale.exists()
        assert (unmarked / "notes.txt").exists()
    finally:
        holder.kill()
        holder.wait()
    assert run("gen", tmp_path / "proj", *PTX, "-o", out)[0] == 0
    assert not foreign.exists()  # its build died: the next build cleans it


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    at, count = int(sys.argv[2]), [0]
    def step(fn):
        def wrapped(*args, **kwargs):
            count[0] += 1
            if count[0] == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)
        return wrapped
    for name in ("replace", "rename", "unlink", "rmdir", "fsync", "mkdir"):
        setattr(os, name, step(getattr(os, name)))
    import atexit
    atexit.register(lambda: print("steps", count[0]))
    from kitdispatch.cli import main
    sys.exit(main(sys.argv[3:]))
""")


@needs_iree_compile
def test_a_sigkill_at_any_step_leaves_nothing_the_next_build_does_not_clean(tmp_path):
    """The build is killed (a real SIGKILL) at each file-system step in turn: every rename,
    unlink, rmdir, fsync and mkdir. After each, the next build must succeed and leave exactly
    its files beside the user's, with no staging folder, journal or temp file."""
    root = project(tmp_path / "proj")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    argv = ["build", str(root), *PTX, "-o", str(out)]
    probe = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(REPO), "0", *argv], capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
    steps = int(probe.stdout.split("steps")[-1])
    assert steps > 10
    killed, left = 0, set()
    for at in range(1, steps + 1):
        factor = 3 + at % 2  # each round publishes something new
        (root / "k.cu").write_text(CU.replace("2 *", f"{factor} *"))
        proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(REPO), str(at), *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
        killed += proc.returncode == -signal.SIGKILL
        left |= {"staging" if p.name.startswith((STAGING_PREFIX, TRANSIT_PREFIX)) else p.name for p in out.iterdir() if p.name.startswith(".")}
        (root / "k.cu").write_text(CU.replace("2 *", f"{factor + 2} *"))
        code, _, err = run(*argv)
        assert code == 0, f"after a kill at step {at}: {err}"
        record = read_record(out / "proj.kitdispatch.json")
        assert {p.name for p in out.iterdir()} == {*record.files, "proj.kitdispatch.json", "notes.txt"}, at
        for name in record.files:
            record.check_file(out, name)
        assert (out / "notes.txt").read_text() == "mine\n"
    assert killed > steps // 2
    assert {"staging", journal_name("proj")} <= left  # kills landed mid-build and mid-publish


# ------------------------------------------------------------------------ full disks


def _tmpfs(folder: Path, size: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("cannot mount a small tmpfs here (needs root)")


def _umount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


def _fill(disk: Path, leave: int) -> None:
    """Leaves `leave` bytes free on `disk` (in a file of the user's that must survive)."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    (disk / "filler").write_bytes(b"\1" * max(0, free - leave))


@needs_iree_compile
def test_a_full_output_disk_during_the_link_says_disk_full(tmp_path):
    """iree-compile dies on the write error (LLVM ERROR, its worker crashes): the error must
    say disk full and name the folder, not blame the compiler; nothing half-written stays."""
    root = project(tmp_path / "proj")
    sizing = tmp_path / "sizing"
    assert run("gen", root, *PTX, "-o", sizing)[0] == 0
    pages = sum(-(-p.stat().st_size // 4096) * 4096 for p in sizing.iterdir() if p.suffix in (".ptx", ".mlir"))
    disk = tmp_path / "disk"
    _tmpfs(disk, "1m")
    try:
        _fill(disk, pages)  # room for the objects and the MLIR, not for the .vmfb
        before = tree(disk)
        code, _, err = run("build", root, *PTX, "-o", disk / "out", "--no-cache")
        assert code == 1
        one_line_error(err, "disk full", str(disk / "out"))
        assert "crashed" not in err
        assert tree(disk) == before  # not even the folder it would have made
    finally:
        _umount(disk)


@needs_iree_compile
def test_a_full_cache_disk_means_building_without_the_cache(tmp_path, monkeypatch):
    disk = tmp_path / "cache"
    _tmpfs(disk, "16k")
    try:
        monkeypatch.setenv("KITDISPATCH_CACHE_DIR", str(disk / "kitdispatch"))
        _fill(disk, 8192)  # the tag and an object fit, not the module
        code, _, err = run("build", project(tmp_path / "proj"), *PTX, "-o", tmp_path / "out")
        assert code == 0, err
        assert "warning: cannot write to the cache" in err and "No space left on device" in err
        read_record(tmp_path / "out" / "proj.kitdispatch.json").check_file(tmp_path / "out", "proj.vmfb")
    finally:
        _umount(disk)


# ----------------------------------------------------------- cache clear beside builds


@needs_iree_compile
def test_cache_clear_running_beside_builds_never_fails_them(tmp_path):
    clearer = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom kitdispatch.cli import main\nwhile True: main(['cache', 'clear', '-q'])"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        for i in range(6):
            root = project(tmp_path / f"p{i}" / "proj", cu=CU.replace("2 *", f"{i + 2} *"))
            proc = subprocess.run(
                [sys.executable, "-m", "kitdispatch", "build", str(root), *PTX, "-o", str(tmp_path / f"out{i}")],
                cwd=REPO, capture_output=True, text=True, timeout=300,
            )
            assert proc.returncode == 0, proc.stderr
            read_record(tmp_path / f"out{i}" / "proj.kitdispatch.json").check_file(tmp_path / f"out{i}", "proj.vmfb")
    finally:
        clearer.kill()
        _, clear_err = clearer.communicate(timeout=30)
    assert "Traceback" not in clear_err


@pytest.mark.gpu
@needs_iree_compile
def test_a_sample_built_into_its_own_folder_tests_green_on_the_gpu(tmp_path):
    """The reference of a sample built into its own folder is recorded as an input, not
    published; `kitdispatch test` must still find, check and run it."""
    import shutil

    from conftest import SAMPLES

    root = tmp_path / "simple_mul"
    shutil.copytree(SAMPLES / "simple_mul", root)
    code, _, err = run("build", root, "--arch", "sm_80,sm_90", "-o", root)
    assert code == 0, err
    code, out, err = run("test", root / "simple_mul.kitdispatch.json")
    assert code == 0, out + err
    assert "3 passed, 0 failed, 0 skipped" in out
