"""`kitdispatch doctor`: what toolchain and GPU this machine has, as kitdispatch sees them."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from kitdispatch._version import __version__

if TYPE_CHECKING:
    from kitdispatch.compile.archs import Arch
    from kitdispatch.compile.compilers import CompileOptions, Compiler


def collect() -> dict:
    report = {
        "kitdispatch": __version__,
        "nvrtc": _compiler("nvrtc") | _nvrtc_install(),
        "nvcc": _compiler("nvcc"),
        "iree_compiler": _pkg("iree-base-compiler"),
        "iree_runtime": _pkg("iree-base-runtime"),
        **_iree_release(),
        "gpu": _gpu(),
    }
    report["warnings"] = _warnings(report)
    return report


def _nvrtc_install() -> dict:
    """Which NVRTC the nvrtc backend loads, from where, with which headers and nvFatbin."""
    from kitdispatch.compile.toolchain import find_all_nvrtc, find_nvrtc

    install = find_nvrtc()
    if install is None:
        return {}
    return {
        "origin": install.origin,
        "cuda_major": install.cuda_major,
        "library": str(install.library),
        "include_dirs": [str(d) for d in install.include_dirs],
        "missing_headers": list(install.missing_headers),
        "headers_hint": install.headers_hint,
        "cccl": str(install.cccl_dir) if install.cccl_dir else None,
        "kit_headers": _kit_headers(),
        "nvfatbin": install.nvfatbin_version or (str(install.nvfatbin) if install.nvfatbin else None),
        "nvfatbin_hint": install.nvfatbin_hint,
        "not_used": [other.origin for other in find_all_nvrtc()[1:]],
    }


def _kit_headers() -> dict:
    from kitdispatch._resources import kit_headers

    headers = kit_headers()
    return {"folder": str(headers.folder), "prelude": headers.prelude.name, "files": list(headers.names), "digest": headers.digest}


def _iree_release() -> dict:
    """The IREE release the MLIR is generated for, and its codegen targets."""
    from kitdispatch.errors import KitError
    from kitdispatch.iree.tools import target_release

    try:
        release = target_release()
    except KitError as exc:  # an IREE version kitdispatch does not support
        return {"iree_release": None, "iree_error": exc.render(), "iree_codegen_targets": []}
    return {
        "iree_release": release.name,
        "iree_mlir_syntax": release.syntax.value,
        "iree_codegen_targets": [a.name for a in release.codegen_targets],
        "iree_crashing_targets": [a.name for a in release.crashing_targets],
    }


def _pkg(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _compiler(name: str) -> dict:
    from kitdispatch.compile.archs import Arch
    from kitdispatch.compile.compilers import CompileOptions, get_compiler
    from kitdispatch.errors import KitError

    try:
        compiler = get_compiler(name)
        info = {"version": compiler.version(), "archs": [a.name for a in compiler.supported_archs()]}
    except KitError as exc:
        return {"error": exc.what}
    info["ptx_isa"] = _ptx_isa(compiler, Arch.parse(info["archs"][0]), CompileOptions(std=None))
    return info


def _ptx_isa(compiler: Compiler, arch: Arch, options: CompileOptions) -> str | None:
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


def _gpu() -> dict:
    from kitdispatch.run.cuda_driver import driver_info
    from kitdispatch.run.driver_ptx import Version, max_ptx_isa
    from kitdispatch.run.module import cuda_status

    status = cuda_status()
    info: dict = {"available": status.available, "detail": status.reason}
    driver = driver_info()
    if driver is not None:
        info["driver_cuda_version"] = driver.version
        info["driver_max_ptx_isa"] = str(max_ptx_isa(Version.parse(driver.version)))
        info["devices"] = [{"name": d.name, "compute_capability": d.arch_name} for d in driver.devices]
    return info


def _warnings(report: dict) -> list[str]:
    """What will fail later: PTX or cubins the local driver cannot load, headers or nvFatbin
    missing beside NVRTC, two NVRTCs, an IREE release kitdispatch does not support."""
    from kitdispatch.compile.toolchain import nvrtc_for_driver
    from kitdispatch.run.driver_ptx import Version

    limit = report["gpu"].get("driver_max_ptx_isa")
    driver = report["gpu"].get("driver_cuda_version")
    out = []
    for name in ("nvrtc", "nvcc"):
        isa = report[name].get("ptx_isa")
        if limit and isa and isa[0].isdigit() and Version.parse(isa) > Version.parse(limit):
            out.append(
                f"{name} emits PTX ISA {isa} but this driver loads {limit} at most: "
                f"build with --format cubin or fatbin, or {nvrtc_for_driver(Version.parse(driver))}"
            )
    nvrtc = report["nvrtc"]
    if driver and nvrtc.get("cuda_major", 0) > Version.parse(driver).major:
        out.append(
            f"NVRTC is CUDA {nvrtc['cuda_major']} but this driver is CUDA {driver}: it loads neither "
            f"its cubins nor its PTX; install kitdispatch's cu{Version.parse(driver).major} extra (pip install -e '.[cu{Version.parse(driver).major}]' in its checkout) to build for it"
        )
    if nvrtc.get("missing_headers"):
        out.append(f"NVRTC has no {', '.join(nvrtc['missing_headers'])} (kernels that include CUDA headers "
                   f"fail to compile): {nvrtc['headers_hint']}")
    if "origin" in nvrtc and not nvrtc.get("cccl"):
        out.append(f"NVRTC has no CCCL (cooperative_groups, cub and cuda::std fail to compile): {nvrtc['headers_hint']}")
    if "origin" in nvrtc and not nvrtc.get("nvfatbin"):
        out.append(f"no nvFatbin beside NVRTC, so --format fatbin (the default) fails: {nvrtc['nvfatbin_hint']}")
    if nvrtc.get("not_used"):
        out.append(f"several NVRTCs are installed; kitdispatch uses {nvrtc['origin']}, not {', '.join(nvrtc['not_used'])}")
    if report.get("iree_error"):
        out.append(report["iree_error"].replace("\n", ";"))
    compiler, runtime = report["iree_compiler"], report["iree_runtime"]
    if compiler and runtime and compiler.split(".")[:2] != runtime.split(".")[:2]:
        out.append(f"iree-base-compiler {compiler} and iree-base-runtime {runtime} are different releases: "
                   "install the same release of both")
    return out


def format_report(report: dict) -> str:
    lines = [f"kitdispatch      {report['kitdispatch']}"]
    for name in ("nvrtc", "nvcc"):
        info = report[name]
        if "error" in info:
            lines.append(f"{name:<16} not available: {info['error']}")
        else:
            lines.append(f"{name:<16} {info['version']} (PTX ISA {info['ptx_isa']}; archs {', '.join(info['archs'])})")
        if "origin" in info:
            lines.append(f"  from           {info['origin']} ({info['library']})")
            lines.append(f"  headers        {', '.join(info['include_dirs']) or 'none'}")
            kit = info["kit_headers"]
            lines.append(f"  C headers      {kit['folder']} ({', '.join(kit['files'])}; pre-included {kit['prelude']})")
            lines.append(f"  nvfatbin       {info['nvfatbin'] or 'not installed'}")
    syntax = f" (MLIR for IREE {report['iree_release']})" if report.get("iree_release") else ""
    lines.append(f"iree compiler    {report['iree_compiler'] or 'not installed'}{syntax}")
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
