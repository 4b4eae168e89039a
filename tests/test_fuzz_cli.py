"""Property-based fuzzing of the CLI, in process: any manifest, source and command line gives
exit code 0 or a clean error (never a traceback, never an internal error), and touches no file
outside the output and cache folders."""

import io
import os
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kitdispatch.cli import EXIT_INTERNAL, main

CLEAN_EXITS = {0, 1, 2, 3, 5}
TYPES = ["f32", "f16", "i32", "i64", "bf16", "f64", "u32", "int", "float", "f32[n]", "f32[]", "", "f32[n", "x"]
NAMES = ["k", "x", "y", "n", "k2", "ns::k", "k<int>", "k\n", "", "1k", "k k", "é", "k\0", "a" * 300]
EXPRESSIONS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from(["ceildiv(n, 64)", "n // 0", "n * n", "n +", "(" * 100 + "n" + ")" * 100, "m", "n % -3", "1e3", "n\0"]),
    st.text(max_size=40),
)


def _toml_value(value) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\0", "\\u0000") + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_value(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return str(value).lower() if isinstance(value, bool) else str(value)


def mostly(valid, hostile):
    """The valid value most of the time, so that fuzzing reaches the compilers and the link too."""
    return st.one_of(st.just(valid), st.just(valid), st.just(valid), hostile)


kernels = st.fixed_dictionaries(
    {
        "name": mostly("k", st.sampled_from(NAMES)),
        "source": mostly("k.cu", st.sampled_from(["missing.cu", "sub/../k.cu", "/dev/null", "k.cu\0", "."])),
        "workgroup_size": mostly([64], st.lists(st.integers(-2, 2**40), min_size=0, max_size=4)),
        "workgroup_count": mostly(["ceildiv(n, 64)"], st.lists(EXPRESSIONS, min_size=0, max_size=4)),
        "shapes": mostly({"x": "f32[n]", "y": "f32[n]"}, st.dictionaries(st.sampled_from(NAMES), st.sampled_from(TYPES), max_size=3)),
    },
    optional={
        "scalars": st.dictionaries(st.sampled_from(NAMES), st.sampled_from(TYPES), max_size=2),
        "values": st.dictionaries(st.sampled_from(NAMES), EXPRESSIONS, max_size=2),
        "inout": st.lists(st.sampled_from(NAMES), max_size=2),
        "format": st.sampled_from(["ptx", "cubin", "fatbin", "elf"]),
        "dynamic_shared_memory": st.integers(-1, 2**31),
        "function": st.sampled_from(NAMES),
    },
)
SOURCES = st.sampled_from([
    'extern "C" __global__ void k(const float* x, float* y, int n) { if (threadIdx.x < n) y[threadIdx.x] = x[threadIdx.x]; }\n',
    'extern "C" __global__ void k(const float* x, float* y, int n) { if (threadIdx.x < n) y[threadIdx.x] = x[threadIdx.x]; }\n',
    'extern "C" __global__ void k(float* y, long long n) { }\n',
    "__global__ void k(float* y) { y[0] = 1; }\n",
    "this is not CUDA\n",
    '#include "nowhere.h"\n',
    "",
])
COMMANDS = st.sampled_from(["gen", "build"])
EXTRA = st.lists(
    st.sampled_from(["--arch", "sm_80", "sm_10", "sm_50", "hopper", "--format", "ptx", "--jobs", "0", "-q", "--json", "--no-cache", "--min-driver", "x.y", "--timeout", "-1", "-D", "-I", "/nonexistent"]),
    max_size=3,
).map(lambda extra: ["--format", "ptx", *extra])


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kernel=kernels, source=SOURCES, command=COMMANDS, extra=EXTRA, with_test=st.booleans())
def test_any_input_gives_a_clean_exit_and_touches_only_its_folders(tmp_path_factory, kernel, source, command, extra, with_test):
    root = tmp_path_factory.mktemp("fuzz")
    project = root / "project"
    project.mkdir()
    (project / "k.cu").write_text(source)
    toml = "[[kernels]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in kernel.items())
    if with_test:
        toml += '\n[test]\nreference = "reference.py"\nsizes = { n = 7 }\n'
        (project / "reference.py").write_text("def k(x):\n    return x\n")
    (project / "kitdispatch.toml").write_text(toml)
    (root / "out").mkdir()
    (root / "out" / "keep.txt").write_text("the user's\n")
    before = _tree(project)
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(root)  # relative paths land here, where they are watched
    try:
        code = main([command, str(project), "-o", str(root / "out"), *extra], out, err)
    finally:
        os.chdir(cwd)
    event(f"exit {code}")
    assert code in CLEAN_EXITS and code != EXIT_INTERNAL, err.getvalue()
    assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue(), err.getvalue()
    assert _tree(project) == before  # the project is read, never written
    assert (root / "out" / "keep.txt").read_text() == "the user's\n"
    assert {p.name for p in root.iterdir()} <= {"project", "out"}
    if code != 0:
        assert {p.name for p in (root / "out").iterdir()} == {"keep.txt"}  # nothing half-written


