"""Which CUDA toolchain the NVRTC backend uses: the NVRTC library, its version, the CUDA
headers that match it, and nvFatbin. Found on disk, without loading anything, so a build
whose objects all come from the cache still knows the compiler's version (its cache key).

Where each toolchain puts its files (Linux):

| install | NVRTC | CUDA headers (cuda_fp16.h, mma.h, crt/) | nvFatbin |
| --- | --- | --- | --- |
| CUDA 13 wheels: the `build` extra | nvidia/cu13/lib | nvidia/cu13/include (nvidia-cuda-runtime, nvidia-cuda-crt) | nvidia/cu13/lib |
| CUDA 12 wheels: the `cu12` extra | nvidia/cuda_nvrtc/lib | nvidia/cuda_runtime/include and, for crt/, nvidia/cuda_nvcc/include | nvidia/nvfatbin/lib |
| a CUDA toolkit (`$CUDA_HOME`, `$CUDA_PATH`, /usr/local/cuda) | lib64 | include | lib64 |

When several are installed the first in that order wins (the order cuda-python's own loader
searches); kitdispatch loads that library itself before cuda-python does, so the NVRTC it
reports (`kitdispatch doctor`) is the one that compiles, with headers of the same CUDA major.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from kitdispatch._resources import installed_version
from kitdispatch.run.driver_ptx import Version
from kitdispatch.errors import KitError

# Headers a compile of `#include <cuda_fp16.h>` or `<mma.h>` needs from the include path.
REQUIRED_HEADERS = ("cuda_fp16.h", "crt/host_defines.h")


@dataclass(frozen=True)
class _Layout:
    """Where one toolchain keeps its files, relative to its root folder."""

    cuda_major: int
    kind: str  # "pip" or "toolkit"
    nvrtc: str
    headers: tuple[str, ...]
    nvfatbin: str
    nvrtc_distribution: str | None = None
    nvfatbin_distribution: str | None = None
    header_distributions: tuple[str, ...] = ()

    @property
    def install_hint(self) -> str:
        return "pip install " + " ".join(f"'{d}=={_series(self.cuda_major)}'" for d in self.header_distributions)


def _series(major: int) -> str:
    """The release series the kit's extras install: 13.0 (its PTX loads on every CUDA 13
    driver) and 12.9 (the last CUDA 12)."""
    return {13: "13.0.*", 12: "12.9.*"}[major]


# Relative to a site-packages `nvidia` folder, in cuda-python's search order.
_WHEEL_LAYOUTS = (
    _Layout(
        13, "pip", "cu13/lib/libnvrtc.so.13", ("cu13/include", "cu13/include/cccl"), "cu13/lib/libnvfatbin.so.13",
        "nvidia-cuda-nvrtc", "nvidia-nvfatbin", ("nvidia-cuda-runtime", "nvidia-cuda-crt", "nvidia-cuda-cccl"),
    ),
    _Layout(
        12, "pip", "cuda_nvrtc/lib/libnvrtc.so.12", ("cuda_runtime/include", "cuda_nvcc/include", "cuda_cccl/include"),
        "nvfatbin/lib/libnvfatbin.so.12",
        "nvidia-cuda-nvrtc-cu12", "nvidia-nvfatbin-cu12",
        ("nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-cccl-cu12"),
    ),
)
# Relative to a CUDA toolkit's root (CUDA 13 keeps CCCL in include/cccl, CUDA 12 in include).
_TOOLKIT_LAYOUTS = tuple(
    _Layout(major, "toolkit", f"{lib}/libnvrtc.so.{major}", ("include", "include/cccl"), f"{lib}/libnvfatbin.so.{major}")
    for major in (13, 12)
    for lib in ("lib64", "targets/x86_64-linux/lib")
)


def wheel_distributions(cuda_major: int) -> tuple[str, ...]:
    """NVRTC's wheel and its header wheels, for a CUDA major kitdispatch has wheels for."""
    layout = next(layout for layout in _WHEEL_LAYOUTS if layout.cuda_major == cuda_major)
    return (layout.nvrtc_distribution, *layout.header_distributions)


