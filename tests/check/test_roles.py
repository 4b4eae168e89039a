"""Pointer roles from the compiled code (kitdispatch/check/roles.py, ptx.param_accesses): real
kernels compiled by NVRTC (and nvcc), built with iree-compile where the function matters."""

import io
import json
import sys
from pathlib import Path

import pytest
from conftest import REPO, DATA, library_spec, needs_iree_compile, write_kernel_project

from kitdispatch import BuildOptions, generate
from kitdispatch import build
from kitdispatch.compile.archs import Arch
from kitdispatch.cli import main
from kitdispatch.compile.compilers import CompileOptions, NvrtcCompiler
from kitdispatch.errors import ManifestError
from kitdispatch.check.ptx import param_accesses
from kitdispatch.describe.record import read_record

DATA = DATA / "pointer_roles"


def _functions(record_path: Path) -> dict[str, dict]:
    return {f.name: f.to_json() for f in read_record(record_path).functions}


# ------------------------------------------------------------------ what the PTX says


def _uses(tmp_path: Path, cu: str, entry: str = "k", arch: str = "sm_80") -> dict[int, str]:
    """'L', 'S', 'E' per parameter position (load, store, escape), and the untraced accesses."""
    src = tmp_path / "k.cu"
    src.write_text(cu)
    obj = NvrtcCompiler().compile(src, Arch.parse(arch), "ptx", CompileOptions())
    found = param_accesses(obj.ptx.decode(), entry)
    uses = {i: "L" * bool(u.load) + "S" * bool(u.store) + "E" * bool(u.escape) for i, u in enumerate(found.params)}
    uses["untraced"] = "L" * bool(found.untraced_load) + "S" * bool(found.untraced_store)
    return uses


ACCESS_CASES = {
    # kernel body over (float* a, float* b, int n), expected uses of a, b
    "plain": ("a[threadIdx.x] = b[threadIdx.x];", "S", "L"),
    "ldg": ("a[threadIdx.x] = __ldg(&b[threadIdx.x]);", "S", "L"),
    "read-modify-write": ("a[threadIdx.x] += b[threadIdx.x];", "LS", "L"),
    "atomic": ("atomicAdd(a, b[threadIdx.x]);", "LS", "L"),
    "float4": ("reinterpret_cast<float4*>(a)[threadIdx.x] = reinterpret_cast<const float4*>(b)[threadIdx.x];", "S", "L"),
    "loop": ("for (int i = threadIdx.x; i < n; i += blockDim.x) a[i] = b[i] * 2.0f;", "S", "L"),
    "selected": ("float* p = n > 0 ? a : b; p[threadIdx.x] = 1.0f;", "S", "S"),
    "untouched": ("if (n < 0) return;", "", ""),
}


@pytest.mark.parametrize("case", sorted(ACCESS_CASES))
def test_loads_and_stores_are_read_per_pointer(tmp_path, case):
    body, a, b = ACCESS_CASES[case]
    uses = _uses(tmp_path, 'extern "C" __global__ void k(float* a, float* b, int n) { ' + body + " }")
    assert (uses[0], uses[1], uses[2], uses["untraced"]) == (a, b, "", "")


def test_cp_async_copies_are_loads_of_their_global_source(tmp_path):
    cu = r"""
    #include <cuda_pipeline.h>
    extern "C" __global__ void k(float* out, float* in) {
      __shared__ float tile[64];
      __pipeline_memcpy_async(&tile[threadIdx.x], &in[threadIdx.x], sizeof(float));
      __pipeline_commit();
      __pipeline_wait_prior(0);
      out[threadIdx.x] = tile[63 - threadIdx.x];
    }"""
    assert _uses(tmp_path, cu) == {0: "S", 1: "L", "untraced": ""}


def test_a_pointer_handed_to_a_call_escapes(tmp_path):
    cu = r"""
    __device__ __noinline__ void put(float* p, float v) { *p = v; }
    extern "C" __global__ void k(float* out, float* in) { put(out + threadIdx.x, in[threadIdx.x]); }"""
    uses = _uses(tmp_path, cu)
    assert "E" in uses[0] and uses[1] == "L"


def test_an_access_at_an_address_read_from_memory_is_untraced(tmp_path):
    cu = r"""
    struct Table { float* p; };
    extern "C" __global__ void k(float* a, const Table* t) { t->p[threadIdx.x] = a[threadIdx.x]; }"""
    uses = _uses(tmp_path, cu)
    assert uses[0] == "L" and uses["untraced"] == "S"


# ------------------------------------------------------------ roles settled by the code


