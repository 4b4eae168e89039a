"""What every benchmark records beside its figures: the GPU and driver, package versions, Python.
Shared by benchmarks/*.py (run as scripts, so this folder is on sys.path)."""

from __future__ import annotations

import platform
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version


def package_versions(*names: str) -> dict[str, str | None]:
    """{"iree_base_runtime": "3.13.0", ...}: None for a package that is not installed."""
    out = {}
    for name in names:
        try:
            out[name.replace("-", "_")] = version(name)
        except PackageNotFoundError:
            out[name.replace("-", "_")] = None
    return out


def gpu(fields: str = "name,driver_version") -> str:
    """nvidia-smi's line for the GPU ('' where there is none)."""
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def cuda_driver() -> str | None:
    from kitdispatch.run.cuda_driver import driver_info

    info = driver_info()
    return info.version if info else None


def base(*packages: str, gpu_fields: str = "name,driver_version") -> dict:
    """The fields every benchmark records, with these packages' versions."""
    return {
        "gpu": gpu(gpu_fields),
        "cuda_driver": cuda_driver(),
        **package_versions(*packages),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
