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


CPU_FLAGS = ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=generic")
EMBEDDING = DATA / "embedding" / "make_model.py"


def make_embedding_model(path: Path, *args) -> None:
    """tests/data/embedding: token and position ids through Gathers, a mask, a Softmax."""
    pytest.importorskip("onnx")
    import subprocess
    import sys

    subprocess.run([sys.executable, str(EMBEDDING), str(path), *map(str, args)], check=True, timeout=120)


def cpu_model_build(model: Path, out_dir: Path, *, baseline: bool = True, transients: bool = True) -> Path:
    """A model build folder as build_model writes one (NAME.vmfb, NAME.baseline.vmfb, the model
    record with the functions and their index bounds read by models/functions.py), compiled by
    IREE alone for its local-task device, so the run side can load and call a model on the CPU.
    NAME.vmfb has the functions' NAME$async_transients twins (models/transients.py), as a model
    build's has, unless not `transients`."""
    import dataclasses
    import subprocess

    from kitdispatch.describe.model_record import ModelRecord, model_record_name
    from kitdispatch.describe.record import sha256
    from kitdispatch.iree.tools import find_tool
    from kitdispatch.models.functions import model_functions
    from kitdispatch.models.pipeline import STAGE, import_model
    from kitdispatch.models.spec import parse_mlir
    from kitdispatch.models.transients import FLAGS, add_twins

    if not HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    out_dir.mkdir(parents=True, exist_ok=True)
    imported = import_model(model, out_dir / "model.imported.mlir")
    compile_ = [find_tool("iree-compile"), str(imported), *CPU_FLAGS]
    stage = out_dir / "stage.mlir"
    subprocess.run([*compile_, f"--compile-to={STAGE}", "-o", str(stage)], check=True, timeout=300)
    _, module = parse_mlir(stage)
    twins = add_twins(stage.read_text()) if transients else None
    names = ["model.vmfb", "model.baseline.vmfb"] if baseline else ["model.vmfb"]
    for name in names:
        if name == "model.vmfb" and twins is not None and twins.names:
            (out_dir / "twins.mlir").write_text(twins.text)
            argv = [find_tool("iree-compile"), str(out_dir / "twins.mlir"), *CPU_FLAGS, *FLAGS, f"--compile-from={STAGE}"]
        else:
            argv = compile_
        subprocess.run([*argv, "-o", str(out_dir / name)], check=True, timeout=300)
    functions = model_functions(module)
    if twins is not None:  # as build_model records them: the twins IREE sized as a constant
        sized = twins.sized(out_dir / "model.vmfb").names
        functions = tuple(dataclasses.replace(f, transients=f.name in sized) for f in functions)
    record = ModelRecord(
        kitdispatch="tests", model=str(model), project="", vmfb=names[0], baseline_vmfb=names[1] if baseline else None, spec="",
        archs=(), codegen_target="", iree_compiler="", iree_flags=CPU_FLAGS, matched_after=("global-optimization",),
        functions=functions, replaced=(), not_replaced=(), kernel_executables=(),
        files={n: sha256((out_dir / n).read_bytes()) for n in names},
    )
    (out_dir / model_record_name("model")).write_bytes(record.to_bytes())
    return out_dir


# ============================================================ models: factories (tests/models)
# Kernels, models and builds the tests of kitdispatch/models share. Below the rest: merges stay easy.

import io  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from kitdispatch import Buffer, Kernel, Scalar, TensorType  # noqa: E402
from kitdispatch.describe.index_expr import IndexExpr  # noqa: E402
from kitdispatch.models.replace import read_ops  # noqa: E402


SOFTMAX_CU = REPO / "kernels" / "softmax" / "softmax.cu"


MATMUL_CU = REPO / "kernels" / "matmul" / "matmul.cu"


ELEMENTWISE = REPO / "kernels" / "elementwise"


ATTENTION = REPO / "kernels" / "attention"


