"""Atomic file output: nothing half-written is ever visible under its final name."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def write_atomic(path: Path, data: bytes | str) -> None:
    """Writes `data` to a temp file beside `path`, fsyncs it, then renames it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would hide outputs from other users
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(Path(tmp))
        raise


@contextmanager
def staging_dir(final_dir: Path) -> Iterator[Path]:
    """A scratch folder beside `final_dir`, removed on exit whatever happens.

    Outputs are made there and published with `publish`, so a failed build leaves
    the output folder as it was.
    """
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.", suffix=".staging", dir=final_dir.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(staged: Path, final_dir: Path, names: list[str]) -> list[Path]:
    """Moves the staged files into `final_dir` by atomic rename, in the order given.

    Callers list the file that marks a complete build (the build record) last.
    """
    final_dir = Path(final_dir)
    final_dir.mkdir(parents=True, exist_ok=True)
    published = []
    for name in names:
        src = staged / name
        with open(src, "rb") as f:
            os.fsync(f.fileno())
        dst = final_dir / name
        os.replace(src, dst)
        published.append(dst)
    return published


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once at import: os.umask is process-wide, not thread-safe
