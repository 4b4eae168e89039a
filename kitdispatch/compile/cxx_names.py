"""C++ kernel names (`scale<float>`, `ns::scale`, `sgemmVectorize<128, 128, 8, 8, 8>`) and the
entries they become in a compiled object, for NVRTC and nvcc alike.

NVRTC instantiates and names them itself (name expressions, `nvrtcGetLoweredName`). nvcc has no
such switch, so it compiles a generated unit instead of the source (`entries_unit`): the
source, included, and each named kernel's address in a `__device__` variable. Measured with
nvcc 13.0: taking the address instantiates a template kernel and emits its entry, and the PTX
writes the variable as `.global .align 8 .u64 __kitdispatch_entry_0 = _Z14sgemmVectorize...;`,
so the object names each entry itself; nvcc's PTX then declares the entry before the variable
(`.entry NAME (...);`), which ptx.py skips and bridge.py rewrites with the definition.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

from kitdispatch.errors import CompileError, KitError

# The unit nvcc compiles for a source with C++ kernel names, and the variables that name them.
ENTRIES_UNIT = "kitdispatch_entries.cu"
_ENTRY_VARIABLE = "__kitdispatch_entry_"
_UNIT_HEAD_LINES = 2  # the #include and the #pragma before the first variable


class KernelNameError(CompileError):
    """The manifest names a C++ kernel the source does not define once: bad input."""

    exit_code = 2


def unknown_kernel_error(compiler: str, name: str, source: Path, **tool: str | Sequence[str] | int | None) -> KernelNameError:
    """A C++ kernel name of the manifest that the compiler cannot resolve to one kernel."""
    return KernelNameError(
        f"{compiler} finds no single kernel {name!r} in {source}",
        where=str(source),
        fix="name a __global__ function of the source as C++ spells it (`scale<float>`, `ns::scale`), "
        "a template with its arguments; an overloaded kernel by its mangled entry, with `params`",
        **tool,
    )


def entries_unit(source: Path, names: tuple[str, ...]) -> str:
    """The translation unit nvcc compiles for a source with C++ kernel names: the source,
    included by its absolute path (its own quoted includes still resolve beside it), then a
    `__device__` variable holding each named kernel's address. Taking the address makes nvcc
    instantiate a template kernel (no explicit instantiation needed) and emit its entry, and
    the variable's initializer in the PTX is that entry's mangled name: the object itself
    says each name's entry, as NVRTC's name expressions do."""
    path = os.path.abspath(source)  # as given, as nvcc resolves the source's own includes
    if any(c in path for c in '"\\\n\r'):
        raise KitError(
            f"nvcc cannot include the kernel source {source!r}: its path holds a quote, backslash or line break",
            fix="move the source to a path without them",
        )
    lines = [f'#include "{path}"', "#pragma nv_diag_suppress 177  /* the variables below are read from the PTX */"]
    lines += [f"__device__ void* const {_ENTRY_VARIABLE}{i} = (void*)&{name};" for i, name in enumerate(names)]
    return "\n".join(lines) + "\n"


def entries_unit_digest() -> str:
    """What the unit is for given names, without its path: part of the object's cache key."""
    return hashlib.sha256(entries_unit(Path("/source.cu"), ("k<T>", "ns::k")).encode()).hexdigest()[:16]


_ENTRY_VARIABLE_RE = re.compile(rf"^\s*\.global\b[^=\n]*\s{_ENTRY_VARIABLE}(\d+)\s*=\s*(?:generic\()?([\w$.]+)\)?\s*;", re.M)


def entries_named(ptx: bytes, source: Path, names: tuple[str, ...]) -> dict[str, str]:
    """Each name's entry, read from the initializers `entries_unit`'s variables get in the PTX."""
    found = {int(m.group(1)): m.group(2) for m in _ENTRY_VARIABLE_RE.finditer(ptx.decode(errors="replace"))}
    missing = [n for i, n in enumerate(names) if i not in found]
    if missing:
        raise CompileError(
            f"nvcc's PTX for {source} does not say the entry of {', '.join(map(repr, missing))}",
            where=str(source),
            fix="report this to kitdispatch with the nvcc version; meanwhile declare the kernel extern \"C\"",
        )
    return {n: found[i] for i, n in enumerate(names)}


def name_in_unit_error(first_error: re.Match | None, names: tuple[str, ...], unit: Path) -> str | None:
    """The kernel name on the entries unit's line where nvcc's first error is, if it is on one
    (`first_error`: the log's first `FILE(LINE): error`, with groups file and line)."""
    if not names or first_error is None or first_error.group("file") != str(unit):
        return None
    index = int(first_error.group("line")) - _UNIT_HEAD_LINES - 1
    return names[index] if 0 <= index < len(names) else None


_NVRTC_NAME_RE = re.compile(r"^__nv_name_map\(\d+\): error: .*\n\s*#pragma nv_mangled_name (?P<name>.+?)\s*$", re.M)


def name_in_nvrtc_error(log: str, first_error: re.Match | None) -> str | None:
    """The name expression NVRTC rejected, if its first error is in one (NVRTC echoes it as
    `#pragma nv_mangled_name NAME` in its `__nv_name_map`)."""
    m = _NVRTC_NAME_RE.search(log)
    if m is None or first_error is None or first_error.start() != m.start():
        return None
    return m.group("name")
