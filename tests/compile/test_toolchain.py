"""Every toolchain users have: which NVRTC (CUDA 13 or 12 wheels, or a toolkit) and its
headers, the architecture-feature table against ptxas, the MLIR of each IREE release."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, SAMPLES, buildable, needs_iree_compile, write_kernel_project
from kitdispatch import BuildOptions, generate
from kitdispatch.check.arch_features import FEATURES, find_unsupported
from kitdispatch.compile.archs import Arch
from kitdispatch.compile.compilers import CompileOptions, NvrtcCompiler
from kitdispatch.errors import ArchError, KitError
from kitdispatch.emit.syntax import AttributeSyntax
from kitdispatch.iree.releases import IREE_RELEASES, release_of
from kitdispatch.iree.tools import choose_codegen_target, installed_release
from kitdispatch.run.driver_ptx import Version, max_ptx_isa
from kitdispatch.emit.render import render_module
from kitdispatch.compile.toolchain import REQUIRED_HEADERS, find_nvrtc

KERNELS = REPO / "kernels"
LIBRARY = sorted(p.parent for p in KERNELS.glob("*/kitdispatch.toml"))


# ------------------------------------------------------------------------------ NVRTC


def test_the_nvrtc_found_is_the_nvrtc_loaded():
    install = find_nvrtc()
    assert install is not None, "kitdispatch[build] or [cu12] installs NVRTC"
    compiler = NvrtcCompiler()
    assert compiler.version() == install.version
    assert compiler.library_version().split(".")[0] == str(install.cuda_major)
    assert install.version.startswith(compiler.library_version())


def test_headers_of_the_nvrtc_major_are_on_the_include_path():
    install = find_nvrtc()
    assert install.missing_headers == ()
    for header in REQUIRED_HEADERS:
        assert any((d / header).is_file() for d in install.include_dirs), header
    # CUDA 12 keeps crt/ in nvidia-cuda-nvcc-cu12, apart from cuda_fp16.h: both folders count.
    cuda_h = next(d / "cuda.h" for d in install.include_dirs if (d / "cuda.h").is_file())
    version = int(re.search(r"#define CUDA_VERSION (\d+)", cuda_h.read_text()).group(1))
    assert version // 1000 == install.cuda_major


def test_cuda_headers_compile_for_the_oldest_target(tmp_path):
    """mma.h (crt/mma.h), cuda_bf16.h and cuda_pipeline.h for the oldest architecture
    NVRTC has: sm_75 with CUDA 13, sm_50 with CUDA 12."""
    src = tmp_path / "k.cu"
    src.write_text(
        "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <mma.h>\n#include <cuda_pipeline.h>\n"
        'extern "C" __global__ void k(float* o, const __nv_bfloat16* x) { o[0] = __bfloat162float(x[0]); }\n'
    )
    compiler = NvrtcCompiler()
    oldest = min(compiler.supported_archs())
    assert compiler.compile(src, oldest, "ptx", CompileOptions()).ptx


def test_doctor_says_which_nvrtc_and_what_it_targets():
    from kitdispatch.doctor import collect, format_report

    report = collect()
    install = find_nvrtc()
    assert report["nvrtc"]["origin"] == install.origin
    assert report["nvrtc"]["cuda_major"] == install.cuda_major
    assert report["nvrtc"]["library"] == str(install.library)
    assert report["nvrtc"]["archs"] == [a.name for a in NvrtcCompiler().supported_archs()]
    assert report["nvrtc"]["ptx_isa"] == str(max_ptx_isa(Version.parse(NvrtcCompiler().library_version())))
    text = format_report(report)
    assert f"from           {install.origin}" in text


def _fake_wheel(nvidia: Path, files: list[str]) -> None:
    for f in files:
        (nvidia / f).parent.mkdir(parents=True, exist_ok=True)
        (nvidia / f).write_text("")


def test_cuda13_wheels_come_before_cuda12_ones_and_each_keeps_its_headers(tmp_path, monkeypatch):
    """The search order of cuda-python's loader, on a site-packages tree laid out as the
    wheels lay it out (files only: nothing is loaded)."""
    from kitdispatch.compile import toolchain

    nvidia = tmp_path / "nvidia"
    cu12 = ["cuda_nvrtc/lib/libnvrtc.so.12", "cuda_runtime/include/cuda_fp16.h", "cuda_nvcc/include/crt/host_defines.h",
            "nvfatbin/lib/libnvfatbin.so.12"]
    cu13 = ["cu13/lib/libnvrtc.so.13", "cu13/include/cuda_fp16.h"]
    _fake_wheel(nvidia, cu12)
    monkeypatch.setattr(toolchain, "_nvidia_folders", lambda: [nvidia])
    monkeypatch.setattr(toolchain, "_toolkit_roots", lambda: [])
    (only12,) = toolchain.find_all_nvrtc()
    assert only12.cuda_major == 12 and only12.missing_headers == ()
    assert only12.include_dirs == (nvidia / "cuda_runtime/include", nvidia / "cuda_nvcc/include")
    assert only12.nvfatbin == nvidia / "nvfatbin/lib/libnvfatbin.so.12"

    _fake_wheel(nvidia, cu13)
    first, second = toolchain.find_all_nvrtc()
    assert (first.cuda_major, second.cuda_major) == (13, 12)
    assert first.missing_headers == ("crt/host_defines.h",)  # nvidia-cuda-crt is not installed
    assert "nvidia-cuda-crt==13.0.*" in first.headers_hint
    assert first.nvfatbin is None and "nvidia-nvfatbin==13.0.*" in first.nvfatbin_hint


@pytest.mark.parametrize(
    "ptx, driver, wheel",
    [((9, 0), (12, 4), "nvidia-cuda-nvrtc-cu12==12.4.*"), ((8, 8), (12, 7), "nvidia-cuda-nvrtc-cu12==12.6.*"),  # no 12.7 wheel
     ((9, 5), (13, 0), "nvidia-cuda-nvrtc==13.0.*")],
)
def test_preflight_hint_names_an_nvrtc_that_exists(ptx, driver, wheel):
    from kitdispatch.compile.toolchain import nvrtc_for_driver
    from kitdispatch.run.driver_ptx import PreflightError, check_ptx_loads

    with pytest.raises(PreflightError) as info:
        check_ptx_loads(Version(*ptx), Version(*driver), compiler="nvrtc", where="k.ptx", rebuild_with=nvrtc_for_driver(Version(*driver)))
    assert wheel in info.value.fix
    with pytest.raises(PreflightError) as info:  # the run side, with no build at hand, points to doctor
        check_ptx_loads(Version(*ptx), Version(*driver), compiler="built", where="m.vmfb")
    assert "kitdispatch doctor" in info.value.fix and "--format cubin" in info.value.fix


# ------------------------------------------------------------------ architecture features


def _ptxas_tools() -> list[tuple[str, Version]]:
    """Every ptxas here: the CUDA toolkit's, and the nvidia-cuda-nvcc-cu12 wheel's."""
    found = [shutil.which("ptxas")]
    install = find_nvrtc()
    if install is not None:
        found.append(str(install.library.parent.parent.parent / "cuda_nvcc" / "bin" / "ptxas"))
    tools = []
    for path in dict.fromkeys(p for p in found if p and Path(p).is_file()):
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        tools.append((path, Version.parse(re.search(r"release (\d+\.\d+)", out).group(1))))
    return tools


def _ptxas_targets(ptxas: str) -> list[str]:
    out = subprocess.run([ptxas, "--help"], capture_output=True, text=True, timeout=30).stdout
    allowed = out[out.index("--gpu-name"):]
    allowed = allowed[allowed.index("Allowed values"):allowed.index("Default value")]
    return sorted(set(re.findall(r"'(sm_\d+[af]?)'", allowed)), key=Arch.parse)


_PTX = """.version {version}
.target {target}
.address_size 64
.visible .entry k(.param .u64 p) {{
  .reg .b32 %r<32>; .reg .b64 %rd<16>; .reg .f32 %f<32>; .reg .f64 %fd<16>; .reg .b16 %h<16>; .reg .b8 %b<4>; .reg .pred %p<4>;
  ld.param.u64 %rd2, [p];
  {instruction}
  ret;
}}
"""


@pytest.mark.parametrize("feature", FEATURES, ids=lambda f: f.name)
def test_each_feature_matches_its_example(feature):
    ptx = _PTX.format(version="8.8", target="sm_50", instruction=feature.example)
    problem = find_unsupported(ptx)
    assert problem is not None and problem.instruction == feature.example


def test_feature_table_agrees_with_ptxas_on_every_target(tmp_path):
    """For every example instruction and every target a ptxas here knows: the table refuses
    it exactly where ptxas does."""
    tools = _ptxas_tools()
    if not tools:
        pytest.skip("no ptxas (CUDA toolkit, or nvidia-cuda-nvcc-cu12)")
    disagreements, checked = [], 0
    for ptxas, release in tools:
        version = max_ptx_isa(release)
        for target in _ptxas_targets(ptxas):
            for feature in FEATURES:
                ptx = _PTX.format(version=version, target=target, instruction=feature.example)
                (tmp_path / "k.ptx").write_text(ptx)
                res = subprocess.run([ptxas, f"-arch={target}", str(tmp_path / "k.ptx"), "-o", "/dev/null"],
                                     capture_output=True, text=True, timeout=60)
                table_ok = find_unsupported(ptx) is None
                checked += 1
                if table_ok != (res.returncode == 0):
                    disagreements.append(f"ptxas {release} {target}: {feature.example} ({res.stderr.strip()[:120]})")
    assert checked > 300
    assert not disagreements, "\n".join(disagreements)


def test_nvrtc_code_for_each_target_passes_the_check(tmp_path):
    """No false refusals: what NVRTC itself emits for bf16/f16 math, atomics and warp
    intrinsics on each architecture is allowed there."""
    src = tmp_path / "k.cu"
    src.write_text(
        "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
        'extern "C" __global__ void k(__nv_bfloat16* b, __half* h, float* f, int* i) {\n'
        "  b[6] = __float2bfloat16(f[0]); f[1] = __bfloat162float(b[7]); f[2] = tanhf(f[3]); atomicAdd(f + 4, 1.0f);\n"
        "#if __CUDA_ARCH__ >= 600\n"
        "  h[0] = __hfma(h[1], h[2], __hadd(h[3], h[4]));\n"
        "#endif\n"
        "#if __CUDA_ARCH__ >= 800\n"
        "  b[0] = __hfma(b[1], b[2], __hadd(b[3], __hmul(b[4], b[5]))); b[8] = __hmax(b[9], b[10]);\n"
        "  h[5] = __hmin(h[6], h[7]); atomicAdd(h + 8, h[9]); i[0] = __reduce_add_sync(0xffffffffu, i[1]);\n"
        "#endif\n"
        "#if __CUDA_ARCH__ >= 900\n"
        "  atomicAdd(b + 11, b[12]);\n"
        "#endif\n"
        "}\n"
    )
    compiler = NvrtcCompiler()
    for arch in compiler.supported_archs():
        ptx = compiler.compile(src, arch, "ptx", CompileOptions()).ptx.decode()
        assert find_unsupported(ptx) is None, (arch, find_unsupported(ptx))


@pytest.mark.parametrize("kernel_dir", LIBRARY + [SAMPLES / "simple_mul", SAMPLES / "mlp_layer"], ids=lambda p: p.name)
def test_library_kernels_on_the_oldest_target(kernel_dir, tmp_path):
    """Every library kernel builds as PTX for the oldest architecture NVRTC has, except the
    tensor-core ones (cp.async, ldmatrix, mma.sync.m16n8k16: sm_80), attention_f32 (cp.async)
    and the norms (their f16x2 and bf16x2 conversions: sm_80), refused with the line."""
    oldest = min(NvrtcCompiler().supported_archs())
    options = BuildOptions.create(oldest.name, format="ptx")
    if kernel_dir.name not in ("matmul", "attention", "attention_f32", "norm"):
        generate(kernel_dir, options, tmp_path)
        return
    with pytest.raises(ArchError) as info:
        generate(buildable(kernel_dir), options, tmp_path)  # kernels/matmul: its representative subset
    message = info.value.render()
    name = kernel_dir.name
    family = "attention_f32" if name == "attention_f32" else f"{name}_f16"  # the f32 family's kernels end in _f32
    assert re.search(rf"\w+\.cuh?:\d+ \(called from {name}\.cu:\d+\): kernel \w*{family} in {name}\.cu uses ", message), message
    assert f"so it cannot run on {oldest.name}" in message and "needs sm_80 or newer" in message
    assert not any(tmp_path.iterdir()), "a refused build writes nothing"


def test_arch_specific_features_need_the_a_target(tmp_path):
    cu = 'extern "C" __global__ void k(int* o) { asm volatile("setmaxnreg.inc.sync.aligned.u32 240;"); o[0] = 1; }\n'
    toml = 'name = "regs"\n[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [128]\nworkgroup_count = [1]\nshapes = { o = "i32[1]" }\n'
    root = write_kernel_project(tmp_path / "src", cu, toml)
    with pytest.raises(ArchError, match=r"needs an arch-specific target: sm_90a, sm_100a.*cannot run on sm_90"):
        generate(root, BuildOptions.create("sm_90", format="ptx"), tmp_path / "out")
    generate(root, BuildOptions.create("sm_90a", format="ptx"), tmp_path / "out")


# ----------------------------------------------------------------------------- IREE


def test_iree_versions_outside_the_range_are_refused_clearly():
    assert release_of("3.13.0rc20261016").name == "3.13"
    assert release_of("3.10.0").syntax is AttributeSyntax.ATTR_DICT
    for version in ("3.9.0", "3.14.0", "2.9.0"):
        with pytest.raises(KitError, match=rf"IREE {version} is not supported: kitdispatch generates MLIR for IREE 3.10 through 3.13") as info:
            release_of(version)
        assert "iree-base-compiler>=3.10,<3.14" in info.value.fix


def test_codegen_target_per_release():
    sm_90, sm_120 = Arch.parse("sm_90"), Arch.parse("sm_120")
    assert choose_codegen_target([sm_90], release=IREE_RELEASES[(3, 10)]).target.name == "sm_87"
    assert choose_codegen_target([sm_90], release=IREE_RELEASES[(3, 12)]).target.name == "sm_89"
    assert choose_codegen_target([sm_120], release=IREE_RELEASES[(3, 13)]).target.name == "sm_120"
    choice = choose_codegen_target([sm_120], release=IREE_RELEASES[(3, 12)])  # sm_120 would abort 3.12
    assert choice.target.name == "sm_89" and "IREE 3.12 has no codegen target for sm_120" in choice.note
    with pytest.raises(KitError, match=r"IREE 3.12 aborts with an LLVM error .*sm_120") as info:
        choose_codegen_target([sm_120], "sm_120", release=IREE_RELEASES[(3, 12)])
    assert "--codegen-target sm_89" in info.value.fix
    assert choose_codegen_target([Arch.parse("sm_52")], release=IREE_RELEASES[(3, 13)]).target.name == "sm_60"


@needs_iree_compile
@pytest.mark.parametrize("root", [SAMPLES / "simple_mul", REPO / "tests" / "data" / "dynamic_shared"], ids=lambda p: p.name)
def test_installed_iree_takes_its_own_syntax_and_rejects_the_other(root, tmp_path):
    """One template set, two spellings: the installed IREE compiles the MLIR rendered for its
    release and rejects the other release's spelling (so the difference is real)."""
    from kitdispatch.errors import IreeCompileError
    from kitdispatch.iree.tools import compile_args, compile_vmfb
    from kitdispatch.describe.manifest import load_manifest
    from kitdispatch.emit.render import ExecutableObjects, VariantObject

    sm_80 = Arch.parse("sm_80")
    spec = load_manifest(root)
    (obj,) = generate(spec, BuildOptions.create("sm_80", format="ptx"), tmp_path).objects
    objects = [ExecutableObjects(spec.kernels[0].source, "ptx", (VariantObject(sm_80, "ptx", obj.name),))]
    programs = [(str(spec.source_path(p.source)), spec.source_path(p.source).read_text()) for p in spec.programs]
    for release in (IREE_RELEASES[(3, 13)], IREE_RELEASES[(3, 10)]):
        syntax = release.syntax.value
        mlir = tmp_path / f"{syntax}.mlir"
        mlir.write_text(render_module(spec, objects, programs=programs, spelling=release.spelling).text)
        argv = compile_args(mlir, tmp_path / f"{syntax}.vmfb", sm_80, tmp_path)
        if release.syntax is installed_release().syntax:
            compile_vmfb(argv, mlir)
        else:
            with pytest.raises(IreeCompileError):
                compile_vmfb(argv, mlir)


def test_workgroup_attributes_are_spelled_per_release(tmp_path):
    from kitdispatch.describe.manifest import load_manifest
    from kitdispatch.emit.render import ExecutableObjects, VariantObject

    spec = load_manifest(REPO / "tests" / "data" / "dynamic_shared")
    objects = [ExecutableObjects(k.source, "ptx", (VariantObject(Arch.parse("sm_80"), "ptx", "k.ptx"),)) for k in spec.kernels[:1]]
    new = render_module(spec, objects, spelling=IREE_RELEASES[(3, 13)].spelling).text
    old = render_module(spec, objects, spelling=IREE_RELEASES[(3, 10)].spelling).text
    assert re.search(r"\} <workgroup_size = \[\d+ : index, 1 : index, 1 : index\], workgroup_local_memory = \d+>", new)
    assert re.search(r"\} attributes \{workgroup_size = \[\d+ : index, 1 : index, 1 : index\], workgroup_local_memory = \d+ : index\}", old)
    assert "hal.executable.source private @" in old and " attributes {objects = #hal.executable.objects<{" in old
