"""Builds, on a machine with iree-compile, every module the GPU tests run, for a GPU machine
that has only IREE's runtime (README: "Running the GPU tests on a machine without iree-compile").

    python tools/prebuild.py OUT            # then, on the GPU machine:
    KITDISPATCH_PREBUILT=OUT python -m pytest -q -m gpu
    python -m kitdispatch test OUT/*        # every module against its numpy reference

    python tools/prebuild.py OUT --only attention norm_rms_f16_model attention_forms   # a subset

Each project goes to OUT/<its folder's name> (what tests/conftest.py's prebuilt_or_build looks
for): the samples, the kernel library, the test modules under tests/data, and the model samples
that tests/models/test_compare.py compares (OUT/<sample>_model, with their baselines).
"""

from __future__ import annotations

import argparse
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kitdispatch as kd  # noqa: E402

# The tensor-core kernels ship sm_90a code beside their sm_80 path (tests/test_kernel_library.py);
# shared_per_arch reserves more shared memory on sm_90a (tests/emit/test_shared_per_arch.py).
HOPPER = {"matmul", "attention", "attention_f32", "shared_per_arch"}
# Test modules that are not CUDA builds (tests/data/cpu_calls and cpu_sized run on IREE's CPU device).
NOT_CUDA = {"cpu_calls", "cpu_sized"}
# Projects the GPU tests also run as built by nvcc (OUT/NAME.nvcc), where nvcc is installed.
NVCC_TOO = {"cxx_kernels"}
# The models tests/models/test_compare.py compares on the GPU: OUT/NAME -> (model maker and its
# arguments, project).
MODELS = {
    "onnx_softmax_model": ((ROOT / "samples" / "onnx_softmax" / "make_model.py",), ROOT / "samples" / "onnx_softmax"),
    "onnx_matmul_model": ((ROOT / "samples" / "onnx_matmul" / "make_model.py",), ROOT / "kernels" / "matmul"),
    "onnx_bias_gelu_model": ((ROOT / "samples" / "onnx_bias_gelu" / "make_model.py",), ROOT / "kernels" / "elementwise"),
    "llama_layer_model": ((ROOT / "tests" / "data" / "llama_layer" / "make_model.py", "--f16"), ROOT / "kernels" / "matmul"),
    # tests/models/test_ops_matmul_forms.py: OUT/matmul_CASE_model (the library alone)
    **{
        f"matmul_{case}_model": ((ROOT / "tests" / "data" / "matmul_forms" / "make_model.py", form, "--dtype", dtype), None)
        for case, form, dtype in [("nt", "wt", "f16"), ("batch1", "batch1", "f16"), ("bmm", "bmm", "f16"), ("qkt", "qkt", "f16"),
                                  ("f32", "gemm_tb", "f32"), ("tf32", "gemm_tb", "f32"), ("bmm_f32", "bmm", "f32"),
                                  ("qkt_f32", "qkt", "f32")]
    },
    "matmul_pv_f32_model": ((ROOT / "tests" / "data" / "matmul_forms" / "make_model.py", "bmm", "--dtype", "f32", "--n", "64"), None),
    # tests/run/test_model_gpu.py: a model called through load_module(DIR)
    "embedding_model": ((ROOT / "tests" / "data" / "embedding" / "make_model.py",), ROOT / "kernels" / "softmax"),
    # tests/models/test_ops_epilogue.py: matmuls replaced with their epilogues by the GEMM family.
    "epilogue_ffn_model": ((ROOT / "tests" / "models" / "epilogue_models.py", "ffn"), ROOT / "kernels" / "matmul"),
    "epilogue_mlp_model": ((ROOT / "tests" / "models" / "epilogue_models.py", "mlp"), ROOT / "kernels" / "matmul"),
    # tests/models/test_ops_epilogue_reshaped.py: a post-LN layer on 3-D activations (the whole library).
    "epilogue_post_ln_model": ((ROOT / "tests" / "models" / "epilogue_models.py", "post_ln"), None),
    # tests/models/test_ops_epilogue_swiglu.py: Llama's MLP, the gate with the silu_mul epilogue.
    "epilogue_swiglu_model": ((ROOT / "tests" / "models" / "epilogue_models.py", "swiglu"), ROOT / "kernels" / "matmul"),
    # tests/models/test_ops_epilogue_heads.py: Q/K/V projections with their transposes to heads (the whole library).
    "epilogue_heads_model": ((ROOT / "tests" / "models" / "heads_models.py",), None),
    # tests/models/test_ops_patch_conv.py: ViT's patch embedding (f16, batch 2; f32 at batch 1) by the library's matmuls.
    "patch_embedding_model": ((ROOT / "tests" / "models" / "patch_models.py",), None),
    "patch_embedding_f32_model": ((ROOT / "tests" / "models" / "patch_models.py", "--dtype", "f32", "--batch", "1"), None),
    # tests/models/test_ops_norm.py's NORM_MODELS: norms replaced by kernels/norm.
    **{
        f"norm_{name}_model": ((ROOT / "tests" / "data" / "norms" / "make_model.py", *args), ROOT / "kernels" / "norm")
        for name, args in {
            "layernorm_f16": ("--form", "layernorm", "--f16"),
            "layernorm_f32": ("--form", "layernorm"),
            "decomposed_f32": ("--form", "decomposed", "--no-bias"),
            "decomposed_bias_f32": ("--form", "decomposed", "--no-weight"),
            "rms_f16": ("--form", "rms", "--f16", "--eps", "1e-6"),
            "rms_f32": ("--form", "rms"),
            "rms_f16_wide": ("--form", "rms", "--f16", "--batch", "2", "--seq", "64", "--hidden", "4096"),
        }.items()
    },
}
TF32_MODELS = {"matmul_tf32_model"}  # built with tf32=True (f32 matmuls in plain TF32)


