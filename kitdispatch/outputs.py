"""Publishing a build into its output folder without ever touching a file the kit did not write.

The folder may hold anything of the user's. A build writes a file there only where none exists,
or where the module's previous build record (or the journal of an interrupted publish) lists
that name with the file's current content; it removes only such files (objects of an earlier
build for other architectures). Anything else in the way is an error that names the file.

Publishing: everything is made in a staging folder inside the output folder; then a journal
naming the new files is written, the files are renamed into place, the record is written, stale
files of the previous build are removed, and the journal goes. Readers refuse a folder with a
journal, and check the files they load against the record's hashes, so a killed build is never
mistaken for a complete one. Staging folders of killed builds are removed by the next build.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ._files import fsync_dir, pid_alive, write_atomic
from .errors import KitError
from .record import JOURNAL_SUFFIX, BuildRecord, RecordError, file_sha256, journal_name, record_name, sha256

STAGING_PREFIX = ".kitdispatch-staging-"
STAGING_MARKER = ".kitdispatch-staging"  # inside each staging folder: proof that the kit made it


class OutputError(KitError):
    """The output folder cannot be used as asked."""

    exit_code = 2


@dataclass(frozen=True)
class Published:
    written: tuple[str, ...]  # names replaced or created
    removed: tuple[str, ...]  # stale files of the previous build
    untouched: bool  # nothing differed: the folder was left exactly as it was


def prepare_output_dir(out_dir: Path) -> bool:
    """Creates `out_dir` if needed (returns True if it did) and removes staging folders that
    killed builds left in it. A path that is a file, or cannot be created, is an OutputError."""
    out_dir = Path(out_dir)
    _check_path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"the output path {out_dir} is a file, not a folder", fix="pass a folder with -o")
    created = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(exc, f"cannot create the output folder {out_dir}") from None
    remove_stale_staging(out_dir)
    return created


def remove_stale_staging(folder: Path, *, min_age_s: float = 0.0) -> list[Path]:
    """Staging folders of builds that are no longer running (their pid is in the name, and the
    marker inside proves the kit made them)."""
    removed = []
    try:
        candidates = [p for p in folder.iterdir() if p.name.startswith(STAGING_PREFIX)]
    except OSError:
        return removed
    for path in candidates:
        pid = _pid_of(path.name)
        if pid is None or pid_alive(pid) or not (path / STAGING_MARKER).is_file():
            continue
        try:
            if time.time() - path.stat().st_mtime < min_age_s:
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _pid_of(name: str) -> int | None:
    head = name[len(STAGING_PREFIX) :].split(".", 1)[0]
    return int(head) if head.isdigit() else None


@contextmanager
def staging_dir(out_dir: Path) -> Iterator[Path]:
    """A scratch folder inside `out_dir` (same filesystem: publishing is a rename), removed on
    exit whatever happens; one left by a SIGKILL is removed by the next build."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}.", dir=out_dir))
        (tmp / STAGING_MARKER).write_bytes(b"")
    except OSError as exc:
        raise os_error(exc, f"cannot write in the output folder {out_dir}") from None
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class OutputFolder:
    """One module's files in one output folder, and what the kit may do to them.

    `record` names the file that lists what the build wrote (default: the module's build
    record); `claims` reads that list ({name: sha256}) from it."""

    def __init__(self, out_dir: Path, module: str, *, record: str | None = None, claims=None) -> None:
        self.dir = Path(out_dir)
        self.module = module
        self.record = record or record_name(module)
        self.journal = f".{self.record}{JOURNAL_SUFFIX}" if record else journal_name(module)
        self._claims = claims or _claimed_files
        self.owned = self._owned()

    def _owned(self) -> dict[str, set[str]]:
        """Names the kit wrote here for this module -> the contents (hashes) it wrote."""
        owned: dict[str, set[str]] = {}
        record = self.dir / self.record
        if record.exists():
            try:
                previous = self._claims(record)
            except RecordError as exc:
                raise OutputError(
                    f"{record} is not a build record this kitdispatch can read ({exc.what}), so the "
                    "files beside it cannot be told apart from yours",
                    where=str(record),
                    fix="move the folder's old build away (or delete it yourself), or build into another folder",
                ) from None
            for name, digest in previous.items():
                owned.setdefault(name, set()).add(digest)
            owned.setdefault(self.record, set()).add(ANY_CONTENT)  # it read as the kit's record
        journal = self.dir / self.journal
        if journal.is_file():  # an interrupted publish: its files are the kit's too
            try:
                entries = json.loads(journal.read_bytes())["files"]
                for name, digest in entries.items():
                    owned.setdefault(str(name), set()).add(str(digest))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                pass  # a journal torn by the kill: what it named is simply not claimed
        return owned

    def check_conflicts(self, outputs: dict[str, bytes]) -> None:
        """Every output name is free, identical already, or the kit's own unchanged file."""
        for name, data in outputs.items():
            path = self.dir / name
            if not path.exists() and not path.is_symlink():
                continue
            if path.is_symlink() or not path.is_file():
                raise OutputError(
                    f"{path} is in the way of the build's output {name!r} and is not a regular file",
                    fix="move it away, or build into another folder",
                )
            digest = _digest(path)
            claimed = self.owned.get(name, ())
            if digest == sha256(data) or digest in claimed or ANY_CONTENT in claimed:
                continue
            if name in self.owned:
                raise OutputError(
                    f"{path} was changed since kitdispatch wrote it; the build would overwrite your change",
                    fix="move your version away, or build into another folder",
                )
            raise OutputError(
                f"{path} exists and was not written by kitdispatch; the build would overwrite it",
                fix=f"rename your file, build into another folder, or rename the module (its outputs are named {self.module}.*)",
            )

    def unchanged(self, outputs: dict[str, bytes]) -> bool:
        """The folder already holds exactly this build (a rebuild with nothing new)."""
        if (self.dir / self.journal).exists() or not (self.dir / self.record).is_file():
            return False
        names = set(outputs)
        stale = [n for n in self.owned if n not in names and n != self.record]
        if any((self.dir / n).exists() for n in stale):
            return False
        for name, data in outputs.items():
            try:
                path = self.dir / name
                if path.stat().st_size != len(data) or path.read_bytes() != data:
                    return False
            except OSError:
                return False
        return True

    def publish(self, stage: Path, outputs: dict[str, bytes]) -> Published:
        """Moves the staged outputs into place; the record (the last entry of `outputs`) last.
        Builds publishing into one folder at once take turns (a lock on the folder itself, which
        the kernel drops when its holder dies: no lock file is left behind)."""
        with _folder_lock(self.dir):
            self.owned = self._owned()  # what the build that published last wrote
            return self._publish(stage, outputs)

    def _publish(self, stage: Path, outputs: dict[str, bytes]) -> Published:
        if self.unchanged(outputs):
            return Published((), (), True)
        self.check_conflicts(outputs)
        names = list(outputs)
        assert names[-1] == self.record, "the record is published last"
        try:
            for name in names:
                if not (stage / name).exists():
                    write_atomic(stage / name, outputs[name])
            files = {n: sha256(outputs[n]) for n in names[:-1]}
            write_atomic(self.dir / self.journal, json.dumps({"files": files}).encode())
            for name in names:
                os.replace(stage / name, self.dir / name)
            fsync_dir(self.dir)
            removed = self._remove_stale(set(names))
            (self.dir / self.journal).unlink()
            fsync_dir(self.dir)
        except OSError as exc:
            raise os_error(exc, f"cannot publish the build into {self.dir}") from None
        return Published(tuple(names), tuple(removed), False)

    def _remove_stale(self, keep: set[str]) -> list[str]:
        removed = []
        for name, digests in self.owned.items():
            path = self.dir / name
            if name in keep or name == self.record or not path.is_file() or path.is_symlink():
                continue
            if _digest(path) in digests or ANY_CONTENT in digests:
                path.unlink()
                removed.append(name)
        return removed


