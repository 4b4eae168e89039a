"""kitdispatch: hand-written CUDA kernels as IREE custom dispatches.

Describe kernels (`Kernel`, `ModuleSpec` or a kitdispatch.toml), `build` them into a
.vmfb for IREE's cuda device, and call it with numpy through `load_module`.

The public names load on first use, each from the stage that owns it, so that a program that
only runs modules (`from kitdispatch import load_module`) imports the run side alone: no jinja2,
no compilers, no iree.compiler.
"""

import importlib

from kitdispatch._version import __version__ as __version__

# Public name -> the module that defines it (packages by stage: README "Layout").
_PUBLIC = {
    **dict.fromkeys(("Arch", "parse_arch_list"), "kitdispatch.compile.archs"),
    **dict.fromkeys(("BuildResult", "build", "build_all", "generate", "generate_all"),
                    "kitdispatch.builder.pipeline"),
    "BuildOptions": "kitdispatch.builder.options",
    "CompileOptions": "kitdispatch.compile.compilers",
    **dict.fromkeys(("Device", "DeviceArray", "get_device"), "kitdispatch.run.device"),
    **dict.fromkeys(("AbiError", "ArchError", "BuildsFailed", "CompileError", "IreeCompileError", "KitError",
                     "ManifestError", "RuntimeUnavailable", "ToolError", "UsageError"), "kitdispatch.errors"),
    **dict.fromkeys(("kernel_from_source", "load_manifest"), "kitdispatch.describe.manifest"),
    **dict.fromkeys(("Module", "cuda_status", "load_module"), "kitdispatch.run.module"),
    "Function": "kitdispatch.run.function",
    **dict.fromkeys(("run_function", "run_module"), "kitdispatch.run.cli_calls"),
    **dict.fromkeys(("ModelBuild", "ModelBuildFailed", "build_model", "export_torch"), "kitdispatch.models.pipeline"),
    **dict.fromkeys(("Comparison", "compare_model", "profile_module"), "kitdispatch.models.compare"),
    **dict.fromkeys(("TuneResult", "tune_model"), "kitdispatch.models.tune"),
    **dict.fromkeys(("Buffer", "Kernel", "Replaces", "Scalar"), "kitdispatch.describe.kernel"),
    **dict.fromkeys(("FunctionSignature", "TensorType"), "kitdispatch.describe.types"),
    **dict.fromkeys(("ModuleSpec", "Program", "TestSpec"), "kitdispatch.describe.module"),
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'kitdispatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


def _running_as_command() -> bool:
    import os
    import sys

    argv = list(getattr(sys, "orig_argv", sys.argv))
    return os.path.basename(sys.argv[0]).removesuffix(".exe") == "kitdispatch" or any(
        a == "-m" and b == "kitdispatch" for a, b in zip(argv, argv[1:])
    )


# A Ctrl-C while the `kitdispatch` command imports its CLI ends it as the command documents
# (exit 130, one line), not with a traceback; a program importing the package gets its
# KeyboardInterrupt.
if _running_as_command():
    try:
        from kitdispatch import cli  # noqa: F401  (the console script's own import: inside this guard)
    except KeyboardInterrupt:
        import sys

        print("kitdispatch: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
