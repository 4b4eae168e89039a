"""Reading kernel entries back out of PTX, to check them against the declared layout."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .errors import AbiError
from .spec import Buffer, Kernel

# An entry's definition; a declaration (`.entry k (...);`, before a variable that holds the
# kernel's address) ends at its `;` and is no match.
ENTRY_RE = re.compile(
    r"\.entry\s+(?P<name>[\w$.]+)\s*\((?P<params>[^)]*)\)(?P<directives>[^{;]*)\{", re.S
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


def stores_to_inputs(kernel: Kernel, ptx: str) -> list[str]:
    """A warning for each `in` buffer the kernel's PTX stores through: IREE binds it
    read-only and may share it with other values, so the write is lost or corrupts them."""
    slots = kernel.c_slots
    warnings = []
    for i in written_params(ptx, kernel.entry):
        p = slots[i].param if i < len(slots) else None
        if isinstance(p, Buffer) and p.access == "in":
            warnings.append(
                f"kernel {kernel.name!r} stores through {p.name!r}, which the manifest declares `in` "
                "(read-only): IREE may share that buffer with other values, so the result is undefined; "
                f"declare it inout = [\"{p.name}\"] (or out), or make the pointer const if it is only read"
            )
    return warnings


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


# ------------------------------------------------------------------ stores through params

_INSTR_RE = re.compile(r"^\s*(?:@!?%\w+\s+)?(?P<op>[a-z][\w.]*)\s+(?P<args>[^;]*);")
_REG_RE = re.compile(r"%[\w$.]+")
_MEMORY_WRITES = re.compile(r"^(?:st|atom|red)(?:\.global)?(?:\.|$)")
_NOT_GLOBAL = re.compile(r"\.(?:shared|local|param|const)\b")


def written_params(ptx: str, entry: str) -> tuple[int, ...]:
    """Positions of the entry's pointer parameters that the kernel stores through (st, atom or
    red to global or generic memory at an address computed from the parameter).

    A taint analysis over the entry's body: a register loaded from a parameter carries it,
    and so does an address computed from it (mov, cvta, add, the pointer of a sub, the
    addend of a mad, either side of a selp); an integer derived otherwise (an alignment test
    `and`, a pointer difference) and a value loaded from memory do not. It runs to a fixed
    point, so loops are followed."""
    m = next((m for m in ENTRY_RE.finditer(ptx) if m.group("name") == entry), None)
    if m is None:
        return ()
    names = {p.group("name"): i for i, p in enumerate(_PARAM_RE.finditer(m.group("params")))}
    body = ptx[m.end() : body_end_of(ptx, m.end() - 1)]
    instructions = [(i.group("op"), i.group("args")) for i in map(_INSTR_RE.match, body.split("\n")) if i]
    taint: dict[str, frozenset[int]] = {}
    written: set[int] = set()
    changed = True
    while changed:
        changed = False
        for op, args in instructions:
            if _MEMORY_WRITES.match(op) and not _NOT_GLOBAL.search(op):
                address = re.search(r"\[\s*(%[\w$.]+)", args)
                if address:
                    written |= taint.get(address.group(1), frozenset())
                if not op.startswith("atom"):
                    continue
            dst, _, sources = args.partition(",")
            dst = dst.strip()
            if not dst.startswith("%"):
                continue
            if op.startswith("ld.param"):
                param = re.search(r"\[\s*([\w$.]+)", sources)
                new = frozenset({names[param.group(1)]}) if param and param.group(1) in names else frozenset()
            elif op.startswith(("ld.", "atom")):
                new = frozenset()  # a value from memory is not the pointer
            else:
                new = frozenset().union(*(taint.get(r, frozenset()) for r in _address_sources(op, sources)))
            if not new <= taint.get(dst, frozenset()):
                taint[dst] = taint.get(dst, frozenset()) | new
                changed = True
    return tuple(sorted(written))


def _address_sources(op: str, sources: str) -> list[str]:
    """The operands of `op` through which an address passes to its result."""
    operands = [o.strip() for o in sources.split(",")]
    base = op.split(".", 1)[0]
    if base in ("mov", "cvta", "add", "selp"):
        chosen = operands[:2] if base == "selp" else operands
    elif base == "sub":
        chosen = operands[:1]
    elif base == "mad":
        chosen = operands[2:3]
    else:
        return []
    return [r for o in chosen for r in _REG_RE.findall(o)]


_BRACE_RE = re.compile(r"[{}]")


def body_end_of(text: str, start: int) -> int:
    """Index of the `}` that closes the `{` at text[start] (an entry's body, which holds
    nested blocks)."""
    depth = 0
    for brace in _BRACE_RE.finditer(text, start):  # braces only: PTX bodies run to megabytes
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return brace.start()
    raise AbiError("a PTX entry's body is not closed", fix="report this kernel to kitdispatch")