@needs_iree_compile
def test_an_only_loaded_non_const_pointer_becomes_an_input(tmp_path):
    """cuda-samples' transposeNoBankConflicts(float* odata, float* idata, int width, int height):
    idata was a second, uninitialised result and the function took only the two scalars."""
    result = build(DATA, BuildOptions.create("sm_80"), tmp_path / "out")
    functions = _functions(result.record)
    assert functions["transposeNoBankConflicts"] == {
        "name": "transposeNoBankConflicts", "args": ["f32[h,w]"], "results": ["f32[w,h]"], "arg_names": ["idata"],
    }
    # Loaded and stored without the manifest saying so: in place.
    assert functions["accumulate"] == {
        "name": "accumulate", "args": ["f32[n]", "f32[n]"], "results": ["f32[n]"], "arg_names": ["acc", "x"],
    }
    mlir = result.mlir.read_text()
    assert "func.func @transposeNoBankConflicts(%idata: tensor<?x?xf32>) -> (tensor<?x?xf32>)" in mlir
    # idata is bound read-only: after odata's binding, in C order.
    layout = mlir.split("@_Z24transposeNoBankConflictsPfS_ii", 1)[1].split("]>)", 1)[0]
    assert layout.count("storage_buffer, ReadOnly") == 1 and layout.index("storage_buffer>") < layout.index("ReadOnly")
    assert not [d for d in result.diagnostics if d.tool == "kitdispatch"]


@needs_iree_compile
@pytest.mark.nvcc
def test_roles_are_the_same_with_nvcc(tmp_path):
    # nvcc has no name expressions: the C++ kernel is instantiated by being defined (no template).
    result = build(DATA, BuildOptions.create("sm_80", compiler="nvcc", format="cubin"), tmp_path / "out")
    functions = _functions(result.record)
    assert functions["transposeNoBankConflicts"]["args"] == ["f32[h,w]"]
    assert functions["accumulate"]["results"] == ["f32[n]"] and functions["accumulate"]["arg_names"] == ["acc", "x"]


def test_settled_roles_come_from_the_cache_on_a_rebuild(tmp_path, monkeypatch):
    build_module = sys.modules["kitdispatch.builder.pipeline"]  # the package's `build` is the function
    settled = []
    real = build_module.settle_roles
    monkeypatch.setattr(build_module, "settle_roles", lambda *a, **k: settled.append(a[0].name) or real(*a, **k))
    first = generate(DATA, BuildOptions.create("sm_80"), tmp_path / "a")
    assert sorted(settled) == ["accumulate", "scale_half2", "transposeNoBankConflicts"]
    again = generate(DATA, BuildOptions.create("sm_80"), tmp_path / "b")
    assert again.compiler_runs == 0 and len(settled) == 3  # the checks' verdict, roles included, was cached
    assert again.mlir.read_text() == first.mlir.read_text()
    assert _functions(again.record) == _functions(first.record)


LOAD_STORE_CU = r"""
extern "C" __global__ void k(float* x, float* y, int n) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) { y[j] = x[j]; x[j] = 2.0f * x[j]; }
}
"""
INFERRED = ('[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [64]\nworkgroup_count = ["ceildiv(n, 64)"]\n'
            'shapes = { x = "f32[n]", y = "f32[n]" }\n')
EXPLICIT = ('[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [64]\nworkgroup_count = ["ceildiv(n, 64)"]\n'
            'params = [{{ name = "x", {x} = "f32[n]" }}, {{ name = "y", {y} = "f32[n]" }}, {{ name = "n", scalar = "i32" }}]\n')


