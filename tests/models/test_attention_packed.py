"""GPT-2's attention read straight out of its packed QKV projection (models/ops/_decomposed.py's
packed read, the library's attention[_causal]_qkv entries): a GPT-2-style block in ONNX
(tests/data/attention_forms/make_gpt2.py: Gemm with bias, Split in three, heads, causal
softmax) through the real iree-import-onnx and iree-compile; near misses keep the [b, s, h, d]
kernel with the reason; builds check that IREE's copies of the three slices are gone."""

from __future__ import annotations

import re

import pytest
from conftest import dump_module, needs_iree_compile

from kitdispatch import BuildOptions
from kitdispatch.models.compare import compare_model
from kitdispatch.models.pipeline import build_model
from kitdispatch.models.ops.attention import kernel_orders
from kitdispatch.models.replace import check_kernel
from models.test_attention_forms import ARCHS, attention_decision, decisions_of, form_build, library_kernels, make_model

PACKED = "attention_causal_qkv_f16"
SPLIT = "attention_causal_bshd_f16"  # Q, K, V as three [b, s, h, d] tensors (IREE copies each slice out)


def _copies(vmfb) -> list[str]:
    """IREE's own copy dispatches (a slice materialized for a dispatch that takes whole tensors)."""
    return re.findall(r"dispatch_\d+_slow_memcpy\w*", vmfb.read_bytes().decode("latin-1"))


def test_a_packed_kernel_declares_itself_by_its_first_buffers_dims():
    """qkv [b, s, 3, h, d] stands in for Q, K and V (one buffer in three roles), passed once."""
    for kernel in (k for k in library_kernels() if "_qkv_" in k.name):
        layout = check_kernel(kernel, "iree_linalg_ext.attention")
        assert layout.inputs[0] is layout.inputs[1] is layout.inputs[2] and layout.pattern == (0, "scale")
        assert kernel_orders(layout) == ("bs3hd",) * 3 + ("bshd",)


@pytest.mark.parametrize("batch, seq", [(2, 128), (1, 128)], ids=["b2", "b1"])
def test_packed_qkv_reaches_the_packed_kernel(tmp_path, batch, seq):
    """The three slices of one projection (offsets 0, h*d, 2*h*d) go to the packed kernel, read
    as the projection's [b, s, 3*h*d] (b = 1: IREE drops the unit dim from the slices) viewed as
    [b, s, 3, h, d]: the call passes it once, and the slices die with the op."""
    d = attention_decision(decisions_of(make_model(tmp_path, "gpt2", "attn.onnx", "--batch", batch, "--seq", seq), tmp_path))
    assert d.kernel is not None and d.kernel.name == PACKED, d.reasons
    [qkv] = d.call.operands
    assert qkv.tensor.shape[-1] == 3 * 4 * 64 and qkv.reshape.shape == (batch, seq, 3, 4, 64)
    assert [a.value for a in d.call.arguments[1:]] == ["0.125"]  # the op's scale, once; no K, V
    assert "unpacked" not in d.to_json()["attention"]["decomposed"]
    assert d.op.detail.summary == "decomposed, ending in linalg.batch_matmul"


@pytest.mark.parametrize(
    "variant, reason, kernel",
    [
        ("swapped", "Q, K and V are its parts 1, 0, 2, not 0, 1 and 2", SPLIT),
        ("wide", "is not a third of its last dim (3 x h x d)", SPLIT),
        ("reader", "the slice at", SPLIT),
        # Q's own projection: IREE transposes it to heads in its bias add, K stays K^T (BERT's form)
        ("other-q", "is not a third of its last dim (3 x h x d)", "attention_causal_kt_f16"),
    ],
)
def test_near_misses_keep_todays_kernel_saying_why(tmp_path, variant, reason, kernel):
    """Q, K and V that are not one tensor's three parts in order, or a slice another op reads
    too: the packed kernel does not fit (the op's report says why), today's kernel does."""
    d = attention_decision(decisions_of(make_model(tmp_path, "gpt2", "attn.onnx", "--variant", variant), tmp_path))
    assert d.kernel is not None and d.kernel.name == kernel, d.reasons
    unpacked = d.to_json()["attention"]["decomposed"]["unpacked"]
    assert unpacked.startswith("not one packed QKV tensor: ") and reason in unpacked, unpacked
    assert "not one packed QKV tensor" in d.op.describe()  # the report's line says it
    if variant == "reader":
        assert "has 2 readers" in unpacked


@needs_iree_compile
def test_packed_build_has_no_slice_copies(tmp_path):
    """Built with the library: the packed kernel runs, and IREE's three slow_memcpy dispatches
    (each slice copied out for the [b, s, h, d] kernel, as IREE alone copies them too) are gone."""
    model = make_model(tmp_path, "gpt2", "attn.onnx")
    result = build_model(None, model, BuildOptions.create(ARCHS), tmp_path / "out", with_baseline=True)
    [attention] = [d for d in result.decisions if d.op.kind == "iree_linalg_ext.attention"]
    assert attention.kernel.name == PACKED, attention.reasons
    assert PACKED in dump_module(result.vmfb)
    assert not _copies(result.vmfb), _copies(result.vmfb)
    spec = (tmp_path / "out" / "attn.spec.mlir").read_text()
    assert "tensor<2x128x768xf16> into tensor<2x128x3x4x64xf16>" in spec  # a view, no copy


@needs_iree_compile
def test_unpacked_build_copies_the_slices(tmp_path):
    """The control: a slice another op reads keeps the [b, s, h, d] kernel, whose inputs IREE
    materializes by copies (what the packed kernel saves)."""
    model = make_model(tmp_path, "gpt2", "attn.onnx", "--variant", "reader")
    result = build_model(None, model, BuildOptions.create(ARCHS), tmp_path / "out")
    assert any(d.kernel is not None and d.kernel.name == SPLIT for d in result.decisions)
    assert len(_copies(result.vmfb)) >= 2, _copies(result.vmfb)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["gpt2-packed", "gpt2-packed-b1-s300"])
def test_packed_attention_agrees_with_iree_on_gpu(tmp_path, prebuilt_dir, case):
    """The packed kernel's build agrees with IREE's own (f16 tolerance), at 128 keys (the
    mma.sync path) and 300 (the sm_90a wgmma + TMA path on Hopper, kHopperMinKeys)."""
    built = form_build(tmp_path, prebuilt_dir, case)
    result = compare_model(built)
    assert result.agree, result.worst
    assert PACKED in result.kernel_names
