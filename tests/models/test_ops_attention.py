"""iree_linalg_ext.attention (models/ops/attention.py): maps, scale, mask, scores, and builds
through the adapter and the V transpose."""

from __future__ import annotations

import functools
import sys

import numpy as np
import pytest
from conftest import (
    ATTENTION,
    SAMPLES,
    dispatch_calls,
    dump_module,
    iree_dispatches,
    needs_iree_compile,
    only,
    ops_of,
)

from kitdispatch import BuildOptions, Kernel, KitError
from kitdispatch.describe.manifest import load_manifest
from kitdispatch.models.pipeline import build_model
from kitdispatch.models.ops.base import Reshape
from kitdispatch.models.replace import decide, replacing_kernels

_D = "affine_map<(d0, d1, d2, d3, d4) -> "


# Q (batch, m, k1), K (batch, k2, k1), V (batch, k2, n), scale (), O (batch, m, n): the layout
# of torch's SDPA as imported; IREE's global optimization reads V through a transpose instead.
PLAIN_V = "(d0, d4, d2)"


@functools.cache
def attention_kernels() -> tuple[Kernel, ...]:
    return replacing_kernels(load_manifest(ATTENTION))


def attention_model(
    batch=8, seq=256, seq_k=None, head=64, dtype="f16", scale="1.250000e-01 : f32", v_map=PLAIN_V, k_map="(d0, d4, d3)",
    v_transposed=False, mask=False, scale_argument=False, scores="%s",
) -> str:
    """One attention op in the form IREE's global optimization gives it, one thing changed at a
    time for the near misses. With `v_transposed`, V goes through IREE's plain transpose first."""
    seq_k = seq_k or seq
    q, kv, o = (f"tensor<{batch}x{s}x{head}x{dtype}>" for s in (seq, seq_k, seq))
    vt = f"tensor<{batch}x{head}x{seq_k}x{dtype}>"
    mask_dtype = "i1" if mask in BOOLEAN_MASKS else dtype
    maskt = f"tensor<{batch}x{seq}x{seq_k}x{mask_dtype}>"
    scale_type = scale.split(": ")[-1]
    args = f"%q: {q}, %k: {kv}, %v: {kv}" + (f", %mask: {maskt}" if mask is True else "") + (f", %scale: {scale_type}" if scale_argument else "")
    transpose = (
        f"""%vte = tensor.empty() : {vt}
  %vt = linalg.generic {{indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>],
      iterator_types = ["parallel", "parallel", "parallel"]}} ins(%v : {kv}) outs(%vte : {vt}) {{
  ^bb0(%in: {dtype}, %out: {dtype}):
    linalg.yield %in : {dtype}
  }} -> {vt}"""
        if v_transposed else ""
    )
    v, v_type = ("%vt", vt) if v_transposed else ("%v", kv)
    maps = [f"{_D}(d0, d1, d3)>", f"{_D}{k_map}>", f"{_D}{v_map}>", f"{_D}()>"] + ([f"{_D}(d0, d1, d4)>"] if mask else []) + [
        f"{_D}(d0, d1, d2)>"
    ]
    ins = f"%q, %k, {v}, %scale" + (", %mask" if mask else "")
    types = f"{q}, {kv}, {v_type}, {scale_type}" + (f", {maskt}" if mask else "")
    return f"""
func.func @forward({args}) -> {o} {{
  {"" if scale_argument else f"%scale = arith.constant {scale}"}
  {mask_op(mask, maskt, mask_dtype, seq, seq_k) if isinstance(mask, str) else ""}
  {transpose}
  %e = tensor.empty() : {o}
  %r = iree_linalg_ext.attention <indexing_maps = [{", ".join(maps)}]> ins({ins} : {types}) outs(%e : {o}) {{
  ^bb0(%s: f32):
    iree_linalg_ext.yield {scores} : f32
  }} -> {o}
  return %r : {o}
}}"""


