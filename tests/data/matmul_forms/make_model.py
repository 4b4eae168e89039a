"""Writes one ONNX matmul the way exporters write it (opset 17), for the matmul forms' tests:

    python tests/data/matmul_forms/make_model.py OUT.onnx FORM [--dtype f16|f32] [--m 128 --k 256 --n 384 --batch 6]

FORM (what IREE 3.13 makes of it at global optimization, tests/models/test_ops_matmul_forms.py):
  plain      MatMul x[m,k] @ W[k,n] (initializer)                -> linalg.matmul
  wt         MatMul x @ Transpose(W[n,k])                         -> linalg.matmul reading B transposed
  gemm_tb    Gemm x, W[n,k], transB=1 (torch.onnx's nn.Linear)    -> linalg.matmul reading B transposed
  linear3d   MatMul x[batch,m,k] @ Transpose(W[n,k])              -> A collapsed to [batch*m,k], matmul reading B transposed
  batch1     MatMul x[1,m,k] @ W[k,n]                             -> linalg.batch_matmul of batch 1
  bmm        MatMul x[batch,m,k] @ y[batch,k,n] (two inputs)      -> linalg.batch_matmul
  bmm4d      MatMul x[2,batch/2,m,k] @ y[2,batch/2,k,n]           -> linalg.batch_matmul over the folded batch
  bcast      MatMul x[batch,m,k] @ y[1,k,n] (B broadcast)         -> A collapsed to [batch*m,k], linalg.matmul
  qkt        MatMul q[2,batch/2,m,k] @ Transpose(kk[2,batch/2,n,k]) (attention's Q K^T)
                                                                  -> a transpose generic, collapsed, into linalg.batch_matmul
The f16/bf16 products come out of IREE as an f32-result matmul followed by a truncf.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FORMS = ("plain", "wt", "gemm_tb", "linear3d", "batch1", "bmm", "bmm4d", "bcast", "qkt")
ELEMENT = {"f16": TensorProto.FLOAT16, "f32": TensorProto.FLOAT}
NUMPY = {"f16": np.float16, "f32": np.float32}


def make_model(form: str, dtype: str = "f16", m: int = 128, k: int = 256, n: int = 384, batch: int = 6, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    elem = ELEMENT[dtype]

    def weight(name: str, shape) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(k)).astype(NUMPY[dtype]), name)

    def io(name: str, shape) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, list(shape))

    node, inits = helper.make_node, []
    transposed = [node("Transpose", ["W"], ["Wt"], perm=[1, 0]), node("MatMul", ["x", "Wt"], ["y"])]
    if form == "plain":
        nodes, inputs, out, inits = [node("MatMul", ["x", "W"], ["y"])], [io("x", (m, k))], (m, n), [weight("W", (k, n))]
    elif form == "wt":
        nodes, inputs, out, inits = transposed, [io("x", (m, k))], (m, n), [weight("W", (n, k))]
    elif form == "gemm_tb":
        nodes, inputs, out, inits = [node("Gemm", ["x", "W"], ["y"], transB=1)], [io("x", (m, k))], (m, n), [weight("W", (n, k))]
    elif form == "linear3d":
        nodes, inputs, out, inits = transposed, [io("x", (batch, m, k))], (batch, m, n), [weight("W", (n, k))]
    elif form == "batch1":
        nodes, inputs, out, inits = [node("MatMul", ["x", "W"], ["y"])], [io("x", (1, m, k))], (1, m, n), [weight("W", (k, n))]
    elif form == "bmm":
        nodes, inputs, out = [node("MatMul", ["x", "b"], ["y"])], [io("x", (batch, m, k)), io("b", (batch, k, n))], (batch, m, n)
    elif form == "bmm4d":
        lead = (2, batch // 2)
        nodes, inputs, out = [node("MatMul", ["x", "b"], ["y"])], [io("x", (*lead, m, k)), io("b", (*lead, k, n))], (*lead, m, n)
    elif form == "bcast":
        nodes, inputs, out = [node("MatMul", ["x", "b"], ["y"])], [io("x", (batch, m, k)), io("b", (1, k, n))], (batch, m, n)
    elif form == "qkt":
        lead = (2, batch // 2)
        nodes = [node("Transpose", ["kk"], ["kt"], perm=[0, 1, 3, 2]), node("MatMul", ["x", "kt"], ["y"])]
        inputs, out = [io("x", (*lead, m, k)), io("kk", (*lead, n, k))], (*lead, m, n)
    else:
        raise SystemExit(f"unknown form {form!r}; one of {', '.join(FORMS)}")
    graph = helper.make_graph(nodes, f"matmul_{form}", inputs, [io("y", out)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("form", choices=FORMS)
    p.add_argument("--dtype", default="f16", choices=sorted(ELEMENT))
    for size, default in (("m", 128), ("k", 256), ("n", 384), ("batch", 6)):
        p.add_argument(f"--{size}", type=int, default=default)
    a = p.parse_args()
    onnx.save(make_model(a.form, a.dtype, a.m, a.k, a.n, a.batch), a.out)


if __name__ == "__main__":
    main()
