"""HF transformer models, whole: IREE alone against IREE with the kit's kernels (by rule), beside
torch eager and torch.compile, on the GPU machine. Two steps, because the GPU machine has no
iree-compile and a model's weights would not fit the trip there twice (replaced and baseline):

1. Where iree-compile is (the build machine), from ONNX files that
   benchmarks/investigations/export_hf_models.py wrote (on a machine with torch):

       python benchmarks/hf_models.py build ONNX_DIR BUILD_DIR [--arch sm_90a]

   Each model is imported with its weights as parameters (`iree-import-onnx --externalize-params`;
   initializers under KEEP_INLINE elements stay constants: the dynamo exporter's attention mask,
   a boolean [1, 1, s, s], must be one for the kit to read it, and biases and norm weights are
   the ones transformers initialises anyway),
   built with the whole library and a baseline (`kitdispatch build --model M.mlir --with-baseline`),
   and its parameters described in NAME.params.npz: the shape and type of every float weight,
   and the values of the others (position ids and other integer constants).

2. On the GPU machine (iree-base-runtime, torch, transformers):

       python benchmarks/hf_models.py run BUILD_DIR OUT.json

   The float weights are drawn as transformers initialises them (normal, std 0.02; norm weights
   1, biases 0) into one parameter archive both modules read, so both compute with the same
   weights. Per model: outputs of the kit's build against IREE's own (the dtype's tolerance),
   the whole call of each by iree-benchmark-module (median, the two interleaved), device time
   per dispatch by Nsight Compute, and the same HF model in torch (random weights of the same
   shapes, not the same values: only its times are read), eager and torch.compile, CUDA events.
   Parameters that are not weights (Llama's rotary cos/sin table, folded by the exporter) are
   drawn the same way: the two builds still compute alike, which is all `run` compares.

Guarded replacement (`kitdispatch tune`), three trips: `build ... --probes`; on the GPU
`run BUILD_DIR OUT.json --tune TUNE_DIR` (the tune records come back in TUNE_DIR); here
`build-tuned BUILD_DIR TUNE_DIR` (BUILD_DIR/NAME.tuned, following the record); on the GPU `run`
again, which then also compares and times each NAME.tuned ("tuned" in OUT.json).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
NAME_RE = re.compile(r"^(?P<model>bert|gpt2|llama|vit)-(?P<dtype>f16|bf16|f32)-b(?P<batch>\d+)s(?P<seq>\d+)(?:-l(?P<layers>\d+))?$")
PARAMETER_RE = re.compile(r'#stream\.parameter\.named<"(?P<scope>[^"]+)"::"(?P<key>[^"]+)"> : tensor<(?P<type>[^>]+)>')
NUMPY = {"f16": np.float16, "bf16": np.uint16, "f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32,
         "i8": np.int8, "i1": np.bool_, "ui8": np.uint8}


# --------------------------------------------------------------------------- build side


def parameters_of(mlir: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """key -> (shape, element type) of every parameter the imported model reads."""
    found = {}
    for m in PARAMETER_RE.finditer(mlir.read_text()):
        *dims, dtype = m["type"].split("x")
        found[m["key"]] = (tuple(int(d) for d in dims), dtype)
    return found


def describe_parameters(mlir: Path, irpa: Path, dest: Path) -> None:
    """NAME.params.npz: float weights by shape and type only, every other parameter's values."""
    import iree.runtime as rt

    index = rt.ParameterIndex()
    index.load(str(irpa))
    entries = dict(index.items())
    kept: dict[str, np.ndarray] = {}
    for key, (shape, dtype) in parameters_of(mlir).items():
        if dtype in ("f16", "bf16", "f32", "f64"):
            kept[f"float:{key}"] = np.array([*shape], np.int64)
            kept[f"dtype:{key}"] = np.array(dtype)
        else:
            data = np.frombuffer(bytes(entries[key].file_view), NUMPY[dtype]).reshape(shape)
            kept[f"value:{key}"] = data
    np.savez(dest, **kept)


