"""The kit's one exception family.

Every error says what failed, where, and what to do about it. Tool failures carry the
tool's log, exit code and the exact command to re-run.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence


# What IREE's Python bindings raise for a failed status (runtime/bindings/python/status_utils.cc):
# ValueError (INVALID_ARGUMENT, NOT_FOUND), IndexError (OUT_OF_RANGE), NotImplementedError
# (UNIMPLEMENTED, a RuntimeError) and RuntimeError for every other code.
IREE_STATUS_ERRORS = (RuntimeError, ValueError, IndexError)


class KitError(Exception):
    """Base of every error kitdispatch raises on purpose."""

    exit_code = 1

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.where}: {self.what}" if self.where else self.what
        return f"{head}\n  fix: {self.fix}" if self.fix else head


class ManifestError(KitError):
    """The kernel description (TOML manifest or Python API) is wrong."""

    exit_code = 2


class ArchError(KitError):
    """An architecture name is unknown or the chosen compiler cannot target it."""

    exit_code = 2


class UsageError(KitError):
    """The command or call was given something it cannot use (an option, a device)."""

    exit_code = 2


class AbiError(KitError):
    """The declared layout does not match the compiled kernel."""


class ToolError(KitError):
    """An external tool (NVRTC, nvcc, iree-compile, iree-run-module) failed."""

    def __init__(
        self,
        what: str,
        *,
        argv: Sequence[str] | None = None,
        returncode: int | None = None,
        log: str = "",
        where: str | None = None,
        fix: str | None = None,
    ):
        self.argv = list(argv) if argv else None
        self.returncode = returncode
        self.log = log
        super().__init__(what, where=where, fix=fix)

    def render(self) -> str:
        parts = [super().render()]
        if self.returncode is not None:
            parts.append(f"  exit code: {self.returncode}")
        if self.argv:
            parts.append(f"  re-run: {shlex.join(self.argv)}")
        if self.log.strip():
            parts.append("  log:\n" + _indent(self.log.rstrip(), "    "))
        return "\n".join(parts)


class CompileError(ToolError):
    """A CUDA compiler rejected a kernel source."""


class IreeCompileError(ToolError):
    """iree-compile rejected the generated MLIR."""


class BuildsFailed(KitError):
    """Several modules of one multi-module build failed; each failure is kept whole."""

    def __init__(self, failures: Sequence[tuple[str, KitError]], total: int):
        self.failures = tuple(failures)
        self.exit_code = max(exc.exit_code for _, exc in self.failures)
        super().__init__(f"{len(self.failures)} of {total} modules failed")

    def render(self) -> str:
        return "\n".join([f"{self.what}:"] + [f"[{name}] {exc.render()}" for name, exc in self.failures])


class RuntimeUnavailable(KitError):
    """No CUDA device or no IREE runtime: GPU work cannot run here."""

    exit_code = 3


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())
