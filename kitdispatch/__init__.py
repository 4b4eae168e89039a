"""kitdispatch: hand-written CUDA kernels as IREE custom dispatches.

Describe kernels (`Kernel`, `ModuleSpec` or a kitdispatch.toml), `build` them into a
.vmfb for IREE's cuda device, and call it with numpy through `load_module`.
"""

__version__ = "0.1.0"


def _interrupted_as_command() -> None:
    """A Ctrl-C while the `kitdispatch` command imports the package ends it as the command
    documents (exit 130, one line), not with a traceback; a program importing it gets its
    KeyboardInterrupt."""
    import os
    import sys

    argv = list(getattr(sys, "orig_argv", sys.argv))
    command = os.path.basename(sys.argv[0]).removesuffix(".exe") == "kitdispatch" or any(
        a == "-m" and b == "kitdispatch" for a, b in zip(argv, argv[1:])
    )
    if command:
        print("kitdispatch: interrupted", file=sys.stderr)
        raise SystemExit(130)


try:
    from .archs import Arch, parse_arch_list  # noqa: E402
    from .build import BuildOptions, BuildResult, build, build_all, generate, generate_all  # noqa: E402
    from .compilers import CompileOptions  # noqa: E402
    from .device import Device, DeviceArray, get_device  # noqa: E402
    from .errors import (  # noqa: E402
        AbiError,
        ArchError,
        BuildsFailed,
        CompileError,
        IreeCompileError,
        KitError,
        ManifestError,
        RuntimeUnavailable,
        ToolError,
        UsageError,
    )
    from .manifest import kernel_from_source, load_manifest  # noqa: E402
    from .runtime import Function, Module, cuda_status, load_module, run_function, run_module  # noqa: E402
    from .models import ModelBuild, build_model, export_torch  # noqa: E402
    from .compare import Comparison, compare_model, profile_module  # noqa: E402
    from .spec import Buffer, FunctionSignature, Kernel, ModuleSpec, Program, Replaces, Scalar, TensorType, TestSpec  # noqa: E402
    from . import cli  # noqa: E402, F401  (the console script's own import: inside this guard)
except KeyboardInterrupt:
    _interrupted_as_command()
    raise

__all__ = [
    "AbiError", "Arch", "ArchError", "Buffer", "BuildOptions", "BuildResult", "BuildsFailed", "CompileError",
    "CompileOptions", "Device", "DeviceArray", "Function", "FunctionSignature", "IreeCompileError", "Kernel", "KitError", "ManifestError",
    "Module", "ModuleSpec", "Program", "Replaces", "RuntimeUnavailable", "Scalar", "TensorType", "TestSpec",
    "ToolError", "UsageError", "build", "build_all", "cuda_status", "generate", "generate_all", "kernel_from_source", "load_manifest", "load_module", "parse_arch_list",
    "get_device", "run_function", "run_module", "ModelBuild", "build_model", "export_torch", "Comparison", "compare_model", "profile_module",
]
