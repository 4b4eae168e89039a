"""Attention with a key-padding mask taken from a model input (models/ops/_masks.py `per_key`,
_decomposed.py, attention.py; kernels/attention's `_pad` entries): ONNX layers written as
transformers' masks reach them (tests/data/attention_forms/make_onnx.py `--mask keypad*`:
an `attention_mask` int64 [b, t] input, cast to bool, broadcast to [b, 1, 1, t]), brought to
IREE's global optimization by the real tools and decided against the whole library; builds
check the dispatches and the spec; GPU tests run padding patterns (a fully padded row among
them) against the ONNX model's reference evaluation and IREE alone."""

from __future__ import annotations

import runpy

import numpy as np
import pytest
from conftest import dispatch_calls, dump_module, iree_dispatches, needs_iree_compile

from kitdispatch import BuildOptions
from kitdispatch.models.pipeline import build_model
from models.test_attention_forms import ARCHS, FORMS, attention_decision, decisions_of, form_build, make_model

FLAGS = "key-padding flags [b, t] made by ops from an input of the model's function"
ADDITIVE = "an additive key-padding mask [b, t] made by ops from an input of the model's function"
INPUT = "made by ops from an input of the model's function"


def computed(ops: str, dtype: str) -> str:
    """What the report says of a mask the scores' generic computes from a [b, t] tensor."""
    return f"a key-padding mask computed in the scores' generic ({ops}) from a [b, t] {dtype} tensor {INPUT}"


@pytest.mark.parametrize(
    "args, kernel, form, what",
    [
        # the Where(keep, 0, lowest) fused into the cast of the input: the scores' generic adds an f16 [b, t]
        (["--mask", "keypad"], "attention_pad_f16", "key_padding", ADDITIVE),
        (["--mask", "keypad-inf"], "attention_pad_f16", "key_padding", ADDITIVE),
        # the flags through a Gather (HF BERT / GPT-2 exports): boolean [b, t] selected in the scores' generic
        (["--mask", "keypad-gather"], "attention_pad_f16", "key_padding", FLAGS),
        (["--form", "layer", "--mask", "keypad-gather"], "attention_pad_kt_f16", "key_padding", FLAGS),
        (["--form", "layer", "--mask", "keypad", "--seq", 197], "attention_pad_kt_f16", "key_padding", ADDITIVE),
        (["--mask", "keypad-causal-gather"], "attention_causal_pad_f16", "causal_key_padding", f"a causal boolean mask and {FLAGS}"),
        (["--kv-seq", 77, "--mask", "keypad"], "attention_cross_pad_f16", "key_padding", ADDITIVE),  # bias [b, t] on t keys
        (["--form", "split", "--mask", "keypad-causal-gather"], "attention_causal_pad_kt_f16", "causal_key_padding",
         f"a causal boolean mask and {FLAGS}"),
        # IREE fuses the mask's own ops into the scores' generic: the kernel gets the bias they compute from the [b, t] tensor
        (["--mask", "keypad-additive"], "attention_pad_f16", "key_padding", computed("subf, mulf", "f16")),  # (1 - m) * lowest
        (["--mask", "keypad-causal"], "attention_causal_pad_f16", "causal_key_padding",
         f"a causal boolean mask and {computed('cmpi, select', 'i64')}"),  # the int64 mask's compare, anded with the causal one
        # transformers' torchscript exports: the flags anded with a compare of aranges the kit evaluates (all true; causal)
        (["--form", "layer", "--mask", "keypad-arange-gather"], "attention_pad_kt_f16", "key_padding", FLAGS),
        (["--form", "split", "--mask", "keypad-arange-causal-gather"], "attention_causal_pad_kt_f16", "causal_key_padding",
         f"a causal boolean mask and {FLAGS}"),
    ],
    ids=["additive", "additive-inf", "flags", "layer-flags", "layer-additive-197", "causal-flags", "cross-additive", "split-causal-flags",
         "additive-fused", "causal-fused", "arange-flags", "arange-causal-flags"],
)
def test_key_padding_from_an_input_is_replaced_whole(tmp_path, args, kernel, form, what):
    decisions = decisions_of(make_model(tmp_path, "onnx", "attn.onnx", "--f16", *args), tmp_path)
    d = attention_decision(decisions)
    assert d.kernel is not None and d.kernel.name == kernel, d.reasons
    assert d.to_json()["attention"]["mask"] == {"form": form, "what": what}
    # the kernel reads the [b, t] tensor the scores' generic broadcasts: as it is, or (flags) through the adapter's select
    keep = d.op.detail.chain.keep
    keys = d.op.result.shape[1] if "layer" in args or "split" in args else d.op.inputs[1].shape[2]  # K [b, h, t, d]
    assert keep.tensor.shape == (2, keys)
    [bias] = [a for a in d.call.arguments if getattr(a, "path", None) == keep.path]
    assert (bias.bias is not None) == (keep.tensor.dtype == "i1" or "computed" in what)
    # the scores' generic (the mask's broadcast), the softmax and the matmuls go with it
    others = [x for x in decisions if x is not d and x.op.kind in ("linalg.softmax", "linalg.batch_matmul")]
    assert others and all(x.kernel is None and f"which {kernel} replaces whole" in x.reasons[0] for x in others)


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--mask", "keypad-where-gather"], "key-padding flags applied as select(keep, scores, masked)"),
        (["--mask", "keypad-query"], "a mask broadcast over the queries or the keys"),
    ],
    ids=["select-scores", "query-padding"],
)
def test_key_padding_near_misses_are_kept_with_the_reason(tmp_path, args, reason):
    d = attention_decision(decisions_of(make_model(tmp_path, "onnx", "attn.onnx", "--f16", *args), tmp_path))
    assert d.kernel is None
    assert all(reason in r for r in d.reasons), d.reasons