# ------------------------------------------- hostile records, journals and model records

import hashlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import pytest  # noqa: E402

from conftest import needs_iree_compile  # noqa: E402

VICTIM = b"a file outside the output folder\n"
NOTES = b"the user's notes, inside the output folder\n"
PLANTED = ["proj.kitdispatch.json", ".proj.kitdispatch-publishing", "m.model.json", "other.kitdispatch.json", ".m.model.json.kitdispatch-publishing"]
KINDS = ["json", "json", "json", "json", "fifo", "symlink to the victim", "symlink to /dev/zero", "folder", "another user's", "hard-linked"]
HOSTILE_NAMES = st.sampled_from([
    "../victim.txt", "../../victim.txt", "VICTIM_ABS", "sub/../../victim.txt", "..", ".", "", "a\0b", "proj.vmfb",
    "proj.mlir", "k.sm_80.ptx", "notes.txt", "proj.kitdispatch.json", ".proj.kitdispatch-publishing",
    ".kitdispatch-staging-1.x", "a" * 300, "é", "x\\..\\victim.txt",
])
# A hash is the victim's (what a planter would write), a valid hex digest, or junk. The notes'
# own hash is left out on purpose: a journal planted by the user themself, as a regular file
# naming the exact hash of a file beside it, cannot be told from the kit's (see test_outputs).
HASHES = st.one_of(st.just(hashlib.sha256(VICTIM).hexdigest()), st.just("*"), st.text("0123456789abcdef", min_size=64, max_size=64), st.integers(), st.none())
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), HOSTILE_NAMES, st.text(max_size=20))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)
FIELDS = ["files", "vmfb", "baseline_vmfb", "mlir", "objects", "test", "schema", "name", "functions", "inputs", "archs", "kernel_formats"]


@st.composite
def hostile_documents(draw, base: dict) -> bytes:
    """A real record with fields replaced by hostile values, any JSON, or any bytes."""
    how = draw(st.sampled_from(["mutated", "mutated", "mutated", "any json", "bytes"]))
    if how == "bytes":
        return draw(st.binary(max_size=200))
    if how == "any json":
        return json.dumps(draw(JSON_VALUES)).encode()
    doc = json.loads(json.dumps(base))
    for field in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3)):
        if field in ("files", "inputs"):
            doc[field] = draw(st.dictionaries(HOSTILE_NAMES, HASHES, max_size=4)) if draw(st.booleans()) else draw(JSON_VALUES)
        elif field == "test":
            doc[field] = {**base.get("test", {}), "reference": draw(HOSTILE_NAMES)}
        else:
            doc[field] = draw(st.one_of(HOSTILE_NAMES, JSON_VALUES))
    return json.dumps(doc).encode()


