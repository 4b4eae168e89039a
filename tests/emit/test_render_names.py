"""Names from the user in the generated MLIR: IREE reads back exactly the kit's strings
(object paths, symbols, comments), and names that collide after sanitising or hashing are
told apart or refused, never a duplicate symbol from iree-compile, never a dropped object."""

import hashlib
import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kitdispatch import BuildOptions, KitError
from kitdispatch import build
from kitdispatch.cli import main
from kitdispatch.emit.mlir_text import mlir_comment, mlir_string, mlir_symbol

from conftest import needs_iree_compile

CU = 'extern "C" __global__ void {name}(float* o, const float* x) {{ o[threadIdx.x] = x[threadIdx.x] + {value}.0f; }}\n'
KERNEL = """
[[kernels]]
name = "{name}"
function = "{function}"
source = {source}
workgroup_size = [64]
workgroup_count = [1]
shapes = {{ o = "f32[64]", x = "f32[64]" }}
"""


def project(root: Path, kernels: list[tuple[str, str, str]], module: str = "names") -> Path:
    """Sources written as given: (source path, kernel name, function name), each kernel adding
    a value of its own, so that every object's bytes differ."""
    root.mkdir(parents=True, exist_ok=True)
    toml = f'name = "{module}"\n'
    for value, (source, name, function) in enumerate(kernels, start=1):
        path = root / source
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(path.read_text() + CU.format(name=name, value=value) if path.exists() else CU.format(name=name, value=value))
        toml += KERNEL.format(name=name, function=function, source=json.dumps(source))  # a TOML basic string
    (root / "kitdispatch.toml").write_text(toml)
    return root


def assert_every_object_embedded(result) -> None:
    """Each object the build wrote is in the .vmfb, byte for byte (IREE embeds objects as they
    are), and no two objects share a file."""
    vmfb = result.vmfb.read_bytes()
    names = [o.name for o in result.objects]
    assert len(set(names)) == len(names)
    contents = [o.read_bytes() for o in result.objects]
    assert len(set(contents)) == len(contents), "expected objects that all differ"
    for obj, data in zip(result.objects, contents):
        assert data in vmfb, f"{obj.name} is not the object embedded"


# ------------------------------------------------------------------------ escaping


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_mlir_reads_back_the_kits_strings(text):
    from iree.compiler import ir

    with ir.Context():
        attr = ir.Attribute.parse(mlir_string(text))
        assert ir.StringAttr(attr).value == text
        module = ir.Module.parse(f"// {mlir_comment(text)}\nmodule {{ func.func private {mlir_symbol(text or 'x')}() }}")
        assert ir.StringAttr(module.body.operations[0].attributes["sym_name"]).value == (text or "x")


@needs_iree_compile
@pytest.mark.parametrize("odd", ["odd\\5Fk.cu", "odd\\2Fk.cu", 'q"uote.cu', "back\\slash.cu", "line\nbreak.cu", "caf\u00e9.cu"])
@pytest.mark.parametrize("fmt", ["fatbin", "ptx"])
def test_odd_source_names_embed_their_own_object(tmp_path, odd, fmt):
    # `odd\5Fk.cu` beside `odd_k.cu`: read as an escape, the path named the other object;
    # `odd\2Fk.cu` named `odd/k...`, a file in another folder.
    root = project(tmp_path / "src", [(odd, "k_odd", "odd"), ("odd_k.cu", "k_plain", "plain")])
    result = build(root, BuildOptions.create("sm_80", format=fmt), tmp_path / "out")
    assert {o.name for o in result.objects} == {f"{Path(odd).stem}.sm_80.{fmt}", f"odd_k.sm_80.{fmt}"}
    assert_every_object_embedded(result)


@needs_iree_compile
def test_a_line_break_in_a_program_path_stays_in_its_comment(tmp_path):
    root = project(tmp_path / "src", [("k.cu", "k", "k")])
    program = "prog\n}\nfunc.func @evil() {\n.mlir"
    (root / program).write_text("func.func @twice(%x: tensor<64xf32>) -> tensor<64xf32> {\n"
                                "  %y = call @k(%x) : (tensor<64xf32>) -> tensor<64xf32>\n  return %y : tensor<64xf32>\n}\n")
    with (root / "kitdispatch.toml").open("a") as f:
        f.write('[[programs]]\nsource = "prog\\n}\\nfunc.func @evil() {\\n.mlir"\n'
                'functions = [{ name = "twice", args = ["f32[64]"], results = ["f32[64]"] }]\n')
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out")
    text = result.mlir.read_text()
    assert "// ---- user program: " in text and "\nfunc.func @evil" not in text


# ----------------------------------------------------------------------- collisions