@pytest.mark.parametrize(
    "args, kernel, what",
    [
        (["--mask", "keypad-gather"], "attention_pad_f32", FLAGS),
        # f32: IREE fuses the int64 mask's compare and the Where into the scores' generic
        (["--mask", "keypad"], "attention_pad_f32", computed("cmpi, select", "i64")),
        (["--mask", "keypad-inf", "--seq", 197], "attention_pad_f32", computed("cmpi, select", "i64")),
        (["--form", "layer", "--mask", "keypad-additive"], "attention_pad_kt_f32", computed("subf, mulf", "f32")),
    ],
    ids=["flags", "where-fused", "where-inf-fused", "layer-additive-fused"],
)
def test_f32_key_padding_reaches_the_f32_kernel(tmp_path, args, kernel, what):
    """An f32 model's mask becomes the f32 bias the kernel adds: select(keep, 0, f32's lowest) of
    boolean flags, or what the scores' generic computes from the [b, t] input."""
    d = attention_decision(decisions_of(make_model(tmp_path, "onnx", "attn.onnx", *args), tmp_path))
    assert d.to_json()["attention"]["mask"] == {"form": "key_padding", "what": what}
    assert d.kernel is not None and d.kernel.name == kernel, d.reasons
    [bias] = [a for a in d.call.arguments if getattr(a, "path", None) == d.op.detail.chain.keep.path]
    assert bias.bias is not None and bias.bias.result_type == "f32"


# ----------------------------------------------------------------- builds (real iree-compile)


