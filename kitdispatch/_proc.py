"""Running external tools: argv lists, timeouts, whole process groups killed on timeout."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kitdispatch.errors import ToolError


@dataclass(frozen=True)
class ToolResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def run_tool(
    argv: Sequence[str],
    *,
    timeout: float,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> ToolResult:
    """Runs `argv` in its own process group; kills the whole group when `timeout` passes."""
    argv = [str(a) for a in argv]
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise ToolError(
            f"cannot start {argv[0]!r}: {exc.strerror}",
            argv=argv,
            fix=f"install {Path(argv[0]).name} or put it on PATH",
        ) from exc
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException as exc:
        _kill_group(proc)  # an interrupt too: no tool outlives the build that started it
        if not isinstance(exc, subprocess.TimeoutExpired):
            proc.wait()
            raise
        stdout, stderr = proc.communicate()
        raise ToolError(
            f"{Path(argv[0]).name} did not finish within {timeout:g} s and was killed",
            argv=argv,
            log=(stderr or "") + (stdout or ""),
            fix="raise the timeout (--timeout) or simplify the input",
        ) from None
    return ToolResult(tuple(argv), proc.returncode, stdout, stderr)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_checked(
    argv: Sequence[str],
    *,
    timeout: float,
    what: str,
    fix: str,
    where: str | None = None,
    error: type[ToolError] = ToolError,
) -> ToolResult:
    """`run_tool`, and a kit error carrying the tool's log, exit code and command when it fails."""
    res = run_tool(argv, timeout=timeout)
    if res.returncode != 0:
        raise error(what, where=where, argv=res.argv, returncode=res.returncode, log=res.stderr + res.stdout, fix=fix)
    return res
