"""Where the shipped data folders live (inside the wheel, or at the top of a source checkout),
and the versions of installed toolchain packages."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """`mlir_templates` or `kernels`: packaged copy first, then the checkout's top level."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"kitdispatch data folder {name!r} is missing from the installation")


def installed_version(distribution: str, package: str) -> str | None:
    """The version of `distribution` (e.g. "nvidia-cuda-nvrtc") from its dist-info beside the
    import package it installs (e.g. "nvidia"); None when it is not installed that way.

    Read directly rather than through importlib.metadata, whose import alone (~15 ms) is more
    than a build with nothing to do spends on everything else.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or []) or ([str(Path(spec.origin).parent)] if spec.origin else [])
    pattern = f"{re.sub(r'[-_.]+', '_', distribution)}-*.dist-info/METADATA"
    for folder in folders:
        for metadata in Path(folder).parent.glob(pattern):
            m = re.search(r"^Version: (\S+)$", metadata.read_text(errors="replace"), re.M)
            if m:
                return m.group(1)
    return None