@needs_iree_compile
@pytest.mark.parametrize(
    "args, kernel, bias",
    [
        (["--form", "layer", "--mask", "keypad-gather"], "attention_pad_kt_f16", ["arith.select %b", "arith.constant -65504.0 : f32"]),
        (["--form", "split", "--mask", "keypad-causal-gather"], "attention_causal_pad_kt_f16", ["arith.select %b"]),
        (["--mask", "keypad"], "attention_pad_f16", None),  # the f16 [b, t] the scores' generic adds, read as it is
        # the mask's ops IREE fused into the scores' generic, re-run on the [b, t] tensor
        (["--mask", "keypad-additive"], "attention_pad_f16", ["arith.subf %b", "arith.mulf %b", "arith.constant -6.550400e+04 : f16"]),
        (["--mask", "keypad-causal"], "attention_causal_pad_f16", ["arith.cmpi ne, %b", "arith.select %b"]),
        # f32 (kernels/attention_f32): the bias made in f32, f32's lowest with no truncf
        (["--f32", "--form", "layer", "--mask", "keypad-gather"], "attention_pad_kt_f32",
         ["arith.select %b", "arith.constant -3.4028234663852886e+38 : f32"]),
        (["--f32", "--mask", "keypad"], "attention_pad_f32", ["arith.cmpi ne, %b", "arith.constant -3.4028234663852886e+38 : f32"]),
        # batch 1: IREE drops b and fuses the mask's gather into the scores' generic; the kernel reads the flags [t] as [1, t]
        (["--form", "layer", "--mask", "keypad-causal-gather", "--batch", 1], "attention_causal_pad_kt_f16", ["arith.select %b"]),
    ],
    ids=["layer-flags", "split-causal-flags", "heads-additive", "additive-fused", "causal-fused", "f32-layer-flags", "f32-where-fused",
         "b1-layer-causal-flags"],
)
def test_key_padding_builds_to_the_kernel_and_no_iree_attention(tmp_path, args, kernel, bias):
    """The whole chain with its mask's broadcast (the scores' generic reading [b, t] per batch
    and key) becomes the one kernel: no IREE batch_matmul or softmax is left, nor an
    elementwise dispatch over the [b, h, s, s] scores, and the module has no more dispatches
    than IREE's own. Flags, and masks whose ops IREE fused into the scores' generic, reach the
    kernel as the bias the model computes, made in the adapter (a [b, t] generic of the
    model's own ops, which IREE runs with the mask's producer)."""
    f32 = args[:1] == ["--f32"]
    model = make_model(tmp_path, "onnx", "attn.onnx", *(args[1:] if f32 else ["--f16", *args]))
    result = build_model(None, model, BuildOptions.create(ARCHS), tmp_path / "out", with_baseline=True)
    [attention] = [d for d in result.decisions if d.op.kind == "iree_linalg_ext.attention"]
    assert attention.kernel is not None and attention.kernel.name == kernel, attention.reasons
    assert kernel in dump_module(result.vmfb)
    assert not iree_dispatches(result.vmfb, "softmax") and not iree_dispatches(result.vmfb, "batch_matmul")
    assert not [x for x in iree_dispatches(result.vmfb, "elementwise") if "128x128" in x]
    assert iree_dispatches(result.baseline_vmfb, "softmax")
    assert dispatch_calls(result.vmfb) <= dispatch_calls(result.baseline_vmfb)
    spec = result.spec.read_text()
    if bias is None:
        assert "^bb0(%b" not in spec
    else:
        assert "^bb0(%b" in spec and all(line in spec for line in bias), spec
    assert ("arith.truncf" not in spec) if f32 else True
    assert ("tensor.expand_shape %x3" in spec) == ("--batch" in args)  # batch 1: the mask [t] as the kernel's [1, t]


@needs_iree_compile
@pytest.mark.parametrize(
    "args, dtype, want",
    [
        (["--f16", "--mask", "keypad-additive"], np.float16, lambda m: ((1 - m) * np.float16(-65504)).astype(np.float16)),
        (["--f16", "--mask", "keypad-causal"], np.float16, lambda m: np.where(m != 0, 0, -65504).astype(np.float16)),
        (["--mask", "keypad"], np.float32, lambda m: np.where(m != 0, 0, np.finfo(np.float32).min).astype(np.float32)),
        (["--mask", "keypad-inf"], np.float32, lambda m: np.where(m != 0, 0, -np.inf).astype(np.float32)),
        (["--f16", "--form", "layer", "--mask", "keypad-gather"], np.float16, lambda m: np.where(m, 0, -65504).astype(np.float16)),
        # batch 1: the flags [t] the scores' generic reads through its fused gather (tensor.extract at positions 0 .. t-1)
        (["--f16", "--form", "layer", "--mask", "keypad-causal-gather", "--batch", 1], np.float16,
         lambda m: np.where(m, 0, -65504).astype(np.float16)),
    ],
    ids=["f16-additive-fused", "f16-causal-fused", "f32-where-fused", "f32-inf-fused", "f16-flags", "f16-b1-gathered-flags"],
)
def test_the_bias_the_adapter_computes_is_the_models_on_the_cpu(tmp_path, args, dtype, want):
    """The adapter's [b, t] bias generic (models/spec.py), compiled by the real iree-compile for
    the CPU and run by IREE's runtime there, gives the values the model's mask adds, for every
    mask value (0, 1, and other integers where the mask is int64): its ops are the model's own,
    re-emitted, and a wrong predicate, operand order or constant shows here without a GPU."""
    import iree.runtime as rt

    from kitdispatch.iree.tools import find_tool, run_tool
    from kitdispatch.models.spec import _Body, tensor_text

    d = attention_decision(decisions_of(make_model(tmp_path, "onnx", "attn.onnx", *args), tmp_path))
    keep = d.op.detail.chain.keep
    [program] = [a.bias for a in d.call.arguments if getattr(a, "path", None) == keep.path]
    body = _Body()
    value = body.bias("%x", keep.tensor, program)
    out = f"tensor<{'x'.join(map(str, keep.tensor.shape))}x{program.result_type}>"
    lines = "\n".join(f"  {line}" for line in body.lines)
    source = tmp_path / "bias.mlir"
    source.write_text(f"func.func @bias(%x: {tensor_text(keep.tensor)}) -> {out} {{\n{lines}\n  return {value} : {out}\n}}\n")
    vmfb = tmp_path / "bias.vmfb"
    run_tool([find_tool("iree-compile"), str(source), "--iree-hal-target-device=local",
              "--iree-hal-local-target-device-backends=llvm-cpu", "-o", str(vmfb)], timeout=300)
    module = rt.load_vm_flatbuffer_file(str(vmfb), driver="local-sync")
    element = {"i64": np.int64, "i1": np.bool_, "f16": np.float16, "f32": np.float32}[keep.tensor.dtype]
    rng = np.random.default_rng(0)
    mask = rng.integers(0, 2, keep.tensor.shape)
    if element is np.int64:
        mask[0, :3] = (2, -1, 7)  # nonzero attends, as the model's Cast to bool reads it
    got = np.asarray(module.bias(mask.astype(element)))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want(mask.astype(element)))


