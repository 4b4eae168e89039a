"""A vision transformer's patch embedding as exporters write it (HF ViT's `projection(x)
.flatten(2).transpose(1, 2)`, torch's dynamo exporter, opset 18): Conv with kernel = stride =
the patch size and a bias, Reshape to [b, f, oh*ow], Transpose to [b, oh*ow, f]; then, as ViT
does, the class token concatenated in front and the position embeddings added.

Near misses for the kind (models/ops/patch_conv.py): `stride` below the patch (overlapping
windows), `pads`, `as_image` (the conv's result is the output as it is, [b, f, oh, ow]), and an
image whose size is no multiple of the patch (the conv drops the last rows)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script (tools/prebuild.py): tests/ holds the `models` package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from models.epilogue_models import OnnxGraph  # noqa: E402


def patch_embedding_onnx(path: Path, *, dtype: str = "f16", batch: int = 2, channels: int = 3, image: int = 64, patch: int = 16,
                         filters: int = 128, bias: bool = True, stride: int | None = None, pads: int = 0, as_image: bool = False,
                         seed: int = 0) -> Path:
    from onnx import TensorProto, helper

    np_t, et = {"f16": (np.float16, TensorProto.FLOAT16), "f32": (np.float32, TensorProto.FLOAT)}[dtype]
    rng = np.random.default_rng(seed)
    g = OnnxGraph(np_t)
    node, const = g.node, g.const
    stride = stride or patch
    w = const("W", rng.standard_normal((filters, channels, patch, patch)) * (channels * patch * patch) ** -0.5)
    ins = ["x", w] + ([const("b", rng.standard_normal((filters,)) * 0.5)] if bias else [])
    conv = node("Conv", ins, kernel_shape=[patch, patch], strides=[stride, stride], pads=[pads] * 4, dilations=[1, 1], group=1)
    side = (image + 2 * pads - patch) // stride + 1
    if as_image:
        out, shape = conv, [batch, filters, side, side]
    else:
        flat = node("Reshape", [conv, const("flat_shape", [batch, filters, side * side], np.int64)], allowzero=1)
        rows = node("Transpose", [flat], perm=[0, 2, 1])
        cls = const("cls", rng.standard_normal((batch, 1, filters)))
        tokens = node("Concat", [cls, rows], axis=1)
        out = node("Add", [tokens, const("pos", rng.standard_normal((1, side * side + 1, filters)) * 0.1)])
        shape = [batch, side * side + 1, filters]
    inputs = [helper.make_tensor_value_info("x", et, [batch, channels, image, image])]
    return g.save(path, "patch_embedding", inputs, [helper.make_tensor_value_info(out, et, shape)], opset=18)


if __name__ == "__main__":  # tools/prebuild.py: python tests/models/patch_models.py OUT.onnx [--dtype f32] [--batch N]
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", choices=["f16", "f32"], default="f16")
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    patch_embedding_onnx(args.out, dtype=args.dtype, batch=args.batch)
