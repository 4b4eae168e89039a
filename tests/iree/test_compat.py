"""The oldest IREE release the kit supports, in a fresh venv, builds every sample and library
kernel (tools/compat.py's cell; the newest release is the one the rest of the suite runs on).
Needs PyPI for the install: where pip cannot install IREE it skips and says why."""

import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, needs_iree_compile

OLDEST_IREE = "3.10"


def _compat():
    spec = importlib.util.spec_from_file_location("kitdispatch_compat", REPO / "tools" / "compat.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@needs_iree_compile
def test_the_oldest_iree_builds_every_sample_and_library_kernel(tmp_path):
    compat = _compat()
    cell = compat.Cell(OLDEST_IREE, "13")
    try:
        bin_dir = compat.make_venv(cell, sys.executable, tmp_path / "venvs", reuse=False)
    except RuntimeError as exc:
        pytest.skip(f"could not install IREE {OLDEST_IREE} with pip here: {str(exc)[-300:]}")
    compat.describe(cell, bin_dir)
    assert cell.iree_installed.startswith(OLDEST_IREE)
    with tempfile.TemporaryDirectory(prefix="kitdispatch-compat-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        compat.build_everything(cell, bin_dir, out)
    assert cell.ok, "\n\n".join(cell.errors) or f"built {cell.built} of {cell.total}; cp.async refused below sm_80: {cell.refused_ok}"
    assert cell.built == cell.total