def softmax_kernel(dtype="f32", cols="cols", **replace_when) -> Kernel:
    return Kernel.create(
        "row_softmax", SOFTMAX_CU,
        [Buffer("x", "in", TensorType(dtype, ("rows", cols))), Buffer("out", "out", TensorType(dtype, ("rows", cols))),
         Scalar("rows", "i32"), Scalar("cols", "i32", None if cols == "cols" else IndexExpr.parse(cols, "cols"))],
        workgroup_size=[256], workgroup_count=["ceildiv(rows, 32) + 1024"],
        replaces=replaces_of("linalg.softmax", **replace_when),
    )


def matmul_kernel(a="f16[m,k]", b="f16[k,n]", c="f32[m,n]", access="out", kind="linalg.matmul", **replace_when) -> Kernel:
    return Kernel.create(
        "matmul_f16", MATMUL_CU,
        [Buffer("a", "in", TensorType.parse(a, "a")), Buffer("b", "in", TensorType.parse(b, "b")),
         Buffer("c", access, TensorType.parse(c, "c")), Scalar("m", "i32"), Scalar("n", "i32"), Scalar("k", "i32")],
        workgroup_size=[128], workgroup_count=["ceildiv(n, 64)", "ceildiv(m, 64)"],
        replaces=replaces_of(kind, **replace_when),
    )


def replaces_of(kind, **when):
    from kitdispatch import Replaces

    return Replaces.create([kind], **when)


def ops_of(mlir: str, kinds=("linalg.softmax", "linalg.matmul", "linalg.batch_matmul")):
    from iree.compiler import ir

    module = ir.Module.parse(mlir, ir.Context())
    return [facts for _, facts in read_ops(module, kinds)]


def softmax_model(shape="512x1000", dtype="f32", dim=1) -> str:
    t = f"tensor<{shape}x{dtype}>"
    dynamic = [i for i, d in enumerate(shape.split("x")) if d == "?"]
    dims = "".join(f"  %c{i} = arith.constant {i} : index\n  %d{i} = tensor.dim %x, %c{i} : {t}\n" for i in dynamic)
    return f"""
func.func @forward(%x: {t}) -> {t} {{
{dims}  %e = tensor.empty({", ".join(f"%d{i}" for i in dynamic)}) : {t}
  %s = linalg.softmax dimension({dim}) ins(%x : {t}) outs(%e : {t}) -> {t}
  return %s : {t}
}}"""


def matmul_model(m=512, k=256, n=1000, init="0.0", dtype="f16", transpose_b=False) -> str:
    a, c = f"tensor<{m}x{k}x{dtype}>", f"tensor<{m}x{n}xf32>"
    b = f"tensor<{n}x{k}x{dtype}>" if transpose_b else f"tensor<{k}x{n}x{dtype}>"
    maps = (
        " indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d1, d2)>, "
        "affine_map<(d0, d1, d2) -> (d0, d1)>]"
        if transpose_b else ""
    )
    acc = (
        f"%e = tensor.empty() : {c}\n  %acc = linalg.fill ins(%cst : f32) outs(%e : {c}) -> {c}"
        if init is not None else f"%acc = tensor.empty() : {c}"
    )
    return f"""
func.func @forward(%a: {a}, %b: {b}) -> {c} {{
  %cst = arith.constant {init or 0.0} : f32
  {acc}
  %r = linalg.matmul{maps} ins(%a, %b : {a}, {b}) outs(%acc : {c}) -> {c}
  return %r : {c}
}}"""


def only(decisions):
    assert len(decisions) == 1
    return decisions[0]


KERNEL_TOML = """
[[kernels]]
name = "row_softmax"
source = "{src}"
workgroup_size = [256]
workgroup_count = ["ceildiv(rows, 32) + 1024"]
params = [
  {{ name = "x", in = "f32[rows,cols]" }},
  {{ name = "out", out = "f32[rows,cols]" }},
  {{ name = "rows", scalar = "i32" }},
  {{ name = "cols", scalar = "i32" }},
]
"""


def model_project(tmp_path, extra='replaces = ["linalg.softmax"]'):
    root = tmp_path / "project"
    root.mkdir()
    (root / "kitdispatch.toml").write_text(KERNEL_TOML.format(src=SOFTMAX_CU) + extra + "\n")
    return root