BOOLEAN_MASKS = ("true-splat", "causal-bool", "causal-bool-offset")


def mask_op(form: str, t: str, dtype: str, seq: int, seq_k: int) -> str:
    """%mask made as IREE's global optimization gives it: torch's is_causal as an index/compare
    generic (select(q >= k, 0, -inf)); transformers' boolean masks (k <= q); constants."""
    lowest = {"f16": "0xFC00", "bf16": "0xFF80", "f32": "0xFF800000"}[dtype] if dtype != "i1" else None
    if form in ("causal-generic", "upper-generic", "causal-bool", "causal-bool-offset"):
        compare = {
            "causal-generic": "arith.cmpi sge, %i, %j : index", "upper-generic": "arith.cmpi sle, %i, %j : index",
            "causal-bool": "arith.cmpi sle, %j, %i : index", "causal-bool-offset": "arith.cmpi slt, %j, %i : index",
        }[form]
        body = "linalg.yield %c : i1" if dtype == "i1" else f"%m = arith.select %c, %zero, %ninf : {dtype}\n    linalg.yield %m : {dtype}"
        return f"""%zero = arith.constant 0.0 : {dtype if dtype != "i1" else "f16"}
  %ninf = arith.constant {lowest or "0xFC00"} : {dtype if dtype != "i1" else "f16"}
  %me = tensor.empty() : {t}
  %mask = linalg.generic {{indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]}}
      outs(%me : {t}) {{
  ^bb0(%out: {dtype}):
    %i = linalg.index 1 : index
    %j = linalg.index 2 : index
    %c = {compare}
    {body}
  }} -> {t}"""
    if form == "true-splat":
        return f"%mask = arith.constant dense<true> : {t}"
    if form == "zero-splat":
        return f"%mask = arith.constant dense<0.0> : {t}"
    if form in ("causal-constant", "arbitrary-constant"):
        # an [s, s] initializer broadcast over the batch, as an ONNX model adds it
        values = np.where(np.tril(np.ones((seq, seq_k), bool)), 0.0, -np.inf) if form == "causal-constant" else np.arange(seq * seq_k).reshape(seq, seq_k) % 3
        text = "[" + ", ".join("[" + ", ".join("0xFC00" if v == -np.inf else repr(float(v)) for v in row) + "]" for row in values) + "]"
        square = f"tensor<{seq}x{seq_k}x{dtype}>"
        return f"""%m2 = arith.constant dense<{text}> : {square}
  %me = tensor.empty() : {t}
  %mask = linalg.generic {{indexing_maps = [affine_map<(d0, d1, d2) -> (d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%m2 : {square}) outs(%me : {t}) {{
  ^bb0(%in: {dtype}, %out: {dtype}):
    linalg.yield %in : {dtype}
  }} -> {t}"""
    raise ValueError(form)


def attention_ops(mlir: str):
    return ops_of(mlir, ("iree_linalg_ext.attention",))


@pytest.mark.parametrize("v_transposed, v_map", [(True, "(d0, d2, d4)"), (False, PLAIN_V)], ids=["v-through-transpose", "plain-v"])
def test_attention_hit(v_transposed, v_map):
    d = decide(attention_ops(attention_model(v_transposed=v_transposed, v_map=v_map)), attention_kernels())[0]
    assert d.kernel is not None and d.kernel.name == "attention_f16"
    assert d.paths == ((0,), (1,), (2, 0) if v_transposed else (2,))  # the transpose's input is passed as V
    assert d.call.result == Reshape(((0, 1), (2,), (3,)))  # [8, s, d] runs as [1, 8, s, d]
    assert d.function.startswith("kitdispatch_attention_f16_batch1_")
    assert d.to_json()["attention"] == {"scale": "1.250000e-01 : f32", "mask": None, "v_through_transpose": v_transposed}