@pytest.fixture(scope="module")
def built_once(tmp_path_factory):
    if not __import__("conftest").HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    root = tmp_path_factory.mktemp("built")
    project = root / "project"
    project.mkdir()
    (project / "k.cu").write_text('extern "C" __global__ void k(const float* x, float* y, int n) { if (threadIdx.x < n) y[threadIdx.x] = x[threadIdx.x]; }\n')
    (project / "kitdispatch.toml").write_text('name = "proj"\n[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [64]\nworkgroup_count = ["ceildiv(n, 64)"]\nshapes = { x = "f32[n]", y = "f32[n]" }\n')
    out = root / "out"
    code = main(["build", str(project), "--arch", "sm_80", "--format", "ptx", "-o", str(out), "-q"], io.StringIO(), io.StringIO())
    assert code == 0
    return project, out


def _plant(path: Path, kind: str, data: bytes, victim: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink to the victim":
        path.symlink_to(victim)
    elif kind == "symlink to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(data.replace(b"VICTIM_ABS", str(victim).encode()))
        if kind == "another user's":
            os.chown(path, 54321, 54321)
        elif kind == "hard-linked":
            os.link(path, victim.parent / "second-name")


@contextmanager
def _hang_fails(seconds: int):
    """A command still running after `seconds` raises in it (a FIFO opened for reading blocks)."""
    def hung(signum, frame):
        raise TimeoutError(f"the command hung for {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _listing(folder: Path) -> dict[str, bytes]:
    found = {}
    for p in folder.rglob("*"):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            found[rel] = b"-> " + os.readlink(p).encode()
        elif p.is_file():
            found[rel] = p.read_bytes()
        else:
            found[rel] = b"<not a regular file>"
    return found


@needs_iree_compile
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), planted=st.sampled_from(PLANTED), kind=st.sampled_from(KINDS), command=st.sampled_from(["gen", "build", "test", "run", "compare"]))
def test_hostile_records_journals_and_model_records_give_a_clean_exit_and_lose_nothing(tmp_path_factory, built_once, data, planted, kind, command):
    project, built = built_once
    root = tmp_path_factory.mktemp("hostile")
    out = root / "out"
    shutil.copytree(built, out)
    (out / "notes.txt").write_bytes(NOTES)
    victim = root / "victim.txt"
    victim.write_bytes(VICTIM)
    base = json.loads((built / "proj.kitdispatch.json").read_bytes())
    if planted.startswith(("m.", ".m.")):
        base = {"schema": 1, "vmfb": "proj.vmfb", "baseline_vmfb": "proj.vmfb", "functions": [], "files": base["files"]}
    path = out / planted
    if path.exists():
        path.unlink()
    _plant(path, kind, data.draw(hostile_documents(base)), victim)
    before_out, before_project = _listing(out), _listing(project)
    argv = {
        "gen": ["gen", project, "--arch", "sm_80", "--format", "ptx", "-o", out],
        "build": ["build", project, "--arch", "sm_80", "--format", "ptx", "-o", out],
        "test": ["test", out],
        "run": ["run", out / "proj.vmfb", "--function", "k", "--input", "4xf32=1", "--input", "4xf32=0", "--input", "4"],
        "compare": ["compare", out],
    }[command]
    err = io.StringIO()
    with _hang_fails(120):
        code = main([str(a) for a in argv], io.StringIO(), err)
    event(f"{command} {kind}: exit {code}")
    assert code in CLEAN_EXITS and code != EXIT_INTERNAL, err.getvalue()
    assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue(), err.getvalue()
    assert victim.read_bytes() == VICTIM and (out / "notes.txt").read_bytes() == NOTES
    assert _listing(project) == before_project
    assert {p.name for p in root.iterdir()} <= {"out", "victim.txt", "second-name"}
    if code != 0 or command in ("test", "run", "compare"):
        assert _listing(out) == before_out  # refused, or only read: nothing changed