LINALG_MODEL = """
func.func @forward(%x: tensor<512x256xf32>, %w: tensor<256x1000xf32>) -> (tensor<512x1000xf32>, tensor<1000x512xf32>) {
  %cst = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<512x1000xf32>
  %f = linalg.fill ins(%cst : f32) outs(%e : tensor<512x1000xf32>) -> tensor<512x1000xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<512x256xf32>, tensor<256x1000xf32>) outs(%f : tensor<512x1000xf32>) -> tensor<512x1000xf32>
  %e2 = tensor.empty() : tensor<512x1000xf32>
  %sm = linalg.softmax dimension(1) ins(%mm : tensor<512x1000xf32>) outs(%e2 : tensor<512x1000xf32>) -> tensor<512x1000xf32>
  %e3 = tensor.empty() : tensor<1000x512xf32>
  %t = linalg.transpose ins(%sm : tensor<512x1000xf32>) outs(%e3 : tensor<1000x512xf32>) permutation = [1, 0]
  %e4 = tensor.empty() : tensor<1000x512xf32>
  %sm2 = linalg.softmax dimension(0) ins(%t : tensor<1000x512xf32>) outs(%e4 : tensor<1000x512xf32>) -> tensor<1000x512xf32>
  return %sm, %sm2 : tensor<512x1000xf32>, tensor<1000x512xf32>
}
"""


@pytest.fixture(scope="session")
def linalg_build(tmp_path_factory):
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    if not HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    tmp = tmp_path_factory.mktemp("linalg")
    model = tmp / "mm_softmax.mlir"
    model.write_text(LINALG_MODEL)
    out = tmp / "out"
    # The project alone: the library's kernels would add the matmul to what is kept.
    result = build_model(model_project(tmp), model, BuildOptions.create("sm_90"), out, library=False, with_baseline=True)
    return result, model, out


def dump_module(vmfb) -> str:
    from kitdispatch.iree.tools import find_tool

    return subprocess.run([find_tool("iree-dump-module"), str(vmfb)], capture_output=True, text=True, timeout=120, check=True).stdout


def dispatch_calls(vmfb) -> int:
    """The dispatches one call of a model's function records (its module's
    hal.command_buffer.dispatch calls). A kit build records each twice, for NAME$async and for
    its NAME$async_transients twin (models/transients.py): counted once."""
    text = dump_module(vmfb)
    calls = text.count("vm.call.variadic @hal.command_buffer.dispatch")
    asyncs = len(re.findall(r"\] \S+\$async\(", text))
    twins = len(re.findall(r"\] \S+\$async_transients\(", text))
    if not twins:
        return calls
    assert twins == asyncs and calls % 2 == 0, f"{vmfb}: {twins} twins of {asyncs} functions and {calls} dispatch calls: count them by hand"
    return calls // 2


def make_sample_model(sample: str, path, *args) -> None:
    pytest.importorskip("onnx")
    subprocess.run([sys.executable, str(SAMPLES / sample / "make_model.py"), str(path), *map(str, args)], check=True, timeout=120)


def cli_build(project, model, out, *extra) -> tuple[int, str, str]:
    from kitdispatch.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    rc = main(["build", str(project), "--model", str(model), "--arch", "sm_90", "-o", str(out), "--json", *extra], stdout, stderr)
    return rc, stdout.getvalue(), stderr.getvalue()


def iree_dispatches(vmfb, kind: str) -> set[str]:
    """IREE's own dispatches named after an op kind (`..._dispatch_0_matmul_1024x...`)."""
    return set(re.findall(rf"dispatch_\d+_{kind}_\w+", vmfb.read_bytes().decode("latin-1")))


LLAMA = REPO / "tests" / "data" / "llama_layer" / "make_model.py"


def make_llama_layer(path, *args) -> None:
    pytest.importorskip("onnx")
    subprocess.run([sys.executable, str(LLAMA), str(path), *map(str, args)], check=True, timeout=120)


MATMUL_FORMS = REPO / "tests" / "data" / "matmul_forms" / "make_model.py"


def make_matmul_form(path, form: str, *args) -> None:
    """One ONNX matmul as exporters write it (tests/data/matmul_forms/make_model.py FORM)."""
    pytest.importorskip("onnx")
    subprocess.run([sys.executable, str(MATMUL_FORMS), str(path), form, *map(str, args)], check=True, timeout=120)


