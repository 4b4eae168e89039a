"""ONNX models of a matmul and its epilogue, written as exporters write them (opset 17-20), and
what IREE makes of them at the stage the kit matches ops (global optimization, then IREE's
elementwise fusion, as pipeline.py runs them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

M, K, N = 64, 128, 256


class OnnxGraph:
    """The nodes and initializers of a model being written. An added node's one output is named
    t<its index in `nodes`>; a constant's type is `dtype` unless given."""

    def __init__(self, dtype: type = np.float32) -> None:
        self.nodes: list = []
        self.inits: list = []
        self.dtype = dtype

    def node(self, op: str, ins: list[str], **attrs) -> str:
        from onnx import helper

        out = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def const(self, name: str, value, dtype: type | None = None) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype or self.dtype), name))
        return name

    def save(self, path: Path, name: str, inputs: list, outputs: list, *, opset: int) -> Path:
        return save_model(path, name, self.nodes, inputs, outputs, self.inits, opset=opset)


def save_model(path: Path, name: str, nodes: list, inputs: list, outputs: list, inits: list, *, opset: int) -> Path:
    """The graph as a checked model of `opset` (IR version 9, as the exporters write) at `path`."""
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def f16_value(name: str, shape: list[int]):
    """An f16 graph input or output."""
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT16, shape)


def epilogue_onnx(path: Path, kind: str, dtype: str = "f32", *, m: int = M, k: int = K, n: int = N, seed: int = 0) -> Path:
    """`x [m, k] @ W [k, n] + B [n]` then `kind`'s ops, in `dtype` (f16: f16 tensors, as an f16
    export; "f16cast": f16 MatMul, its result Cast to f32 for the epilogue, Cast back)."""
    from onnx import TensorProto, helper, numpy_helper

    half = dtype in ("f16", "f16cast")
    np_t, et = (np.float16, TensorProto.FLOAT16) if half else (np.float32, TensorProto.FLOAT)
    rng = np.random.default_rng(seed)
    g = OnnxGraph(np.float32 if dtype == "f16cast" else np_t)  # constants in the epilogue's own type
    node, const = g.node, g.const

    g.inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np_t), "W")]
    inputs = [helper.make_tensor_value_info("x", et, [m, k])]
    g.nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"])]
    if kind == "batch1_bias_residual":  # torch's batch-1 Linear: x [1, m, k] -> a batch_matmul of batch 1
        inputs = [helper.make_tensor_value_info("x", et, [1, m, k]), helper.make_tensor_value_info("r", et, [1, m, n])]
        kind = "batch1"
    if kind == "bmm_scale":  # attention's Q K^T / sqrt(d): two activations [4, m, k] x [4, k, n]
        g.inits, kind = [], "scale_div"
        inputs = [helper.make_tensor_value_info("q", et, [4, m, k]), helper.make_tensor_value_info("kt", et, [4, k, n])]
        g.nodes = [helper.make_node("MatMul", ["q", "kt"], ["mm"])]
    y = "mm"
    if dtype == "f16cast":
        g.nodes.append(helper.make_node("Cast", ["mm"], ["mm32"], to=TensorProto.FLOAT))
        y = "mm32"

    def bias(v: str, bias_shape=(n,)) -> str:
        return node("Add", [v, const("B", rng.standard_normal(bias_shape))])

    if kind == "gemm":  # ONNX Gemm (transB = 0): the matmul and its bias in one node
        g.nodes = [helper.make_node("Gemm", ["x", "W", const("B", rng.standard_normal((n,)), np_t)], ["g"])]
        y = "g"
    elif kind == "none":
        pass
    elif kind == "bias":
        y = bias(y)
    elif kind == "bias_first":  # Add(B, mm): the bias as the first operand
        y = node("Add", [const("B", rng.standard_normal((n,))), y])
    elif kind == "gelu":  # opset 20's Gelu node
        y = node("Gelu", [bias(y)])
    elif kind == "gelu_tanh":
        y = node("Gelu", [bias(y)], approximate="tanh")
    elif kind == "gelu_erf_decomposed":  # x * 0.5 * (1 + erf(x / sqrt 2)), torch's opset-17 export
        x = bias(y)
        e = node("Erf", [node("Div", [x, const("s2", 1.4142135623730951)])])
        y = node("Mul", [node("Mul", [x, const("half", 0.5)]), node("Add", [e, const("one", 1.0)])])
    elif kind == "gelu_tanh_decomposed":  # x * ((1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) * 0.5), pre-opset-20 exports
        x = bias(y)
        cube = node("Pow", [x, const("three", 3.0)])
        inner = node("Add", [x, node("Mul", [cube, const("c1", 0.044715)])])
        t = node("Tanh", [node("Mul", [inner, const("c0", 0.7978845608028654)])])
        y = node("Mul", [x, node("Mul", [node("Add", [t, const("one", 1.0)]), const("half", 0.5)])])
    elif kind == "gelu_nobias":  # opset 20's Gelu on the product itself (a zero bias folded away)
        y = node("Gelu", [y])
    elif kind == "gelu_tanh_nobias":
        y = node("Gelu", [y], approximate="tanh")
    elif kind == "relu":
        y = node("Relu", [bias(y)])
    elif kind == "silu":  # x * Sigmoid(x), as torch exports SiLU
        x = bias(y)
        y = node("Mul", [x, node("Sigmoid", [x])])
    elif kind == "residual":
        inputs.append(helper.make_tensor_value_info("r", et, [m, n]))
        y = node("Add", [y, "r"])
    elif kind == "batch1":
        y = node("Add", [bias(y), "r"])
    elif kind == "bias_residual":
        inputs.append(helper.make_tensor_value_info("r", et, [m, n]))
        y = node("Add", [bias(y), "r"])
    elif kind == "scale":
        y = node("Mul", [y, const("alpha", 0.125)])
    elif kind == "scale_div":  # Q K^T / sqrt(d)
        y = node("Div", [y, const("d", 8.0)])
    elif kind == "bias_2d":  # a bias [1, n], as some exporters keep it
        y = bias(y, (1, n))
    elif kind == "bias_column":  # a bias [m, 1]: broadcast along the columns, not one per column
        y = bias(y, (m, 1))
    elif kind == "gelu_times_input":  # an extra op after GELU: a product with another input
        inputs.append(helper.make_tensor_value_info("g", et, [m, n]))
        y = node("Mul", [node("Gelu", [bias(y)]), "g"])
    elif kind == "relu_then_sin":
        y = node("Sin", [node("Relu", [bias(y)])])
    else:
        raise ValueError(kind)
    if dtype == "f16cast":
        y = node("Cast", [y], to=TensorProto.FLOAT16)
    out_shape = [d.dim_value for d in inputs[0].type.tensor_type.shape.dim][:-2] + [m, n]  # A's batch dims, if any
    return g.save(path, "layer", inputs, [helper.make_tensor_value_info(y, et, out_shape)], opset=20)


