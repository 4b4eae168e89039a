"""Writes attention as exporters write it without SDPA (ONNX opset 17): MatMul(Q, Transpose(K)),
a Div by sqrt(d) (or a Mul by 1/sqrt(d)), an optional additive mask Add, Softmax over the last
axis, MatMul with V. The inputs are Q, K, V [b, h, s, d] (`--form heads`, or `[b*h, s, d]` with
`--form flat`), or x [b, s, h*d] projected to heads and back (`--form layer`: MatMul, Reshape,
Transpose, as a BERT/GPT-2 layer writes it).

    python tests/data/attention_forms/make_onnx.py OUT.onnx [--batch 2 --heads 4 --seq 128 --head-dim 64]
        [--f16] [--mask none|zero|causal|causal-where|where-add|where-add-causal|arbitrary|keypad...] [--scale div|mul|wrong|sqrt-qk]
        [--kv-seq N] [--form heads|flat|layer|split]
        [--kv-heads N] [--nan-guard]

Masks are constant initializers [s, s] added to the scores: all zero, causal (0 on and below
the diagonal, the dtype's lowest value above it, as HF builds it) or arbitrary (random);
`causal-where` is a boolean [s, s] initializer applied with Where(keep, scores, lowest), as
GPT-2's eager attention does; `where-add` and `where-add-causal` add Where(keep, 0, lowest) of
a boolean [1, 1, s, s] initializer (all true, or causal) to the scores, as torch's dynamo
exporter writes SDPA with the mask transformers builds (/work/hf exports).
`keypad*` masks come from a model input `attention_mask` int64 [b, t] (1 attends, 0 pads), as
transformers builds them: Cast to bool, Reshape to [b, 1, 1, t], then `keypad` adds
Where(keep, 0, lowest), `keypad-causal` first ands a causal [1, 1, s, s] initializer (GPT-2),
`keypad-inf` adds Where(keep, 0, -inf), `keypad-where` applies Where(keep, scores, lowest),
`keypad-additive` adds (1 - float(mask)) * lowest (older transformers), `keypad-query` pads the
queries ([b, 1, s, 1]) instead of the keys. `-gather` masks read the flags through a Gather of
constant indices (transformers 5's vmapped `attention_mask[batch, kv]`, as in HF BERT and GPT-2
exports), which keeps IREE from fusing the Where into the mask's producer: the scores' generic
then reads boolean flags [b, t]. `keypad-arange*-gather` write the mask as transformers' torchscript
exports do (torch.onnx.export(dynamo=False)): the flags anded with a compare of aranges, q >= 0
(every query: BERT) or k <= q (causal: GPT-2), which IREE leaves in the scores' generic.
`--scale sqrt-qk` and `--nan-guard` write torch's SDPA as the dynamo exporter does (transformers'
default attention): Q and K^T each multiplied by d^-1/4 before their MatMul and the scores not
scaled; Where(IsNaN(p), 0, p) after the Softmax.
`--form split` projects x with one MatMul to Q, K and V side by side and splits them (GPT-2's
c_attn), each then reshaped and transposed to heads.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


KEYPAD = ["keypad", "keypad-causal", "keypad-inf", "keypad-where", "keypad-additive", "keypad-query", "keypad-gather",
          "keypad-causal-gather", "keypad-where-gather", "keypad-arange-gather", "keypad-arange-causal-gather"]
ARANGE = ("keypad-arange-gather", "keypad-arange-causal-gather")


def make_model(
    batch: int = 2, heads: int = 4, seq: int = 128, head_dim: int = 64, *, f16: bool = False, mask: str = "none",
    scale: str = "div", kv_seq: int | None = None, form: str = "heads", kv_heads: int | None = None, seed: int = 0,
    nan_guard: bool = False,
) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    dtype = np.float16 if f16 else np.float32
    elem = TensorProto.FLOAT16 if f16 else TensorProto.FLOAT
    kv_seq = kv_seq or seq
    node = helper.make_node

    def const(name: str, value, t=dtype) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, t), name)

    scale_value = {"div": np.sqrt(head_dim), "mul": 1 / np.sqrt(head_dim), "wrong": 0.5, "sqrt-qk": head_dim ** -0.25}[scale]
    inits = [const("scale", scale_value)]
    nodes = []
    if form == "split":  # one QKV projection, split in three (GPT-2's c_attn)
        hidden = heads * head_dim
        inputs = [helper.make_tensor_value_info("x", elem, [batch, seq, hidden])]
        inits.append(numpy_helper.from_array(np.array([batch, seq, heads, head_dim], np.int64), "heads_shape"))
        inits.append(numpy_helper.from_array(np.array([batch, seq, hidden], np.int64), "out_shape"))
        inits.append(numpy_helper.from_array(np.array([hidden] * 3, np.int64), "split_sizes"))
        inits.append(const("w_qkv", rng.standard_normal((hidden, 3 * hidden)) / np.sqrt(hidden)))
        nodes += [node("MatMul", ["x", "w_qkv"], ["qkv"]), node("Split", ["qkv", "split_sizes"], ["q_proj", "k_proj", "v_proj"], axis=2)]
        for p in "qkv":
            nodes += [
                node("Reshape", [f"{p}_proj", "heads_shape"], [f"{p}_split"]),
                node("Transpose", [f"{p}_split"], [p], perm=[0, 2, 1, 3]),
            ]
        out_shape = [batch, seq, hidden]
    elif form == "layer":
        hidden = heads * head_dim
        inputs = [helper.make_tensor_value_info("x", elem, [batch, seq, hidden])]
        inits.append(numpy_helper.from_array(np.array([batch, seq, heads, head_dim], np.int64), "heads_shape"))
        inits.append(numpy_helper.from_array(np.array([batch, seq, hidden], np.int64), "out_shape"))
        kv = kv_heads or heads
        inits.append(numpy_helper.from_array(np.array([batch, seq, kv, head_dim], np.int64), "kv_shape"))
        for p in "qkv":
            width = hidden if p == "q" else kv * head_dim
            inits.append(const(f"w_{p}", rng.standard_normal((hidden, width)) / np.sqrt(hidden)))
            nodes += [
                node("MatMul", ["x", f"w_{p}"], [f"{p}_proj"]),
                node("Reshape", [f"{p}_proj", "heads_shape" if p == "q" else "kv_shape"], [f"{p}_split"]),
                node("Transpose", [f"{p}_split"], [p], perm=[0, 2, 1, 3]),
            ]
        if kv_heads:  # transformers' repeat_kv: Unsqueeze, Expand, Reshape
            inits.append(numpy_helper.from_array(np.array([2], np.int64), "axis2"))
            inits.append(numpy_helper.from_array(np.array([batch, kv, heads // kv, seq, head_dim], np.int64), "repeat"))
            inits.append(numpy_helper.from_array(np.array([batch, heads, seq, head_dim], np.int64), "merged"))
            for p in ("k", "v"):
                nodes += [
                    node("Unsqueeze", [p, "axis2"], [f"{p}_u"]),
                    node("Expand", [f"{p}_u", "repeat"], [f"{p}_e"]),
                    node("Reshape", [f"{p}_e", "merged"], [f"{p}_r"]),
                ]
        out_shape = [batch, seq, hidden]
    else:
        lead = [batch * heads] if form == "flat" else [batch, heads]
        kv_lead = [batch, kv_heads] if kv_heads else lead
        inputs = [helper.make_tensor_value_info("q", elem, lead + [seq, head_dim])]
        inputs += [helper.make_tensor_value_info(p, elem, kv_lead + [kv_seq, head_dim]) for p in ("k", "v")]
        out_shape = lead + [seq, head_dim]
        if kv_heads:  # GQA as transformers' repeat_kv writes it: Unsqueeze, Expand, Reshape
            group = heads // kv_heads
            inits.append(numpy_helper.from_array(np.array([2], np.int64), "axis2"))
            inits.append(numpy_helper.from_array(np.array([batch, kv_heads, group, kv_seq, head_dim], np.int64), "repeat"))
            inits.append(numpy_helper.from_array(np.array([batch, heads, kv_seq, head_dim], np.int64), "merged"))
            for p in ("k", "v"):
                nodes += [
                    node("Unsqueeze", [p, "axis2"], [f"{p}_u"]),
                    node("Expand", [f"{p}_u", "repeat"], [f"{p}_e"]),
                    node("Reshape", [f"{p}_e", "merged"], [f"{p}_r"]),
                ]
    k_name, v_name = ("k_r", "v_r") if kv_heads and form in ("heads", "flat", "layer") else ("k", "v")
    rank = 3 if form == "flat" else 4
    if scale == "sqrt-qk" and rank == 4:  # torchlib's K^T: through [b*h, s, d], transposed there, reshaped back
        inits.append(numpy_helper.from_array(np.array([-1, kv_seq, head_dim], np.int64), "k_flat_shape"))
        inits.append(numpy_helper.from_array(np.array([batch, kv_heads if kv_heads and form == "heads" and k_name == "k" else heads,
                                                       head_dim, kv_seq], np.int64), "kt_shape"))
        nodes += [node("Reshape", [k_name, "k_flat_shape"], ["k_flat"]), node("Transpose", ["k_flat"], ["kt_flat"], perm=[0, 2, 1]),
                  node("Reshape", ["kt_flat", "kt_shape"], ["kt"])]
    else:
        nodes.append(node("Transpose", [k_name], ["kt"], perm=list(range(rank - 2)) + [rank - 1, rank - 2]))
    if scale == "sqrt-qk":  # torch's SDPA as dynamo exports it: Q and K^T each scaled by d^-1/4, the scores not
        nodes += [node("Mul", ["q", "scale"], ["q_scaled"]), node("Mul", ["kt", "scale"], ["kt_scaled"]),
                  node("MatMul", ["q_scaled", "kt_scaled"], ["scores"])]
    else:
        nodes.append(node("MatMul", ["q", "kt"], ["qk"]))
        nodes.append(node("Div" if scale == "div" else "Mul", ["qk", "scale"], ["scores"]))
    scores = "scores"
    if mask == "causal-where":  # GPT-2's eager attention: torch.where(causal, scores, lowest)
        inits.append(numpy_helper.from_array(np.tril(np.ones((seq, kv_seq), bool)), "keep"))
        inits.append(const("lowest", np.finfo(dtype).min))
        nodes.append(node("Where", ["keep", "scores", "lowest"], ["masked"]))
        scores = "masked"
    elif mask in ("where-add", "where-add-causal"):  # the dynamo exporter's SDPA mask
        keep = np.ones((seq, kv_seq), bool) if mask == "where-add" else np.tril(np.ones((seq, kv_seq), bool))
        inits.append(numpy_helper.from_array(keep.reshape(1, 1, seq, kv_seq), "keep"))
        inits.append(const("zeros", 0.0))
        inits.append(const("lowest", np.finfo(dtype).min))
        nodes.append(node("Where", ["keep", "zeros", "lowest"], ["additive"]))
        nodes.append(node("Add", ["scores", "additive"], ["masked"]))
        scores = "masked"
    elif mask.startswith("keypad"):
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, kv_seq]))
        query = mask == "keypad-query"
        inits.append(numpy_helper.from_array(np.array([batch, 1, seq, 1] if query else [batch, 1, 1, kv_seq], np.int64), "mask_shape"))
        inits.append(const("zeros", 0.0))
        inits.append(const("lowest", -np.inf if mask == "keypad-inf" else np.finfo(dtype).min))
        if mask == "keypad-additive":
            inits.append(const("one", 1.0))
            nodes += [node("Cast", ["attention_mask"], ["mask_f"], to=elem), node("Reshape", ["mask_f", "mask_shape"], ["mask_4d"]),
                      node("Sub", ["one", "mask_4d"], ["inverted"]), node("Mul", ["inverted", "lowest"], ["additive"])]
        else:
            nodes.append(node("Cast", ["attention_mask"], ["mask_b"], to=TensorProto.BOOL))
            if mask.endswith("-gather"):
                inits.append(numpy_helper.from_array(np.array([batch * kv_seq], np.int64), "flat_shape"))
                inits.append(numpy_helper.from_array(np.arange(batch * kv_seq, dtype=np.int64).reshape(batch, kv_seq), "positions"))
                nodes += [node("Reshape", ["mask_b", "flat_shape"], ["mask_flat"]), node("Gather", ["mask_flat", "positions"], ["mask_g"])]
            nodes.append(node("Reshape", ["mask_g" if mask.endswith("-gather") else "mask_b", "mask_shape"], ["keep"]))
            if mask in ("keypad-causal", "keypad-causal-gather"):
                inits.append(numpy_helper.from_array(np.tril(np.ones((seq, kv_seq), bool)).reshape(1, 1, seq, kv_seq), "causal"))
                nodes.append(node("And", ["causal", "keep"], ["keep_causal"]))
            if mask in ARANGE:  # positions compared, as transformers' torchscript exports leave them
                inits.append(numpy_helper.from_array(np.arange(seq, dtype=np.int64).reshape(1, 1, seq, 1), "q_pos"))
                inits.append(numpy_helper.from_array(np.arange(kv_seq, dtype=np.int64).reshape(1, 1, 1, kv_seq), "k_pos"))
                inits.append(numpy_helper.from_array(np.array(0, np.int64), "zero_pos"))
                compare = (node("LessOrEqual", ["k_pos", "q_pos"], ["positions_keep"]) if mask == "keypad-arange-causal-gather"
                           else node("GreaterOrEqual", ["q_pos", "zero_pos"], ["positions_keep"]))
                nodes += [compare, node("And", ["positions_keep", "keep"], ["keep_causal"])]
            keep = "keep_causal" if mask in ("keypad-causal", "keypad-causal-gather", *ARANGE) else "keep"
            if mask in ("keypad-where", "keypad-where-gather"):
                nodes.append(node("Where", [keep, "scores", "lowest"], ["masked"]))
            else:
                nodes.append(node("Where", [keep, "zeros", "lowest"], ["additive"]))
        if mask not in ("keypad-where", "keypad-where-gather"):
            nodes.append(node("Add", ["scores", "additive"], ["masked"]))
        scores = "masked"
    elif mask != "none":
        lowest = np.finfo(dtype).min
        values = {
            "zero": np.zeros((seq, kv_seq)),
            "causal": np.where(np.tril(np.ones((seq, kv_seq), bool)), 0, lowest),
            "arbitrary": rng.standard_normal((seq, kv_seq)),
        }[mask]
        inits.append(const("mask", values))
        nodes.append(node("Add", ["scores", "mask"], ["masked"]))
        scores = "masked"
    nodes.append(node("Softmax", [scores], ["probs"], axis=-1))
    if nan_guard:  # torch's SDPA as dynamo exports it: a row whose every score is -inf gives 0, not NaN
        inits.append(const("zero_p", 0.0))
        nodes += [node("IsNaN", ["probs"], ["probs_nan"]), node("Where", ["probs_nan", "zero_p", "probs"], ["probs_guarded"])]
    nodes.append(node("MatMul", ["probs_guarded" if nan_guard else "probs", v_name], ["attn"]))
    if form in ("layer", "split"):
        nodes.append(node("Transpose", ["attn"], ["attn_t"], perm=[0, 2, 1, 3]))
        nodes.append(node("Reshape", ["attn_t", "out_shape"], ["y"]))
    else:
        nodes.append(node("Identity", ["attn"], ["y"]))
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("y", elem, out_shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kitdispatch test")
    onnx.checker.check_model(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--kv-seq", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--f16", action="store_true")
    p.add_argument("--mask", choices=["none", "zero", "causal", "causal-where", "where-add", "where-add-causal", "arbitrary", *KEYPAD],
                   default="none")
    p.add_argument("--scale", choices=["div", "mul", "wrong", "sqrt-qk"], default="div")
    p.add_argument("--nan-guard", action="store_true", help="Where(IsNaN(p), 0, p) after the softmax (SDPA, dynamo)")
    p.add_argument("--form", choices=["heads", "flat", "layer", "split"], default="heads")
    p.add_argument("--kv-heads", type=int, default=None, help="fewer K/V heads, repeated (GQA; --form heads or layer)")
    args = p.parse_args()
    model = make_model(args.batch, args.heads, args.seq, args.head_dim, f16=args.f16, mask=args.mask, scale=args.scale,
                       kv_seq=args.kv_seq, form=args.form, kv_heads=args.kv_heads, nan_guard=args.nan_guard)
    onnx.save(model, args.out)


if __name__ == "__main__":
    main()