def ops_at_matching_stage(model, tmp, kinds=("linalg.matmul", "linalg.batch_matmul")):
    """The facts of a model's ops of `kinds` where the kit matches them: imported (an .onnx
    through iree-import-onnx), then iree-compile to the pipeline's stage, as a model build does."""
    from kitdispatch.iree.tools import find_tool
    from kitdispatch.models.pipeline import STAGE, import_model

    imported = import_model(Path(model), Path(tmp) / "imported.mlir")
    staged = Path(tmp) / "staged.mlir"
    subprocess.run(
        [find_tool("iree-compile"), str(imported), "--iree-hal-target-device=cuda", "--iree-cuda-target=sm_89",
         f"--compile-to={STAGE}", "-o", str(staged)],
        check=True, timeout=300, capture_output=True,
    )
    return ops_of(staged.read_text(), kinds)


def chains_of(mlir: str, kinds=("linalg.matmul", "linalg.batch_matmul")) -> list:
    """The epilogue chain (models/ops/epilogue.py's read_chain) of each op of `kinds` in the
    module, in order; ops of other dialects are allowed (`"test.use"(%v)` as a reader)."""
    from iree.compiler import ir

    from kitdispatch.models.ops.epilogue import read_chain

    context = ir.Context()
    context.allow_unregistered_dialects = True
    module = ir.Module.parse(mlir, context)
    found = []

    def visit(op):
        if op.name in kinds:
            found.append(read_chain(op))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def chain_of(mlir: str, kinds=("linalg.matmul", "linalg.batch_matmul")):
    """The epilogue chain of the module's one op of `kinds`."""
    return only(chains_of(mlir, kinds))


def onnx_build_with_baseline(tmp_path_factory, kernels, make, name: str):
    """The ONNX model `make(PATH)` writes (NAME.onnx), built with `kernels` alone (not the
    library) for sm_90a and by IREE alone beside it (the baseline): build_model's result."""
    pytest.importorskip("onnx")
    if not HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    tmp = tmp_path_factory.mktemp(name)
    model = make(tmp / f"{name}.onnx")
    return build_model(kernels, model, BuildOptions.create("sm_90a"), tmp / "out", library=False, with_baseline=True)


def library_onnx_build(tmp_path_factory, name: str, make, *, baseline: bool = True):
    """The ONNX model `make(PATH)` writes (NAME.onnx), built with the whole library for sm_90a
    (and by IREE alone beside it): build_model's result."""
    pytest.importorskip("onnx")
    if not HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    tmp = tmp_path_factory.mktemp(name)
    model = make(tmp / f"{name}.onnx")
    return build_model(None, model, BuildOptions.create("sm_90a"), tmp / "out", with_baseline=baseline)


def replaced_ops(built) -> list[dict]:
    """The report's replaced ops of a model build."""
    return json.loads(built.report.read_text())["replaced"]


def iree_own_dispatches(vmfb) -> list[str]:
    """IREE's own dispatch kinds in a module, without their numbers (`elementwise_transpose`, `conv`)."""
    names = set(re.findall(r"\$async_dispatch_\d+_[a-z_]+?(?=_\d|_f|_i|$)", vmfb.read_bytes().decode("latin-1")))
    return sorted({re.sub(r"^\$async_dispatch_\d+_", "", n) for n in names})


def prebuilt_or_fixture(request, prebuilt_dir, prebuilt: str, fixture: str) -> Path:
    """A model build's folder: on a GPU machine without iree-compile the one tools/prebuild.py
    wrote as `prebuilt` (skipped where it was not prebuilt), else the `fixture`'s build here."""
    if prebuilt_dir is not None:
        built = prebuilt_dir / prebuilt
        if not built.is_dir():
            pytest.skip(f"{built} was not prebuilt")
        return built
    return request.getfixturevalue(fixture).out_dir


def library_matmul_kernels():
    """The kernels of kernels/matmul that replace model ops, in manifest order."""
    from kitdispatch import load_manifest
    from kitdispatch.models.replace import replacing_kernels

    return replacing_kernels(load_manifest(REPO / "kernels" / "matmul"))


