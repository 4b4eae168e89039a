"""The registry of op kinds (models/ops/__init__.py) and the manifest's `replaces` vocabulary
(describe/op_names.py) that it must equal."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import tomllib
from conftest import KERNEL_TOML, REPO, SOFTMAX_CU

from kitdispatch import ManifestError
from kitdispatch.describe.manifest import parse_manifest
from kitdispatch.describe.op_names import PATTERN_OPS, REPLACEABLE_OPS
from kitdispatch.models import ops
from kitdispatch.models.ops import OP_KINDS


def _manifest(extra: str):
    data = tomllib.loads(KERNEL_TOML.format(src=SOFTMAX_CU) + extra)
    return parse_manifest(data, root=REPO, where="kitdispatch.toml")


def test_manifest_replaces_plain_and_with_limits():
    plain = _manifest('replaces = ["linalg.softmax"]').kernels[0].replaces
    assert plain.ops == ("linalg.softmax",) and plain.dimension is None
    limited = _manifest('replaces = ["linalg.softmax"]\nreplace_when = { max = { cols = 8192 }, multiple_of = { rows = 4 }, dimension = -1 }')
    r = limited.kernels[0].replaces
    assert r.max_size == (("cols", 8192),) and r.multiple_of == (("rows", 4),) and r.dimension == -1
    assert _manifest("").kernels[0].replaces is None
    generic = _manifest('replaces = ["linalg.generic"]\nreplace_when = { pattern = "p.mlir" }').kernels[0].replaces
    assert generic.pattern == REPO / "p.mlir"  # beside the manifest, as `source` is
    conditioned = _manifest('replaces = ["linalg.softmax"]\nreplace_when = { when = "!(rows < 4) || ceildiv(cols, 128) == 2", arithmetic = "tf32" }')
    r = conditioned.kernels[0].replaces
    assert set(r.when.symbols) == {"rows", "cols"} == set(r.limited_symbols) and r.arithmetic == "tf32"
    assert r.when.holds({"rows": 4, "cols": 1}) and r.when.holds({"rows": 1, "cols": 256}) and not r.when.holds({"rows": 1, "cols": 1})


def test_the_library_causal_attention_kernels_declare_their_mask():
    from kitdispatch.describe.manifest import load_manifest

    kernels = {k.name: k.replaces for k in load_manifest(REPO / "kernels" / "attention").kernels}
    def declared(name: str) -> str | None:
        padding = "key_padding" if "_pad" in name else None
        return ("causal_" + padding if padding else "causal") if "_causal" in name else padding

    assert {n: r.mask for n, r in kernels.items()} == {n: declared(n) for n in kernels}
    assert {"attention_f16", "attention_causal_f16", "attention_bf16", "attention_causal_bf16"} <= set(kernels)
    # plain, _bshd, _kt, _gqa, _gqa_bshd, _gqa_bhsd, _qkv (each plain and causal), _cross; key padding:
    # plain, _kt, _bshd (each plain and causal), causal _gqa and _gqa_bshd, _cross_pad; f16 and bf16
    assert len(kernels) == 30 + 18


@pytest.mark.parametrize(
    "extra, message",
    [
        ('replaces = ["linalg.conv_2d"]', "kitdispatch cannot replace 'linalg.conv_2d'"),
        ('replaces = "linalg.softmax"', "replaces must be a non-empty list of op names"),
        ("replace_when = { max = { cols = 8 } }", "replace_when without replaces"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { max = { width = 8 } }', "replace_when uses 'width'"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { most = { cols = 8 } }', "unknown key 'most'"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { max = { cols = 0 } }', "max must map dimension names to positive integers"),
        ('replaces = ["linalg.generic"]', "a linalg.generic needs a pattern"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { pattern = "p.mlir" }', "and a pattern is for linalg.generic only"),
        ('replaces = ["linalg.generic"]\nreplace_when = { pattern = 3 }', "pattern 3 is not a file name"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { when = "cols > 8 && width < 4" }', "replace_when uses 'width'"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { when = "cols + 8" }', "'cols + 8' is not a comparison of index expressions"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { when = "cols ** 2 > 8" }', "unsupported syntax 'cols ** 2'"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { when = "cols >" }', "cannot parse condition 'cols >'"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { when = 8 }', "8 is not a condition"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { arithmetic = "fp8" }', "arithmetic 'fp8' is not one the kit knows"),
        ('replaces = ["linalg.softmax"]\nreplace_when = { mask = "causal" }', "only a kernel that replaces iree_linalg_ext.attention alone says its mask"),
        ('replaces = ["iree_linalg_ext.attention"]\nreplace_when = { mask = "sliding" }', "mask 'sliding': only a kernel"),
    ],
)
def test_manifest_replace_errors(extra, message):
    with pytest.raises(ManifestError) as err:
        _manifest(extra)
    assert message in err.value.render()


# ------------------------------------------------------------------------- the registry


def test_the_registry_holds_every_name_the_manifest_accepts_in_its_order():
    """describe checks `replaces` against op_names.py without importing models: the two lists
    must be one, or a kind would be accepted in a manifest and then missing at build time."""
    assert tuple(OP_KINDS) == REPLACEABLE_OPS
    assert tuple(name for name, kind in OP_KINDS.items() if kind.takes_pattern) == PATTERN_OPS
    assert all(kind.name == name for name, kind in OP_KINDS.items())


def test_every_kind_module_is_registered():
    """Adding an op kind is adding a module of models/ops: one left out of OP_KINDS is an error here
    (private modules, `_masks.py`, are helpers of kinds; so are norm.py, what layer_norm and rms_norm
    share, and epilogue.py, a matmul's)."""
    modules = {m.name for m in pkgutil.iter_modules(ops.__path__) if not m.name.startswith("_")} - {"base", "norm", "epilogue"}
    kinds = {m: importlib.import_module(f"kitdispatch.models.ops.{m}").KIND for m in modules}
    assert sorted(kinds) == ["attention", "batch_matmul", "generic", "layer_norm", "matmul", "patch_conv", "rms_norm", "softmax"]
    assert sorted(k.name for k in kinds.values()) == sorted(OP_KINDS)
    assert all(OP_KINDS[k.name] is k for k in kinds.values())
