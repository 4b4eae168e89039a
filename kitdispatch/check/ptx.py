"""Reading kernel entries back out of PTX, to check them against the declared layout."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kitdispatch.check.arch_features import _FILE_RE, _LOC_RE, _source_line  # one reading of PTX line info
from kitdispatch.compile.ptx_text import ENTRY_RE, body_end_of
from kitdispatch.errors import AbiError
from kitdispatch.describe.kernel import Buffer, Kernel

# An entry's definition; a declaration (`.entry k (...);`, before a variable that holds the
# kernel's address) ends at its `;` and is no match.
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


# ------------------------------------------------------------- loads and stores through params

_INSTR_RE = re.compile(r"^\s*(?:@!?%\w+\s+)?(?P<op>[a-z][\w.:]*)\s+(?P<args>[^;]*);")
_REG_RE = re.compile(r"%[\w$.]+")
_ADDRESS_RE = re.compile(r"\[\s*([^\],]*?)\s*(?:[+\]]|,)")
_NOT_GLOBAL = re.compile(r"\.(?:shared|local|param|const)\b")  # state spaces no pointer parameter reaches
OTHER = -1  # taint of an address into shared, local, constant or a named variable: no pointer's
# Ops through which an address passes to the result without the analysis losing it, and ops
# that read a pointer without letting it escape (tests, differences, alignment checks: a value
# they compute that is then used as an address makes an untraced access, below).
_PROPAGATES = frozenset({"mov", "cvta", "add", "sub", "mad", "selp"})
_READS_ONLY = frozenset({"setp", "set", "and", "or", "xor", "not", "neg", "cvt", "shr", "shl", "rem", "div",
                         "mul", "min", "max", "prefetch", "prefetchu", "applypriority", "discard", "isspacep"})


@dataclass(frozen=True)
class PointerUse:
    """What an entry's code does through one parameter: the first PTX instruction that loads
    through it, stores through it (st, atom, red, cp to global; atom and red also load), and
    hands it where this analysis cannot follow it (a call, stored as a value, an op it does not
    know); None where there is none."""

    load: str | None = None
    store: str | None = None
    escape: str | None = None
    store_at: str | None = None  # the store's source line ("k.cu:12"), where the PTX has .loc lines


@dataclass(frozen=True)
class EntryAccesses:
    """Every parameter's use, by position, and the first global or generic load and store at
    an address the analysis cannot trace to a parameter or to non-global memory (a pointer
    read from memory, rebuilt from integers): where there is one, any pointer may be read or
    written by it."""

    params: tuple[PointerUse, ...]
    untraced_load: str | None = None
    untraced_store: str | None = None


def param_accesses(ptx: str, entry: str) -> EntryAccesses | None:
    """How the entry's code uses each parameter, from its PTX; None if there is no such entry.

    A taint analysis over the entry's body: a register loaded from a parameter carries it,
    and so does an address computed from it (mov, cvta, add, the pointer of a sub, the
    addend of a mad, either side of a selp); an integer derived otherwise (an alignment test
    `and`, a pointer difference) and a value loaded from memory do not. It runs to a fixed
    point, so loops are followed; then each memory access is attributed to the parameters its
    address derives from."""
    m = next((m for m in ENTRY_RE.finditer(ptx) if m.group("name") == entry), None)
    if m is None:
        return None
    names = {p.group("name"): i for i, p in enumerate(_PARAM_RE.finditer(m.group("params")))}
    body = ptx[m.end() : body_end_of(ptx, m.end() - 1)]
    files = {f.group(1): f.group(2) for f in _FILE_RE.finditer(ptx)}
    instructions, located, loc = [], [], None
    for line in body.split("\n"):
        loc = _LOC_RE.match(line) or loc
        if i := _INSTR_RE.match(line):
            instructions.append((i.group("op"), i.group("args").strip(), " ".join(i.group().split())))
            located.append(loc)
    taint = _taint(instructions, names)
    uses: dict[int, dict[str, str | None]] = {i: {} for i in names.values()}
    untraced: dict[str, str] = {}
    for (op, args, text), loc in zip(instructions, located):
        for kind, address in _accesses(op, args):
            origins = taint.get(address, frozenset()) if address.startswith("%") else frozenset({OTHER})
            if not origins:
                untraced.setdefault(kind, text)
            for i in origins - {OTHER}:
                if kind not in uses[i]:
                    uses[i][kind], uses[i][f"{kind}_at"] = text, _source_line(loc, files)
        for i in _escaping(op, args, taint):
            uses[i].setdefault("escape", text)
    params = tuple(
        PointerUse(u.get("load"), u.get("store"), u.get("escape"), u.get("store_at")) for _, u in sorted(uses.items())
    )
    return EntryAccesses(params, untraced.get("load"), untraced.get("store"))


def written_params(ptx: str, entry: str) -> tuple[int, ...]:
    """Positions of the entry's parameters that the kernel stores through."""
    found = param_accesses(ptx, entry)
    return () if found is None else tuple(i for i, u in enumerate(found.params) if u.store)


