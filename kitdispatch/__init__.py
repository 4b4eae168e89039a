"""kitdispatch: hand-written CUDA kernels as IREE custom dispatches.

Describe kernels (`Kernel`, `ModuleSpec` or a kitdispatch.toml), `build` them into a
.vmfb for IREE's cuda device, and call it with numpy through `load_module`.
"""

__version__ = "0.1.0"

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
)
from .manifest import kernel_from_source, load_manifest  # noqa: E402
from .runtime import Function, Module, cuda_status, load_module, run_function, run_module  # noqa: E402
from .models import ModelBuild, build_model, export_torch  # noqa: E402
from .compare import Comparison, compare_model, profile_module  # noqa: E402
from .spec import Buffer, FunctionSignature, Kernel, ModuleSpec, Program, Replaces, Scalar, TensorType, TestSpec  # noqa: E402

__all__ = [
    "AbiError", "Arch", "ArchError", "Buffer", "BuildOptions", "BuildResult", "BuildsFailed", "CompileError",
    "CompileOptions", "Device", "DeviceArray", "Function", "FunctionSignature", "IreeCompileError", "Kernel", "KitError", "ManifestError",
    "Module", "ModuleSpec", "Program", "Replaces", "RuntimeUnavailable", "Scalar", "TensorType", "TestSpec",
    "ToolError", "build", "build_all", "cuda_status", "generate", "generate_all", "kernel_from_source", "load_manifest", "load_module", "parse_arch_list",
    "get_device", "run_function", "run_module", "ModelBuild", "build_model", "export_torch", "Comparison", "compare_model", "profile_module",
]
