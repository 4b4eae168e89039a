"""The local CUDA driver through ctypes: version and devices, with no CUDA Python package.

Run-only machines have iree-base-runtime and numpy, nothing else; the preflight still
needs to know which PTX the driver can load.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

_ATTR_CC_MAJOR = 75  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
_ATTR_CC_MINOR = 76


@dataclass(frozen=True)
class CudaDevice:
    index: int
    name: str
    capability: int  # major*10+minor

    @property
    def arch_name(self) -> str:
        return f"sm_{self.capability}"


@dataclass(frozen=True)
class DriverInfo:
    version: str  # the CUDA version the driver supports, e.g. "13.0"
    devices: tuple[CudaDevice, ...]


@functools.cache
def libcuda() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


@functools.cache
def driver_version() -> str | None:
    """The CUDA version the driver supports, e.g. "13.0"; None where there is no driver.
    No cuInit: that alone takes a tenth of a second or more on a GPU machine, and a build
    only needs the version (its PTX check)."""
    lib = libcuda()
    version = ctypes.c_int()
    if lib is None or lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


@functools.cache
def driver_info() -> DriverInfo | None:
    """The version and the devices. None where there is no libcuda (no NVIDIA driver)."""
    lib, text = libcuda(), driver_version()
    if lib is None or text is None:
        return None
    if lib.cuInit(0) != 0:
        return DriverInfo(text, ())
    count = ctypes.c_int()
    lib.cuDeviceGetCount(ctypes.byref(count))
    devices = []
    for i in range(count.value):
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), i) != 0:
            continue
        name = ctypes.create_string_buffer(256)
        lib.cuDeviceGetName(name, 256, dev)
        major, minor = ctypes.c_int(), ctypes.c_int()
        lib.cuDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, dev)
        lib.cuDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, dev)
        devices.append(CudaDevice(i, name.value.decode(errors="replace"), major.value * 10 + minor.value))
    return DriverInfo(text, tuple(devices))