@needs_iree_compile
def test_sources_alike_after_sanitising_get_their_own_executables(tmp_path):
    root = project(tmp_path / "src", [("my-k.cu", "k_dash", "dash"), ("my_k.cu", "k_under", "under")])
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out")
    assert_every_object_embedded(result)
    text = result.mlir.read_text()
    assert text.count("hal.executable.source private @my_k_executable_") == 2


@needs_iree_compile
def test_sources_alike_but_for_case_get_their_own_objects(tmp_path):
    root = project(tmp_path / "src", [("K.cu", "k_upper", "upper"), ("k.cu", "k_lower", "lower")])
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out")
    assert_every_object_embedded(result)
    assert len({o.name.casefold() for o in result.objects}) == 2  # one file each where case does not count


@needs_iree_compile
def test_a_source_named_like_a_derived_stem_keeps_its_object(tmp_path):
    # a/k.cu and b/k.cu become k-<hash of "a/k.cu"> and k-<hash of "b/k.cu">; a third source
    # already has the first of those names.
    taken = f"k-{hashlib.sha256(b'a/k.cu').hexdigest()[:8]}.cu"
    root = project(tmp_path / "src", [("a/k.cu", "ka", "ka"), ("b/k.cu", "kb", "kb"), (taken, "kc", "kc")])
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out")
    assert len(result.objects) == 3
    assert_every_object_embedded(result)


@needs_iree_compile
def test_an_executable_named_like_a_function_is_renamed(tmp_path):
    # k.cu's executable would be @k_executable, which is the first kernel's function.
    root = project(tmp_path / "src", [("k.cu", "k", "k_executable"), ("k.cu", "k2", "k2")])
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out")
    assert "func.func @k_executable(" in result.mlir.read_text()
    assert_every_object_embedded(result)


@needs_iree_compile
def test_an_executable_named_like_another_sources_format_is_renamed(tmp_path):
    # k.cu in two formats gives @k_ptx_executable and @k_fatbin_executable; k_ptx.cu gives
    # @k_ptx_executable too.
    root = project(tmp_path / "src", [("k.cu", "k", "k"), ("k.cu", "k2", "k2"), ("k_ptx.cu", "k3", "k3")])
    toml = (root / "kitdispatch.toml").read_text().replace('function = "k2"', 'function = "k2"\nformat = "ptx"')
    (root / "kitdispatch.toml").write_text(toml)
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out")
    assert_every_object_embedded(result)


CPP = "template <typename T> __global__ void scale(T* o, const T* x) { o[threadIdx.x] = x[threadIdx.x] * 2; }\n"


def _cpp_project(root: Path, first: str, second: str) -> Path:
    root.mkdir(parents=True)
    (root / "s.cu").write_text(CPP + 'extern "C" __global__ void scale_float(float* o, const float* x) { o[threadIdx.x] = x[threadIdx.x]; }\n')
    kernel = 'source = "s.cu"\nworkgroup_size = [64]\nworkgroup_count = [1]\nshapes = { o = "f32[64]", x = "f32[64]" }\n'
    (root / "kitdispatch.toml").write_text(f'name = "cpp"\n[[kernels]]\n{first}\n{kernel}[[kernels]]\n{second}\n{kernel}')
    return root


def test_functions_alike_after_deriving_are_refused_naming_both(tmp_path):
    # `scale<float>` is the function scale_float by default, which the second kernel is too.
    root = _cpp_project(tmp_path / "src", 'name = "scale<float>"', 'name = "scale_float"')
    out, err = io.StringIO(), io.StringIO()
    assert main(["gen", str(root), "-o", str(tmp_path / "out")], out, err) == 2
    message = err.getvalue()
    assert "function 'scale_float' is defined twice: by kernel 'scale<float>' (s.cu) and by kernel 'scale_float' (s.cu)" in message
    assert "Traceback" not in message and not (tmp_path / "out").exists()


@needs_iree_compile
def test_two_kernels_of_one_entry_are_refused_naming_both(tmp_path):
    # Two name expressions of one instantiation: NVRTC lowers both to one mangled entry.
    root = _cpp_project(tmp_path / "src", 'name = "scale<float>"\nfunction = "a"', 'name = "scale<float >"\nfunction = "b"')
    out, err = io.StringIO(), io.StringIO()
    assert main(["build", str(root), "-o", str(tmp_path / "out"), "--arch", "sm_80"], out, err) == 2
    message = err.getvalue()
    assert "kernels 'scale<float>' and 'scale<float >' of s.cu are both the entry '_Z5scaleIfEvPT_PKS0_'" in message, message
    assert "Traceback" not in message and not (tmp_path / "out").exists()


