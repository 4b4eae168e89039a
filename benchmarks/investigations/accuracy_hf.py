"""How right are whole HF models built by the kit? Each model's output from the kit's build and
from IREE alone, both against the same model in torch computed in f32 (the f16 weights widened),
with the very weights the ONNX export carries: the export step computes that reference on the
CPU from the module it exports (`NAME.ref.npy`). On the GPU machine the model is rebuilt from its
seed for torch f16 eager beside them, which is shown only where the rebuilt model is the exported
one (its f32 output matches the reference): a different transformers there may build other
weights from the same seed (ViT under transformers 5.17 against the export's 5.24: 10% apart).

Three steps, because iree-compile and the GPU live on different machines here:

    /work/tenv/bin/python benchmarks/investigations/accuracy_hf.py export ONNX_DIR      # torch, CPU
    /work/tenv/bin/python benchmarks/investigations/accuracy_hf.py reference ONNX_DIR   # (older exports)
    .venv/bin/python benchmarks/investigations/accuracy_hf.py build ONNX_DIR BUILD_DIR  # iree-compile
    python3 benchmarks/investigations/accuracy_hf.py run BUILD_DIR OUT.json            # the GPU

Models: BERT-base, GPT-2 small, ViT-base (one layer each) and a small Llama-style decoder
(hidden 1024, 16 query / 4 key-value heads, SwiGLU 2816, one layer), batch 1, seq 128, f16.
Unlike benchmarks/hf_models.py the weights travel (IREE parameter archives of 10-25 MB), so the
models are kept small enough for the GPU machine's carry limit.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: hf_models' import and build steps
import hf_models

SEED = 0
NAMES = ("bert", "gpt2", "vit", "llama")


def models() -> dict:
    """name -> (model, keyword, example input), in f32, from one seed: the same on both machines."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    ids = torch.randint(0, 1000, (1, 128))
    made = {}
    for name in NAMES:
        torch.manual_seed(SEED + NAMES.index(name) + 1)  # each model from its own seed: order-proof
        if name == "bert":
            net = transformers.BertModel(transformers.BertConfig(num_hidden_layers=1, vocab_size=1000, attn_implementation="eager"),
                                         add_pooling_layer=False)
            made[name] = (net, "input_ids", ids)
        elif name == "gpt2":
            made[name] = (transformers.GPT2Model(transformers.GPT2Config(n_layer=1, vocab_size=1000, attn_implementation="eager")), "input_ids", ids)
        elif name == "vit":
            net = transformers.ViTModel(transformers.ViTConfig(num_hidden_layers=1, attn_implementation="eager"), add_pooling_layer=False)
            made[name] = (net, "pixel_values", torch.randn(1, 3, 224, 224))
        else:
            config = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=1, num_attention_heads=16,
                                              num_key_value_heads=4, vocab_size=1000, attn_implementation="eager")
            made[name] = (transformers.LlamaModel(config), "input_ids", ids)
    sys.path.insert(0, str(Path(__file__).parent))
    from export_hf_models import trained_like

    return {name: (trained_like(net, SEED), key, x) for name, (net, key, x) in made.items()}