@dataclass(frozen=True)
class NvrtcInstall:
    """One NVRTC library and what belongs with it."""

    library: Path
    cuda_major: int
    version: str  # the wheel's full version, or the library file's (libnvrtc.so.13.0.88)
    origin: str  # "pip: nvidia-cuda-nvrtc-cu12 12.9.86" or "CUDA toolkit /usr/local/cuda-13.0"
    include_dirs: tuple[Path, ...]
    missing_headers: tuple[str, ...]  # of REQUIRED_HEADERS, with the command that installs them
    nvfatbin: Path | None
    nvfatbin_version: str | None
    layout: _Layout

    @property
    def cccl_dir(self) -> Path | None:
        """The include folder with CCCL (cuda/std, cub, nv/target), which cooperative_groups needs."""
        return next((d for d in self.include_dirs if (d / "cuda/std/type_traits").is_file()), None)

    @property
    def headers_hint(self) -> str:
        if self.layout.kind == "pip":
            return self.layout.install_hint
        return f"install the CUDA {self.cuda_major} toolkit's headers, or pass -I with a folder that has them"

    @property
    def nvfatbin_hint(self) -> str:
        if self.layout.kind == "pip":
            return f"pip install '{self.layout.nvfatbin_distribution}=={_series(self.cuda_major)}', or use --compiler nvcc"
        return "install the CUDA toolkit's nvFatbin, or use --compiler nvcc"


def find_all_nvrtc() -> tuple[NvrtcInstall, ...]:
    """Every NVRTC found, the one kitdispatch uses first."""
    found = [_install(root, layout) for root in _nvidia_folders() for layout in _WHEEL_LAYOUTS]
    found += [_install(root, layout) for root in _toolkit_roots() for layout in _TOOLKIT_LAYOUTS]
    unique: dict[Path, NvrtcInstall] = {}
    for install in found:
        if install is not None:
            unique.setdefault(install.library.resolve(), install)  # a toolkit symlinked twice
    return tuple(unique.values())


@functools.cache
def find_nvrtc() -> NvrtcInstall | None:
    """The NVRTC kitdispatch compiles with, or None where none is installed."""
    found = find_all_nvrtc()
    return found[0] if found else None


def _install(root: Path, layout: _Layout) -> NvrtcInstall | None:
    library = root / layout.nvrtc
    if not library.is_file():
        return None
    include_dirs = tuple(d for d in (root / h for h in layout.headers) if d.is_dir())
    missing = tuple(h for h in REQUIRED_HEADERS if not any((d / h).is_file() for d in include_dirs))
    nvfatbin = root / layout.nvfatbin
    if layout.kind == "pip":
        version = installed_version(layout.nvrtc_distribution, "nvidia") or _file_version(library)
        origin = f"pip: {layout.nvrtc_distribution} {version}"
        fatbin_version = installed_version(layout.nvfatbin_distribution, "nvidia") if nvfatbin.is_file() else None
    else:
        version = _file_version(library)
        origin = f"CUDA toolkit {root}"
        fatbin_version = _file_version(nvfatbin) if nvfatbin.is_file() else None
    return NvrtcInstall(
        library=library,
        cuda_major=layout.cuda_major,
        version=version,
        origin=origin,
        include_dirs=include_dirs,
        missing_headers=missing,
        nvfatbin=nvfatbin if nvfatbin.is_file() else None,
        nvfatbin_version=fatbin_version,
        layout=layout,
    )