def at_matching_stage(model: Path, tmp: Path) -> str:
    """The model as the kit reads it: imported, global optimization, IREE's elementwise fusion."""
    from kitdispatch.iree.tools import find_tool
    from kitdispatch.models.ops.generic import FUSION_PIPELINE
    from kitdispatch.models.pipeline import STAGE

    imported, staged, fused = (tmp / f"{model.stem}.{s}.mlir" for s in ("imported", "staged", "fused"))
    steps = [
        [sys.executable, "-m", "iree.compiler.tools.import_onnx", str(model), "-o", str(imported)],
        [find_tool("iree-compile"), str(imported), "--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80",
         f"--compile-to={STAGE}", "-o", str(staged)],
        [find_tool("iree-opt"), str(staged), f"--pass-pipeline={FUSION_PIPELINE}", "-o", str(fused)],
    ]
    for argv in steps:
        subprocess.run(argv, check=True, capture_output=True, timeout=300)
    return fused.read_text()


def ffn_onnx(path: Path, *, m: int = M, hidden: int = K, inner: int = N, activation: str = "Gelu", seed: int = 0) -> Path:
    """A transformer FFN in f16 as exporters write it: `x + (act(x @ W1 + b1) @ W2 + b2)`."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weight(name: str, shape: tuple, scale: float = 1.0):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float16), name)

    inits = [weight("W1", (hidden, inner), hidden ** -0.5), weight("B1", (inner,), 0.5), weight("W2", (inner, hidden), inner ** -0.5),
             weight("B2", (hidden,), 0.5)]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "B1"], ["h1"]),
        helper.make_node(activation, ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W2"], ["y0"]),
        helper.make_node("Add", ["y0", "B2"], ["y1"]),
        helper.make_node("Add", ["y1", "x"], ["y"]),
    ]
    return save_model(path, "ffn", nodes, [f16_value("x", [m, hidden])], [f16_value("y", [m, hidden])], inits, opset=20)


def mlp_onnx(path: Path, *, m: int = M, width: int = K, seed: int = 0) -> Path:
    """An f16 MLP of three layers as exporters write them: `Relu(x W1 + b1)`, then SiLU as
    `h * Sigmoid(h)` of `h = . W2 + b2`, then `(. W3) * 0.125`."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((width, width)) * width ** -0.5).astype(np.float16), f"W{i}") for i in (1, 2, 3)]
    inits += [numpy_helper.from_array(rng.standard_normal((width,)).astype(np.float16), f"B{i}") for i in (1, 2)]
    inits.append(numpy_helper.from_array(np.array(0.125, np.float16), "alpha"))
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["a0"]), helper.make_node("Add", ["a0", "B1"], ["a1"]), helper.make_node("Relu", ["a1"], ["a"]),
        helper.make_node("MatMul", ["a", "W2"], ["b0"]), helper.make_node("Add", ["b0", "B2"], ["b1"]),
        helper.make_node("Sigmoid", ["b1"], ["b2"]), helper.make_node("Mul", ["b1", "b2"], ["b"]),
        helper.make_node("MatMul", ["b", "W3"], ["c0"]), helper.make_node("Mul", ["c0", "alpha"], ["y"]),
    ]
    return save_model(path, "mlp", nodes, [f16_value("x", [m, width])], [f16_value("y", [m, width])], inits, opset=20)


