"""Writes a Llama-style decoder MLP block as ONNX: RMSNorm spelled out in ONNX ops
(Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul by a weight), then SwiGLU
(MatMul gate, MatMul up, Sigmoid(gate) * gate * up, MatMul down), no biases, a residual Add.

    python tests/data/llama_layer/make_model.py OUT.onnx [--rows 64 --hidden 128 --ffn 256] [--f16]

Exporters write Llama this way; building it with `kernels/elementwise` once ended in an
internal error (an IndexError in replace.py) instead of a report.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(rows: int = 64, hidden: int = 128, ffn: int = 256, *, f16: bool = False, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    dtype = np.float16 if f16 else np.float32
    elem = TensorProto.FLOAT16 if f16 else TensorProto.FLOAT

    def const(name: str, value) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, dtype), name)

    def weight(name: str, shape) -> onnx.TensorProto:
        return const(name, rng.standard_normal(shape) / np.sqrt(shape[0]))

    initializers = [
        const("two", 2.0), const("eps", 1e-6), const("norm_w", rng.standard_normal(hidden)),
        weight("w_gate", (hidden, ffn)), weight("w_up", (hidden, ffn)), weight("w_down", (ffn, hidden)),
        numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
    ]
    node = helper.make_node
    nodes = [
        # RMSNorm: x / sqrt(mean(x^2) + eps) * w
        node("Pow", ["x", "two"], ["sq"]),
        node("ReduceMean", ["sq", "last_axis"], ["ms"], keepdims=1),
        node("Add", ["ms", "eps"], ["ms_eps"]),
        node("Sqrt", ["ms_eps"], ["rms"]),
        node("Reciprocal", ["rms"], ["inv_rms"]),
        node("Mul", ["x", "inv_rms"], ["normed"]),
        node("Mul", ["normed", "norm_w"], ["h"]),
        # SwiGLU: down(silu(gate(h)) * up(h))
        node("MatMul", ["h", "w_gate"], ["gate"]),
        node("MatMul", ["h", "w_up"], ["up"]),
        node("Sigmoid", ["gate"], ["sig"]),
        node("Mul", ["gate", "sig"], ["silu"]),
        node("Mul", ["silu", "up"], ["act"]),
        node("MatMul", ["act", "w_down"], ["down"]),
        node("Add", ["x", "down"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "llama_mlp_block",
        [helper.make_tensor_value_info("x", elem, [rows, hidden])],
        [helper.make_tensor_value_info("y", elem, [rows, hidden])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="kitdispatch test")
    onnx.checker.check_model(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--f16", action="store_true")
    args = p.parse_args()
    onnx.save(make_model(args.rows, args.hidden, args.ffn, f16=args.f16), args.out)


if __name__ == "__main__":
    main()