def test_attention_hits_bf16_head_dim_128_and_four_dims():
    d = decide(attention_ops(attention_model(head=128, dtype="bf16", scale="0.0883883461 : f32")), attention_kernels())[0]
    assert d.kernel.name == "attention_bf16"
    four = attention_model().replace("tensor<8x", "tensor<2x4x").replace("(d0, d1, d2, d3, d4) -> (d0,", "(d5, d0, d1, d2, d3, d4) -> (d5, d0,")
    four = four.replace("(d0, d1, d2, d3, d4) -> ()", "(d5, d0, d1, d2, d3, d4) -> ()")
    d = decide(attention_ops(four), attention_kernels())[0]
    assert d.kernel.name == "attention_f16" and not d.call.needs_adapter and d.function == "kitdispatch_attention_f16"  # [b, h, s, d] as the kernel: no adapter


def test_cross_attention_takes_the_cross_entry():
    """256 queries, 128 keys: the entries of one sequence length say so; attention_cross_f16
    (K and V [b, h, t, d]) takes it, with the op's scale as its argument."""
    d = only(decide(attention_ops(attention_model(seq_k=128)), attention_kernels()))
    assert d.kernel is not None and d.kernel.name == "attention_cross_f16", d.reasons
    assert d.call.arguments[-1].value == "0.125"
    near = only(decide(attention_ops(attention_model(seq_k=128)), [k for k in attention_kernels() if k.name == "attention_f16"]))
    assert "cross-attention: 256 queries and 128 keys; the kernel takes one sequence length for both" in near.reasons[0]


@pytest.mark.parametrize(
    "model, reason, value",
    [
        (attention_model(scale="5.000000e-01 : f32"), "the op's scale is 5.000000e-01 : f32, the kernel's 1/sqrt(64) = 0.125 (f32)", "0.5"),
        (attention_model(head=128, scale="8.837890e-02 : f16"), "the op's scale is 8.837890e-02 : f16, the kernel's 1/sqrt(128)",
         "0.08837890625"),
    ],
    ids=["scale", "f16-scale"],
)
def test_another_scale_takes_the_entry_given_the_scale(model, reason, value):
    """The fixed-scale entries (1/sqrt(d) in f32) refuse another scale; attention_cross_f16, which
    takes the scale as an argument (and t = s keys), computes it."""
    d = only(decide(attention_ops(model), attention_kernels()))
    assert d.kernel is not None and d.kernel.name == "attention_cross_f16" and d.call.arguments[-1].value == value
    fixed = only(decide(attention_ops(model), [k for k in attention_kernels() if k.name.startswith("attention_f16")]))
    assert fixed.kernel is None and reason in fixed.reasons[0], fixed.reasons


@pytest.mark.parametrize("scale", ["-1.250000e-01 : f32", "0.000000e+00 : f32", "0x7FC00000 : f32"], ids=["negative", "zero", "nan"])
def test_a_scale_that_is_not_positive_is_refused_by_the_entry_given_the_scale(scale):
    """attention.cu reads a scale that is not positive as "use 1/sqrt(d)": an op of such a scale
    is refused by the entries that take it (not silently run with 1/sqrt(d)), with the reason."""
    d = only(decide(attention_ops(attention_model(scale=scale)), attention_kernels()))
    assert d.kernel is None
    assert any("the kernel takes a positive, finite scale" in r for r in d.reasons), d.reasons