# ----------------------------------------------------------------- GPU: padding patterns


_CASES = runpy.run_path(str(FORMS / "gpu_cases.py"))
KEYPAD_CASES = sorted(c for c in _CASES["GPU_CASES"] if "keypad" in c)


def padding_patterns(batch: int, keys: int, *, full: bool) -> list[np.ndarray]:
    """attention_mask [batch, keys] int64 patterns: right padding, left padding (a causal row
    whose own keys are all padded), random holes, and (`full`) a fully padded row."""
    rng = np.random.default_rng(0)
    right = np.ones((batch, keys), np.int64)
    right[0, keys - 37:] = 0
    left = np.ones((batch, keys), np.int64)
    left[-1, :50] = 0
    holes = (rng.random((batch, keys)) > 0.3).astype(np.int64)
    patterns = [right, left, holes]
    if full:
        padded = np.ones((batch, keys), np.int64)
        padded[-1] = 0
        patterns.append(padded)
    return patterns


@pytest.mark.gpu
@pytest.mark.parametrize("case", KEYPAD_CASES)
def test_key_padding_agrees_with_the_model_on_gpu(tmp_path, prebuilt_dir, case):
    """Each padding pattern through the kit's build agrees with the ONNX model's reference
    evaluation (onnx.reference) and with IREE alone, a fully padded row included (the model's
    softmax over every key's lowest-biased score, where the mask adds its dtype's lowest: not NaN);
    prebuilt as `attention_forms_<case>` (tools/prebuild.py) where the GPU machine has no iree-compile."""
    from onnx import load
    from onnx.reference import ReferenceEvaluator

    from kitdispatch import load_module
    from kitdispatch.describe.model_record import read_model_record
    from kitdispatch.models.compare import check_agreement
    from kitdispatch.run.device import numpy_dtype

    kind, args, kernel = _CASES["GPU_CASES"][case]
    built = form_build(tmp_path, prebuilt_dir, case)
    folder, record = read_model_record(built)
    sig = record.function(None)
    onnx_model = load(make_model(tmp_path, "onnx", "ref.onnx", *args))
    reference = ReferenceEvaluator(onnx_model)
    kit, iree = load_module(folder / record.vmfb), load_module(folder / record.baseline_vmfb)
    assert kernel in (folder / record.vmfb).read_bytes().decode("latin-1")  # the kit's kernels keep their names
    names = [i.name for i in onnx_model.graph.input]  # the function's inputs, in order: tensors, then attention_mask
    rng = np.random.default_rng(1)
    tensors = [rng.uniform(-2, 2, t.shape).astype(numpy_dtype(t.dtype)) for t in sig.inputs[:-1]]  # f16, or f32 (attention_f32)
    for mask in padding_patterns(*sig.inputs[-1].shape, full="keypad-inf" not in args):
        inputs = [*tensors, mask]
        got = np.asarray(kit.call(sig.name, *inputs))
        want = np.asarray(reference.run(None, dict(zip(names, inputs)))[0])
        alone = np.asarray(iree.call(sig.name, *inputs))
        assert np.isfinite(got).all()
        for other in (want, alone):
            agree, _, _, worst = check_agreement([got], [other], sig)
            assert agree, (mask.sum(axis=1), worst)


