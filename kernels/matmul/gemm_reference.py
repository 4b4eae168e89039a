"""numpy references of the tensor-core matmuls: exact products (float64), the epilogue in float64,
rounded once to the result type.

The six original functions are written out; the generated family (gen_manifest.py: matmul_nn_*,
matmul_nt_*, bmm_*, matmul_*_f32*) is served by the module's __getattr__, which reads the name.
Self-contained (kitdispatch copies this file next to the built module)."""

import math
import re

import numpy as np

from ml_dtypes import bfloat16  # what the kit's runtime uses for bf16 arrays


def _matmul(a, b, out=np.float32):
    # float64 stands in for the exact sum; the kernel accumulates in f32 on the tensor cores.
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32).astype(out)


def matmul_f16(a, b):
    return _matmul(a, b)


def matmul_bf16(a, b):
    return _matmul(a, b)


def matmul_f16_f16(a, b):
    return _matmul(a, b, np.float16)


def matmul_bf16_bf16(a, b):
    return _matmul(a, b, bfloat16)


def matmul_f16_bf16(a, b):
    return _matmul(a, b, bfloat16)


def matmul_bf16_f16(a, b):
    return _matmul(a, b, np.float16)


# ------------------------------------------------------------------ the generated family

_EPILOGUES = ("bias_heads_t", "bias_heads", "bias_gelu_erf", "bias_gelu_tanh", "bias_residual", "bias_relu", "bias_silu", "residual", "scale", "bias",
              "none", "gelu_erf", "gelu_tanh", "silu_mul")
_NAME = re.compile(
    r"^(?P<kind>matmul|bmm)_(?P<layout>nn|nt)_(?P<ti>f16|bf16|f32)(?P<to>_f32|_tf32)?_(?P<epi>"
    + "|".join(_EPILOGUES)
    + r")(?P<cfg>_t(?:128|64)x\d+(?:_k\d|_p)?)?$"
)
_OUT = {"f16": np.float16, "bf16": bfloat16, "f32": np.float32}


def _epilogue(v, epi, bias=None, residual=None, scalar=None):
    """The kernel's formula (README.md) in float64."""
    if epi == "scale":
        return np.float64(np.float32(scalar)) * v
    if epi == "silu_mul":  # residual: the `up` tensor
        return v / (1.0 + np.exp(-v)) * residual.astype(np.float64)
    if epi.startswith("bias"):
        v = v + bias.astype(np.float64)
    if epi in ("bias_gelu_erf", "gelu_erf"):
        erf = np.vectorize(math.erf, otypes=[np.float64])
        v = 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))
    elif epi in ("bias_gelu_tanh", "gelu_tanh"):
        c = np.float64(np.float32(scalar))
        v = 0.5 * v * (1.0 + np.tanh(c * (v + 0.044715 * v**3)))
    elif epi == "bias_relu":
        v = np.where(v < 0, 0.0, v)
    elif epi == "bias_silu":
        v = v / (1.0 + np.exp(-v))
    if epi.endswith("residual"):
        v = v + residual.astype(np.float64)
    return v


def _generated(name):
    m = _NAME.match(name)
    if m is None:
        return None
    layout, ti, epi = m["layout"], m["ti"], m["epi"]
    out = _OUT["f32" if ti == "f32" or m["to"] == "_f32" else ti]

    def compute(a, b, bias=None, residual=None, scalar=None):
        b64 = b.astype(np.float64)
        if layout == "nt":
            b64 = np.swapaxes(b64, -1, -2)
        v = _epilogue(a.astype(np.float64) @ b64, epi, bias, residual, scalar)
        return v.astype(np.float32).astype(out)

    # One Python parameter per argument of the generated function (tensors in, then f32 scalars).
    if epi in ("bias_heads", "bias_heads_t"):
        def ref(a, b, bias, nb, seq):  # C [m, n] with m = nb * seq, n = heads * d, in the heads layout
            heads, d = bias.shape
            c = compute(a, b, bias=bias.reshape(-1)).reshape(nb, seq, heads, d)
            return np.ascontiguousarray(c.transpose(0, 2, 1, 3) if epi == "bias_heads" else c.transpose(0, 2, 3, 1))
    elif epi == "none":
        def ref(a, b):
            return compute(a, b)
    elif epi == "scale":
        def ref(a, b, alpha):
            return compute(a, b, scalar=alpha)
    elif epi == "bias_gelu_tanh":
        def ref(a, b, bias, gelu_c):
            return compute(a, b, bias=bias, scalar=gelu_c)
    elif epi == "residual":
        def ref(a, b, residual):
            return compute(a, b, residual=residual)
    elif epi == "silu_mul":
        def ref(a, b, up):
            return compute(a, b, residual=up)
    elif epi == "gelu_erf":
        def ref(a, b):
            return compute(a, b)
    elif epi == "gelu_tanh":
        def ref(a, b, gelu_c):
            return compute(a, b, scalar=gelu_c)
    elif epi == "bias_residual":
        def ref(a, b, bias, residual):
            return compute(a, b, bias=bias, residual=residual)
    else:
        def ref(a, b, bias):
            return compute(a, b, bias=bias)
    ref.__name__ = name
    return ref


def __getattr__(name):
    ref = _generated(name)
    if ref is None:
        raise AttributeError(name)
    return ref
