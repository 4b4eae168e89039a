"""Pointer roles from the compiled code: what a kernel loads and stores through each pointer.

C says only const-ness: a `const` pointer is read-only, any other may be anything. So a
non-const pointer that the manifest does not name is provisionally `out` (spec.infer_params),
and once the kernel is compiled its PTX decides (ptx.param_accesses):

- only loaded: `in` (an argument; cuda-samples' `transpose(float* odata, float* idata, ...)`);
- loaded and stored (atom and red do both): `inout`;
- only stored: `out`.

Where the analysis cannot follow a pointer (handed to a call, stored as a value, an access at
an address it cannot trace), it does not guess: the pointer keeps its role, or becomes the
role that loses nothing, and a warning says so. A role the manifest states (or C's `const`)
is checked against the same facts: a store through an `in` buffer is an error naming the
pointer and the PTX instruction; loads from an `out` buffer and an `inout` never stored get
warnings, since the analysis cannot tell whether the kernel wrote an element before reading it.
"""

from __future__ import annotations

import dataclasses

from kitdispatch.errors import ManifestError
from kitdispatch.check.ptx import EntryAccesses, PointerUse
from kitdispatch.describe.kernel import Buffer, Kernel


def settle_roles(kernel: Kernel, accesses: EntryAccesses, where: str) -> tuple[Kernel, tuple[str, ...]]:
    """The kernel with every buffer's role settled by its compiled code, and the warnings."""
    roles: dict[str, str] = {}
    warnings: list[str] = []
    accesses = _with_scalar_addresses(kernel, accesses)
    for i, slot in enumerate(kernel.c_slots):
        p = slot.param
        if not isinstance(p, Buffer):
            continue
        use = accesses.params[i] if i < len(accesses.params) else PointerUse()
        if p.inferred:
            role, warning = _inferred_role(kernel, p, use, accesses)
            roles[p.name] = role
        else:
            warning = _check_declared(kernel, p, use, accesses, where)
        if warning:
            warnings.append(warning)
    if not any(roles.get(b.name, b.access) != "in" for b in kernel.buffers):
        raise ManifestError(
            f"kernel {kernel.name!r} stores through none of its pointers ({', '.join(b.name for b in kernel.buffers)}), "
            "read from its compiled code, so its function would have no result",
            where=where,
            fix="check that the kernel writes its output through a pointer parameter, or name that pointer "
            "in out = [...] / inout = [...]",
        )
    return kernel.with_roles(roles, where), tuple(warnings)


def _with_scalar_addresses(kernel: Kernel, accesses: EntryAccesses) -> EntryAccesses:
    """An access at an address computed from a scalar parameter (an integer cast to a pointer)
    may reach any buffer: it counts as untraced."""
    scalars = [u for s, u in zip(kernel.c_slots, accesses.params) if not isinstance(s.param, Buffer)]
    load = accesses.untraced_load or next((u.load for u in scalars if u.load), None)
    store = accesses.untraced_store or next((u.store for u in scalars if u.store), None)
    return dataclasses.replace(accesses, untraced_load=load, untraced_store=store)


def _inferred_role(kernel: Kernel, p: Buffer, use: PointerUse, accesses: EntryAccesses) -> tuple[str, str | None]:
    """The role of a non-const pointer the manifest does not name, and a warning where the
    code does not say it for sure."""
    what = f"kernel {kernel.name!r} pointer {p.name!r}"
    if use.escape and not use.load:
        return p.access, (
            f"{what}: kitdispatch cannot follow it in the compiled code (PTX: `{use.escape}`), so it "
            f"stays `{p.access}`; if the kernel reads it, name it: in = [\"{p.name}\"] or inout = [\"{p.name}\"]"
        )
    if use.load and use.store:
        return "inout", None
    if use.load:
        if use.escape:  # read for sure, and maybe written where the analysis cannot follow
            return "inout", (
                f"{what} is loaded (PTX: `{use.load}`) and passed where kitdispatch cannot follow it "
                f"(`{use.escape}`), so it is `inout`; if the kernel never writes it, declare it const or "
                f"in = [\"{p.name}\"]"
            )
        if accesses.untraced_store:
            return "inout", (
                f"{what} is loaded (PTX: `{use.load}`) and the kernel stores at an address kitdispatch cannot "
                f"trace (`{accesses.untraced_store}`), so it is `inout`; if the kernel never writes it, "
                f"declare it const or in = [\"{p.name}\"]"
            )
        return "in", None
    if use.store:
        if accesses.untraced_load:
            return "out", (
                f"{what} is stored (PTX: `{use.store}`) and the kernel loads from an address kitdispatch cannot "
                f"trace (`{accesses.untraced_load}`), so it stays `out` (a new, uninitialised tensor); "
                f"if the kernel reads it, declare inout = [\"{p.name}\"]"
            )
        return "out", None
    return p.access, (
        f"{what} is neither loaded nor stored in the compiled code, so it stays `{p.access}` "
        "(a new, uninitialised tensor); declare it const or in = [...] if it is an input"
    )


def _check_declared(kernel: Kernel, p: Buffer, use: PointerUse, accesses: EntryAccesses, where: str) -> str | None:
    """A stated role against the code: a store through `in` is an error, the rest warnings."""
    if p.access == "in" and use.store:
        raise ManifestError(
            f"kernel {kernel.name!r} stores through {p.name!r} (PTX: `{use.store}`), which is declared `in` "
            "(a const pointer, or named `in` in the manifest): IREE binds it read-only and may share it "
            "with other values, so the write is lost or corrupts them",
            where=use.store_at or where,
            fix=f"declare it inout (inout = [\"{p.name}\"], or {{ name = \"{p.name}\", inout = ... }} in params) "
            "or out if the kernel never reads it",
        )
    if p.access == "out" and use.load:
        return (
            f"kernel {kernel.name!r} loads from {p.name!r} (PTX: `{use.load}`), which is declared `out`: an "
            "`out` buffer is a new, uninitialised tensor, so any element the kernel reads before writing it "
            f"is garbage; declare it inout if the kernel reads the caller's data"
        )
    if p.access == "inout" and not (use.store or use.escape or accesses.untraced_store):
        return (
            f"kernel {kernel.name!r} never stores through {p.name!r}, which is declared `inout`: "
            f"the result is its input unchanged; declare it in (or const) if the kernel only reads it"
        )
    return None
