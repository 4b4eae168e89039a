"""Reading kernel entries back out of PTX, to check them against the declared layout."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .errors import AbiError
from .spec import Buffer, Kernel

ENTRY_RE = re.compile(
    r"\.entry\s+(?P<name>[\w$.]+)\s*\((?P<params>[^)]*)\)(?P<directives>[^{]*)\{", re.S
)
_PARAM_RE = re.compile(
    r"\.param\s+(?:\.align\s+(?P<align>\d+)\s+)?(?:\.ptr\s+(?:\.\w+\s+)*)?\.(?P<type>[usfb]\d+)"
    r"(?:\s+\.ptr(?:\s+\.(?!align\b)\w+)*(?:\s+\.align\s+\d+)?)?\s+(?P<name>[\w$.]+)(?:\[(?P<count>\d+)\])?"
)
_NTID_RE = re.compile(r"\.(?P<kind>reqntid|maxntid)\s+(?P<dims>\d+(?:\s*,\s*\d+)*)")


@dataclass(frozen=True)
class PtxParam:
    name: str
    size: int  # bytes


@dataclass(frozen=True)
class PtxEntry:
    name: str
    params: tuple[PtxParam, ...]
    reqntid: tuple[int, ...] | None = None
    maxntid: tuple[int, ...] | None = None


def parse_entries(ptx: str) -> dict[str, PtxEntry]:
    entries = {}
    for m in ENTRY_RE.finditer(ptx):
        params = tuple(
            PtxParam(p.group("name"), int(p.group("type")[1:]) // 8 * int(p.group("count") or 1))
            for p in _PARAM_RE.finditer(m.group("params"))
        )
        ntid = {n.group("kind"): tuple(int(d) for d in n.group("dims").split(",")) for n in _NTID_RE.finditer(m.group("directives"))}
        entries[m.group("name")] = PtxEntry(m.group("name"), params, ntid.get("reqntid"), ntid.get("maxntid"))
    return entries


def check_kernel_against_ptx(kernel: Kernel, entries: dict[str, PtxEntry], where: str) -> None:
    """The object must export the kernel with the parameters and block size the layout declares.

    Each C parameter must have the size of what the layout puts there (abi.py): a pointer
    8 bytes, a scalar its type's size (a 64-bit half 4 bytes). Entries whose parameters IREE
    cannot fill as they are (8-byte scalars, pointers after scalars) are bridged after this
    check (bridge.py)."""
    entry = entries.get(kernel.entry)
    if entry is None:
        have = ", ".join(sorted(entries)) or "none"
        named = kernel.name if kernel.entry == kernel.name else f"{kernel.name} ({kernel.entry})"
        raise AbiError(
            f"kernel {named!r} is not in the compiled object (entries found: {have})",
            where=where,
            fix='declare it `extern "C" __global__` in the source, or correct the name in the manifest',
        )
    slots = kernel.c_slots
    if len(entry.params) != len(slots):
        raise AbiError(
            f"kernel {kernel.name!r} takes {len(entry.params)} parameters in the compiled object "
            f"but the manifest declares {len(slots)} ({', '.join(s.name for s in slots)})",
            where=where,
            fix="declare every C parameter of the kernel, in the order of its signature",
        )
    for i, (slot, compiled) in enumerate(zip(slots, entry.params)):
        if compiled.size != slot.size:
            p = slot.param
            what = (
                "a pointer" if isinstance(p, Buffer)
                else f"a 32-bit half of {p.dtype} {p.name!r}" if p.split
                else p.dtype
            )
            hint = (
                "; a 64-bit scalar is declared i64, u64 or f64"
                if compiled.size == 8 and not isinstance(p, Buffer) else ""
            )
            raise AbiError(
                f"kernel {kernel.name!r} parameter {i} ({slot.name!r}) is declared as {what} "
                f"({slot.size} bytes) but the compiled kernel takes {compiled.size} bytes there{hint}",
                where=where,
                fix="make the manifest's params match the C signature, in order",
            )
    _check_block_size(kernel, entry, where)


def _check_block_size(kernel: Kernel, entry: PtxEntry, where: str) -> None:
    size = kernel.workgroup_size
    if entry.reqntid is not None:
        req = tuple(entry.reqntid) + (1,) * (3 - len(entry.reqntid))
        if req != size:
            raise AbiError(
                f"kernel {kernel.name!r} requires a block of {list(req)} threads (.reqntid) "
                f"but workgroup_size is {list(size)}",
                where=where,
                fix="make workgroup_size match the kernel's required block size",
            )
    if entry.maxntid is not None and math.prod(size) > math.prod(entry.maxntid):
        raise AbiError(
            f"kernel {kernel.name!r} allows at most {math.prod(entry.maxntid)} threads a block "
            f"(__launch_bounds__) but workgroup_size {list(size)} has {math.prod(size)}",
            where=where,
            fix="lower workgroup_size or raise the kernel's __launch_bounds__",
        )