def test_render_refuses_a_duplicate_entry_without_building():
    from kitdispatch import Buffer, Kernel, ModuleSpec, TensorType
    from kitdispatch.compile.archs import Arch
    from kitdispatch.emit.render import ExecutableObjects, VariantObject, render_module
    from kitdispatch.iree.tools import target_release

    params = [Buffer("o", "out", TensorType("f32", (64,))), Buffer("x", "in", TensorType("f32", (64,)))]
    kernels = [Kernel.create(n, "k.cu", params, workgroup_size=[64], workgroup_count=[1], symbol="k") for n in ("a", "b")]
    spec = ModuleSpec.create("dup", kernels)
    objects = [ExecutableObjects(Path("k.cu"), "ptx", (VariantObject(Arch.parse("sm_80"), "ptx", "k.sm_80.ptx"),))]
    with pytest.raises(KitError, match="kernels 'a' and 'b' of k.cu are both the entry 'k'"):
        render_module(spec, objects, spelling=target_release().spelling)


PROGRAM = """func.func @twice(%x: tensor<64xf32>) -> tensor<64xf32> {
  %y = call @k(%x) : (tensor<64xf32>) -> tensor<64xf32>
  %z = call @HELPER(%y) : (tensor<64xf32>) -> tensor<64xf32>
  return %z : tensor<64xf32>
}
func.func private @HELPER(%x: tensor<64xf32>) -> tensor<64xf32> {
  return %x : tensor<64xf32>
}
"""


def _program_project(root: Path, helper: str) -> Path:
    project(root, [("k.cu", "k", "k")])
    (root / "prog.mlir").write_text(PROGRAM.replace("HELPER", helper))
    with (root / "kitdispatch.toml").open("a") as f:
        f.write('[[programs]]\nsource = "prog.mlir"\nfunctions = [{ name = "twice", args = ["f32[64]"], results = ["f32[64]"] }]\n')
    return root


@needs_iree_compile
def test_an_executable_named_like_a_programs_symbol_is_renamed(tmp_path):
    root = _program_project(tmp_path / "src", "k_executable")
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out")
    text = result.mlir.read_text()
    assert "func.func private @k_executable(" in text and "hal.executable.source private @k_executable_" in text
    assert_every_object_embedded(result)


@needs_iree_compile
@pytest.mark.parametrize("helper", ["k", "k$async", "k$record"])
def test_a_program_defining_a_generated_function_is_refused(tmp_path, helper):
    """By `build`, which links the program (`gen` leaves programs to the user's own module)."""
    root = _program_project(tmp_path / "src", helper)
    out, err = io.StringIO(), io.StringIO()
    assert main(["build", str(root), "-o", str(tmp_path / "out")], out, err) == 2
    message = err.getvalue()
    assert f"prog.mlir:6: the program defines @{helper}, which kitdispatch generates for kernel 'k'" in message, message
    assert "Traceback" not in message and not (tmp_path / "out").exists()


def test_two_objects_of_one_file_name_are_an_error_not_a_loss():
    from kitdispatch.compile.archs import Arch
    from kitdispatch.builder.pipeline import _Built, _Job, _object_files
    from kitdispatch.compile.compilers import ObjectCode

    arch = Arch.parse("sm_80")
    built = [
        _Built(_Job(Path(f"/p/{d}/k.cu"), "ptx", (arch,), "k"), ObjectCode.from_ptx(f".target sm_80 // {d}".encode(), arch, Path(f"/p/{d}/k.cu"), "nvrtc"))
        for d in ("a", "b")
    ]
    with pytest.raises(KitError, match="/p/a/k.cu and /p/b/k.cu would both be written as k.sm_80.ptx"):
        _object_files(built)
    assert list(_object_files(built[:1])) == ["k.sm_80.ptx"]


@needs_iree_compile
def test_sizes_and_scalars_named_like_the_kits_own_values(tmp_path):
    # `%device` is the count region's argument; `count_x`, `result`, `zero`, `commands`,
    # `c0`, `dim_device` name values the generated functions make themselves.
    root = tmp_path / "src"
    root.mkdir()
    (root / "k.cu").write_text(
        'extern "C" __global__ void k(const float* x, float* o, int device, int count_x, int result, int zero, int commands, int c0, int dim_device) '
        "{ if (threadIdx.x == 0) o[0] = x[0] + zero + commands + c0; }\n"
    )
    (root / "kitdispatch.toml").write_text(
        'name = "own"\n[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [64]\n'
        'workgroup_count = ["ceildiv(device, 64) + count_x", "result + zero", "commands + c0 + dim_device"]\n'
        'shapes = { x = "f32[device,count_x]", o = "f32[result]" }\n'
    )
    result = build(root, BuildOptions.create("sm_80"), tmp_path / "out")
    assert "count(%device: !hal.device, %count_x: index, %device_2: index, %result_2: index" in result.mlir.read_text()
