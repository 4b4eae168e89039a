"""`kitdispatch doctor`: what toolchain and GPU this machine has, as kitdispatch sees them."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

from . import __version__


def collect() -> dict:
    return {
        "kitdispatch": __version__,
        "nvrtc": _compiler("nvrtc"),
        "nvcc": _compiler("nvcc"),
        "iree_compiler": _pkg("iree-base-compiler"),
        "iree_runtime": _pkg("iree-base-runtime"),
        "iree_codegen_targets": _codegen_targets(),
        "gpu": _gpu(),
    }


def _pkg(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _compiler(name: str) -> dict:
    from .archs import Arch
    from .compilers import CompileOptions, get_compiler
    from .errors import KitError

    try:
        compiler = get_compiler(name)
        info = {"version": compiler.version(), "archs": [a.name for a in compiler.supported_archs()]}
    except KitError as exc:
        return {"error": exc.what}
    info["ptx_isa"] = _ptx_isa(compiler, Arch.parse(info["archs"][0]), CompileOptions(std=None))
    return info


def _ptx_isa(compiler, arch, options) -> str | None:
    """The `.version` of the PTX this compiler emits: a driver loads only what it knows."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cu"
        src.write_text('extern "C" __global__ void probe() {}\n')
        try:
            ptx = compiler.compile(src, arch, "ptx", options).data.decode()
        except Exception as exc:  # a broken toolchain is what doctor reports, not a crash
            return f"unknown ({exc})"
    m = re.search(r"^\.version\s+(\S+)", ptx, re.M)
    return m.group(1) if m else None


def _codegen_targets() -> list[str]:
    from .iree_compile import IREE_CODEGEN_TARGETS

    return [a.name for a in IREE_CODEGEN_TARGETS]


def _gpu() -> dict:
    from .runtime import cuda_status

    status = cuda_status()
    info: dict = {"available": status.available, "detail": status.reason}
    if status.available:
        info.update(_driver_details())
    return info


def _driver_details() -> dict:
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return {}
    (err,) = cu.cuInit(0)
    if err != cu.CUresult.CUDA_SUCCESS:
        return {"driver_error": str(err)}
    _, ver = cu.cuDriverGetVersion()
    _, dev = cu.cuDeviceGet(0)
    _, name = cu.cuDeviceGetName(128, dev)
    attr = cu.CUdevice_attribute
    _, major = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    _, minor = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return {
        "driver_cuda_version": f"{ver // 1000}.{ver % 1000 // 10}",
        "device": name.split(b"\0")[0].decode(),
        "compute_capability": f"{major}.{minor}",
    }


def format_report(report: dict) -> str:
    lines = [f"kitdispatch      {report['kitdispatch']}"]
    for name in ("nvrtc", "nvcc"):
        info = report[name]
        if "error" in info:
            lines.append(f"{name:<16} not available: {info['error']}")
        else:
            lines.append(f"{name:<16} {info['version']} (PTX ISA {info['ptx_isa']}; archs {', '.join(info['archs'])})")
    lines.append(f"iree compiler    {report['iree_compiler'] or 'not installed'}")
    lines.append(f"iree runtime     {report['iree_runtime'] or 'not installed'}")
    lines.append(f"iree codegen     {', '.join(report['iree_codegen_targets'])}")
    gpu = report["gpu"]
    if gpu["available"]:
        lines.append(
            f"gpu              {gpu.get('device', '?')} (compute capability {gpu.get('compute_capability', '?')}), "
            f"driver CUDA {gpu.get('driver_cuda_version', '?')}"
        )
    else:
        lines.append(f"gpu              none: {gpu['detail']}")
    return "\n".join(lines)
