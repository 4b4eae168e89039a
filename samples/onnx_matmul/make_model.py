"""Writes model.onnx: y = x @ W in half precision (ONNX MatMul, f16 in, f16 out), W a fixed initializer.

    python samples/onnx_matmul/make_model.py [OUT.onnx] [--rows 1024 --features 1024 --outputs 1024]
                                             [--batch B [--batched-weights]]

The library's tensor-core matmul (kernels/matmul, which declares `replaces = ["linalg.matmul"]`)
stands in for the model's matmul; there is no manifest here, the library's is the project:

    kitdispatch build kernels/matmul --model model.onnx --with-baseline --arch sm_90 -o out/matmul

IREE's importer accumulates an f16 MatMul in f32 (a zero-filled f32 accumulator, then a
truncation to f16), which is what `matmul_f16` computes: f16 operands, f32 accumulation from
zero; the truncation stays IREE's. With `--batch B`, x is [B, rows, features]: IREE folds the
batch into the rows, so the op is still a 2-D matmul. With `--batched-weights` too, W is
[B, features, outputs] and the op a `linalg.batch_matmul`, for which the library has no kernel.

The model is made here, from a seed, so the repository holds no binary model files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).parent


def make_model(
    rows: int = 1024, features: int = 1024, outputs: int = 1024, *, batch: int = 0, batched_weights: bool = False, seed: int = 0
) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    lead = [batch] if batch else []
    weight_shape = [*lead, features, outputs] if batched_weights else [features, outputs]
    weight = (rng.standard_normal(weight_shape) / np.sqrt(features)).astype(np.float16)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "weight"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [*lead, rows, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [*lead, rows, outputs])],
        initializer=[numpy_helper.from_array(weight, "weight")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kitdispatch sample")
    onnx.checker.check_model(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=str(HERE / "model.onnx"))
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--features", type=int, default=1024)
    p.add_argument("--outputs", type=int, default=1024)
    p.add_argument("--batch", type=int, default=0, help="x of [batch, rows, features]")
    p.add_argument("--batched-weights", action="store_true", help="W of [batch, features, outputs]: a batch_matmul")
    args = p.parse_args()
    if args.batched_weights and not args.batch:
        p.error("--batched-weights needs --batch")
    model = make_model(args.rows, args.features, args.outputs, batch=args.batch, batched_weights=args.batched_weights)
    onnx.save(model, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
