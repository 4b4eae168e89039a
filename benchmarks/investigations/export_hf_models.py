"""Export the HF models of issue 24's goal from their transformers configs (random weights, no
downloads) to ONNX as users export them: `torch.onnx.export` (torch's default exporter, dynamo,
opset 18; `--torchscript` for the older one, opset 17), the model called with keywords, its last
hidden state out. One layer of each by default (real per-layer shapes), f16 and f32:

    python benchmarks/investigations/export_hf_models.py OUT_DIR [--layers N] [--dtype f16|f32|both]
        [--batch B] [--seq S] [--only bert gpt2 llama vit]

BERT-base, GPT-2 small, a Llama-style decoder (hidden 2048, 16 query and 4 key/value heads) at
batch B, seq S (default 1, 128), and ViT-base (batch B, 224x224). Files are NAME-DTYPE-bBsS.onnx.
GPT-2 exported by the TorchScript exporter stops in IREE 3.13's importer (a dynamic onnx.Reshape,
benchmarks/results/hf-library-build.txt); the dynamo exporter's imports. Then, where iree-compile
is: python benchmarks/hf_models.py build OUT_DIR BUILD_DIR.

`--attention-mask` exports the text models called with an `attention_mask` input too (int64
[b, s], the first row's second half padded; GPT-2 and Llama with use_cache=False), as
NAME-mask-DTYPE-bBsS.onnx: the key-padding mask the kit's `attention_pad_*` kernels take."""
import argparse
import os

import torch
import transformers


class LastHidden(torch.nn.Module):
    """What users export: the model called with keywords, its last hidden state out."""

    def __init__(self, model: torch.nn.Module, key: str) -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.key: x}).last_hidden_state


class WithMask(torch.nn.Module):
    """A text model called with input_ids and attention_mask, its last hidden state out."""

    def __init__(self, model: torch.nn.Module, decoder: bool) -> None:
        super().__init__()
        self.model, self.decoder = model, decoder

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        extra = {"use_cache": False} if self.decoder else {}
        return self.model(input_ids=ids, attention_mask=mask, **extra).last_hidden_state


def trained_like(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Biases and norm weights as a trained model has them, not as transformers initialises
    them (zeros and ones): imported as constants (benchmarks/hf_models.py inlines tensors under
    300k elements), zeros would be splat constants IREE folds away, which no trained model has."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
            elif "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1 + torch.randn(p.shape, generator=generator) * 0.02)
    return model


def models(layers: int, batch: int = 1, seq: int = 128, attention: str = "eager") -> dict:
    """name -> (model, keyword, example input), built from configs with seeded random weights
    (biases and norm weights `trained_like`)."""
    made = _models(layers, batch, seq, attention)
    return {name: (trained_like(net), key, x) for name, (net, key, x) in made.items()}


def _models(layers: int, batch: int, seq: int, attention: str) -> dict:
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (batch, seq))
    bert = transformers.BertConfig(num_hidden_layers=layers, vocab_size=1000, attn_implementation=attention)
    gpt2 = transformers.GPT2Config(n_layer=layers, vocab_size=1000, attn_implementation=attention)
    llama = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers, num_attention_heads=16,
                                     num_key_value_heads=4, vocab_size=1000, attn_implementation=attention)
    vit = transformers.ViTConfig(num_hidden_layers=layers, attn_implementation=attention)
    return {
        "bert": (transformers.BertModel(bert, add_pooling_layer=False), "input_ids", ids),
        "gpt2": (transformers.GPT2Model(gpt2), "input_ids", ids),
        "llama": (transformers.LlamaModel(llama), "input_ids", ids),
        "vit": (transformers.ViTModel(vit, add_pooling_layer=False), "pixel_values", torch.randn(batch, 3, 224, 224)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--dtype", choices=["f16", "f32", "both"], default="both")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--torchscript", action="store_true")
    parser.add_argument("--attention-mask", action="store_true", help="text models with an attention_mask input too")
    parser.add_argument("--attn", choices=["eager", "sdpa"], default="eager",
                        help="transformers' attn_implementation (sdpa: its default; files named -sdpa-)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    print("torch", torch.__version__, "transformers", transformers.__version__)
    dtypes = {"f16": torch.float16, "f32": torch.float32}
    chosen = dtypes if args.dtype == "both" else {args.dtype: dtypes[args.dtype]}
    for name, (model, key, example) in models(args.layers, args.batch, args.seq, args.attn).items():
        if args.only and name not in args.only:
            continue
        for tag, dtype in chosen.items():
            masked = args.attention_mask and key == "input_ids"
            module = (WithMask(model.to(dtype).eval(), name in ("gpt2", "llama")) if masked else LastHidden(model.to(dtype).eval(), key)).eval()
            x = example.to(dtype) if example.is_floating_point() else example
            inputs, names = (x,), [key]
            if masked:
                mask = torch.ones(example.shape, dtype=torch.int64)
                mask[0, example.shape[1] // 2:] = 0
                inputs, names = (x, mask), [key, "attention_mask"]
            layers = f"-l{args.layers}" if args.layers != 1 else ""  # benchmarks/hf_models.py reads the layers from the name
            attn = "-sdpa" if args.attn == "sdpa" else ""
            path = os.path.join(args.out, f"{name}{attn}{'-mask' if masked else ''}-{tag}-b{args.batch}s{args.seq}{layers}.onnx")
            try:
                opset = 17 if args.torchscript else 18
                torch.onnx.export(module, inputs, path, input_names=names, opset_version=opset, dynamo=not args.torchscript,
                                  external_data=False)
                print(name, tag, os.path.getsize(path), "bytes")
            except Exception as exc:  # noqa: BLE001 - report and go on with the others
                print(name, tag, "FAILED:", type(exc).__name__, str(exc).splitlines()[0][:200])


if __name__ == "__main__":
    main()
