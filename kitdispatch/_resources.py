"""Where the shipped data folders live: inside the wheel, or at the top of a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """`mlir_templates` or `kernels`: packaged copy first, then the checkout's top level."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"kitdispatch data folder {name!r} is missing from the installation")
