"""Writes GPT-2's attention block as the dynamo exporter writes it (ONNX opset 17, f16): x
[b, s, h*d] reshaped to [b*s, h*d], one Gemm with bias to [b*s, 3*h*d] (c_attn), reshaped to
[b, s, 3*h*d] and Split in three on the last axis; Q, K, V each reshaped to [b, s, h, d] and
transposed to heads (K straight to K^T [b, h, d, s]); MatMul, Mul by 1/sqrt(d), Add of
Where(causal, 0, lowest), Softmax, MatMul with V, Transpose back, Reshape to [b, s, h*d].

    python tests/data/attention_forms/make_gpt2.py OUT.onnx [--batch 2 --heads 4 --seq 128 --head-dim 64]
        [--variant packed|swapped|wide|reader|other-q]

Variants (near misses of the packed QKV read): `swapped` takes Q from the second third and K
from the first; `wide` projects to 4*h*d and splits in four (the fourth unused); `reader` also
returns K's slice as a second output; `other-q` projects Q with a Gemm of its own and K, V
with one of 2*h*d split in two.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VARIANTS = ("packed", "swapped", "wide", "reader", "other-q")


def make_model(batch: int = 2, heads: int = 4, seq: int = 128, head_dim: int = 64, *, variant: str = "packed", seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    hidden = heads * head_dim
    node = helper.make_node
    inits, nodes = [], []

    def const(name: str, value, dtype=np.float16) -> None:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))

    def projection(name: str, parts: int) -> str:
        """x [b*s, hidden] -> [b, s, parts*hidden] by Gemm with bias, split in `parts` (name_0, ...)."""
        const(f"w_{name}", rng.standard_normal((hidden, parts * hidden)) / np.sqrt(hidden))
        const(f"b_{name}", rng.standard_normal(parts * hidden) * 0.1)
        const(f"{name}_shape", [batch, seq, parts * hidden], np.int64)
        const(f"{name}_sizes", [hidden] * parts, np.int64)
        nodes.extend([
            node("Gemm", ["x_rows", f"w_{name}", f"b_{name}"], [f"{name}_rows"]),
            node("Reshape", [f"{name}_rows", f"{name}_shape"], [f"{name}_3d"]),
            node("Split", [f"{name}_3d", f"{name}_sizes"], [f"{name}_{i}" for i in range(parts)], axis=2),
        ])
        return name

    const("rows_shape", [batch * seq, hidden], np.int64)
    const("heads_shape", [batch, seq, heads, head_dim], np.int64)
    const("out_shape", [batch, seq, hidden], np.int64)
    const("scale", 1 / np.sqrt(head_dim))
    const("keep", np.tril(np.ones((seq, seq), bool))[None, None], bool)
    const("zero", 0.0)
    const("lowest", np.finfo(np.float16).min)
    nodes.append(node("Reshape", ["x", "rows_shape"], ["x_rows"]))
    if variant == "other-q":
        q_proj = projection("q", 1) + "_0"
        kv = projection("kv", 2)
        k_proj, v_proj = f"{kv}_0", f"{kv}_1"
    else:
        parts = projection("qkv", 4 if variant == "wide" else 3)
        order = (1, 0, 2) if variant == "swapped" else (0, 1, 2)
        q_proj, k_proj, v_proj = (f"{parts}_{i}" for i in order)
    for role, source, perm in (("q", q_proj, [0, 2, 1, 3]), ("k", k_proj, [0, 2, 3, 1]), ("v", v_proj, [0, 2, 1, 3])):
        nodes += [node("Reshape", [source, "heads_shape"], [f"{role}_heads"]), node("Transpose", [f"{role}_heads"], [role], perm=perm)]
    nodes += [
        node("MatMul", ["q", "k"], ["qk"]),
        node("Mul", ["qk", "scale"], ["scores"]),
        node("Where", ["keep", "zero", "lowest"], ["mask"]),
        node("Add", ["scores", "mask"], ["masked"]),
        node("Softmax", ["masked"], ["probs"], axis=-1),
        node("MatMul", ["probs", "v"], ["attn"]),
        node("Transpose", ["attn"], ["attn_t"], perm=[0, 2, 1, 3]),
        node("Reshape", ["attn_t", "out_shape"], ["y"]),
    ]
    elem = TensorProto.FLOAT16
    outputs = [helper.make_tensor_value_info("y", elem, [batch, seq, hidden])]
    if variant == "reader":  # K's slice read by something else too
        outputs.append(helper.make_tensor_value_info(k_proj, elem, [batch, seq, hidden]))
    graph = helper.make_graph(nodes, "gpt2_attention", [helper.make_tensor_value_info("x", elem, [batch, seq, hidden])], outputs,
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kitdispatch test")
    onnx.checker.check_model(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--variant", choices=VARIANTS, default="packed")
    args = p.parse_args()
    onnx.save(make_model(args.batch, args.heads, args.seq, args.head_dim, variant=args.variant), args.out)


if __name__ == "__main__":
    main()
