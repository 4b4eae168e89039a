"""Where the shipped data folders live (inside the wheel, or at the top of a source checkout),
and the versions of installed toolchain packages."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """`mlir_templates` or `kernels`: packaged copy first, then the checkout's top level."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"kitdispatch data folder {name!r} is missing from the installation")


@dataclass(frozen=True)
class KitHeaders:
    """The C library headers the kit gives NVRTC (kitdispatch/include), and their digest for
    the cache key: an edit to any of them is a new key."""

    folder: Path
    prelude: Path
    digest: str
    names: tuple[str, ...]


@functools.cache
def kit_headers() -> KitHeaders:
    folder = _PACKAGE / "include"
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".md")
    digest = hashlib.sha256()
    for path in files:
        name = path.relative_to(folder).as_posix()
        data = path.read_bytes()
        digest.update(f"{len(name)}:{name}{len(data)}:".encode() + data)
    names = tuple(p.relative_to(folder).as_posix() for p in files)
    return KitHeaders(folder, folder / "kitdispatch_nvrtc_prelude.h", digest.hexdigest()[:16], names)


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
