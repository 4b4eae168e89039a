"""Writes model.onnx: logits = x @ W, probs = Softmax(logits, axis=-1), with W a fixed initializer.

    python samples/onnx_softmax/make_model.py [OUT.onnx] [--rows 512 --features 256 --classes 1000]

The model is made here, from a seed, so the repository holds no binary model files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).parent


def make_model(rows: int = 512, features: int = 256, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((features, classes)) / np.sqrt(features)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "weight"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        ],
        "matmul_softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, features])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [rows, classes])],
        initializer=[numpy_helper.from_array(weight, "weight")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kitdispatch sample")
    onnx.checker.check_model(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=str(HERE / "model.onnx"))
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--classes", type=int, default=1000)
    args = p.parse_args()
    onnx.save(make_model(args.rows, args.features, args.classes), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
