"""The kit's kernel library (kernels/) and every sample build for real, and every function they
generate has a numpy reference."""

import importlib.util
import inspect
from pathlib import Path

import pytest

from kitdispatch import BuildOptions, build, load_manifest
from kitdispatch.manifest import MANIFEST_NAME

from conftest import REPO, needs_iree_compile

MANIFEST_DIRS = sorted(
    p.parent for root in ("kernels", "samples") for p in (REPO / root).glob(f"*/{MANIFEST_NAME}")
)
IDS = [str(d.relative_to(REPO)) for d in MANIFEST_DIRS]


def _reference_module(folder: Path):
    spec = load_manifest(folder)
    assert spec.test.reference is not None, f"{folder}: [test] names no reference"
    path = spec.source_path(spec.test.reference)
    module_spec = importlib.util.spec_from_file_location(f"reference_{folder.name}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return spec, module


def test_the_library_has_every_family():
    families = {d.name for d in MANIFEST_DIRS if d.parent.name == "kernels"}
    assert {"elementwise", "reduction", "argmax", "softmax", "transpose", "matmul"} <= families


@pytest.mark.parametrize("folder", MANIFEST_DIRS, ids=IDS)
def test_every_function_has_a_reference(folder):
    spec, reference = _reference_module(folder)
    for sig in spec.signatures:
        ref = getattr(reference, sig.name, None)
        assert callable(ref), f"{folder.name}/reference.py has no function {sig.name!r}"
        params = inspect.signature(ref).parameters
        assert len(params) == len(sig.args), f"{sig.name}: {len(params)} parameters, the function takes {len(sig.args)}"


@needs_iree_compile
@pytest.mark.parametrize("folder", MANIFEST_DIRS, ids=IDS)
def test_builds_for_sm_80(folder, tmp_path):
    result = build(folder, BuildOptions.create("sm_80"), tmp_path)
    assert result.vmfb is not None and result.vmfb.is_file() and result.vmfb.stat().st_size > 0
