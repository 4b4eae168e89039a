"""Model calls that never block the host: each exported NAME$async gets a twin,
NAME$async_transients, that takes its transient memory from a buffer the caller passes.

Why: IREE 3.13's CUDA HAL blocks the calling thread in `queue_alloca` and `queue_dealloca`
until their wait fences are reached (runtime/src/iree/hal/drivers/cuda/cuda_device.c: "the CUDA
HAL is not currently asynchronous"). A model's NAME$async frees its transient buffers with a
dealloca that waits on its own execution, so every call returns only after the GPU has run it:
calls never overlap, and the host's time per call adds to the GPU's (on an H200, BERT-base
b1s128 with the kit's kernels: 122 us a call, launched in loops or waited one by one). A
function whose transients come from caller storage (IREE's `hal.tensor.transients`, what the
`iree.abi.transients` argument attribute makes) has no dealloca: the same build took 70 us a
call in loops (benchmarks/investigations/transient_storage.py).

The twin is made at the matching stage, after the replacements (the ABI's wrappers are there
already): a copy of NAME$async with a `!hal.buffer` argument before its two fences and each
tensor the final barrier joins annotated as made in that storage, as IREE's WrapEntryPoints
does for `iree.abi.transients`. NAME$async itself stays as it was, so IREE's own tools and
callers keep the ABI they know. The module is compiled with indirect command buffers forced
(`FLAGS`), which keeps the twin's dispatches recorded once (memoized) as NAME$async's are.

Where a function cannot have a twin (dynamic result shapes, no final barrier, a form this
module does not know), it keeps NAME$async alone and `twins` says why; the run side
(run/model.py) uses a twin only where IREE reports its storage size as a constant."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kitdispatch.describe.names import ASYNC_SUFFIX, TRANSIENTS_SUFFIX
from kitdispatch.run.module import transients_size

# The final compile of a module with twins (the baseline keeps IREE's defaults).
FLAGS = ("--iree-hal-force-indirect-command-buffers=true",)
STORAGE = "%kit_transients"

# A public function's first line as iree-opt prints it: @NAME$async, or @"NAME$async" where NAME
# is no bare identifier (an ONNX graph named "rms-norm v2").
_HEADER = re.compile(r"^  util\.func public @(?:(?P<name>[\w$.\-]+)|\"(?P<quoted>[^\"\\]+))\$async\"?\((?P<args>.*?)\) -> (?P<rest>.*)$")
_BARRIER = re.compile(r"^(?P<indent>\s*)(?P<result>%[\w#:$.\-]+) = hal\.tensor\.barrier join\((?P<values>.*?) : (?P<types>.*?)\) => "
                      r"(?P<fence>%[\w$.\-]+) : !hal\.fence(?P<tail>.*)$")


@dataclass(frozen=True)
class Twins:
    """What add_twins did: the public names that have a twin, and why the others have none."""

    text: str
    names: tuple[str, ...]
    reasons: dict[str, str]

    def sized(self, vmfb: Path) -> "Twins":
        """The twins that serve once compiled into `vmfb`: those whose storage IREE sized as a
        constant (the run side reads it); the others join the reasons."""
        sizes = constant_sizes(vmfb, self.names)
        dynamic = {n: f"IREE sizes its transient storage only at run time (dynamic shapes): calls run through {n}{ASYNC_SUFFIX}"
                   for n, size in sizes.items() if size is None}
        return Twins(self.text, tuple(n for n in self.names if n not in dynamic), self.reasons | dynamic)


def add_twins(text: str) -> Twins:
    """`text` (a module at the matching stage, as iree-opt prints it) with a twin after each
    coarse-fences NAME$async that can have one."""
    lines = text.split("\n")
    out: list[str] = []
    names: list[str] = []
    reasons: dict[str, str] = {}
    i = 0
    while i < len(lines):
        match = _HEADER.match(lines[i])
        if match is None or 'iree.abi.model = "coarse-fences"' not in match["rest"]:
            if lines[i].startswith("  util.func public @") and 'iree.abi.model = "coarse-fences"' in lines[i]:
                reasons[lines[i].split("@", 1)[1].split("(", 1)[0]] = "its first line is not in the form the kit reads"
            out.append(lines[i])
            i += 1
            continue
        end = _function_end(lines, i)
        body = lines[i:end + 1]
        out += body
        name = match["name"] or match["quoted"]
        try:
            out += _twin(body, match, name)
            names.append(name)
        except _NoTwin as exc:
            reasons[name] = str(exc)
        i = end + 1
    return Twins("\n".join(out), tuple(names), reasons)


class _NoTwin(Exception):
    """Why a function gets no twin."""


def constant_sizes(vmfb: Path, names: Sequence[str]) -> dict[str, int | None]:
    """Each twin's storage size as IREE's reflection states it in the compiled module (the bytes,
    or None where IREE sizes it only at run time: dynamic input shapes), read as the run side
    reads it."""
    import iree.runtime as rt

    module = rt.VmModule.mmap(rt.VmInstance(), str(vmfb))
    sizes: dict[str, int | None] = {}
    for name in names:
        function = module.lookup_function(name + TRANSIENTS_SUFFIX)
        sizes[name] = transients_size(function, f"{vmfb}: {name}{TRANSIENTS_SUFFIX}") if function is not None else None
    return sizes


def _function_end(lines: list[str], start: int) -> int:
    """The line that closes the function opened at `start` (its `  }` at the module's indent)."""
    for j in range(start + 1, len(lines)):
        if lines[j].startswith("  }"):
            return j
    return len(lines) - 1


def _twin(body: list[str], header: re.Match, name: str) -> list[str]:
    args = _split_top(header["args"])
    if len(args) < 2 or not all(": !hal.fence" in a for a in args[-2:]):
        raise _NoTwin(f"its last two arguments are not fences ({header['args']})")
    if any(STORAGE in line for line in body):
        raise _NoTwin(f"it already uses the name {STORAGE}")
    barriers = [k for k, line in enumerate(body) if " = hal.tensor.barrier join(" in line]
    if len(barriers) != 1:
        raise _NoTwin(f"it has {len(barriers)} hal.tensor.barrier ops; a twin needs the one that signals its results")
    k = barriers[0]
    barrier = _BARRIER.match(body[k])
    signal = args[-1].split(":")[0].strip()
    if barrier is None or barrier["fence"] != signal:
        raise _NoTwin("its barrier is not the one that signals the function's fence")
    values, types = _split_top(barrier["values"]), _split_top(barrier["types"])
    if len(values) != len(types) or any("?" in t for t in types):
        raise _NoTwin("its results have dynamic shapes (the storage size would not be a constant)")
    annotated = [f"{barrier['indent']}{STORAGE}_{n} = hal.tensor.transients {v} : {t} from {STORAGE} : !hal.buffer"
                 for n, (v, t) in enumerate(zip(values, types))]
    joined = ", ".join(f"{STORAGE}_{n}" for n in range(len(values)))
    new_barrier = (f"{barrier['indent']}{barrier['result']} = hal.tensor.barrier join({joined} : {barrier['types']}) => "
                   f"{barrier['fence']} : !hal.fence{barrier['tail']}")
    new_args = ", ".join([*args[:-2], f"{STORAGE}: !hal.buffer", *args[-2:]])
    symbol = f"{name}{TRANSIENTS_SUFFIX}" if header["name"] else f'"{name}{TRANSIENTS_SUFFIX}"'
    first = f"  util.func public @{symbol}({new_args}) -> {header['rest']}"
    return [first, *body[1:k], *annotated, new_barrier, *body[k + 1:]]


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets, parentheses and quotes."""
    parts, depth, quoted, current = [], 0, False, []
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "<([{":
            depth += 1
        elif not quoted and ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0 and not quoted:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


__all__ = ["FLAGS", "Twins", "add_twins", "constant_sizes"]