def _cli_build(root: Path, out: Path) -> tuple[int, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(["gen", str(root), "--arch", "sm_80", "-o", str(out)], stdout, stderr)
    return code, stderr.getvalue()


@pytest.mark.parametrize(
    "cu, toml",
    [
        (LOAD_STORE_CU, INFERRED + 'in = ["x"]\n'),  # named `in`
        (LOAD_STORE_CU, EXPLICIT.format(x="in", y="out")),  # explicit params
        (LOAD_STORE_CU.replace("float* x", "const float* x").replace("x[j] = 2.0f", "const_cast<float*>(x)[j] = 2.0f"),
         INFERRED),  # const, cast away
    ],
    ids=["in-list", "params", "const-cast"],
)
def test_a_store_through_an_in_buffer_is_an_error_naming_pointer_and_instruction(tmp_path, cu, toml):
    root = write_kernel_project(tmp_path / "src", cu, toml)
    before = {p: p.read_bytes() for p in root.iterdir()}
    code, text = _cli_build(root, tmp_path / "out")
    assert code == 2, text
    [first] = [line for line in text.splitlines() if "error:" in line]  # one line says what and where
    assert "k.cu:4: kernel 'k' stores through 'x' (PTX: `st.global.f32 [%rd" in first  # the source line
    assert "declared `in`" in first and "Traceback" not in text
    assert 'fix: declare it inout (inout = ["x"]' in text
    assert not (tmp_path / "out").exists()
    assert {p: p.read_bytes() for p in root.iterdir()} == before


def test_an_out_the_code_loads_from_is_a_warning_naming_the_instruction(tmp_path):
    root = write_kernel_project(tmp_path / "src", LOAD_STORE_CU, EXPLICIT.format(x="out", y="out"))
    result = generate(root, BuildOptions.create("sm_80"), tmp_path / "out")
    [warning] = [d.text for d in result.diagnostics if d.tool == "kitdispatch"]
    assert "kernel 'k' loads from 'x' (PTX: `ld.global.f32" in warning and "declared `out`" in warning
    assert read_record(result.record).diagnostics == result.diagnostics
    # The manifest may say `out` for an inferred pointer too: kept, with the same warning.
    root = write_kernel_project(tmp_path / "src2", LOAD_STORE_CU, INFERRED + 'out = ["x"]\n')
    result = generate(root, BuildOptions.create("sm_80"), tmp_path / "out2")
    assert [d.text for d in result.diagnostics if d.tool == "kitdispatch"] == [warning]
    assert _functions(result.record)["k"]["results"] == ["f32[n]", "f32[n]"]


def test_an_inout_never_stored_is_a_warning(tmp_path):
    root = write_kernel_project(tmp_path / "src", LOAD_STORE_CU, INFERRED + 'inout = ["y"]\n')
    assert not [d for d in generate(root, BuildOptions.create("sm_80"), tmp_path / "a").diagnostics if d.tool == "kitdispatch"]
    cu = LOAD_STORE_CU.replace("x[j] = 2.0f * x[j];", "")
    root = write_kernel_project(tmp_path / "src2", cu, INFERRED + 'inout = ["x"]\n')
    [warning] = [d.text for d in generate(root, BuildOptions.create("sm_80"), tmp_path / "b").diagnostics if d.tool == "kitdispatch"]
    assert "never stores through 'x', which is declared `inout`" in warning


def test_inferred_roles_without_a_manifest_word(tmp_path):
    root = write_kernel_project(tmp_path / "src", LOAD_STORE_CU, INFERRED)
    result = generate(root, BuildOptions.create("sm_80"), tmp_path / "out")
    assert _functions(result.record)["k"] == {"name": "k", "args": ["f32[n]"], "results": ["f32[n]", "f32[n]"], "arg_names": ["x"]}
    assert "func.func @k(%x: tensor<?xf32>) -> (tensor<?xf32>, tensor<?xf32>)" in result.mlir.read_text()


def test_a_kernel_that_stores_through_no_pointer_is_an_error(tmp_path):
    cu = 'extern "C" __global__ void k(float* x, float* y, int n) { if (n > 1 && x[0] == y[0]) __trap(); }\n'
    root = write_kernel_project(tmp_path / "src", cu, INFERRED)
    code, text = _cli_build(root, tmp_path / "out")
    assert code == 2 and "kernel 'k' stores through none of its pointers (x, y)" in text and "Traceback" not in text
    assert not (tmp_path / "out").exists()


def test_a_pointer_the_analysis_cannot_follow_keeps_its_role_with_a_warning(tmp_path):
    cu = r"""
    __device__ __noinline__ void put(float* p, float v) { *p = v; }
    extern "C" __global__ void k(float* out, float* in, int n) {
      int j = blockIdx.x * blockDim.x + threadIdx.x;
      if (j < n) put(out + j, in[j]);
    }"""
    toml = INFERRED.replace("x = ", "out = ").replace("y = ", "in = ")
    root = write_kernel_project(tmp_path / "src", cu, toml)
    result = generate(root, BuildOptions.create("sm_80"), tmp_path / "out")
    [warning] = [d.text for d in result.diagnostics if d.tool == "kitdispatch"]
    assert "pointer 'out': kitdispatch cannot follow it in the compiled code (PTX: `st.param.b64" in warning
    assert "stays `out`" in warning
    assert _functions(result.record)["k"] == {"name": "k", "args": ["f32[n]"], "results": ["f32[n]"], "arg_names": ["in"]}


def test_a_loaded_pointer_beside_an_untraced_store_becomes_inout_with_a_warning(tmp_path):
    cu = r"""
    extern "C" __global__ void k(float* out, float* a, unsigned long long where, int n) {
      int j = blockIdx.x * blockDim.x + threadIdx.x;
      if (j < n) { out[j] = a[j]; reinterpret_cast<float*>(where)[j] = a[j]; }
    }"""
    toml = INFERRED.replace("x = ", "out = ").replace("y = ", "a = ")
    root = write_kernel_project(tmp_path / "src", cu, toml)
    result = generate(root, BuildOptions.create("sm_80"), tmp_path / "out")
    [warning] = [d.text for d in result.diagnostics if d.tool == "kitdispatch"]
    assert "pointer 'a' is loaded" in warning and "cannot trace" in warning and "so it is `inout`" in warning
    assert _functions(result.record)["k"]["arg_names"] == ["a", "where"]
    assert _functions(result.record)["k"]["results"] == ["f32[n]", "f32[n]"]


def test_the_record_keeps_the_settled_functions(tmp_path):
    result = generate(DATA, BuildOptions.create("sm_80"), tmp_path / "out")
    data = json.loads(result.record.read_text())
    by_name = {f["name"]: f for f in data["functions"]}
    assert by_name["transposeNoBankConflicts"]["args"] == ["f32[h,w]"]


def test_roles_named_at_load_are_declared_and_unnamed_ones_provisional(tmp_path):
    from kitdispatch import kernel_from_source

    root = write_kernel_project(tmp_path / "src", LOAD_STORE_CU, INFERRED)
    common = dict(shapes={"x": "f32[n]", "y": "f32[n]"}, workgroup_size=[64], workgroup_count=["ceildiv(n, 64)"], root=root)
    kernel = kernel_from_source("k", "k.cu", outputs=["x"], **common)
    assert [(b.name, b.access, b.inferred) for b in kernel.buffers] == [("x", "out", False), ("y", "out", True)]
    with pytest.raises(ManifestError, match="pointer 'x' is listed in more than one of inout, in and out"):
        kernel_from_source("k", "k.cu", outputs=["x"], inputs=["x"], **common)
    const = write_kernel_project(tmp_path / "const", LOAD_STORE_CU.replace("float* x", "const float* x"), INFERRED)
    with pytest.raises(ManifestError, match=r"parameter 'x': the manifest declares out \(written\), the source .* 'const float \*'"):
        kernel_from_source("k", "k.cu", outputs=["x"], **(common | {"root": const}))


def test_a_loaded_pointer_that_escapes_becomes_inout_with_a_warning(tmp_path):
    cu = r"""
    __device__ __noinline__ void twice(float* p) { *p *= 2.0f; }
    extern "C" __global__ void k(float* out, float* a, int n) {
      int j = blockIdx.x * blockDim.x + threadIdx.x;
      if (j < n) { out[j] = a[j]; twice(a + j); }
    }"""
    toml = INFERRED.replace("x = ", "out = ").replace("y = ", "a = ")
    result = generate(write_kernel_project(tmp_path / "src", cu, toml), BuildOptions.create("sm_80"), tmp_path / "out")
    [warning] = [d.text for d in result.diagnostics if d.tool == "kitdispatch"]
    assert "pointer 'a' is loaded (PTX: `ld.global.f32" in warning and "so it is `inout`" in warning
    assert _functions(result.record)["k"] == {"name": "k", "args": ["f32[n]"], "results": ["f32[n]", "f32[n]"], "arg_names": ["a"]}


LIBRARY = REPO / "kernels"


@pytest.mark.parametrize("project", sorted(p.parent.name for p in LIBRARY.glob("*/kitdispatch.toml")))
def test_the_code_gives_the_library_kernels_the_roles_their_manifests_declare(project):
    """Were every pointer of the library left to the compiled code, each would get the role its
    manifest states, without a warning (sm_90: the copy-engine path of sm_90a hands the
    matmul's inputs to tensor maps, where the analysis stops)."""
    import dataclasses

    from kitdispatch.check.roles import settle_roles
    from kitdispatch.describe.kernel import Buffer

    spec = library_spec(LIBRARY / project)  # kernels/matmul: its representative subset
    names = tuple(k.name for k in spec.kernels if k.cpp_name)
    for source in {spec.source_path(k.source) for k in spec.kernels}:
        defines = spec.source_flags(source)[1]  # kernels/matmul compiles each generated entry only with its define
        obj = NvrtcCompiler().compile(source, Arch.parse("sm_90"), "ptx", CompileOptions(name_expressions=names, defines=defines))
        for kernel in (k for k in spec.kernels if spec.source_path(k.source) == source):
            left = dataclasses.replace(kernel, params=tuple(
                dataclasses.replace(p, access="out", inferred=True) if isinstance(p, Buffer) else p for p in kernel.params
            ))
            entry = dict(obj.lowered).get(kernel.name, kernel.name)
            settled, warnings = settle_roles(left, param_accesses(obj.ptx.decode(), entry), str(source))
            assert ([b.access for b in settled.buffers], warnings) == ([b.access for b in kernel.buffers], ()), kernel.name


def test_a_difference_of_two_pointers_is_an_offset_not_an_address(tmp_path):
    cu = r"""
    extern "C" __global__ void k(float* out, const float* in, const float* end) {
      const float* p = in + threadIdx.x;
      if (p < end) out[end - p] = *p;
    }"""
    uses = _uses(tmp_path, cu)
    assert (uses[0], uses[1], uses[2]) == ("S", "L", "")
