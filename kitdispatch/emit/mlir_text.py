"""Names and strings as MLIR text: what the kit writes into MLIR, IREE must read back as
exactly the kit's string (a `\\2F` in a file name is `/` to MLIR's parser)."""

from __future__ import annotations

import re


_BARE_ID_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*\Z")


def mlir_string(text: str) -> str:
    """`text` as an MLIR string literal, quotes included, that IREE reads back as exactly
    `text`: MLIR decodes a backslash and two hex digits (`\\2F` is `/`), so backslashes and
    quotes are escaped, and so is every byte outside printable ASCII (as its UTF-8 bytes;
    a file name's undecodable bytes as the bytes they stand for)."""
    out = []
    for byte in text.encode("utf-8", "surrogateescape"):
        out.append(f"\\{byte:02X}" if byte in b'"\\' or not 0x20 <= byte < 0x7F else chr(byte))
    return '"' + "".join(out) + '"'


def mlir_symbol(name: str) -> str:
    """`@name`, quoted where `name` is not a bare MLIR identifier."""
    return f"@{name}" if _BARE_ID_RE.match(name) else f"@{mlir_string(name)}"


def mlir_comment(text: str) -> str:
    """`text` for a `//` comment: a line break in a name must not end it (and start MLIR)."""
    return re.sub(r"[\x00-\x1f\x7f\x85\u2028\u2029]", lambda m: f"\\x{ord(m.group()):02x}", text)
