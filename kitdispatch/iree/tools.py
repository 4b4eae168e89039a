"""Driving iree-compile: the generated MLIR and its objects to a .vmfb."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kitdispatch._tools import find_iree_tool
from kitdispatch._proc import run_tool
from kitdispatch._resources import installed_version
from kitdispatch._workers import POOL
from kitdispatch.compile.archs import Arch
from kitdispatch.describe.limits import IREE_COMPILE_TIMEOUT_S
from kitdispatch.errors import ArchError, IreeCompileError, KitError
from kitdispatch.iree.releases import NEWEST_RELEASE, SUPPORTED_PIN, IreeRelease, release_of

EXCERPT_CONTEXT_LINES = 4


@functools.cache
def installed_release() -> IreeRelease | None:
    """The installed IREE compiler's release; None where no compiler is installed (then the
    MLIR is generated for the newest release). An unsupported version is an error."""
    try:
        version = iree_compiler_version()
    except KitError:  # no compiler here: generating MLIR still works
        return None
    return release_of(version)


def target_release() -> IreeRelease:
    return installed_release() or NEWEST_RELEASE


@dataclass(frozen=True)
class CodegenChoice:
    target: Arch
    note: str | None  # one line for the user when the choice differs from what they asked


def choose_codegen_target(
    archs: Sequence[Arch], override: str | None = None, *, release: IreeRelease | None = None
) -> CodegenChoice:
    """IREE-generated dispatches must run on every requested GPU: compile them for the best
    target the IREE release (default: the installed one) knows at or below the oldest
    requested architecture (PTX runs forward)."""
    release = release or target_release()
    if override:
        target = Arch.parse(override)
        check_codegen_target(target, release)
        return CodegenChoice(target, None)
    oldest = min(archs)
    plain = Arch(oldest.major, oldest.minor)
    candidates = [t for t in release.codegen_targets if t <= plain]
    if not candidates:
        # Hand-written kernels do not care; an IREE-generated dispatch would not run there.
        lowest = min(release.codegen_targets)
        return CodegenChoice(
            lowest,
            f"IREE {release.name} has no codegen target at or below {oldest.name}; IREE-generated "
            f"dispatches use {lowest.name} and will not run on {oldest.name} (custom kernels keep their own objects)",
        )
    best = max(candidates)
    note = None
    if best != plain:
        note = (
            f"IREE {release.name} has no codegen target for {oldest.name}; "
            f"IREE-generated dispatches use {best.name} (custom kernels keep their own objects)"
        )
    return CodegenChoice(best, note)


def check_codegen_target(target: Arch, release: IreeRelease | None = None) -> None:
    """Refuses a target that would abort iree-compile, and the Python process linking in process."""
    release = release or target_release()
    if target in release.crashing_targets:
        safe = max(t for t in release.codegen_targets if t < target)
        raise ArchError(
            f"IREE {release.name} aborts with an LLVM error when compiling for --iree-cuda-target={target.name}",
            fix=f"pass --codegen-target {safe.name} (its PTX runs on {target.name} too), or use IREE {NEWEST_RELEASE.name}",
        )


def find_tool(name: str) -> str:
    """An IREE tool (iree-compile, iree-opt, iree-benchmark-module, ...), from `_tools.find_tool`;
    the error names the IREE releases kitdispatch supports."""
    return find_iree_tool(name, install=f"pip install '{SUPPORTED_PIN}' (kitdispatch's build extra) and iree-base-runtime of the same release")


def find_iree_compile() -> str:
    return find_tool("iree-compile")


@functools.cache
def iree_compiler_version() -> str:
    """The installed iree-base-compiler's version (part of every link's cache key)."""
    return installed_version("iree-base-compiler", "iree") or _version_from_metadata() or _version_from_tool()


def _version_from_metadata() -> str | None:
    try:
        from importlib.metadata import version

        return version("iree-base-compiler")
    except Exception:
        return None


def _version_from_tool() -> str:
    out = run_tool([find_iree_compile(), "--version"], timeout=60).stdout
    m = re.search(r"compiler version (\S+)", out)
    return m.group(1) if m else "unknown"


def target_flags(codegen: Arch, extra: Sequence[str] = ()) -> list[str]:
    """The device and target of every iree-compile run of the kit: a model's stages and its
    baseline take only these (IREE's defaults otherwise: the baseline is IREE alone)."""
    check_codegen_target(codegen)
    return ["--iree-hal-target-device=cuda", f"--iree-cuda-target={codegen.name}", *extra]


# What a kit module's link adds to the target (part of every link's cache key, in this order).
LINK_FLAGS = (
    # Const-eval JIT-runs constant subgraphs on the host at compile time; a custom CUDA
    # dispatch whose inputs are all constant (e.g. a kernel function with no tensor
    # arguments) crashes iree-compile 3.13 in LinkExecutables when it tries.
    "--iree-opt-const-eval=false",
    # IREE demotes f64 to f32 by default; a hand-written kernel that takes double* must
    # get the f64 buffers it was written for.
    "--iree-input-demote-f64-to-f32=false",
)


def iree_flags(codegen: Arch, extra: Sequence[str] = ()) -> list[str]:
    """The flags every link uses, in process or as a subprocess."""
    return target_flags(codegen, [*LINK_FLAGS, *extra])


def compile_args(mlir: Path, vmfb: Path, codegen: Arch, object_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    return [
        find_iree_compile(),
        str(mlir),
        *iree_flags(codegen, extra),
        f"--iree-hal-executable-object-search-path={object_dir}",
        "-o",
        str(vmfb),
    ]


def link_in_worker(mlir_text: str, stage: Path, vmfb: Path, codegen: Arch, extra: Sequence[str], *, timeout: float) -> tuple[bool, str]:
    """Links through IREE's compiler API in a worker process (`_workers`): it saves the ~0.2 s
    each iree-compile process spends loading the compiler library (0.25 s against 0.43 s a
    module, measured), and a link that hangs is killed at `timeout`. The objects are files in
    `stage`, named relative to it.

    Returns (ok, what the compiler printed). On failure the caller runs iree-compile as a
    subprocess, which gives the full log and a command to re-run.
    """
    stage, vmfb = Path(stage).resolve(), Path(vmfb).resolve()  # the worker's folder is not ours
    request = {
        "mlir": mlir_text,
        "buffer_name": vmfb.with_suffix(".mlir").name,
        "output": str(vmfb),
        "flags": iree_flags(codegen, extra),
        "cwd": str(stage),
    }
    reply = POOL.call("iree_link", request, timeout=timeout, what=f"linking {vmfb.name}", argv=compile_args(stage / request["buffer_name"], vmfb, codegen, stage, extra))
    return reply["ok"], reply["log"]


def compile_vmfb(argv: list[str], mlir: Path, *, timeout: float = IREE_COMPILE_TIMEOUT_S) -> str:
    """Runs iree-compile; returns what it printed on success (warnings)."""
    res = run_tool(argv, timeout=timeout)
    if res.returncode != 0:
        log = res.stderr + res.stdout
        raise IreeCompileError(
            "iree-compile rejected the generated MLIR",
            where=_first_location(log, mlir),
            argv=argv,
            returncode=res.returncode,
            log=_excerpt(log, mlir) + _trim(log),
            fix="check the kernel description; if it looks right, report the excerpt as a kitdispatch bug",
        )
    return res.stderr


_ERROR_RE = re.compile(r"^(?P<file>[^\n:]+):(?P<line>\d+):(?P<col>\d+): error: (?P<msg>.*)$", re.M)


def _first_location(log: str, mlir: Path) -> str | None:
    m = _ERROR_RE.search(log)
    return f"{m.group('file')}:{m.group('line')}:{m.group('col')}" if m else str(mlir)


def _excerpt(log: str, mlir: Path) -> str:
    """The generated MLIR around the first error, with line numbers and a caret."""
    m = _ERROR_RE.search(log)
    if not m or Path(m.group("file")).name != mlir.name:
        return ""
    try:
        lines = mlir.read_text().splitlines()
    except OSError:
        return ""
    line, col = int(m.group("line")), int(m.group("col"))
    lo, hi = max(1, line - EXCERPT_CONTEXT_LINES), min(len(lines), line + EXCERPT_CONTEXT_LINES)
    width = len(str(hi))
    out = [f"generated MLIR around {mlir.name}:{line}: {m.group('msg')}"]
    for n in range(lo, hi + 1):
        mark = ">" if n == line else " "
        out.append(f"{mark}{n:>{width}} | {lines[n - 1]}")
        if n == line:
            out.append(" " * (width + 4) + " " * (col - 1) + "^")
    return "\n".join(out) + "\n\niree-compile output:\n"


def _trim(log: str, limit: int = 60) -> str:
    """iree-compile dumps whole operations after notes; the first lines say what matters."""
    lines = log.splitlines()
    if len(lines) <= limit:
        return log
    return "\n".join(lines[:limit]) + f"\n... ({len(lines) - limit} more lines)"