@pytest.mark.parametrize(
    "model, reason",
    [
        (attention_model(dtype="f32"), "element type: the op's Q is 8x256x64xf32, the kernel's q is f16[b,h,s,d]"),
        (attention_model(head=72, scale="0.117851131 : f32"), "head dim 72: the kernel has code for 64, 80, 96 and 128 only"),
        (attention_model(seq=64, v_map="(d0, d2, d4)"),  # V stored transposed: square, so the types fit
         "operand maps: Q (d0, d1, d3) of 5 loops, K (d0, d4, d3) of 5 loops, V (d0, d2, d4) of 5 loops"),
        (attention_model(seq=64, k_map="(d0, d3, d4)"), "K (d0, d3, d4) of 5 loops"),
        (attention_model(scale_argument=True), "the op's scale is computed by a function argument, not a constant"),
        (attention_model(mask=True), "the op's mask is a mask kitdispatch cannot read: an input of the model's function (known at run time only): "
         "the library has no kernel for an arbitrary mask"),
        (attention_model(scores="%s2").replace("iree_linalg_ext.yield %s2", "%s2 = arith.mulf %s, %s : f32\n    iree_linalg_ext.yield %s2"),
         "the op's score region changes the scores"),
    ],
    ids=["dtype", "head-dim", "v-map", "k-map", "scale-not-constant", "mask", "score-region"],
)
def test_attention_near_misses(model, reason):
    d = only(decide(attention_ops(model), attention_kernels()))
    assert d.kernel is None
    assert reason in d.reasons[0], d.reasons
    # every library kernel says why (those that say the same, named together)
    assert sum(len(r.split(": ", 1)[0].split(", ")) for r in d.reasons) == len(attention_kernels())


@needs_iree_compile
def test_attention_build_dispatches_the_library_kernel(tmp_path):
    """An imported attention (V plain, as torch's SDPA gives it): IREE's global optimization
    puts V through a transpose, the kernel reads V through it, and the module dispatches the
    library's attention in place of IREE's attention dispatch (and the transpose)."""
    model = tmp_path / "attn.mlir"
    model.write_text(attention_model(batch=6, seq=300))
    # The project alone: with the library, the generics' preparation (IREE's elementwise
    # fusion) runs first and V reaches the op without the transpose.
    result = build_model(ATTENTION, model, BuildOptions.create("sm_90a,sm_80"), tmp_path / "out", library=False, with_baseline=True)
    [replaced] = result.replaced
    assert replaced.kernel.name == "attention_f16" and replaced.paths[2] == (2, 0) and replaced.call.result is not None
    spec = result.spec.read_text()
    assert "transform.get_producer_of_operand %op[2]" in spec and f"util.func private @{replaced.function}(" in spec
    assert "attention_f16" in dump_module(result.vmfb) and "attention_f16" not in dump_module(result.baseline_vmfb)
    assert iree_dispatches(result.baseline_vmfb, "attention") and not iree_dispatches(result.vmfb, "attention")
    assert not iree_dispatches(result.vmfb, "transpose")
    assert dispatch_calls(result.vmfb) == 1


@needs_iree_compile
def test_masked_attention_is_kept_with_its_reason(tmp_path):
    model = tmp_path / "attn.mlir"
    model.write_text(attention_model(mask=True))
    with pytest.raises(KitError) as err:
        build_model(ATTENTION, model, BuildOptions.create("sm_90a,sm_80"), tmp_path / "out", library=False)
    assert "the library has no kernel for an arbitrary mask" in err.value.render()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["attn.model.json", "attn.replace.json", "attn.replace.txt"]


@needs_iree_compile
def test_torch_attention_sample_exports_and_builds(tmp_path):
    """torch's SDPA through iree-turbine: the library attention replaces IREE's, V read through
    the transpose IREE's global optimization puts before the op."""
    pytest.importorskip("torch")
    pytest.importorskip("iree.turbine")

    sys.modules.pop("model", None)  # torch_mlp's sample module has the same name
    sys.path.insert(0, str(SAMPLES / "torch_attention"))
    try:
        from model import export
    finally:
        sys.path.pop(0)
        sys.modules.pop("model", None)
    mlir = export(tmp_path / "attn.mlir", batch=2, heads=3, seq=300, head_dim=128)
    assert "torch.aten.scaled_dot_product_attention" in mlir.read_text()
    result = build_model(ATTENTION, mlir, BuildOptions.create("sm_90a,sm_80"), tmp_path / "out", with_baseline=True)
    [replaced] = result.replaced
    assert replaced.kernel.name == "attention_f16" and replaced.op.result.shape == (6, 300, 128)
    assert replaced.op.detail.scale_text == "0.0883883461 : f32" and replaced.paths[2] == (2, 0)
    assert iree_dispatches(result.baseline_vmfb, "attention") and not iree_dispatches(result.vmfb, "attention")