def _taint(instructions: list[tuple[str, str, str]], names: dict[str, int]) -> dict[str, frozenset[int]]:
    """Each register's origins: the parameters (positions) its value is an address into, and
    OTHER for addresses into shared, local or constant memory or a named variable."""
    taint: dict[str, frozenset[int]] = {}
    changed = True
    while changed:
        changed = False
        for op, args, _ in instructions:
            dst, _, sources = args.partition(",")
            dst = dst.strip()
            if not dst.startswith("%") or _is_memory_write(op):
                continue
            base = op.split(".", 1)[0]
            if op.startswith("ld.param"):
                param = re.search(r"\[\s*([\w$.]+)", sources)
                new = frozenset({names[param.group(1)]}) if param and param.group(1) in names else frozenset()
            elif base == "cvta" and _NOT_GLOBAL.search(op):
                new = frozenset({OTHER})  # to or from an address of shared, local or const memory
            elif base == "mov" and re.fullmatch(r"[A-Za-z_$][\w$.]*", sources.strip()):
                new = frozenset({OTHER})  # the address of a named variable (or the stack)
            elif base in ("ld", "ldu", "atom"):
                new = frozenset()  # a value from memory is not the pointer
            elif base == "sub" and any(taint.get(r) for r in _REG_RE.findall(sources.partition(",")[2])):
                new = frozenset()  # a difference of two addresses is an offset
            else:
                new = frozenset().union(*(taint.get(r, frozenset()) for r in _address_sources(op, sources)))
            if not new <= taint.get(dst, frozenset()):
                taint[dst] = taint.get(dst, frozenset()) | new
                changed = True
    return taint


def _is_memory_write(op: str) -> bool:
    return op.split(".", 1)[0] in ("st", "red")


def _accesses(op: str, args: str) -> list[tuple[str, str]]:
    """(load or store, the address operand) of each global or generic access `op` makes."""
    base = op.split(".", 1)[0]
    addresses = _ADDRESS_RE.findall(args)
    if base in ("ld", "ldu", "st", "atom", "red"):
        if _NOT_GLOBAL.search(op) or not addresses:
            return []
        kinds = {"ld": ("load",), "ldu": ("load",), "st": ("store",)}.get(base, ("load", "store"))
        return [(k, addresses[0]) for k in kinds]
    if base == "cp" and len(addresses) >= 2 and ".tensor" not in op:
        # cp[.reduce].async...DST.SRC [dst], [src]: the first space named is the destination's.
        spaces = re.findall(r"\.(global|shared(?:::\w+)?|local)\b", op)
        out = []
        if spaces[:1] == ["global"]:
            out += [("store", addresses[0])] + ([("load", addresses[0])] if op.startswith("cp.reduce") else [])
        if spaces[1:2] == ["global"]:
            out.append(("load", addresses[1]))
        return out
    return []


def _escaping(op: str, args: str, taint: dict[str, frozenset[int]]) -> set[int]:
    """Parameters whose pointers `op` hands where the analysis cannot follow: stored as a
    value (a call's argument is one too), or read by an op it does not know."""
    base = op.split(".", 1)[0]
    if base in _PROPAGATES or base in _READS_ONLY or base in ("ld", "ldu", "cp", "bra", "ret", "exit"):
        return set()
    operands = re.sub(r"\[[^\]]*\]", "", args)  # addresses are accesses, not escapes
    if base == "atom":
        operands = operands.partition(",")[2]  # its first operand is where the old value goes
    return {i for r in _REG_RE.findall(operands) for i in taint.get(r, frozenset()) if i != OTHER}


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
