"""Preflight: will the PTX we build load on the driver it has to run on?

A driver JIT-compiles PTX only up to the PTX ISA version it knows. NVRTC 13.5 emits ISA 9.5,
which a CUDA 13.0 driver rejects at load time (CUDA_ERROR_UNSUPPORTED_PTX_VERSION); this
module turns that run-time failure into a build-time error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kitdispatch.errors import KitError
from kitdispatch.run.cuda_driver import driver_version

# CUDA driver version -> newest PTX ISA it loads (from NVIDIA's PTX ISA release notes).
_DRIVER_PTX_ISA = {
    (11, 0): (7, 0), (11, 1): (7, 1), (11, 2): (7, 2), (11, 3): (7, 3), (11, 4): (7, 4),
    (11, 5): (7, 5), (11, 6): (7, 6), (11, 7): (7, 7), (11, 8): (7, 8),
    (12, 0): (8, 0), (12, 1): (8, 1), (12, 2): (8, 2), (12, 3): (8, 3), (12, 4): (8, 4),
    (12, 5): (8, 5), (12, 6): (8, 5), (12, 8): (8, 7), (12, 9): (8, 8),
}
# What a module that will not load should be rebuilt with, where no build is at hand to name
# the NVRTC wheel (`kitdispatch doctor` on the build machine names it).
REBUILD_HINT = "rebuild it with an NVRTC whose PTX this driver loads (kitdispatch doctor names it)"
_PTX_VERSION_RE = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", re.M)


class PreflightError(KitError):
    exit_code = 2


@dataclass(frozen=True, order=True)
class Version:
    major: int
    minor: int

    @classmethod
    def parse(cls, text: str, what: str = "version") -> "Version":
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(text))
        if not m:
            raise PreflightError(f"{what} {text!r} is not MAJOR.MINOR", fix="e.g. --min-driver 13.0")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


def ptx_isa(ptx: bytes) -> Version | None:
    m = _PTX_VERSION_RE.search(ptx)
    return Version(int(m.group(1)), int(m.group(2))) if m else None


def max_ptx_isa(driver: Version) -> Version:
    """CUDA 13.x drivers load PTX ISA 9.x (13.0 -> 9.0, as measured on a 580 driver)."""
    if (driver.major, driver.minor) in _DRIVER_PTX_ISA:
        return Version(*_DRIVER_PTX_ISA[(driver.major, driver.minor)])
    if driver.major >= 13:
        return Version(driver.major - 4, driver.minor)
    older = [k for k in _DRIVER_PTX_ISA if k <= (driver.major, driver.minor)]
    return Version(*_DRIVER_PTX_ISA[max(older)]) if older else Version(6, 0)


def local_driver() -> Version | None:
    version = driver_version()
    return Version.parse(version) if version else None


def check_ptx_loads(ptx_isa_version: Version, driver: Version, *, compiler: str, where: str, rebuild_with: str = REBUILD_HINT) -> None:
    """Raises when a driver of version `driver` cannot load PTX of `ptx_isa_version`;
    `rebuild_with` says which compiler would make PTX it loads (the build side knows the wheels)."""
    limit = max_ptx_isa(driver)
    if ptx_isa_version > limit:
        raise PreflightError(
            f"the PTX ({compiler}, ISA {ptx_isa_version}) would not load on CUDA driver {driver}, "
            f"which loads PTX ISA {limit} at most",
            where=where,
            fix=(
                "use --format cubin or --format fatbin (SASS needs no PTX JIT), or "
                f"{rebuild_with}, or raise --min-driver if every target machine has a newer driver"
            ),
        )
