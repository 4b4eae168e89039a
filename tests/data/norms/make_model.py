"""Writes a LayerNorm or RMSNorm over the last dim of x [batch, seq, hidden] as ONNX, the way
exporters write them:

- `layernorm`: ONNX LayerNormalization (opset 17), with scale and, unless --no-bias, B;
- `decomposed`: ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul weight, Add bias
  (older exporters; --no-weight / --no-bias leave the Mul / Add out);
- `rms`: RMSNorm as Llama writes it: x.float(), Pow 2, ReduceMean, Add eps, Sqrt, Reciprocal
  (torch.rsqrt), Mul by x, cast back to the model's type, Mul weight (--no-weight: none).

    python tests/data/norms/make_model.py OUT.onnx --form rms [--f16] [--eps 1e-6] [--axis 1]
        [--mean-output] [--batch 2 --seq 16 --hidden 256]

Near misses for the tests: --axis normalizes over another dim (the reductions read it),
--mean-output makes the (first) mean an output of the model too (a user outside the norm).
--residual makes x the sum of two inputs, also an output (a residual stream).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DTYPES = {"f32": (np.float32, TensorProto.FLOAT), "f16": (np.float16, TensorProto.FLOAT16)}


def make_model(
    form: str, *, dtype: str = "f32", batch: int = 2, seq: int = 16, hidden: int = 256, eps: float = 1e-5,
    weight: bool = True, bias: bool = True, axis: int = -1, mean_output: bool = False, residual: bool = False, seed: int = 0,
) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    np_type, elem = DTYPES[dtype]
    shape = [batch, seq, hidden]
    norm_shape = shape[axis:] if axis != -1 else shape[-1:]

    def const(name: str, value, t=np_type) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, t), name)

    inits = [const("w", 1 + 0.1 * rng.standard_normal(norm_shape)), const("b", 0.1 * rng.standard_normal(norm_shape))]
    node = helper.make_node
    outputs = [helper.make_tensor_value_info("y", elem, shape)]
    if form == "layernorm":
        nodes = [node("LayerNormalization", ["x", "w", "b"] if bias else ["x", "w"], ["y"], axis=axis, epsilon=eps)]
        opset = 17
    elif form == "decomposed":
        inits += [const("two", 2.0), const("eps", eps), numpy_helper.from_array(np.array([axis], np.int64), "axes")]
        nodes = [
            node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
            node("Sub", ["x", "mean"], ["centered"]),
            node("Pow", ["centered", "two"], ["sq"]),
            node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1),
            node("Add", ["var", "eps"], ["var_eps"]),
            node("Sqrt", ["var_eps"], ["std"]),
            node("Div", ["centered", "std"], ["normed" if weight or bias else "y"]),
        ]
        last = "normed"
        if weight:
            nodes.append(node("Mul", [last, "w"], ["scaled" if bias else "y"]))
            last = "scaled"
        if bias:
            nodes.append(node("Add", [last, "b"], ["y"]))
        opset = 18
    elif form == "rms":
        wide = dtype != "f32"
        inits += [const("two", 2.0, np.float32), const("eps", eps, np.float32), numpy_helper.from_array(np.array([axis], np.int64), "axes")]
        nodes = [node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT)] if wide else []
        xf = "xf" if wide else "x"
        nodes += [
            node("Pow", [xf, "two"], ["sq"]),
            node("ReduceMean", ["sq", "axes"], ["mean"], keepdims=1),
            node("Add", ["mean", "eps"], ["mean_eps"]),
            node("Sqrt", ["mean_eps"], ["rms"]),
            node("Reciprocal", ["rms"], ["inv_rms"]),
            node("Mul", [xf, "inv_rms"], ["normed_f" if wide or weight else "y"]),
        ]
        if wide:
            nodes.append(node("Cast", ["normed_f"], ["normed" if weight else "y"], to=elem))
        if weight:
            nodes.append(node("Mul", ["normed" if wide else "normed_f", "w"], ["y"]))
        opset = 18
    else:
        raise SystemExit(f"unknown form {form!r}: layernorm, decomposed or rms")
    if mean_output:
        if form == "layernorm":
            raise SystemExit("--mean-output needs the decomposed or rms form")
        mean_type = TensorProto.FLOAT if form == "rms" else elem
        mean_shape = [d if i != (axis % 3) else 1 for i, d in enumerate(shape)]
        outputs.append(helper.make_tensor_value_info("mean", mean_type, mean_shape))
    inputs = [helper.make_tensor_value_info("x", elem, shape)]
    if residual:  # x = a + r, as a transformer's residual stream reaches its norm; the sum is an output too
        inputs = [helper.make_tensor_value_info("a", elem, shape), helper.make_tensor_value_info("r", elem, shape)]
        nodes.insert(0, node("Add", ["a", "r"], ["x"]))
        outputs.append(helper.make_tensor_value_info("x", elem, shape))
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(nodes, f"{form}_norm", inputs, outputs, initializer=[t for t in inits if t.name in used])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="kitdispatch test")
    onnx.checker.check_model(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--form", choices=("layernorm", "decomposed", "rms"), required=True)
    p.add_argument("--f16", action="store_true")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--axis", type=int, default=-1)
    p.add_argument("--no-weight", action="store_true")
    p.add_argument("--no-bias", action="store_true")
    p.add_argument("--mean-output", action="store_true")
    p.add_argument("--residual", action="store_true", help="x = a + r (two inputs), the sum an output too")
    args = p.parse_args()
    model = make_model(
        args.form, dtype="f16" if args.f16 else "f32", batch=args.batch, seq=args.seq, hidden=args.hidden, eps=args.eps,
        weight=not args.no_weight, bias=not args.no_bias, axis=args.axis, mean_output=args.mean_output, residual=args.residual,
    )
    onnx.save(model, args.out)


if __name__ == "__main__":
    main()