KEEP_INLINE = 300_000  # elements: a [512, 512] mask (262144) stays a constant, a 768 x 768 weight (589824) does not


def import_onnx(onnx: Path, mlir: Path, irpa: Path) -> None:
    """The model imported to `mlir`, its weights of KEEP_INLINE elements or more into `irpa`."""
    tool = Path(sys.executable).parent / "iree-import-onnx"
    subprocess.run([str(tool), str(onnx), "--externalize-params", "--num-elements-threshold", str(KEEP_INLINE),
                    "--save-params-to", str(irpa), "-o", str(mlir)],
                   check=True, timeout=900)


def kit_build(mlir: Path, folder: Path, archs: str, log: Path, *extra: str) -> int:
    """`kitdispatch build --model MLIR --with-baseline -o FOLDER EXTRA...`, its output in `log`;
    its exit code (a failed build is reported, and the other models go on)."""
    done = subprocess.run([sys.executable, "-m", "kitdispatch", "build", "--model", str(mlir), "--arch", archs, "--with-baseline",
                           "-o", str(folder), *extra],
                          check=False, capture_output=True, text=True, timeout=3600)
    log.write_text(done.stdout + done.stderr)
    return done.returncode


def build(onnx_dir: Path, out: Path, archs: str, *, probes: bool = False, only: tuple[str, ...] = ()) -> None:
    """Imports and builds each model; keeps its imported NAME.mlir (weights outside it) for a
    later `build-tuned`. With `probes`, the builds also write tune's probes."""
    out.mkdir(parents=True, exist_ok=True)
    for onnx in sorted(onnx_dir.glob("*.onnx")):
        name = onnx.stem
        if not NAME_RE.match(name) or (only and name not in only):
            continue
        mlir, irpa = out / f"{name}.mlir", out / f"{name}.irpa"
        mine = [mlir, irpa, out / f"{name}.params.npz", out / f"{name}.build.log", out / name]
        taken = [str(path) for path in mine if path.exists() or path.is_symlink()]
        if taken:  # never overwrite or delete what this script did not write in this run
            print(f"{name}: skipped, {', '.join(taken)} already there (remove it or choose another BUILD_DIR)", flush=True)
            continue
        import_onnx(onnx, mlir, irpa)
        describe_parameters(mlir, irpa, out / f"{name}.params.npz")
        irpa.unlink()  # the GPU machine draws its own
        started = time.monotonic()
        code = kit_build(mlir, out / name, archs, out / f"{name}.build.log", "--json", *(["--probes"] if probes else []))
        print(f"{name}: build exit {code} in {time.monotonic() - started:.0f} s", flush=True)


def build_tuned(build_dir: Path, tune_dir: Path, archs: str) -> None:
    """Per model with a tune record in `tune_dir` (NAME.tune.json, from `run --tune`): the build
    that follows it, in BUILD_DIR/NAME.tuned (with its baseline, for `run` to compare)."""
    for record in sorted(tune_dir.glob("*.tune.json")):
        name = Path(json.loads(record.read_text())["model"]).stem  # the record's name is the model's as an identifier
        mlir, folder = build_dir / f"{name}.mlir", build_dir / f"{name}.tuned"
        if not mlir.is_file() or folder.exists():
            print(f"{name}: skipped ({'no ' + str(mlir) if not mlir.is_file() else str(folder) + ' already there'})", flush=True)
            continue
        code = kit_build(mlir, folder, archs, build_dir / f"{name}.tuned.build.log", "--tuned", str(record))
        print(f"{name}: tuned build exit {code}", flush=True)


# ----------------------------------------------------------------------------- GPU side


