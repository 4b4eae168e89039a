"""Writes model.onnx: y = gelu(x @ W + b), tanh GELU spelled out in ONNX ops (W, b fixed initializers).

    python samples/onnx_bias_gelu/make_model.py [OUT.onnx] [--rows 512 --features 256 --hidden 1024] [--gelu-op]

Exporters before ONNX opset 20 write GELU as Pow, Mul, Add, Tanh, ... with sqrt(2/pi) as a
constant. IREE imports each as a linalg.generic and its elementwise fusion joins them and the
bias Add into one, which the library's fused `bias_gelu` (kernels/elementwise, which declares
`replaces = ["linalg.generic"]` with the pattern `bias_gelu.pattern.mlir`) computes. There is no
manifest here, the library's is the project:

    kitdispatch build kernels/elementwise --model model.onnx --with-baseline --arch sm_90 -o out/bias_gelu

With `--gelu-op` the model uses opset 20's `Gelu(approximate="tanh")` instead, which IREE's
importer lowers with 0.797724 for sqrt(2/pi) (0.7978846): not what the kernel computes, so the
op is kept and the report says which constant differs.

The model is made here, from a seed, so the repository holds no binary model files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).parent
GELU_CONSTANTS = {"three": 3.0, "cubic": 0.044715, "sqrt_2_over_pi": np.sqrt(2.0 / np.pi), "one": 1.0, "half": 0.5}


def gelu_tanh_nodes(y: str, out: str) -> list[onnx.NodeProto]:
    """0.5 * y * (1 + tanh(sqrt(2/pi) * (y + 0.044715 * y^3))), one ONNX op at a time."""
    node = helper.make_node
    return [
        node("Pow", [y, "three"], ["y3"]),
        node("Mul", ["y3", "cubic"], ["t0"]),
        node("Add", [y, "t0"], ["t1"]),
        node("Mul", ["t1", "sqrt_2_over_pi"], ["t2"]),
        node("Tanh", ["t2"], ["t3"]),
        node("Add", ["t3", "one"], ["t4"]),
        node("Mul", ["t4", "half"], ["t5"]),
        node("Mul", [y, "t5"], [out]),
    ]


def make_model(rows: int = 512, features: int = 256, hidden: int = 1024, *, gelu_op: bool = False, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((features, hidden)) / np.sqrt(features)).astype(np.float32)
    bias = rng.standard_normal(hidden).astype(np.float32)
    initializers = [numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(bias, "bias")]
    nodes = [helper.make_node("MatMul", ["x", "weight"], ["h"]), helper.make_node("Add", ["h", "bias"], ["z"])]
    if gelu_op:
        nodes.append(helper.make_node("Gelu", ["z"], ["y"], approximate="tanh"))
    else:
        nodes += gelu_tanh_nodes("z", "y")
        initializers += [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in GELU_CONSTANTS.items()]
    graph = helper.make_graph(
        nodes,
        "linear_gelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, hidden])],
        initializer=initializers,
    )
    opset = 20 if gelu_op else 17
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="kitdispatch sample")
    onnx.checker.check_model(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=str(HERE / "model.onnx"))
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--gelu-op", action="store_true", help="opset 20's Gelu op (IREE's importer: another constant)")
    args = p.parse_args()
    onnx.save(make_model(args.rows, args.features, args.hidden, gelu_op=args.gelu_op), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
