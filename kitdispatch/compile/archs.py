"""GPU architecture names: parsing, ordering and validation against a compiler."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from kitdispatch.errors import ArchError

# Family names users know from NVIDIA's marketing, mapped to the base architecture.
FAMILIES = {
    "turing": "sm_75",
    "ampere": "sm_80",
    "ada": "sm_89",
    "lovelace": "sm_89",
    "hopper": "sm_90",
    "blackwell": "sm_100",
}

_ARCH_RE = re.compile(r"^sm_(\d+)(\d)([af]?)$")  # the minor is always the last digit


@dataclass(frozen=True, order=True)
class Arch:
    """A CUDA compute capability, e.g. sm_90 (major 9, minor 0) or sm_90a."""

    major: int
    minor: int
    suffix: str = ""  # "a" (architecture-specific) or "f" (family-specific) features

    @classmethod
    def parse(cls, text: str) -> "Arch":
        name = FAMILIES.get(text.strip().lower(), text.strip().lower())
        m = _ARCH_RE.match(name)
        if not m:
            families = ", ".join(sorted(FAMILIES))
            raise ArchError(
                f"unknown architecture {text!r}",
                fix=f"use sm_XX (e.g. sm_80, sm_90, sm_90a) or a family name ({families})",
            )
        return cls(int(m.group(1)), int(m.group(2)), m.group(3))

    @property
    def name(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def compute_name(self) -> str:
        return f"compute_{self.major}{self.minor}{self.suffix}"

    @property
    def capability(self) -> int:
        """Compute capability as major*10+minor, as the device reports it."""
        return self.major * 10 + self.minor

    def __str__(self) -> str:
        return self.name


def parse_arch_list(items: Iterable[str] | str) -> tuple[Arch, ...]:
    """Parses 'sm_80,sm_90' or a list of names; newest first, duplicates dropped."""
    if isinstance(items, str):
        items = items.split(",")
    names = [s for s in (i.strip() for i in items) if s]
    if not names:
        raise ArchError("no architecture given", fix="pass at least one, e.g. --arch sm_80")
    return tuple(sorted({Arch.parse(n) for n in names}, reverse=True))


# Compute capabilities NVIDIA has shipped GPUs of (Fermi to Blackwell), to tell a typo from
# an architecture the compiler has dropped.
KNOWN_CAPABILITIES = (20, 21, 30, 32, 35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 110, 120, 121)


def check_supported(archs: Iterable[Arch], supported: Iterable[Arch], compiler: str) -> None:
    """Rejects an architecture the compiler cannot target, saying why and listing the ones
    it can."""
    supported = sorted(set(supported))
    supported_caps = {a.capability for a in supported}
    for arch in archs:
        if arch.capability not in supported_caps:
            if arch.capability not in KNOWN_CAPABILITIES:
                why = "no NVIDIA GPU has that compute capability"
            elif supported and arch.capability < supported[0].capability:
                why = f"{compiler} no longer supports GPUs older than {supported[0].name}"
            elif supported and arch.capability > supported[-1].capability:
                why = f"it is newer than {compiler}'s newest target, {supported[-1].name}"
            else:
                why = f"{compiler} does not support it"
            raise ArchError(
                f"{compiler} cannot target {arch.name}: {why}",
                fix=f"choose from what {compiler} supports: {', '.join(a.name for a in supported)}",
            )


def ptx_fallback_archs(archs: Iterable[Arch]) -> tuple[Arch, ...]:
    """Which architectures' PTX to ship beside SASS: the newest, for GPUs newer than every
    target, and the oldest, for a GPU between targets of different majors (SASS runs only
    within its major). Arch-specific targets (sm_90a) are left out: their PTX runs only on
    that exact architecture."""
    portable = sorted({a for a in archs if not a.suffix}, reverse=True)
    return tuple(dict.fromkeys([portable[0], portable[-1]])) if portable else ()
