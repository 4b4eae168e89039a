"""Finding IREE's tools: one finder for the build side (iree-compile, iree-opt, ...) and the run
side (iree-run-module, iree-benchmark-module)."""

from __future__ import annotations

import functools
import shutil
import sys
from pathlib import Path

from kitdispatch.errors import KitError


@functools.cache
def find_iree_tool(name: str, *, install: str) -> str:
    """An IREE tool: on PATH, else inside the installed iree-base-compiler or iree-base-runtime
    package (the binary itself, not the console script that starts Python to run it), else beside
    this Python (a virtual environment's bin). A KitError says `install` where there is none."""
    found = shutil.which(name) or _packaged_tool(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise KitError(f"{name} is not installed", fix=install)
    return found


def _packaged_tool(name: str) -> str | None:
    """Where IREE's Python packages keep their tools (neither need be installed; the runtime's
    first, so that running a module never loads the compiler package)."""
    try:
        import iree._runtime_libs as runtime_libs
    except ImportError:
        pass
    else:
        path = Path(runtime_libs.__file__).parent / name
        if path.is_file():
            return str(path)
    try:
        from iree.compiler.tools.binaries import find_tool as find_compiler_tool
    except ImportError:
        return None
    try:
        return find_compiler_tool(name)
    except ValueError:  # not a compiler tool, or not installed
        return None
