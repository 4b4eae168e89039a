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
