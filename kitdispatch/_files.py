"""Atomic file output: nothing half-written is ever visible under its final name.

Temp files carry the writer's pid in their name, so leftovers of a killed process can be told
from files another process is still writing (`remove_stale_temp_files`).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
import time
from pathlib import Path

TEMP_SUFFIX = ".kdtmp"
_TEMP_RE = re.compile(r"^\..+\.(\d+)\.[^.]+" + re.escape(TEMP_SUFFIX) + r"\Z")


def write_atomic(path: Path, data: bytes | str) -> None:
    """Writes `data` to a temp file beside `path`, fsyncs it, then renames it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=TEMP_SUFFIX, dir=path.parent)
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


def fsync_dir(folder: Path) -> None:
    """Makes renames inside `folder` durable (a crash must not undo a publish)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def is_plain_name(name: object) -> bool:
    """A file name inside one folder: no path, no parent, no NUL, short enough to exist."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
        and len(name.encode(errors="surrogateescape")) <= 255
    )


def is_temp_file(name: str) -> bool:
    """A write_atomic temp file (of this or another process)."""
    return _TEMP_RE.match(name) is not None


def remove_stale_temp_files(folder: Path, *, min_age_s: float = 60.0) -> int:
    """Removes write_atomic temp files in `folder` whose writer is gone (killed mid-write)."""
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        m = _TEMP_RE.match(name)
        if not m or pid_alive(int(m.group(1))):
            continue
        path = Path(folder) / name
        try:
            st = path.lstat()
            if stat.S_ISREG(st.st_mode) and time.time() - st.st_mtime >= min_age_s:
                path.unlink()
                removed += 1
        except OSError:
            pass
    return removed


# The largest source, header, manifest or MLIR file the kit reads into memory: a sparse file of
# 100 GB behind an `#include` (even under `#if 0`, which the cache key follows) would not fit.
MAX_TEXT_BYTES = 64 << 20


def open_regular(path: Path):
    """`path` opened for reading as a binary file, refusing anything but a regular file: opening
    a FIFO or a device would block forever or read without end. The open itself cannot block
    (O_NONBLOCK), and the kind is checked on what was opened, so a swap after a stat is caught.
    Raises OSError (ENOENT, or NotRegularFile)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
            raise NotRegularFile(kind, str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: Path, *, limit: int | None = MAX_TEXT_BYTES) -> bytes:
    """The bytes of `path` (see `open_regular`); a file over `limit` bytes would not fit in
    memory and is refused unread (FileTooLarge, an OSError EFBIG)."""
    with open_regular(Path(path)) as f:
        size = os.fstat(f.fileno()).st_size
        if limit is not None and size > limit:
            raise FileTooLarge(size, limit, str(path))
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:  # it grew since the fstat
        raise FileTooLarge(len(data), limit, str(path))
    return data


class FileTooLarge(OSError):
    def __init__(self, size: int, limit: int, filename: str) -> None:
        what = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
        super().__init__(errno.EFBIG, f"is {size} bytes, over the {what} kitdispatch reads", filename)
        self.kind = f"{size} bytes, over the {what} kitdispatch reads"


def not_an_option(path: Path) -> Path:
    """`path` as a tool's argument: a relative path that starts with `-` (`Path` drops the
    `./` a user wrote before it) would be read as an option; absolute, it cannot be."""
    path = Path(path)
    return path.absolute() if str(path).startswith("-") else path


class NotRegularFile(OSError):
    def __init__(self, kind: str, filename: str) -> None:
        super().__init__(22, f"is {kind}", filename)
        self.kind = kind


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
