"""Several modules in one build: real NVRTC and iree-compile, sharing the cores."""

import importlib
import io
import json
import threading

import pytest

from kitdispatch import BuildOptions, BuildsFailed, CompileError, KitError, ManifestError, build_all, generate_all
from kitdispatch import build
from kitdispatch._parallel import CpuSlots
from kitdispatch.cli import main

from conftest import SAMPLES, needs_iree_compile, write_kernel_project

build_module = importlib.import_module("kitdispatch.builder.pipeline")  # the package's `build` is the function

pytestmark = needs_iree_compile

GOOD_CU = 'extern "C" __global__ void twice(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] *= 2.0f; }\n'
BROKEN_CU = 'extern "C" __global__ void twice(float* x, int n) {\n  x[0] = oops;\n}\n'


def project(root, name, cu=GOOD_CU):
    toml = (
        f'name = "{name}"\n[[kernels]]\nname = "twice"\nsource = "k.cu"\nworkgroup_size = [64]\n'
        'workgroup_count = ["ceildiv(n, 64)"]\nshapes = { x = "f32[n]" }\n'
    )
    return write_kernel_project(root / name, cu, toml)


def test_modules_build_into_folders_of_their_names(tmp_path):
    events = []
    results = build_all(
        [SAMPLES / "simple_mul", project(tmp_path / "src", "other")],
        BuildOptions.create("sm_80,sm_90"),
        tmp_path / "out",
        progress=events.append,
    )
    assert [r.name for r in results] == ["simple_mul", "other"]  # the order they were given in
    assert results[0].vmfb == tmp_path / "out" / "simple_mul" / "simple_mul.vmfb"
    assert results[1].vmfb == tmp_path / "out" / "other" / "other.vmfb"
    assert all(r.vmfb.stat().st_size > 0 and r.compiler_runs == 1 and r.iree_compile_runs == 1 for r in results)
    # One count over both modules (a fatbin and a link each), each step named by its module.
    assert [e.done for e in events] == [1, 2, 3, 4] and {e.total for e in events} == {4}
    assert sorted(e.what.split(":")[0] for e in events) == ["other", "other", "simple_mul", "simple_mul"]


def test_modules_built_together_match_modules_built_alone(tmp_path):
    options = BuildOptions.create("sm_80", format="ptx", use_cache=False)
    together = build_all([SAMPLES / "simple_mul", SAMPLES / "mlp_layer"], options, tmp_path / "all")
    for result in together:
        alone = build(SAMPLES / result.name, options, tmp_path / "alone" / result.name)
        assert alone.vmfb.read_bytes() == result.vmfb.read_bytes()
        assert alone.mlir.read_text() == result.mlir.read_text()


def test_generate_all_stops_before_the_vmfbs(tmp_path):
    results = generate_all([project(tmp_path / "src", "a"), project(tmp_path / "src", "b")], BuildOptions.create("sm_80"), tmp_path / "out")
    assert [r.vmfb for r in results] == [None, None]
    assert (tmp_path / "out" / "a" / "a.mlir").is_file() and (tmp_path / "out" / "b" / "b.mlir").is_file()


def test_two_modules_of_one_name_are_refused_before_any_work(tmp_path):
    first, second = project(tmp_path / "one", "same"), project(tmp_path / "two", "same")
    with pytest.raises(ManifestError, match=r"are both named 'same'") as info:
        build_all([first, second], BuildOptions.create("sm_80"), tmp_path / "out")
    assert str(first) in str(info.value) and str(second) in str(info.value)
    assert not (tmp_path / "out").exists()


def test_a_failing_module_leaves_the_others_built(tmp_path):
    good, bad = project(tmp_path / "src", "good"), project(tmp_path / "src", "bad", BROKEN_CU)
    with pytest.raises(CompileError, match=r"k.cu:2"):
        build_all([good, bad], BuildOptions.create("sm_80"), tmp_path / "out")
    assert (tmp_path / "out" / "good" / "good.vmfb").is_file()
    assert not (tmp_path / "out" / "bad").exists()
    assert not [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no staging left


def test_every_failing_module_is_reported(tmp_path):
    bad = [project(tmp_path / "src", name, BROKEN_CU) for name in ("bad1", "bad2")]
    with pytest.raises(BuildsFailed) as info:
        build_all([*bad, project(tmp_path / "src", "good")], BuildOptions.create("sm_80"), tmp_path / "out")
    text = info.value.render()
    assert text.startswith("2 of 3 modules failed:")
    for name in ("bad1", "bad2"):
        assert f"[{name}] {tmp_path}/src/{name}/k.cu:2: NVRTC failed to compile" in text
    assert info.value.exit_code == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["good"]


class CountingSlots(CpuSlots):
    """The build's own slots, recording how many steps held one at once."""

    most = 0

    def __init__(self, size=None):
        super().__init__(size)
        self._held = 0
        self._lock = threading.Lock()

    def __enter__(self):
        super().__enter__()
        with self._lock:
            self._held += 1
            CountingSlots.most = max(CountingSlots.most, self._held)
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._held -= 1
        super().__exit__(*exc)


@pytest.mark.parametrize("jobs", [1, 2])
def test_compiles_and_links_of_every_module_share_the_jobs_bound(tmp_path, monkeypatch, jobs):
    monkeypatch.setattr(build_module, "CpuSlots", CountingSlots)
    CountingSlots.most = 0
    specs = [project(tmp_path / "src", f"m{i}") for i in range(3)]
    # Three modules of a three-architecture fatbin each: nine compiles and three links could overlap.
    build_all(specs, BuildOptions.create("sm_80,sm_86,sm_90", jobs=jobs, use_cache=False), tmp_path / "out")
    assert CountingSlots.most == jobs


def test_jobs_must_be_positive():
    with pytest.raises(KitError, match=r"--jobs must be at least 1, got 0"):
        BuildOptions.create("sm_80", jobs=0)


# ---------------------------------------------------------------------------------- CLI


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), out, err), out.getvalue(), err.getvalue()


def test_cli_builds_several_manifests(tmp_path):
    other = project(tmp_path / "src", "other")
    code, out, err = run("build", str(SAMPLES / "simple_mul"), str(other), "-o", str(tmp_path / "out"), "--json")
    assert code == 0, err
    modules = json.loads(out)["modules"]
    assert [m["name"] for m in modules] == ["simple_mul", "other"]
    assert modules[1]["vmfb"] == str(tmp_path / "out" / "other" / "other.vmfb")
    assert "[4/4]" in err


def test_cli_reports_every_failing_manifest(tmp_path):
    bad = [str(project(tmp_path / "src", name, BROKEN_CU)) for name in ("bad1", "bad2")]
    code, out, err = run("build", *bad, "-o", str(tmp_path / "out"), "-q")
    assert code == 1 and out == ""
    assert "error: 2 of 2 modules failed:" in err and "[bad1]" in err and "[bad2]" in err and "fix:" in err
