"""The `kitdispatch run` command's calls: a function called in process with IREE's --input text forms, or through iree-run-module."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
import numpy as np
from kitdispatch._tools import find_iree_tool
from kitdispatch._proc import ToolResult, run_checked
from kitdispatch.errors import KitError
from kitdispatch.run.arguments import check_count
from kitdispatch.run.module import Module, preflight_run, require_cuda
from kitdispatch.run.text_forms import format_result, parse_input
from kitdispatch.run.timing import CallTimes, time_calls

RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RunResult:
    function: str
    results: tuple[str, ...]  # each as iree-run-module prints it
    times: "CallTimes | None" = None


def run_function(vmfb: str | Path, function: str, inputs: Sequence[str], *, device: str = "cuda", benchmark: int = 0) -> RunResult:
    """Runs one function in process with IREE's --input syntax, the way Python calls it; with
    `benchmark` > 0 also times that many calls (timing.time_calls)."""
    module = Module(vmfb, device=device)
    fn = module.function(function)
    sig = fn.signature
    if sig is None:
        raise KitError(f"{vmfb} has no kitdispatch build record for {function}", fix="run it with iree-run-module")
    if len(inputs) != len(sig.args):
        check_count(sig, inputs)
    args = [parse_input(text, t, f"--input {i + 1} ({t})") for i, (text, t) in enumerate(zip(inputs, sig.args))]
    results = fn(*args)
    results = results if isinstance(results, tuple) else (results,)
    times = None
    if benchmark > 0:
        on_device = [module.device.put(a) if isinstance(a, np.ndarray) else a for a in args]
        times = time_calls(fn, on_device, calls=benchmark)
    return RunResult(function, tuple(format_result(i, r) for i, r in enumerate(results)), times)


def find_runtime_tool(name: str) -> str:
    """iree-run-module or iree-benchmark-module, which iree-base-runtime ships."""
    return find_iree_tool(name, install="pip install iree-base-runtime")


def run_module(
    vmfb: str | Path,
    function: str,
    inputs: Sequence[str],
    *,
    device: str = "cuda",
    extra: Sequence[str] = (),
    timeout: float = RUN_TIMEOUT_S,
) -> ToolResult:
    """Runs one function through iree-run-module with IREE's --input syntax (e.g. 8xf32=2)."""
    vmfb = Path(vmfb)
    if not vmfb.is_file():
        raise KitError(f"no module at {vmfb}", fix="build it first: kitdispatch build ... -o DIR")
    require_cuda(device)
    preflight_run(vmfb)
    argv = [
        find_runtime_tool("iree-run-module"),
        f"--device={device}",
        f"--module={vmfb}",
        f"--function={function}",
        *(f"--input={i}" for i in inputs),
        *extra,
    ]
    return run_checked(
        argv,
        timeout=timeout,
        what=f"iree-run-module failed running {function}",
        where=str(vmfb),
        fix="check the function name and the inputs' shapes and types",
    )