def draw_parameters(spec: Path, irpa: Path, seed: int = 0) -> None:
    """The archive both modules read: weights drawn as transformers initialises them."""
    import iree.runtime as rt

    rng = np.random.default_rng(seed)
    data = np.load(spec)
    entries = {}
    for item in data.files:
        kind, key = item.split(":", 1)
        if kind == "value":
            entries[key] = np.ascontiguousarray(data[item])
        elif kind == "float":
            shape, dtype = tuple(int(d) for d in data[item]), str(data[f"dtype:{key}"])
            lower = key.lower()
            if "norm" in lower and lower.endswith("weight"):
                values = np.ones(shape)
            elif lower.endswith("bias"):
                values = np.zeros(shape)
            else:
                values = rng.normal(0.0, 0.02, shape)
            entries[key] = values.astype(np.float32 if dtype == "f32" else np.float16)
    rt.save_archive_file({k: v.view(np.uint8).reshape(-1) for k, v in entries.items()}, irpa)


def torch_times(model: str, batch: int, seq: int, dtype: str, rounds: int = 3, calls: int = 50, *, layers: int = 1,
                max_autotune: bool = False) -> dict[str, float]:
    """Median call (us) of the HF model in torch: eager, torch.compile default (and, with
    `max_autotune`, mode="max-autotune-no-cudagraphs": minutes of tuning per model), interleaved."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks" / "investigations"))
    from export_hf_models import LastHidden, models

    net, key, example = models(layers, batch, seq)[model]
    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    net = LastHidden(net.to(torch_dtype).cuda().eval(), key).eval()
    x = (example.to(torch_dtype) if example.is_floating_point() else example).cuda()
    variants = {"torch eager": net, "torch.compile": torch.compile(net)}
    if max_autotune:
        variants["torch.compile max-autotune-no-cudagraphs"] = torch.compile(net, mode="max-autotune-no-cudagraphs")
    results: dict[str, list[float]] = {k: [] for k in variants}
    with torch.inference_mode():
        for fn in variants.values():
            for _ in range(5):
                fn(x)
        torch.cuda.synchronize()
        for _ in range(rounds):
            for name, fn in variants.items():
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                times = []
                for _ in range(calls):
                    start.record()
                    fn(x)
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1000)
                results[name].append(statistics.median(times))
    return {k: statistics.median(v) for k, v in results.items()}


def model_inputs(model: str, batch: int, seq: int, dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    if model == "vit":
        return [rng.standard_normal((batch, 3, 224, 224)).astype(np.float16 if dtype == "f16" else np.float32)]
    return [rng.integers(0, 1000, (batch, seq), dtype=np.int64)]  # within the vocabulary of 1000


def run(build_dir: Path, out: Path, *, max_autotune: bool = False, only: tuple[str, ...] = (), tune_out: Path | None = None,
        tuned_only: bool = False, with_torch: bool = True) -> None:
    """Per model of BUILD_DIR: the build by rule against IREE alone, torch's times (unless not
    `with_torch`: a second build of the same models in one lease), and the tuned build where
    there is one; `tuned_only`: only the tuned builds (NAME.tuned), each against its own baseline."""
    from kitdispatch.models.compare import compare_model

    results = []
    for spec in sorted(build_dir.glob("*.params.npz")):
        name = spec.name[: -len(".params.npz")]
        m = NAME_RE.match(name)
        if only and name not in only:
            continue
        folder = build_dir / name
        entry: dict = {"model": name}
        results.append(entry)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                irpa = Path(tmp) / "weights.irpa"
                draw_parameters(spec, irpa)
                inputs = Path(tmp) / "inputs.npz"
                np.savez(inputs, *model_inputs(m["model"], int(m["batch"]), int(m["seq"]), m["dtype"]))
                tuned = build_dir / f"{name}.tuned"
                if tuned_only:
                    if tuned.is_dir():
                        entry["tuned"] = tuned_entry(compare_model(tuned, inputs=inputs, parameters=irpa, repetitions=20))
                    continue
                c = compare_model(folder, inputs=inputs, parameters=irpa, repetitions=20)
                entry.update(c.to_json())
                if tune_out is not None:
                    entry["tune"] = tune(folder, inputs, irpa, tune_out)
                if tuned.is_dir():
                    entry["tuned"] = tuned_entry(compare_model(tuned, inputs=inputs, parameters=irpa, repetitions=20))
                baseline = compare_model_output_std(folder, inputs, irpa)
                entry["output_std"], entry["output_nans"] = baseline
            if with_torch:
                entry["torch_us"] = torch_times(m["model"], int(m["batch"]), int(m["seq"]), m["dtype"], layers=int(m["layers"] or 1),
                                                max_autotune=max_autotune)
        except Exception as exc:  # noqa: BLE001 - report the model and go on with the others
            entry["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            print(summary(entry), flush=True)
            out.write_text(json.dumps(results, indent=1))
    try:
        plot(results, out.with_suffix(".png"))
    except ImportError:
        print("no matplotlib: no plot", flush=True)


def tuned_entry(t: object) -> dict:
    return {"agree": t.agree, "max_abs_error": t.max_abs_error, "tolerance": t.tolerance, "call_us": t.call_us,
            "prepared_us": t.prepared_us, "replaced_ops": list(t.replaced_ops),
            "dispatches": {k: [d.to_json() for d in v] for k, v in t.dispatches.items()}}


def tune(folder: Path, inputs: Path, irpa: Path, tune_out: Path) -> dict:
    """`kitdispatch tune` on the model's inputs and weights; its record copied to `tune_out`."""
    import kitdispatch as kd
    from kitdispatch.models.tune import format_tune

    result = kd.tune_model(folder, inputs=inputs, parameters=irpa)
    print(format_tune(result), flush=True)
    tune_out.mkdir(parents=True, exist_ok=True)
    (tune_out / result.path.name).write_bytes(result.path.read_bytes())
    return json.loads(result.path.read_text())


