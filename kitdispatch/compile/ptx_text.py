"""PTX text: where an entry and its body are. Read by the checks (check/ptx.py) and rewritten by
the entry bridge (bridge.py)."""

from __future__ import annotations

import re

from kitdispatch.errors import AbiError

ENTRY_RE = re.compile(
    r"\.entry\s+(?P<name>[\w$.]+)\s*\((?P<params>[^)]*)\)(?P<directives>[^{;]*)\{", re.S
)

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
