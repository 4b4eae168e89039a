"""Writes a GQA attention layer of dynamic batch B (ONNX opset 17, f16): Q [B, h, s, d] projected
from x [B, s, h*d], K and V with g heads repeated as transformers' repeat_kv does (Unsqueeze,
Expand, Reshape), a causal mask, Softmax, MatMul with V.

    python tests/data/attention_forms/make_gqa_dynamic.py OUT.onnx [--half-batch-k]

`--half-batch-k` projects K from x[:B/2] and repeats each of its g heads 2h/g times, reshaped
with -1 back to [B, h, s, d]: query head hh of batch bq then reads K batch (bq*h + hh) // (2h),
not bq (a model the GQA kernels do not compute; with a dynamic batch only Q's head count ties the
broadcast's repeat to h / g)."""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(half_batch_k: bool, h: int = 4, g: int = 2, s: int = 128, d: int = 64) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    hidden, node = h * d, helper.make_node
    inits, nodes = [], []

    def i64(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.array(value, np.int64), name))
        return name

    def f16(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float16), name))
        return name

    def project(p: str, heads: int, source: str) -> None:
        f16(f"w_{p}", rng.standard_normal((hidden, heads * d)) / np.sqrt(hidden))
        nodes.extend([node("MatMul", [source, f"w_{p}"], [f"{p}_proj"]),
                      node("Reshape", [f"{p}_proj", i64(f"{p}_heads", [0, s, heads, d])], [f"{p}_split"]),
                      node("Transpose", [f"{p}_split"], [p], perm=[0, 2, 1, 3])])

    def repeat(p: str, times: int, lead: int) -> None:
        nodes.extend([node("Unsqueeze", [p, i64(f"{p}_axis", [2])], [f"{p}_u"]),
                      node("Expand", [f"{p}_u", i64(f"{p}_rep", [1, g, times, s, d])], [f"{p}_e"]),
                      node("Reshape", [f"{p}_e", i64(f"{p}_merged", [lead, h, s, d])], [f"{p}_r"])])

    f16("scale", np.sqrt(d))
    project("q", h, "x")
    k_source = "x"
    if half_batch_k:
        nodes.extend([node("Shape", ["x"], ["x_shape"]), node("Gather", ["x_shape", i64("zero", 0)], ["batch"], axis=0),
                      node("Div", ["batch", i64("two", 2)], ["half"]), node("Unsqueeze", ["half", i64("axis0", [0])], ["half1"]),
                      node("Slice", ["x", i64("start", [0]), "half1", i64("axes", [0])], ["x_half"])])
        k_source = "x_half"
    project("k", g, k_source)
    repeat("k", 2 * h // g if half_batch_k else h // g, -1 if half_batch_k else 0)
    project("v", g, "x")
    repeat("v", h // g, 0)
    inits.append(numpy_helper.from_array(np.tril(np.ones((s, s), bool)).reshape(1, 1, s, s), "keep"))
    f16("zeros", 0.0)
    f16("lowest", np.finfo(np.float16).min)
    nodes.extend([
        node("Transpose", ["k_r"], ["kt"], perm=[0, 1, 3, 2]), node("MatMul", ["q", "kt"], ["qk"]), node("Div", ["qk", "scale"], ["scores"]),
        node("Where", ["keep", "zeros", "lowest"], ["mask"]), node("Add", ["scores", "mask"], ["masked"]),
        node("Softmax", ["masked"], ["probs"], axis=-1), node("MatMul", ["probs", "v_r"], ["attn"]),
        node("Transpose", ["attn"], ["attn_t"], perm=[0, 2, 1, 3]), node("Reshape", ["attn_t", i64("out", [0, s, hidden])], ["y"]),
    ])
    elem = TensorProto.FLOAT16
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", elem, ["B", s, hidden])],
                              [helper.make_tensor_value_info("y", elem, ["B", s, hidden])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--half-batch-k", action="store_true")
    args = p.parse_args()
    onnx.save(make_model(args.half_batch_k), args.out)


if __name__ == "__main__":
    main()
