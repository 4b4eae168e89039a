"""A built model's prepared call in a loop, for a sampling profiler (py-spy) to say where a
call's host time goes: the kit's Python, IREE's VM invoke of `f$async`, the HAL's queue
operations. Run over a benchmarks/hf_models.py build folder on the GPU machine:

    py-spy record --native --format raw -o prof.txt -- \\
        python3 benchmarks/investigations/model_call_profile.py BUILD_DIR NAME [--seconds S] [--baseline]

It prints the calls made and their mean time (launched in loops of 30, one wait each)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hf_models import NAME_RE, draw_parameters, model_inputs  # noqa: E402


def main() -> None:
    import kitdispatch as kd
    from kitdispatch.describe.model_record import read_model_record

    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir", type=Path)
    parser.add_argument("name")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--baseline", action="store_true", help="IREE alone's build instead of the kit's")
    args = parser.parse_args()
    m = NAME_RE.match(args.name)
    with tempfile.TemporaryDirectory() as tmp:
        irpa = Path(tmp) / "w.irpa"
        draw_parameters(args.build_dir / f"{args.name}.params.npz", irpa)
        module = kd.load_module(args.build_dir / args.name, baseline=args.baseline, parameters=irpa)
        _, record = read_model_record(args.build_dir / args.name)
        dev = module.device
        inputs = [dev.put(a) for a in model_inputs(m["model"], int(m["batch"]), int(m["seq"]), m["dtype"])]
        prepared = module.function(record.function(None).name).prepare(*inputs)
        for _ in range(10):
            prepared()
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            for _ in range(30):
                prepared.launch()
            dev.synchronize()
            calls += 30
        elapsed = time.perf_counter() - start
        print(f"{args.name} ({'IREE alone' if args.baseline else 'IREE + kit'}): {calls} calls, {elapsed / calls * 1e6:.1f} us a call", flush=True)


if __name__ == "__main__":
    main()
