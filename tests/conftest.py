import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"  # kernel projects the tests build
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


def kernel_toml(name: str = "k", *, threads: int = 64, size: str = "n", source: str = "k.cu", module: str | None = None, body: str = "") -> str:
    """A manifest of one 1-D kernel: `threads` a workgroup, ceildiv(size, threads) workgroups,
    `body` (its shapes or params, values...) after; `module` names the module."""
    head = f'name = "{module}"\n\n' if module else ""
    return (f'{head}[[kernels]]\nname = "{name}"\nsource = "{source}"\nworkgroup_size = [{threads}]\n'
            f'workgroup_count = ["ceildiv({size}, {threads})"]\n{body}')


# A kernel that doubles `x` into `y`, described from its C signature: the project the safety,
# output-folder and record tests build and break.
DOUBLING_CU = 'extern "C" __global__ void k(const float* x, float* y, int n) { int i = threadIdx.x; if (i < n) y[i] = 2 * x[i]; }\n'
DOUBLING_TOML = kernel_toml(body='shapes = { x = "f32[n]", y = "f32[n]" }\n')


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


# ---------------------------------------------------------------- shared factories


def run_cli(*argv: str) -> tuple[int, str, str]:
    """`kitdispatch ARGV...` in process: (exit code, stdout, stderr)."""
    import io

    from kitdispatch.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


CPU_DEVICE = "local-task"


def write_record(functions_json: Path, vmfb: Path) -> None:
    """A build record beside `vmfb`, as a kit build writes it (its functions from the data file)."""
    import json

    import kitdispatch as kd
    from kitdispatch.describe.module import TestSpec
    from kitdispatch.describe.record import BuildRecord, file_sha256, record_beside
    from kitdispatch.describe.types import FunctionSignature

    functions = tuple(FunctionSignature.from_json(f, vmfb.stem) for f in json.loads(functions_json.read_text())["functions"])
    record = BuildRecord(
        name=vmfb.stem, kitdispatch=kd.__version__, mlir=f"{vmfb.stem}.mlir", vmfb=vmfb.name, archs=(), format="cpu",
        kernel_formats={}, ptx_isa=None, compiler={"name": "iree-cpu", "version": "-"}, iree_compiler=None,
        codegen_target="generic", objects=(), functions=functions, test=TestSpec(),
        files={vmfb.name: file_sha256(vmfb)},
    )
    record_beside(vmfb).write_bytes(record.to_bytes())


def cpu_module_vmfb(data: Path, name: str, out_dir: Path) -> Path:
    """tests/data/<data>/<name>.mlir (the ABI the kit generates, with IREE's CPU codegen in place
    of CUDA kernels) compiled for IREE's local-task device, with its build record."""
    import subprocess

    from kitdispatch.iree.tools import find_iree_compile

    if not HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    vmfb = out_dir / f"{name}.vmfb"
    subprocess.run(
        [find_iree_compile(), str(data / f"{name}.mlir"), "--iree-hal-target-device=local",
         "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=generic", "-o", str(vmfb)],
        check=True, timeout=300,
    )
    write_record(data / f"{name}.kitdispatch.json", vmfb)
    return vmfb


@pytest.fixture(scope="module")
def cpu_sized_module(tmp_path_factory):
    """tests/data/cpu_sized loaded on the CPU: results sized by scalar arguments."""
    import kitdispatch as kd

    return kd.load_module(cpu_module_vmfb(DATA / "cpu_sized", "sized", tmp_path_factory.mktemp("cpu_sized")), device=CPU_DEVICE)
