import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"


def _iree_compile_available() -> bool:
    try:
        from kitdispatch.iree.tools import find_iree_compile

        return bool(find_iree_compile())
    except Exception:
        return False


def _cuda_available() -> bool:
    from kitdispatch.run.module import cuda_status

    return cuda_status().available


HAVE_IREE_COMPILE = _iree_compile_available()
HAVE_CUDA = _cuda_available()
HAVE_NVCC = shutil.which("nvcc") is not None


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    """Each test gets its own cache: nothing leaks between tests or into ~/.cache."""
    root = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("KITDISPATCH_CACHE_DIR", str(root / "kitdispatch"))
    return root / "kitdispatch"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA device for IREE's cuda driver")
    skip_nvcc = pytest.mark.skip(reason="nvcc is not on PATH")
    for item in items:
        if "gpu" in item.keywords and not HAVE_CUDA:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not HAVE_NVCC:
            item.add_marker(skip_nvcc)


needs_iree_compile = pytest.mark.skipif(not HAVE_IREE_COMPILE, reason="iree-compile is not installed")


@pytest.fixture(scope="session")
def prebuilt_dir():
    """GPU machines have no iree-compile: they run modules built elsewhere and carried in
    KITDISPATCH_PREBUILT (a folder of build folders named after the samples)."""
    path = os.environ.get("KITDISPATCH_PREBUILT")
    return Path(path) if path else None


def prebuilt_or_build(source: Path, tmp_path_factory, prebuilt_dir, archs: str = "sm_80,sm_90", *, compiler: str = "nvrtc") -> Path:
    """A project built for `archs` here, or its prebuilt copy on a GPU machine (named after
    the project's folder, `NAME.nvcc` for an nvcc build) where there is no iree-compile."""
    name = source.name if compiler == "nvrtc" else f"{source.name}.{compiler}"
    if prebuilt_dir is not None:
        return prebuilt_dir / name
    if not HAVE_IREE_COMPILE:
        pytest.skip("neither iree-compile nor KITDISPATCH_PREBUILT is available")
    if compiler == "nvcc" and not HAVE_NVCC:
        pytest.skip("nvcc is not on PATH")
    from kitdispatch import BuildOptions
    from kitdispatch import build

    out = tmp_path_factory.mktemp(name)
    build(source, BuildOptions.create(archs, compiler=compiler), out)
    return out


@pytest.fixture(scope="session")
def simple_mul_build(tmp_path_factory, prebuilt_dir):
    """The simple_mul sample built for sm_80 and sm_90 (or the prebuilt copy)."""
    return prebuilt_or_build(SAMPLES / "simple_mul", tmp_path_factory, prebuilt_dir)


# A kernel that doubles `x` into `y`, described from its C signature: the project the safety,
# output-folder and record tests build and break.
DOUBLING_CU = 'extern "C" __global__ void k(const float* x, float* y, int n) { int i = threadIdx.x; if (i < n) y[i] = 2 * x[i]; }\n'
DOUBLING_TOML = """
[[kernels]]
name = "k"
source = "k.cu"
workgroup_size = [64]
workgroup_count = ["ceildiv(n, 64)"]
shapes = { x = "f32[n]", y = "f32[n]" }
"""


def doubling_project(root: Path, cu: str = DOUBLING_CU, toml: str = DOUBLING_TOML) -> Path:
    """The doubling kernel's project at `root` (its source or manifest replaced where given)."""
    return write_kernel_project(root, cu, toml)


def write_kernel_project(root: Path, cu: str, toml: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "k.cu").write_text(cu)
    (root / "kitdispatch.toml").write_text(toml)
    return root


# Property tests of records: any JSON value, every place in a JSON value, and one place replaced.
def json_values():
    from hypothesis import strategies as st

    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=6,
    )


def json_paths(value, prefix=()):
    """Every place in a JSON value, as a path of keys and indexes."""
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield from json_paths(v, prefix + (k,))


def json_replaced_at(value, path, new):
    """`value` with the place at `path` replaced by `new` (a copy; `value` is unchanged)."""
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = json_replaced_at(value[path[0]], path[1:], new)
    return copy