# ----------------------------------------------------------------- batch 1: the gather IREE fuses in


def test_key_padding_at_batch_1_is_read_per_key_as_one_row(tmp_path):
    """At batch 1 IREE drops b: the scores' generic (loops [h, q, k]) reads the additive mask [t]
    per key, and the kernel reads it as [1, t] (the adapter's expand_shape)."""
    d = attention_decision(decisions_of(make_model(tmp_path, "onnx", "attn.onnx", "--f16", "--mask", "keypad", "--batch", 1), tmp_path))
    assert d.kernel is not None and d.kernel.name == "attention_pad_f16", d.reasons
    keep = d.op.detail.chain.keep
    assert keep.tensor.shape == (128,)
    [bias] = [a for a in d.call.arguments if getattr(a, "path", None) == keep.path]
    assert bias.reshape is not None and bias.reshape.groups == ((0, 1),)


_GATHERED = """
util.global private @positions = dense<{positions}> : tensor<4xi64>
func.func @scores(%s: tensor<2x4x4xf16>, %flags: tensor<4xi1>, %other: tensor<4xi1>) -> tensor<2x4x4xf32> {{
  %positions = util.global.load immutable @positions : tensor<4xi64>
  %zero = arith.constant 0.000000e+00 : f16
  %lowest = arith.constant -6.550400e+04 : f16
  %empty = tensor.empty() : tensor<2x4x4xf32>
  %r = linalg.generic {{indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d2)>,
                                        affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%s, %positions : tensor<2x4x4xf16>, tensor<4xi64>) outs(%empty : tensor<2x4x4xf32>) {{
  ^bb0(%in: f16, %p: i64, %out: f32):
    %i = arith.index_cast %p : i64 to index
    %keep = tensor.extract %flags[%i] : tensor<4xi1>
    {second}
    %bias = arith.select %keep, %zero, %lowest : f16
    %a = arith.addf %in, %bias : f16
    %f = arith.extf %a : f16 to f32
    linalg.yield %f : f32
  }} -> tensor<2x4x4xf32>
  return %r : tensor<2x4x4xf32>
}}
"""


@pytest.mark.parametrize(
    "positions, second, read",
    [
        ("[0, 1, 2, 3]", "", True),
        ("[0, 2, 1, 3]", "", False),  # a gather of other positions: not the flags per key
        ("[0, 1, 2, 3]", "%unused = tensor.extract %other[%i] : tensor<4xi1>", False),  # the spec finds the body's one extract
    ],
    ids=["arange", "permuted", "two-extracts"],
)
def test_batch_1_flags_are_read_through_the_fused_gather_only_at_every_key_in_order(positions, second, read):
    """IREE's form of a batch-1 model's gather of its flags, fused into the scores' generic: the
    flags are the kernel's only where the positions are 0 .. t-1 (a hoisted global the kit
    evaluates) and the extract is the body's only one (the spec reaches the flags through it)."""
    pytest.importorskip("iree.compiler")
    from iree.compiler import ir

    from kitdispatch.models.ops._decomposed import _captured_flags
    from kitdispatch.models.ops.base import map_dims

    module = ir.Module.parse(_GATHERED.format(positions=positions, second=second), ir.Context())
    func = next(o.operation for o in module.body.operations if o.operation.name == "func.func")
    generic = next(o.operation for o in func.regions[0].blocks[0].operations if o.operation.name == "linalg.generic")
    args = list(generic.regions[0].blocks[0].arguments)
    maps = [map_dims(a) for a in ir.ArrayAttr(generic.attributes["indexing_maps"])]
    keep = next(o for o in generic.regions[0].blocks[0].operations if o.operation.name == "tensor.extract").results[0]
    flags = _captured_flags(keep, generic, args, maps)
    assert (flags is not None) == read
    if read:
        assert flags == func.regions[0].blocks[0].arguments[1]
