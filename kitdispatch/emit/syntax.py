"""How an IREE release spells the MLIR the kit emits: ops' inherent attributes and the entry
points of recorded dispatches. The releases themselves are iree/releases.py's table."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class AttributeSyntax(enum.Enum):
    """How hal.executable.source (objects) and hal.executable.export (workgroup_size,
    workgroup_local_memory) spell their inherent attributes."""

    PROPERTIES = "properties"  # `<workgroup_size = [...]>`: 3.13, which parses only this
    ATTR_DICT = "attr-dict"  # `attributes {workgroup_size = [...]}`: 3.10 to 3.12, where an untyped integer is not an index


class EntryPoints(enum.Enum):
    """How hal.command_buffer.dispatch names its entry point (NAME$record)."""

    FUNCTION = "function"  # an i64 function id, hal.executable.lookup.function: 3.12 and later
    ORDINAL = "ordinal"  # an index, hal.executable.export.ordinal: 3.10 and 3.11


@dataclass(frozen=True)
class Spelling:
    """How the target IREE release spells ops' inherent attributes and entry points."""

    syntax: AttributeSyntax
    entry_points: EntryPoints = EntryPoints.FUNCTION

    def entry_point(self, ssa: str, executable: str, target: str) -> str:
        """The op giving `%ssa`, the entry point `target` of the loaded `%executable`."""
        if self.entry_points is EntryPoints.FUNCTION:
            return f"%{ssa} = hal.executable.lookup.function target(%{executable} : !hal.executable) function({target}) : i64"
        return f"%{ssa} = hal.executable.export.ordinal target({target}) : index"

    def inherent(self, attrs: dict[str, str], index_attrs: dict[str, int] | None = None) -> str:
        """`attrs` are spelled out already; `index_attrs` are integers of type index."""
        typed = " : index" if self.syntax is AttributeSyntax.ATTR_DICT else ""
        items = [f"{k} = {v}" for k, v in attrs.items()] + [f"{k} = {v}{typed}" for k, v in (index_attrs or {}).items()]
        if self.syntax is AttributeSyntax.PROPERTIES:
            return "<" + ", ".join(items) + ">"
        return "attributes {" + ", ".join(items) + "}"