def plot(results: list[dict], path: Path) -> None:
    """Whole-call speed of each model relative to IREE alone (IREE's own call), one bar a route."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [e for e in results if len(e.get("call_us", {})) == 2]
    routes = [("IREE + kit (IREE's call)", lambda e: e["call_us"]["replaced"]),
              ("IREE + kit (kit's prepared call)", lambda e: e.get("prepared_us", {}).get("replaced")),
              ("IREE + kit tuned (IREE's call)", lambda e: e.get("tuned", {}).get("call_us", {}).get("replaced")),
              *[(k, (lambda e, k=k: e.get("torch_us", {}).get(k))) for k in
                dict.fromkeys(k for e in rows for k in e.get("torch_us", {}))]]
    y = np.arange(len(rows))
    width = 0.8 / max(len(routes), 1)
    fig, ax = plt.subplots(figsize=(9, 0.9 * len(rows) + 1.5))
    for i, (label, time_of) in enumerate(routes):
        speed = [e["call_us"]["baseline"] / t if (t := time_of(e)) else 0.0 for e in rows]
        ax.barh(y - 0.4 + (i + 0.5) * width, speed, width, label=label)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(y, [e["model"] for e in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("speed relative to IREE alone (its whole call / the route's; > 1 is faster)")
    ax.set_title("Whole HF models, f16: IREE alone, with the kit's kernels, torch")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def compare_model_output_std(folder: Path, inputs: Path, irpa: Path) -> tuple[float, int]:
    """The baseline's first output's spread and NaNs: outputs that agree must also be something."""
    import kitdispatch as kd
    from kitdispatch.describe.model_record import read_model_record

    _, record = read_model_record(folder)
    model = kd.load_module(folder, baseline=True, parameters=irpa)
    data = np.load(inputs)
    result = model.function(record.function(None).name)(*[data[k] for k in data.files])
    first = np.asarray(result[0] if isinstance(result, (tuple, list)) else result, np.float64)
    return float(np.std(first)), int(np.isnan(first).sum())


def summary(e: dict) -> str:
    if "error" in e:
        return f"{e['model']}: {e['error']}"
    t = e.get("tuned", {})
    tuned = (f"\n  tuned build ({len(t['replaced_ops'])} ops replaced; outputs {'agree' if t['agree'] else 'DISAGREE'}): "
             f"IREE's call: IREE alone {t['call_us']['baseline']:.1f} us, tuned {t['call_us']['replaced']:.1f} us "
             f"({t['call_us']['baseline'] / t['call_us']['replaced']:.2f}x)") if len(t.get("call_us", {})) == 2 else ""
    if "call_us" not in e:
        return f"{e['model']}:{tuned or ' nothing measured'}"
    calls, prepared, torch_us = e.get("call_us", {}), e.get("prepared_us", {}), e.get("torch_us", {})
    parts = [f"{e['model']}: {len(e.get('replaced_ops', []))} ops replaced; outputs {'agree' if e.get('agree') else 'DISAGREE'} "
             f"(max abs error {e.get('max_abs_error', float('nan')):.3g}, {e.get('tolerance')}; "
             f"output std {e.get('output_std', float('nan')):.3g}, {e.get('output_nans')} NaN)"]
    for label, pair in (("IREE's call", calls), ("kit's prepared call", prepared)):
        if len(pair) == 2:
            parts.append(f"  {label}: IREE alone {pair['baseline']:.1f} us, IREE + kit {pair['replaced']:.1f} us "
                         f"({pair['baseline'] / pair['replaced']:.2f}x)")
    mine = prepared.get("replaced") or calls.get("replaced")
    for k, v in torch_us.items():
        parts.append(f"  {k} {v:.1f} us" + (f" ({v / mine:.2f}x of IREE + kit's prepared call)" if mine else ""))
    if tuned:
        parts.append(tuned[1:])
    for k, rows in e.get("dispatches", {}).items():
        total = sum(r["per_call_us"] for r in rows)
        parts.append(f"  device time, {k}: {total:.1f} us in {len(rows)} dispatches; heaviest: "
                     + ", ".join(f"{r['name'][-40:]} {r['per_call_us']:.1f}" for r in rows[:4]))
    return "\n".join(parts)


def add_build_step(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `build ONNX_DIR OUT [--arch]` step (benchmarks/investigations/accuracy_hf.py has it too)."""
    b = sub.add_parser("build")
    b.add_argument("onnx_dir", type=Path)
    b.add_argument("out", type=Path)
    b.add_argument("--arch", default="sm_90a")
    return b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    b = add_build_step(sub)
    b.add_argument("--probes", action="store_true", help="the builds also write tune's probes (for run --tune)")
    b.add_argument("--only", nargs="*", default=(), help="model names to build")
    bt = sub.add_parser("build-tuned", help="rebuild each model following its tune record (from run --tune)")
    bt.add_argument("build_dir", type=Path)
    bt.add_argument("tune_dir", type=Path)
    bt.add_argument("--arch", default="sm_90a")
    r = sub.add_parser("run")
    r.add_argument("build_dir", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--max-autotune", action="store_true", help="also torch.compile(mode='max-autotune-no-cudagraphs') (slow)")
    r.add_argument("--only", nargs="*", default=(), help="model names (e.g. llama-f16-b1s512) to run")
    r.add_argument("--tune", type=Path, metavar="TUNE_DIR", help="also run kitdispatch tune on each build with probes; records into TUNE_DIR")
    r.add_argument("--tuned-only", action="store_true", help="only the tuned builds (BUILD_DIR/NAME.tuned), each against its baseline")
    r.add_argument("--no-torch", action="store_true", help="leave torch out (a second build of the same models, timed in the same lease)")
    args = parser.parse_args()
    if args.step == "build":
        build(args.onnx_dir, args.out, args.arch, probes=args.probes, only=tuple(args.only))
    elif args.step == "build-tuned":
        build_tuned(args.build_dir, args.tune_dir, args.arch)
    else:
        run(args.build_dir, args.out, max_autotune=args.max_autotune, only=tuple(args.only), tune_out=args.tune,
            tuned_only=args.tuned_only, with_torch=not args.no_torch)


if __name__ == "__main__":
    main()