# The attention forms tests/models/test_attention_forms.py compares: OUT/attention_forms_<case>,
# built with the whole library (tests/data/attention_forms/gpu_cases.py).
FORMS = ROOT / "tests" / "data" / "attention_forms"


def projects() -> list[Path]:
    found = []
    for parent in (ROOT / "samples", ROOT / "kernels", ROOT / "tests" / "data"):
        found += sorted(p for p in parent.iterdir() if (p / "kitdispatch.toml").is_file() and p.name not in NOT_CUDA)
    return found


def build_projects(out: Path, failures: list[str], only: set[str]) -> None:
    for project in projects():
        if only and project.name not in only:
            continue
        archs = "sm_90a,sm_80" if project.name in HOPPER else "sm_80,sm_90"
        compilers = ["nvrtc"] + (["nvcc"] if project.name in NVCC_TOO and shutil.which("nvcc") else [])
        for compiler in compilers:
            name = project.name if compiler == "nvrtc" else f"{project.name}.{compiler}"
            try:
                kd.build(project, kd.BuildOptions.create(archs, compiler=compiler), out / name)
                print(f"built {project.relative_to(ROOT)} ({archs}, {compiler})", flush=True)
            except kd.KitError as exc:
                failures.append(f"{project.relative_to(ROOT)} ({compiler}): {str(exc).splitlines()[0]}")


def build_models(out: Path, failures: list[str], only: set[str], archs: str = "sm_90") -> None:
    for name, ((maker, *args), project) in MODELS.items():
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            model = Path(tmp) / "model.onnx"
            subprocess.run([sys.executable, str(maker), str(model), *args], check=True, timeout=300)
            try:
                kd.build_model(project, model, kd.BuildOptions.create(archs), out / name, with_baseline=True, tf32=name in TF32_MODELS)
                print(f"built {name} with {project.relative_to(ROOT) if project else 'the library'}", flush=True)
            except kd.KitError as exc:
                failures.append(f"{name}: {str(exc).splitlines()[0]}")


def build_attention_forms(out: Path, failures: list[str], only: set[str]) -> None:
    cases = runpy.run_path(str(FORMS / "gpu_cases.py"))
    for case, (kind, args, _) in cases["GPU_CASES"].items():
        name = f"attention_forms_{case}"
        if only and name not in only and "attention_forms" not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            model = Path(tmp) / cases["model_name"](kind)
            subprocess.run([sys.executable, str(FORMS / f"make_{kind}.py"), str(model), *args], check=True, timeout=300)
            try:
                kd.build_model(None, model, kd.BuildOptions.create(cases["ARCHS"]), out / name, with_baseline=True)
                print(f"built {name} with the library", flush=True)
            except kd.KitError as exc:
                failures.append(f"{name}: {str(exc).splitlines()[0]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to build into (one subfolder a project)")
    parser.add_argument("--no-models", action="store_true", help="skip the model samples")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME",
                        help="build only these projects and models (OUT's subfolder names; attention_forms: every form)")
    parser.add_argument("--model-arch", default="sm_90", metavar="ARCHS",
                        help="architectures of the model samples (default sm_90: the mma.sync path; sm_90a,sm_80 for Hopper's)")
    args = parser.parse_args(argv)
    only = set(args.only)
    known = {p.name for p in projects()} | set(MODELS) | {"attention_forms"}
    unknown = sorted(n for n in only if n not in known and not n.startswith("attention_forms_"))
    if unknown:
        parser.error(f"no project or model named {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    failures: list[str] = []
    build_projects(args.out, failures, only)
    if not args.no_models:
        build_models(args.out, failures, only, args.model_arch)
        build_attention_forms(args.out, failures, only)
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