def _matmul_configs():
    """kernels/matmul/configs.py, loaded from the checkout."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernels_matmul_configs", REPO / "kernels" / "matmul" / "configs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def choose_config(*shape):
    """kernels/matmul/configs.py's choose_config(m, n, k, dtype, batch)."""
    return _matmul_configs().choose_config(*shape)


def report_sizes(record: dict) -> tuple[int, int, int]:
    """(m, n, k) of a matmul the build report lists: a [.., m, k], result [.., m, n]."""
    m, k = record["inputs"][0]["shape"][-2:]
    return m, record["result"]["shape"][-1], k


def f32_matmul_entry(family: str, m: int, n: int, k: int, batch: int = 1) -> str:
    """The library's f32 entry of `family` (e.g. matmul_nn_f32_none, bmm_nt_f32_none) for
    C[m, n] = A[m, k] B (`batch` of them): the config configs.choose_config_f32 picks."""
    config = _matmul_configs().choose_config_f32(m, n, k, batch)
    return family + (f"_{config}" if config else "")


# kernels/matmul's 342 entries take about 3 minutes to build for sm_80 on 2 cores (NVRTC 4 min of
# CPU, iree-compile 1 min; measured): here a representative subset builds, one entry of every
# source file, config, epilogue kind and arithmetic (each generated entry compiles only with
# its own define, so a subset compiles only its entries). `tools/prebuild.py` builds them all;
# tests that compile the library's sources (test_abi, test_roles) take the subset too.
MATMUL_SUBSET = (
    "matmul_f16", "matmul_bf16", "matmul_f16_f16", "matmul_bf16_bf16", "matmul_f16_bf16", "matmul_bf16_f16",
    "matmul_nt_f16_f32_none", "matmul_nt_f16_f32_none_t128x128", "matmul_nt_f16_f32_none_t128x128_k2",
    "matmul_nt_f16_f32_none_t128x64_k4", "matmul_nt_f16_f32_none_t128x128_p", "matmul_nn_bf16_bias_gelu_tanh_t128x128",
    "matmul_nn_f16_bias_residual_t128x128_p", "matmul_nt_bf16_bias_gelu_erf_t128x128_p",  # ping-pong, cooperative
    "bmm_nn_f16_f32_none_t128x128", "bmm_nt_bf16_scale_t128x64_k4",
    "matmul_nn_f32_none", "matmul_nt_f32_tf32_bias_gelu_erf", "matmul_nn_f32_bias_residual_t64x128_k4",
    "matmul_nt_f32_tf32_none_t64x128_k2", "bmm_nt_f32_scale_t64x128", "bmm_nn_f32_tf32_none_t64x128_k4",
    "bmm_nn_f32_none_t64x64_k4", "matmul_nt_f32_bias_t128x64",
    "matmul_nt_f16_silu_mul_t128x128_k2", "matmul_nn_bf16_gelu_tanh_t128x64_k4", "matmul_nn_f16_gelu_erf",
    "matmul_nt_f16_f32_none_t128x64_k2", "matmul_nn_bf16_bias_residual_t128x64_k2",
    "matmul_nt_f16_f32_none_t64x64", "matmul_nn_bf16_bias_residual_t64x64_k4", "bmm_nt_f16_scale_t64x64",
    "matmul_nn_f16_bias_heads_t64x64", "matmul_nt_bf16_bias_heads_t_t128x128",
)


def buildable(folder: Path):
    """What the build tests build of a library folder: the folder, or kernels/matmul's subset."""
    import dataclasses

    from kitdispatch import load_manifest

    if folder != REPO / "kernels" / "matmul":
        return folder
    spec = load_manifest(folder)
    return dataclasses.replace(spec, kernels=tuple(k for k in spec.kernels if k.name in MATMUL_SUBSET))


def library_spec(folder: Path):
    """The ModuleSpec of buildable(folder)."""
    from kitdispatch import load_manifest

    spec = buildable(folder)
    return load_manifest(spec) if isinstance(spec, Path) else spec