@pytest.mark.parametrize(
    "mask, kernel, dtype",
    [
        (None, "attention_f16", "f16"),
        ("true-splat", "attention_f16", "f16"),  # all true: no mask
        ("zero-splat", "attention_f16", "f16"),  # additive zeros: no mask
        ("causal-generic", "attention_causal_f16", "f16"),  # torch's is_causal=True as IREE gives it
        ("causal-generic", "attention_causal_bf16", "bf16"),
        ("causal-bool", "attention_causal_f16", "f16"),  # transformers' boolean k <= q
        ("causal-constant", "attention_causal_f16", "f16"),  # a lower-triangular 0 / -inf initializer
    ],
)
def test_attention_masks_that_a_kernel_applies(mask, kernel, dtype):
    d = only(decide(attention_ops(attention_model(mask=mask, dtype=dtype)), attention_kernels()))
    assert d.kernel is not None and d.kernel.name == kernel, d.reasons
    assert d.paths == ((0,), (1,), (2,))  # the mask is not passed: the kernel applies it


@pytest.mark.parametrize(
    "mask, why",
    [
        ("upper-generic", "the op's mask is an additive mask neither empty nor causal"),  # q <= k
        ("causal-bool-offset", "a boolean mask neither empty nor causal"),  # k < q: the diagonal masked
        ("arbitrary-constant", "an additive mask of values other than 0 and -inf"),
        (True, "a mask kitdispatch cannot read: an input of the model's function"),
    ],
)
def test_attention_masks_kept(mask, why):
    d = only(decide(attention_ops(attention_model(mask=mask, seq=64)), attention_kernels()))
    assert d.kernel is None
    assert all(why in r and "the library has no kernel for an arbitrary mask" in r for r in d.reasons), d.reasons


def test_causal_kernel_refuses_an_unmasked_op_and_another_key_length():
    d = only(decide(attention_ops(attention_model()), attention_kernels()[1:2]))
    assert d.kernel is None and "the op has no mask, the kernel applies a causal mask" in d.reasons[0]
    d = only(decide(attention_ops(attention_model(mask="causal-generic", seq_k=128)), attention_kernels()))
    assert d.kernel is None and "the op's mask is an additive mask neither empty nor causal" in d.reasons[0]  # not square


def test_a_causal_mask_cut_to_the_sequence_is_causal():
    """HF builds a causal mask for the longest sequence and slices it: the slice is read too."""
    mlir = attention_model(mask="causal-generic", seq=64, head=128, scale="0.0883883461 : f32").replace("tensor<8x64x64xf16>", "tensor<8x96x96xf16>")
    cut = "%mask0 = tensor.extract_slice %mask[0, 0, 0] [8, 64, 64] [1, 1, 1] : tensor<8x96x96xf16> to tensor<8x64x64xf16>"
    mlir = mlir.replace("  } -> tensor<8x96x96xf16>", f"  }} -> tensor<8x96x96xf16>\n  {cut}").replace(", %mask :", ", %mask0 :")
    mlir = mlir.replace("tensor<8x96x96xf16>) outs", "tensor<8x64x64xf16>) outs")
    d = only(decide(attention_ops(mlir), attention_kernels()))
    assert d.kernel is not None and d.kernel.name == "attention_causal_f16", d.reasons
    shifted = mlir.replace("[0, 0, 0] [8, 64, 64]", "[0, 0, 1] [8, 64, 64]")  # keys shifted by one: not causal
    assert only(decide(attention_ops(shifted), attention_kernels())).kernel is None
