"""`kitdispatch doctor`: what toolchain and GPU this machine has, as kitdispatch sees them."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

from . import __version__


def collect() -> dict:
    report = {
        "kitdispatch": __version__,
        "nvrtc": _compiler("nvrtc"),
        "nvcc": _compiler("nvcc"),
        "iree_compiler": _pkg("iree-base-compiler"),
        "iree_runtime": _pkg("iree-base-runtime"),
        "iree_codegen_targets": _codegen_targets(),
        "gpu": _gpu(),
    }
    report["warnings"] = _warnings(report)
    return report


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
    from .cuda_driver import driver_info
    from .preflight import Version, max_ptx_isa
    from .runtime import cuda_status

    status = cuda_status()
    info: dict = {"available": status.available, "detail": status.reason}
    driver = driver_info()
    if driver is not None:
        info["driver_cuda_version"] = driver.version
        info["driver_max_ptx_isa"] = str(max_ptx_isa(Version.parse(driver.version)))
        info["devices"] = [{"name": d.name, "compute_capability": d.arch_name} for d in driver.devices]
    return info


def _warnings(report: dict) -> list[str]:
    """PTX that a compiler here emits but the local driver cannot load."""
    from .preflight import Version

    limit = report["gpu"].get("driver_max_ptx_isa")
    out = []
    for name in ("nvrtc", "nvcc"):
        isa = report[name].get("ptx_isa")
        if limit and isa and isa[0].isdigit() and Version.parse(isa) > Version.parse(limit):
            out.append(
                f"{name} emits PTX ISA {isa} but this driver loads {limit} at most: "
                "build with --format cubin or fatbin, or pin an older NVRTC"
            )
    return out


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
    if "driver_cuda_version" in gpu:
        lines.append(f"cuda driver      {gpu['driver_cuda_version']} (loads PTX ISA {gpu['driver_max_ptx_isa']} at most)")
    for d in gpu.get("devices", []):
        lines.append(f"gpu              {d['name']} ({d['compute_capability']})")
    if not gpu["available"]:
        lines.append(f"gpu              none usable by IREE: {gpu['detail']}")
    lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)
