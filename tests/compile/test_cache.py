"""The object cache: keys, integrity, eviction, safety, and many real processes at once."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kitdispatch import BuildOptions, CompileOptions, KitError, generate
from kitdispatch import build
from kitdispatch.compile.archs import Arch
from kitdispatch.compile.cache import Cache, CacheWarning, object_key
from kitdispatch.compile.compilers import IncludeSearch, NvrtcCompiler

from conftest import kernel_toml, REPO, needs_iree_compile, write_kernel_project

SM80, SM90 = Arch.parse("sm_80"), Arch.parse("sm_90")


@pytest.fixture
def src(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "scale.h").write_text("#define SCALE 2.0f\n")
    (tmp_path / "local.h").write_text("#define OFFSET 1.0f\n")
    path = tmp_path / "k.cu"
    path.write_text('#include "local.h"\n#include <scale.h>\n#include <cuda_fp16.h>\nextern "C" __global__ void k(float* x) { x[0] = SCALE + OFFSET; }\n')
    return path


OPTS = CompileOptions(include_dirs=("INC",))


def key(src, *, compiler="nvrtc", version="13.0", fmt="ptx", archs=(SM80,), options=None):
    options = options or CompileOptions(include_dirs=(str(src.parent / "inc"),))
    return object_key(compiler, version, fmt, archs, options, src, NvrtcCompiler().include_search(src, options))


def test_key_table(src, tmp_path):
    base = key(src)
    differ = {
        "compiler": key(src, compiler="nvcc"),
        "compiler version": key(src, version="13.1"),
        "format": key(src, fmt="cubin"),
        "arch": key(src, archs=(SM90,)),
        "options": key(src, options=CompileOptions(include_dirs=(str(src.parent / "inc"),), defines=("X=1",))),
    }
    for what, other in differ.items():
        assert other != base, what
    # A header edit is a miss, quoted or found through -I.
    (src.parent / "local.h").write_text("#define OFFSET 3.0f\n")
    after_local = key(src)
    assert after_local != base
    (src.parent / "inc" / "scale.h").write_text("#define SCALE 5.0f\n")
    assert key(src) != after_local
    # The same text in another folder, with the same options, is the same object.
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("k.cu", "local.h"):
        (copy / name).write_text((src.parent / name).read_text())
    same_options = CompileOptions(include_dirs=(str(src.parent / "inc"),))
    assert key(copy / "k.cu", options=same_options) == key(src)


def test_same_kernel_name_different_sources_never_share(tmp_path):
    a, b = tmp_path / "a.cu", tmp_path / "b.cu"
    a.write_text('extern "C" __global__ void k(float* x) { x[0] = 1; }\n')
    b.write_text('extern "C" __global__ void k(float* x) { x[0] = 2; }\n')
    assert key(a, options=CompileOptions()) != key(b, options=CompileOptions())


def test_uncacheable_computed_include_still_compiles(tmp_path):
    from kitdispatch.compile.cache import Uncacheable, source_closure

    path = tmp_path / "k.cu"
    path.write_text('#define H "h.h"\n#include H\n')
    with pytest.raises(Uncacheable):
        source_closure(path, IncludeSearch(()))


TOML = kernel_toml(threads=32, body='params = [{ name = "x", inout = "f32[n]" }, { name = "n", scalar = "i32" }]\n')


def project(tmp_path, body="x[i] = 2 * x[i];"):
    cu = 'extern "C" __global__ void k(float* x, int n) { int i = blockIdx.x * 32 + threadIdx.x; if (i < n) { %s } }\n'
    return write_kernel_project(tmp_path / "proj", cu % body, TOML)


def test_second_generate_compiles_nothing(tmp_path, isolated_cache):
    root = project(tmp_path)
    options = BuildOptions.create("sm_80,sm_90")
    first = generate(root, options, tmp_path / "a")
    second = generate(root, options, tmp_path / "b")
    assert first.compiler_runs == 1 and second.compiler_runs == 0
    assert (tmp_path / "a" / first.objects[0].name).read_bytes() == (tmp_path / "b" / second.objects[0].name).read_bytes()
    assert generate(root, BuildOptions.create("sm_80,sm_90", use_cache=False), tmp_path / "c").compiler_runs == 1


@needs_iree_compile
def test_unchanged_build_skips_iree_compile_and_an_edit_relinks(tmp_path):
    root = project(tmp_path)
    options = BuildOptions.create("sm_80", format="ptx")
    assert build(root, options, tmp_path / "a").iree_compile_runs == 1
    again = build(root, options, tmp_path / "b")
    assert (again.compiler_runs, again.iree_compile_runs) == (0, 0)
    project(tmp_path, body="x[i] = 3 * x[i];")
    edited = build(root, options, tmp_path / "c")
    assert (edited.compiler_runs, edited.iree_compile_runs) == (1, 1)


@needs_iree_compile
def test_rebuild_with_nothing_new_leaves_the_output_folder_untouched(tmp_path):
    root = project(tmp_path)
    options = BuildOptions.create("sm_80", format="ptx")
    build(root, options, tmp_path / "out")
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "out").iterdir()}
    again = build(root, options, tmp_path / "out")
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "out").iterdir()} == before
    assert again.vmfb.is_file() and again.record.is_file()
    # A changed output is the user's now: the build refuses to overwrite it.
    again.mlir.write_text("// my edit\n")
    with pytest.raises(KitError, match="was changed since kitdispatch wrote it"):
        build(root, options, tmp_path / "out")
    assert again.mlir.read_text() == "// my edit\n"
    # A damaged record proves nothing about the files beside it: refused, nothing touched.
    again.mlir.unlink()
    again.record.write_text("{}")
    with pytest.raises(KitError, match="is not a build record this kitdispatch can read"):
        build(root, options, tmp_path / "out")
    assert again.record.read_text() == "{}"


def test_corrupt_entry_is_a_miss_and_is_replaced(tmp_path, isolated_cache):
    root = project(tmp_path)
    options = BuildOptions.create("sm_80", format="ptx")
    generate(root, options, tmp_path / "a")
    (entry,) = Cache().entries("object")
    blob = bytearray(entry.read_bytes())
    blob[-5] ^= 0xFF
    entry.write_bytes(bytes(blob))
    result = generate(root, options, tmp_path / "b")
    assert result.compiler_runs == 1
    assert b".entry k" in result.objects[0].read_bytes()
    (entry,) = Cache().entries("object")
    assert Cache().get("object", entry.name) is not None  # valid again
    entry.write_bytes(entry.read_bytes()[:20])  # truncated
    assert generate(root, options, tmp_path / "c").compiler_runs == 1


def test_size_bound_evicts_least_recently_used(tmp_path):
    cache = Cache(tmp_path / "c", max_bytes=10_000)
    for i in range(5):
        cache.put("object", f"{i:02d}" + "0" * 62, {}, os.urandom(3000))
        os.utime(cache._path("object", f"{i:02d}" + "0" * 62), (i, i))
    names = sorted(p.name[:2] for p in cache.entries())
    assert cache.size() <= 10_000
    assert "04" in names and "00" not in names


@pytest.mark.parametrize("make_unsafe, why", [
    (lambda d: (d.rmdir(), d.symlink_to(d.parent / "elsewhere", target_is_directory=True)), "symbolic link"),
    (lambda d: d.chmod(0o777), "writable by group or others"),
    (lambda d: os.chown(d, 65534, -1) if os.getuid() == 0 else pytest.skip("needs root to chown"), "another user"),
])
def test_unsafe_cache_folder_is_refused_but_the_build_works(tmp_path, make_unsafe, why):
    (tmp_path / "elsewhere").mkdir()
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    make_unsafe(cache_dir)
    root = project(tmp_path)
    with pytest.warns(CacheWarning, match=why):
        result = generate(root, BuildOptions.create("sm_80", cache_dir=str(cache_dir)), tmp_path / "out")
    assert result.objects[0].is_file()
    assert not list((tmp_path / "elsewhere").iterdir())


CHILD = textwrap.dedent("""
    import sys
    from kitdispatch import BuildOptions, generate
    generate(sys.argv[1], BuildOptions.create("sm_80,sm_90"), sys.argv[2])