def swiglu_onnx(path: Path, *, m: int = M, hidden: int = K, inner: int = N, up_first: bool = False, seed: int = 0) -> Path:
    """Llama's MLP in f16 as the dynamo exporter writes it: `(g * Sigmoid(g)) * u @ Wd` with
    g = x Wg, u = x Wu; `up_first` writes the up projection's MatMul node before the gate's."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * shape[0] ** -0.5).astype(np.float16), name)
             for name, shape in (("Wg", (hidden, inner)), ("Wu", (hidden, inner)), ("Wd", (inner, hidden)))]
    gate, up = helper.make_node("MatMul", ["x", "Wg"], ["g"]), helper.make_node("MatMul", ["x", "Wu"], ["u"])
    nodes = [up, gate] if up_first else [gate, up]
    nodes += [helper.make_node("Sigmoid", ["g"], ["sg"]), helper.make_node("Mul", ["g", "sg"], ["silu"]),
              helper.make_node("Mul", ["silu", "u"], ["h"]), helper.make_node("MatMul", ["h", "Wd"], ["y"])]
    return save_model(path, "swiglu", nodes, [f16_value("x", [m, hidden])], [f16_value("y", [m, hidden])], inits, opset=18)


def post_ln_layer_onnx(path: Path, *, batch: int = 2, seq: int = 32, hidden: int = 128, heads: int = 2, inner: int = 256,
                       head_bias: str = "split", seed: int = 0) -> Path:
    """A BERT-style post-LN layer in f16 on 3-D activations x [batch, seq, hidden], as torch's
    dynamo exporter writes it (opset 18, /work/hf/x*/bert: `MatMul(x3d, W) + b`, Reshape to
    heads, Transpose; LayerNormalization; GELU spelled Div/Erf/Add/Mul/Mul):
        h = LN(x); q = Transpose(Reshape(h Wq + bq)); a = LN(h Wo + bo + h)
        y = LN(GELU(a W1 + b1) W2 + b2 + a)
    Outputs q [batch, heads, seq, hidden/heads] and y. IREE reads each `x3d @ W` as a collapse,
    a 2-D matmul and an expand_shape. `head_bias`: "split" adds bq as above (IREE adds it in
    the transposing generic after the expand); "per_head" outputs `Reshape(h Wq) + bq` with bq
    [hidden/heads] (a bias over part of n, which no kernel's bias [n] is), not transposed."""
    rng = np.random.default_rng(seed)
    d = hidden // heads
    g = OnnxGraph(np.float16)
    node, const = g.node, g.const

    def weight(name: str, shape: tuple, scale: float = 1.0) -> str:
        return const(name, rng.standard_normal(shape) * scale)

    def layer_norm(x: str, tag: str) -> str:
        ins = [x, weight(f"ln{tag}_w", (hidden,), 0.1), weight(f"ln{tag}_b", (hidden,), 0.1)]
        return node("LayerNormalization", ins, axis=-1, epsilon=1e-12, stash_type=1)

    def linear(x: str, tag: str, n_in: int, n_out: int) -> str:
        return node("Add", [node("MatMul", [x, weight(f"W{tag}", (n_in, n_out), n_in ** -0.5)]), weight(f"b{tag}", (n_out,), 0.5)])

    h = layer_norm("x", "0")
    if head_bias == "split":
        view = node("Reshape", [linear(h, "q", hidden, hidden), const("heads", [batch, seq, heads, d], np.int64)], allowzero=1)
        q, q_shape = node("Transpose", [view], perm=[0, 2, 1, 3]), [batch, heads, seq, d]
    else:
        view = node("Reshape", [node("MatMul", [h, weight("Wq", (hidden, hidden), hidden ** -0.5)]), const("heads", [batch, seq, heads, d], np.int64)], allowzero=1)
        q, q_shape = node("Add", [view, weight("bq", (d,), 0.5)]), [batch, seq, heads, d]
    a = layer_norm(node("Add", [linear(h, "o", hidden, hidden), h]), "1")
    f = linear(a, "1", hidden, inner)
    gelu = node("Mul", [f, node("Mul", [const("half", 0.5), node("Add", [node("Erf", [node("Div", [f, const("s2", 1.4142)])]), const("one", 1.0)])])])
    y = layer_norm(node("Add", [linear(gelu, "2", inner, hidden), a]), "2")
    return g.save(path, "post_ln_layer", [f16_value("x", [batch, seq, hidden])], [f16_value(q, q_shape), f16_value(y, [batch, seq, hidden])],
                  opset=18)


if __name__ == "__main__":  # tools/prebuild.py: python tests/models/epilogue_models.py OUT.onnx {ffn|mlp|post_ln|swiglu}
    {"ffn": ffn_onnx, "mlp": mlp_onnx, "post_ln": post_ln_layer_onnx, "swiglu": swiglu_onnx}[sys.argv[2]](Path(sys.argv[1]))