def _nvidia_folders() -> list[Path]:
    """The `nvidia` namespace package's folders (one per site-packages that has NVIDIA wheels)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def _toolkit_roots() -> list[Path]:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return list(dict.fromkeys(Path(r) for r in roots if r))


def _file_version(library: Path) -> str:
    """libnvrtc.so.13 -> its real file libnvrtc.so.13.0.88 -> "13.0.88"."""
    m = re.search(r"\.so\.(\d+(?:\.\d+)*)$", library.resolve().name)
    return m.group(1) if m else "unknown"


# -------------------------------------------------------------------------------- loading


def not_installed_error() -> KitError:
    return KitError(
        "NVRTC is not installed",
        fix="install kitdispatch's build extra (CUDA 13) or its cu12 extra (CUDA 12 drivers, Volta): pip install -e '.[build]' in its checkout, "
        "or use --compiler nvcc",
    )


@functools.cache
def load_nvrtc() -> ModuleType:
    """cuda-python's NVRTC bindings, bound to `find_nvrtc()`'s library."""
    install = find_nvrtc()
    if install is not None:
        fix = (f"pip install --force-reinstall '{install.layout.nvrtc_distribution}'"
               if install.layout.kind == "pip" else "check the CUDA toolkit")
        # NVRTC opens its builtins library by name (libnvrtc-builtins.so.13.0) at the first
        # compile, and the folder it lies in is on no search path: load it first as well.
        for builtins in sorted(install.library.parent.glob(f"libnvrtc-builtins.so.{install.cuda_major}.*")):
            _preload(builtins, "NVRTC builtins", fix)
        _preload(install.library, "NVRTC", fix)
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise KitError(
            f"cuda-python is not installed ({exc})",
            fix="pip install cuda-python (kitdispatch's build or cu12 extra), or use --compiler nvcc",
        ) from None
    try:
        err, major, _ = nvrtc.nvrtcVersion()
    except Exception:  # cuda-python raises RuntimeError when it finds no libnvrtc
        raise not_installed_error() from None
    if install is not None and major != install.cuda_major:
        raise KitError(
            f"this process already has NVRTC {major} loaded, not {install.origin}",
            fix="load kitdispatch before other CUDA libraries, or install only one CUDA major's NVRTC",
        )
    return nvrtc


@functools.cache
def load_nvfatbin() -> ModuleType:
    """cuda-python's nvFatbin bindings, bound to the nvFatbin beside the NVRTC in use (an
    nvFatbin of another CUDA major may not know that NVRTC's architectures)."""
    install = find_nvrtc()
    if install is not None and install.nvfatbin is None:
        raise KitError(f"nvFatbin is not installed beside {install.origin}", fix=install.nvfatbin_hint)
    if install is not None:
        _preload(install.nvfatbin, "nvFatbin", install.nvfatbin_hint)
    try:
        from cuda.bindings import nvfatbin

        nvfatbin.version()
    except ImportError as exc:
        raise KitError(f"nvFatbin is not available: {exc}", fix="pip install 'nvidia-nvfatbin==13.0.*' cuda-python (kitdispatch's build extra)") from None
    except Exception as exc:  # cuda-pathfinder raises when it finds no libnvfatbin
        raise KitError(
            f"nvFatbin library could not be loaded: {str(exc).splitlines()[0]}",
            fix="pip install 'nvidia-nvfatbin==13.0.*' (kitdispatch's build extra; 'nvidia-nvfatbin-cu12' for cu12), or use --compiler nvcc",
        ) from None
    return nvfatbin


def _preload(library: Path, what: str, fix: str) -> None:
    """Loads `library` first: cuda-python's loader takes a library that is already loaded
    under its name (libnvrtc.so.12 or .13) before searching for one."""
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise KitError(f"{what} library {library} could not be loaded: {exc}", fix=fix) from None


# The minor releases of the NVRTC wheels on PyPI, by CUDA major (there is no 12.7).
_NVRTC_WHEEL_MINORS = {12: (0, 1, 2, 3, 4, 5, 6, 8, 9), 13: (0, 1, 2, 3, 4, 5)}


def nvrtc_for_driver(driver: Version) -> str:
    """How to install the newest NVRTC whose PTX a driver of version `driver` loads."""
    if driver.major not in _NVRTC_WHEEL_MINORS:
        return f"build with the nvcc of a CUDA {driver.major} toolkit (--compiler nvcc)"
    release = f"{driver.major}.{max(m for m in _NVRTC_WHEEL_MINORS[driver.major] if m <= driver.minor)}"
    extra = "cu12" if driver.major == 12 else "build"
    pins = " ".join(f"'{d}=={release}.*'" for d in wheel_distributions(driver.major))
    return f"install NVRTC {release}, whose PTX loads there: pip install {pins} (kitdispatch's {extra} extra)"