""")


def test_sixteen_concurrent_processes_share_one_entry(tmp_path, isolated_cache):
    root = project(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(tmp_path / f"out{i}")], env=env, stderr=subprocess.PIPE)
        for i in range(16)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    assert len(Cache().entries("object")) == 1
    leftovers = [p for p in isolated_cache.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


KILLED_WRITER = textwrap.dedent("""
    import os, sys, time
    real_fsync = os.fsync
    def stall(fd):
        print("writing", flush=True)
        time.sleep(600)  # killed here: the entry is half-written in its temp file
    os.fsync = stall
    from kitdispatch import BuildOptions, generate
    generate(sys.argv[1], BuildOptions.create("sm_80"), sys.argv[2])
""")


def test_writer_killed_mid_write_leaves_no_entry_and_no_lock(tmp_path, isolated_cache):
    root = project(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(root), str(tmp_path / "dead")], env=env, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert Cache().entries("object") == []  # the temp file is not an entry
    start = time.monotonic()
    result = generate(root, BuildOptions.create("sm_80"), tmp_path / "next")
    assert time.monotonic() - start < 60
    assert result.compiler_runs == 1 and len(Cache().entries("object")) == 1


# ------------------------------------------------------------ issue 21: sizes and the cache's place


def test_a_header_too_large_to_read_under_if_0_is_not_read_and_the_build_works(tmp_path, isolated_cache):
    """A 100 GB (sparse) header behind `#if 0`: the compiler never reads it, and the kit, which
    follows conditional includes for the key, must not either (it would not fit in memory).
    The compile goes on uncached, with the real NVRTC."""
    root = project(tmp_path)
    cu = root / "k.cu"
    cu.write_text('#if 0\n#include "huge.h"\n#endif\n' + cu.read_text())
    with open(root / "huge.h", "wb") as f:
        f.truncate(100 << 30)
    from kitdispatch.compile.cache import Uncacheable, source_closure

    with pytest.raises(Uncacheable, match="huge.h: 107374182400 bytes, over the 64 MiB kitdispatch reads"):
        source_closure(cu, IncludeSearch(()))
    first = generate(root, BuildOptions.create("sm_80"), tmp_path / "out")
    second = generate(root, BuildOptions.create("sm_80"), tmp_path / "out2")
    assert first.compiler_runs == second.compiler_runs == 1  # not cached: the key cannot see the header


def test_a_kernel_source_too_large_to_read_is_a_clear_error(tmp_path):
    root = project(tmp_path)
    with open(root / "k.cu", "r+b") as f:
        f.truncate(100 << 30)
    from conftest import run_cli as run

    code, out, err = run("gen", str(root), "-o", str(tmp_path / "out"))
    assert code == 2, err
    assert "k.cu: the kernel source is 107374182400 bytes, over the 64 MiB kitdispatch reads" in err
    assert "Traceback" not in err and "internal error" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("xdg, expected", [("relative/cache", None), ("", None), ("/abs/cache", "/abs/cache/kitdispatch")])
def test_xdg_cache_home_is_used_only_when_absolute(tmp_path, monkeypatch, xdg, expected):
    """The XDG spec: a relative path in XDG_CACHE_HOME is invalid and ignored (~/.cache then)."""
    from kitdispatch.compile.cache import default_cache_dir

    monkeypatch.delenv("KITDISPATCH_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    monkeypatch.chdir(tmp_path)
    assert default_cache_dir() == Path(expected or tmp_path / "home" / ".cache" / "kitdispatch")