ANY_CONTENT = "*"


def _claimed_files(path: Path) -> dict[str, str]:
    """The files a previous record claims (a journal beside it is handled by the caller).
    Records of schema 1 (kitdispatch 0.1) listed their files without hashes: what they name
    is taken as the kit's whatever its content, so folders built before stay usable."""
    raw = path.read_bytes()
    try:
        old = json.loads(raw)
    except ValueError:
        old = None
    if isinstance(old, dict) and old.get("schema") == 1:
        names = [old.get("mlir"), old.get("vmfb"), *(old.get("objects") or []), (old.get("test") or {}).get("reference")]
        return {n: ANY_CONTENT for n in names if isinstance(n, str) and n and "/" not in n}
    return BuildRecord.from_bytes(raw, str(path)).files


@contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError as exc:
        raise os_error(exc, f"cannot open the output folder {folder}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _digest(path: Path) -> str | None:
    try:
        return file_sha256(path)
    except OSError:
        return None


def _check_path(path: Path) -> None:
    if "\0" in str(path):
        raise OutputError(f"the output path {str(path)!r} contains a NUL character", fix="pass a plain folder path")


def os_error(exc: OSError, what: str) -> KitError:
    """An OSError as the kit's error: what, the file, and the usual fix for its errno."""
    fixes = {
        errno.ENOSPC: "free disk space, or build into a folder on another disk",
        errno.EDQUOT: "free space within your quota, or build elsewhere",
        errno.EACCES: "choose a folder you can write, or fix its permissions",
        errno.EPERM: "choose a folder you can write, or fix its permissions",
        errno.EROFS: "the filesystem is read-only: build into a writable folder",
        errno.ENOTDIR: "a part of the path is a file: choose another folder",
        errno.EEXIST: "move the file in the way, or choose another folder",
    }
    where = exc.filename if isinstance(exc.filename, str) else None
    return OutputError(f"{what}: {exc.strerror or exc}", where=where, fix=fixes.get(exc.errno, "check the folder and try again"))
