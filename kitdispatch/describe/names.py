"""Names: identifiers, C++ entry names, generated function names and how colliding names are told apart."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Container
from kitdispatch.errors import ManifestError


# The C parameters of a scalar the kernel takes as two 32-bit halves (the form that needs
# no entry bridge): NAME_lo, NAME_hi, low half first.
WIDE_HALVES = ("_lo", "_hi")


_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


# A C++ name expression as NVRTC takes it: `scale`, `ns::scale`, `scale<float, 4>`.
_CPP_NAME_RE = re.compile(r"^(?:::)?[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*(?:<[\w ,:*&<>().+-]*>)?\Z", re.ASCII)


MAX_IDENTIFIER_LENGTH = 256


def check_identifier(name: object, what: str, where: str) -> str:
    """C and MLIR share this identifier alphabet; anything else is refused up front."""
    if not isinstance(name, str) or not _IDENT_RE.match(name) or len(name) > MAX_IDENTIFIER_LENGTH:
        raise ManifestError(
            f"{what} {_shown(name)} is not a valid identifier",
            where=where,
            fix=f"use letters, digits and '_' only, not starting with a digit, at most "
            f"{MAX_IDENTIFIER_LENGTH} characters",
        )
    return name


def check_kernel_name(name: object, where: str) -> str:
    """A kernel is named by its C identifier or, for C++ kernels, a name expression such as
    `scale<float>` or `ns::scale` (resolved to the mangled entry through NVRTC)."""
    if isinstance(name, str) and len(name) <= MAX_IDENTIFIER_LENGTH and _CPP_NAME_RE.match(name):
        return name
    raise ManifestError(
        f"kernel name {_shown(name)} is not a valid identifier, nor a C++ name expression",
        where=where,
        fix="use the kernel's name as in the source, e.g. 'scale', 'ns::scale' or 'scale<float>'",
    )


def cpp_base_name(name: str) -> str:
    """`ns::scale<float>` -> `scale`: the name the signature parser knows the kernel by."""
    return name.split("<", 1)[0].rsplit("::", 1)[-1]


def as_identifier(text: str, *, fallback: str, digit_prefix: str) -> str:
    """`text` as an identifier (MLIR symbols, file stems): each character outside [A-Za-z0-9_]
    as `_`, `fallback` for nothing, `digit_prefix` before a leading digit."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", text) or fallback
    return ident if not ident[0].isdigit() else digit_prefix + ident


def default_function_name(kernel: str) -> str:
    """`scale<float>` -> `scale_float`: an identifier for a C++ name expression."""
    text = re.sub(r"\W+", "_", kernel.replace("::", "_"), flags=re.ASCII).strip("_")
    return text if _IDENT_RE.match(text) else f"k_{text}"


def distinct_names(wanted: dict, salts: dict[object, str], *, join: str, fold: Callable[[str], str] = lambda s: s, taken: Container[str] = frozenset(), what: str) -> dict:
    """`wanted` names made distinct (after `fold`) from each other and from `taken`: every name
    that two keys share, or that is taken, gets a short hash of the key's salt appended after
    `join`, until none is shared. Deterministic: a name changes only where it collides."""
    names = dict(wanted)
    for _ in range(4):
        holders: dict[str, list] = {}
        for key, name in names.items():
            holders.setdefault(fold(name), []).append(key)
        colliding = [key for keys in holders.values() for key in keys if len(keys) > 1 or fold(names[key]) in taken]
        if not colliding:
            return names
        for key in colliding:
            names[key] = f"{names[key]}{join}{hashlib.sha256(salts[key].encode()).hexdigest()[:8]}"
    keys = sorted(salts[k] for k in colliding)
    raise ManifestError(f"{what} stay the same after renaming: {', '.join(keys)}", fix="rename one of these files")


def _shown(name: object) -> str:
    text = repr(name)
    return text if len(text) <= 60 else f"{text[:40]}...{text[-10:]} ({len(text)} characters)"


# The companions of each generated function NAME: NAME$async takes and signals fences (the
# runtime's asynchronous call) and NAME$record records the dispatch once for repeated submission.
ASYNC_SUFFIX = "$async"
RECORDING_SUFFIX = "$record"
# A model build's NAME$async_transients: NAME$async that takes its transient memory from a buffer
# the caller passes before the fences (models/transients.py), so that no call blocks the host.
TRANSIENTS_SUFFIX = "$async_transients"
# Where IREE's reflection of such a function states its storage's size in bytes, when a constant.
TRANSIENTS_SIZE_KEY = "iree.abi.transients.size.constant"