def export(out: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from export_hf_models import LastHidden

    out.mkdir(parents=True, exist_ok=True)
    for name, (net, key, example) in models().items():
        module = LastHidden(net.to(torch.float16).eval(), key).eval()
        x = example.to(torch.float16) if example.is_floating_point() else example
        path = out / f"{name}.onnx"
        torch.onnx.export(module, (x,), str(path), input_names=[key], opset_version=18, dynamo=True, external_data=False)
        np.save(out / f"{name}.input.npy", x.numpy())
        save_reference(module, x, out / f"{name}.ref.npy")
        print(name, path.stat().st_size, "bytes", flush=True)


def save_reference(module, x, path: Path) -> None:
    """The exported module in f32 (its f16 weights widened), on the CPU: the reference."""
    import torch

    with torch.inference_mode():
        full = copy.deepcopy(module).float()
        np.save(path, full(x.float() if x.is_floating_point() else x).double().numpy())


def reference(onnx_dir: Path) -> None:
    """NAME.ref.npy for exports made before the export step wrote it, from the same seeds (run
    with the transformers the export was made with)."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from export_hf_models import LastHidden

    for name, (net, key, _) in models().items():
        if (onnx_dir / f"{name}.onnx").is_file():
            x = torch.from_numpy(np.load(onnx_dir / f"{name}.input.npy"))
            save_reference(LastHidden(net.to(torch.float16).eval(), key).eval(), x, onnx_dir / f"{name}.ref.npy")
            print(name, "reference written", flush=True)


def build(onnx_dir: Path, out: Path, arch: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        mlir, irpa, folder = out / f"{name}.mlir", out / f"{name}.irpa", out / name
        copies = [out / f"{name}.{kind}.npy" for kind in ("input", "ref")]
        if any(p.exists() or p.is_symlink() for p in (mlir, irpa, folder, out / f"{name}.build.log", *copies)):
            print(f"{name}: skipped, its files (or files of their names) are already in {out}", flush=True)
            continue
        if not (onnx_dir / f"{name}.onnx").is_file():
            print(f"{name}: skipped, {onnx_dir} has no {name}.onnx (export it first)", flush=True)
            continue
        # Imported as benchmarks/hf_models.py imports (small initializers stay constants: the
        # exporter's attention mask must be one for the kit to read it); the weights travel.
        hf_models.import_onnx(onnx_dir / f"{name}.onnx", mlir, irpa)
        started = time.monotonic()
        code = hf_models.kit_build(mlir, folder, arch, out / f"{name}.build.log")
        mlir.unlink()
        for kind, copy in zip(("input", "ref"), copies):
            with open(copy, "xb") as f:  # a new file: never through a link or over one of the user's
                f.write((onnx_dir / f"{name}.{kind}.npy").read_bytes())
        print(f"{name}: build exit {code} in {time.monotonic() - started:.0f} s", flush=True)


def errors(y: np.ndarray, ref: np.ndarray) -> dict:
    d = y.astype(np.float64) - ref
    return {"max_abs": float(np.abs(d).max()), "relative_l2": float(np.linalg.norm(d) / np.linalg.norm(ref)),
            "p99_abs": float(np.quantile(np.abs(d), 0.99))}


def run(build_dir: Path, out: Path) -> None:
    import torch

    import kitdispatch as kd
    from kitdispatch.describe.model_record import read_model_record

    sys.path.insert(0, str(Path(__file__).parent))
    from export_hf_models import LastHidden

    results = []
    made = models()
    for name in NAMES:
        folder = build_dir / name
        if not folder.is_dir():
            continue
        net, key, _ = made[name]
        x = np.load(build_dir / f"{name}.input.npy")
        entry: dict = {"model": name}
        results.append(entry)
        half = LastHidden(net.to(torch.float16).cuda().eval(), key).eval()
        with torch.inference_mode():
            tx = torch.from_numpy(x).cuda()
            y16 = half(tx).float().cpu().numpy()
            full = half.float()  # the rebuilt model in f32, to check it is the exported one
            rebuilt = full(tx.float() if tx.is_floating_point() else tx).double().cpu().numpy()
        ref = np.load(build_dir / f"{name}.ref.npy")  # the exported module's own f32 output
        entry["rebuilt_model_vs_export"] = errors(rebuilt, ref)
        _, record = read_model_record(folder)
        function = record.function(None).name
        entry["replaced_ops"] = len(record.replaced)
        entry["kernels"] = sorted({r.kernel_entry for r in record.replaced})
        outputs = {}
        for label, baseline in (("kit", False), ("iree", True)):
            module = kd.load_module(folder, baseline=baseline, parameters=build_dir / f"{name}.irpa")
            y = module.function(function)(x)
            outputs[label] = np.asarray(y[0] if isinstance(y, (tuple, list)) else y, np.float64)
        if entry["rebuilt_model_vs_export"]["relative_l2"] < 1e-3:  # else: other weights, not comparable
            outputs["torch_f16"] = y16.astype(np.float64)
        entry["output_std"] = float(ref.std())
        entry["vs_torch_f32"] = {k: errors(v, ref) for k, v in outputs.items()}
        entry["kit_vs_iree"] = errors(outputs["kit"], outputs["iree"])
        print(json.dumps(entry), flush=True)
        out.write_text(json.dumps(results, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    e = sub.add_parser("export")
    e.add_argument("out", type=Path)
    f = sub.add_parser("reference")
    f.add_argument("onnx_dir", type=Path)
    hf_models.add_build_step(sub)
    r = sub.add_parser("run")
    r.add_argument("build_dir", type=Path)
    r.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.step == "export":
        export(args.out)
    elif args.step == "reference":
        reference(args.onnx_dir)
    elif args.step == "build":
        build(args.onnx_dir, args.out, args.arch)
    else:
        run(args.build_dir, args.out)


if __name__ == "__main__":
    main()
