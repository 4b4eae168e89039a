"""Models with and without kit kernels on the GPU: agreement, whole-call time and the replaced
dispatch's device time against IREE's own, in one run per model.

    python benchmarks/models.py BUILT_DIR... [--json OUT.json]

BUILT_DIR: folders written on a build machine by
`kitdispatch build PROJECT --model MODEL --with-baseline --arch sm_90 -o BUILT_DIR`
(samples/onnx_softmax, samples/torch_mlp; kernels/matmul with samples/onnx_matmul's model,
kernels/elementwise with samples/onnx_bias_gelu's). Needs only iree-base-runtime on the GPU machine.
The last two columns are the device time per call of the dispatches that changed: IREE's that
the replaced module lacks, and the replaced module's new ones (the kit's kernels, and any op IREE
had fused into the replaced one and now runs alone).
Whole call: iree-benchmark-module (median of 5 repetitions of 50 calls); dispatch device time:
Nsight Compute (`gpu__time_duration`, clocks left alone; IREE 3.13 has no HAL-native profiling on CUDA).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import kitdispatch as kd
from kitdispatch.models.compare import compare_model, format_comparison
from kitdispatch.run.module import cuda_status


def environment() -> dict:
    from environment import base

    return {**base("iree-base-runtime"), "device": cuda_status().reason, "kitdispatch": kd.__version__}


def call_only(folders, n: int) -> None:
    from kitdispatch.models.compare import _function, random_inputs
    from kitdispatch.models.pipeline import read_model_record

    for folder in folders:
        root, record = read_model_record(folder)
        sig = _function(record, None)
        args = random_inputs(sig)
        for key in ("baseline_vmfb", "vmfb"):
            module = kd.load_module(root / record[key])
            for _ in range(n):
                module.call(sig["name"], *args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("built", nargs="+", type=Path)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--calls-only", type=int, default=0, metavar="N",
                   help="only call each module N times, for a run under Nsight Compute (ncu) as a cross-check")
    args = p.parse_args()
    if args.calls_only:
        return call_only(args.built, args.calls_only)
    env = environment()
    print(json.dumps(env))
    rows, results = [], {}
    for folder in args.built:
        c = compare_model(folder)
        print(f"== {folder.name}\n{format_comparison(c)}\n")
        kit, iree = c.replaced_dispatches()
        per_call = lambda ts: sum(t.per_call_us for t in ts)  # noqa: E731
        base, mine = c.call_us["baseline"], c.call_us["replaced"]
        rows.append(
            f"| {folder.name} | {'yes' if c.agree else 'NO'} ({c.max_abs_error:.1e}) | {base:.0f} us | {mine:.0f} us | "
            f"{base / mine:.2f}x | {per_call(iree):.1f} us | {per_call(kit):.1f} us |"
        )
        results[folder.name] = c.to_json()
    print("| model | outputs agree (max abs err) | whole call, IREE | whole call, kit kernel | speed-up | IREE's dispatches that went | new dispatches |")
    print("|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "models": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
