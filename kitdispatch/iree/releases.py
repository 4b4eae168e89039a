"""The IREE releases kitdispatch generates MLIR for, and what it knows of each."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kitdispatch.compile.archs import Arch
from kitdispatch.emit.syntax import AttributeSyntax, EntryPoints, Spelling
from kitdispatch.errors import KitError


@dataclass(frozen=True)
class IreeRelease:
    """What kitdispatch knows of one IREE release series, measured with iree-base-compiler
    3.10.0, 3.11.0, 3.12.0 and 3.13.0 (a dispatch IREE generates, compiled for every target
    from sm_50 to sm_121)."""

    series: tuple[int, int]
    spelling: Spelling  # how its MLIR is written (emit/syntax.py)
    # CUDA targets IREE's codegen knows; any other gives "missing GPU target in
    # #hal.executable.target" for an IREE-generated dispatch. Hand-written kernels are not
    # limited by this list.
    codegen_targets: tuple[Arch, ...]
    # Targets that abort the whole process (an LLVM ERROR, in process as well) instead of failing.
    crashing_targets: tuple[Arch, ...] = ()

    @property
    def syntax(self) -> AttributeSyntax:
        return self.spelling.syntax

    @property
    def name(self) -> str:
        return f"{self.series[0]}.{self.series[1]}"


def _archs(names: str) -> tuple[Arch, ...]:
    return tuple(Arch.parse(n) for n in names.split())


_ORDINALS = Spelling(AttributeSyntax.ATTR_DICT, EntryPoints.ORDINAL)
_ATTR_DICT = Spelling(AttributeSyntax.ATTR_DICT, EntryPoints.FUNCTION)
_PROPERTIES = Spelling(AttributeSyntax.PROPERTIES, EntryPoints.FUNCTION)
_PASCAL_TO_ORIN = "sm_60 sm_61 sm_62 sm_70 sm_72 sm_75 sm_80 sm_86 sm_87"
IREE_RELEASES = {
    (3, 10): IreeRelease((3, 10), _ORDINALS, _archs(_PASCAL_TO_ORIN)),
    (3, 11): IreeRelease((3, 11), _ORDINALS, _archs(_PASCAL_TO_ORIN)),
    # "PTX version 7.6 does not support target 'sm_120'": LLVM ERROR, the process aborts.
    (3, 12): IreeRelease((3, 12), _ATTR_DICT, _archs(_PASCAL_TO_ORIN + " sm_89"), _archs("sm_120 sm_121")),
    (3, 13): IreeRelease((3, 13), _PROPERTIES, _archs(_PASCAL_TO_ORIN + " sm_89 sm_120 sm_121")),
}
OLDEST_RELEASE, NEWEST_RELEASE = IREE_RELEASES[min(IREE_RELEASES)], IREE_RELEASES[max(IREE_RELEASES)]
SUPPORTED_RANGE = f"{OLDEST_RELEASE.name} through {NEWEST_RELEASE.name}"
SUPPORTED_PIN = f"iree-base-compiler>={OLDEST_RELEASE.name},<{NEWEST_RELEASE.series[0]}.{NEWEST_RELEASE.series[1] + 1}"


def release_of(version: str) -> IreeRelease:
    """The release series of an iree-base-compiler version ("3.13.0", "3.13.0rc20261016")."""
    m = re.match(r"(\d+)\.(\d+)", version)
    release = IREE_RELEASES.get((int(m.group(1)), int(m.group(2)))) if m else None
    if release is None:
        raise KitError(
            f"IREE {version} is not supported: kitdispatch generates MLIR for IREE {SUPPORTED_RANGE}",
            fix=f"pip install '{SUPPORTED_PIN}' (and the iree-base-runtime of the same release)",
        )
    return release
