"""A BERT-style attention block in f16 as torch's dynamo exporter writes it (opset 18): each of
Q, K, V is `MatMul(x, W) + b`, Reshape to [b, s, h, d] and Transpose to heads ([0, 2, 1, 3]; K
straight to K^T with [0, 2, 3, 1]), then MatMul(Q, K^T), Div by sqrt(d), Softmax, MatMul with V,
Transpose back and Reshape to [b, s, h*d]. IREE adds each bias in the generic that transposes
the projection to heads (the heads epilogue: models/ops/epilogue.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script (tools/prebuild.py): tests/ holds the `models` package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from models.epilogue_models import OnnxGraph, f16_value  # noqa: E402


def heads_layer_onnx(path: Path, *, batch: int = 2, seq: int = 64, heads: int = 4, head_dim: int = 64, k_perm: str = "0231",
                     q_perm: str = "0213", q_also: bool = False, seed: int = 0) -> Path:
    """`k_perm`: K's transpose ("0231": K^T at once; "0213": to heads, then a second
    Transpose [0, 1, 3, 2]); `q_perm`: Q's ("0213", or a near miss such as "0132"); `q_also`:
    the un-transposed Q projection is a second output too (a second reader of its result)."""
    rng = np.random.default_rng(seed)
    hidden = heads * head_dim
    g = OnnxGraph(np.float16)
    node, const = g.node, g.const
    shape = const("heads_shape", [batch, seq, heads, head_dim], np.int64)

    def projection(tag: str, perm: str) -> tuple[str, str]:
        w = const(f"W{tag}", rng.standard_normal((hidden, hidden)) * hidden ** -0.5)
        b = const(f"b{tag}", rng.standard_normal((hidden,)) * 0.5)
        flat = node("Add", [node("MatMul", ["x", w]), b])
        return node("Transpose", [node("Reshape", [flat, shape], allowzero=1)], perm=[int(c) for c in perm]), flat

    q, q_flat = projection("q", q_perm)
    k, _ = projection("k", k_perm if k_perm == "0231" else "0213")
    v, _ = projection("v", "0213")
    kt = k if k_perm == "0231" else node("Transpose", [k], perm=[0, 1, 3, 2])
    scores = node("Div", [node("MatMul", [q, kt]), const("scale", np.sqrt(head_dim))])
    attn = node("MatMul", [node("Softmax", [scores], axis=-1), v])
    y = node("Reshape", [node("Transpose", [attn], perm=[0, 2, 1, 3]), const("out_shape", [batch, seq, hidden], np.int64)], allowzero=1)
    outputs = [f16_value(y, [batch, seq, hidden])] + ([f16_value(q_flat, [batch, seq, hidden])] if q_also else [])
    return g.save(path, "heads_layer", [f16_value("x", [batch, seq, hidden])], outputs, opset=18)


def projection_onnx(path: Path, *, batch: int = 2, seq: int = 128, heads: int = 4, head_dim: int = 64, perm: str = "0213",
                    also_flat: bool = False, seed: int = 0) -> Path:
    """One projection `MatMul(x, W) + b`, Reshape to [b, s, h, d], Transpose by `perm`, as the
    model's output; `also_flat`: the un-transposed sum is an output too (a second reader)."""
    rng = np.random.default_rng(seed)
    hidden = heads * head_dim
    g = OnnxGraph(np.float16)
    node, const = g.node, g.const
    w = const("W", rng.standard_normal((hidden, hidden)) * hidden ** -0.5)
    flat = node("Add", [node("MatMul", ["x", w]), const("b", rng.standard_normal((hidden,)) * 0.5)])
    split = node("Reshape", [flat, const("heads_shape", [batch, seq, heads, head_dim], np.int64)], allowzero=1)
    order = [int(c) for c in perm]
    out = node("Transpose", [split], perm=order)
    sizes = [batch, seq, heads, head_dim]
    outputs = [f16_value(out, [sizes[i] for i in order])] + ([f16_value(flat, [batch, seq, hidden])] if also_flat else [])
    return g.save(path, "projection", [f16_value("x", [batch, seq, hidden])], outputs, opset=18)


if __name__ == "__main__":  # tools/prebuild.py: python tests/models/heads_models.py OUT.onnx
    heads_layer_onnx(Path(sys.argv[1]))
