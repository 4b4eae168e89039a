"""Where a built model's whole call spends its time, by route, on the GPU machine: IREE's own
synchronous call in process (FunctionInvoker), the kit's prepared call waited each time and
launched in loops with one wait, and the kit's call, against the device time of its kernels
(CUPTI). Run over a benchmarks/hf_models.py build folder:

    python3 benchmarks/investigations/model_call_paths.py BUILD_DIR [NAME ...] [--iree-flag=--cuda_use_streams=false]

`--iree-flag=F` passes F to IREE's runtime flags (iree.runtime.flags.parse_flags) before the
device is made: how IREE's CUDA HAL runs command buffers (streams or graphs) changes its host time.

The weights are drawn as hf_models.py draws them.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hf_models import NAME_RE, draw_parameters, model_inputs  # noqa: E402


def median_us(call, wait, rounds: int = 7, calls: int = 30) -> float:
    for _ in range(3):
        call()
        wait()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        wait()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def device_us(call, wait, calls: int = 30) -> tuple[float, int]:
    from kitdispatch.run.timing import KernelTimer

    timer = KernelTimer.get()
    call()
    wait()
    with timer.collect() as spans:
        for _ in range(calls):
            call()
        wait()
    return sum(e - s for s, e in spans) / calls / 1e3, len(spans) // calls


def main() -> None:
    import kitdispatch as kd
    from kitdispatch.describe.model_record import read_model_record

    build_dir = Path(sys.argv[1])
    flags = [a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--iree-flag=")]
    only = {a for a in sys.argv[2:] if not a.startswith("--")}
    if flags:
        import iree.runtime as rt

        rt.flags.parse_flags(*flags)
        print("IREE runtime flags:", flags, flush=True)
    for spec in sorted(build_dir.glob("*.params.npz")):
        name = spec.name[: -len(".params.npz")]
        m = NAME_RE.match(name)
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            irpa = Path(tmp) / "w.irpa"
            draw_parameters(spec, irpa)
            args = model_inputs(m["model"], int(m["batch"]), int(m["seq"]), m["dtype"])
            _, record = read_model_record(build_dir / name)
            fname = record.function(None).name
            for label, baseline in (("IREE alone", True), ("IREE + kit", False)):
                module = kd.load_module(build_dir / name, baseline=baseline, parameters=irpa)
                dev = module.device
                on_device = [dev.put(a) for a in args]
                invoker = module.raw(fname)
                prepared = module.function(fname).prepare(*on_device)
                kept: list = []

                def keep_results() -> None:  # each call's results held until the loop's wait (their release deferred)
                    kept.append(prepared.launch())

                def wait_and_release() -> None:
                    dev.synchronize()
                    kept.clear()

                rows = {
                    "IREE's synchronous call (FunctionInvoker)": median_us(lambda: invoker(*on_device), lambda: None),
                    "kit prepared call, waited each time": median_us(prepared, lambda: None),
                    "kit prepared call, loops of 30, one wait": median_us(prepared.launch, dev.synchronize),
                    "kit prepared call, loops of 30, results released after the wait": median_us(keep_results, wait_and_release),
                    "kit call (launch), loops of 30, one wait": median_us(lambda: module.function(fname).launch(*on_device), dev.synchronize),
                }
                kernels, count = device_us(prepared.launch, dev.synchronize)
                print(f"{name} {label}: device time of its kernels {kernels:.1f} us in {count} kernels a call", flush=True)
                for k, v in rows.items():
                    print(f"  {k:48s} {v:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
