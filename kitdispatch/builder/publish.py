"""Publishing a build into its output folder without ever touching a file the kit did not write.

The folder may hold anything of the user's. A build writes a file there only where none exists,
or where the module's previous build record (or the journal of an interrupted publish) lists
that name with the file's current content; it removes only such files (objects of an earlier
build for other architectures). Anything else in the way is an error that names the file.

Publishing: everything is made in a staging folder inside the output folder; then a journal
naming the new files is written, the files are renamed into place, the record is written, stale
files of the previous build are removed, and the journal goes. Readers refuse a folder with a
journal, and check the files they load against the record's hashes, so a killed build is never
mistaken for a complete one. Staging folders of killed builds are removed by the next build:
a live build holds a lock on its own for its whole life, and only unlocked ones go.

Names read from a record or a journal are trusted only as far as the kit can show it wrote
the file (a regular file of the user's own, with one link) and only when they are plain file
names of the folder; the project's own files in the folder are never the kit's.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kitdispatch._files import fsync_dir, is_plain_name, is_temp_file, read_regular_file, write_atomic
from kitdispatch.errors import IreeCompileError, KitError, ToolError
from kitdispatch.describe.record import JOURNAL_SUFFIX, MAX_RECORD_BYTES, MODEL_RECORD_SUFFIX, RECORD_SUFFIX, BuildRecord, RecordError, file_sha256, journal_name, record_name, sha256

STAGING_PREFIX = ".kitdispatch-staging-"
STAGING_MARKER = ".kitdispatch-staging"  # inside each staging folder: proof that the kit made it, and its lock
# A staging folder while it is made (until its lock is held) and while it is removed: a name
# only the kit uses, so that one left by a kill halfway is recognised even when empty.
TRANSIT_PREFIX = ".kitdispatch-transit-"


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


def remove_stale_staging(folder: Path) -> list[Path]:
    """Staging folders of builds that are no longer running. A live build holds a lock on its
    folder's marker for its whole life, which the kernel drops when the build dies (SIGKILL
    too): a folder whose lock can be taken is a dead build's, whatever its pid says (the pid
    of a build in another pid namespace, a container, means nothing here). A folder under the
    transit name (made or removed by a build that was killed meanwhile) goes when it is empty."""
    removed = []
    try:
        candidates = [p for p in folder.iterdir() if p.name.startswith((STAGING_PREFIX, TRANSIT_PREFIX))]
    except OSError:
        return removed
    for path in candidates:
        with _staging_lock(path) as dead:
            if dead:
                _remove_staging(path)  # under the lock: no build can take it meanwhile
                removed.append(path)
            elif path.name.startswith(TRANSIT_PREFIX) and _remove_if_empty(path):
                removed.append(path)
    return removed


def _remove_staging(path: Path) -> None:
    """Renamed to its transit name, emptied with the marker last, then removed: a removal
    killed at any point leaves a folder the next build recognises and finishes."""
    if path.name.startswith(STAGING_PREFIX):
        transit = path.with_name(TRANSIT_PREFIX + path.name[len(STAGING_PREFIX) :])
        try:
            os.rename(path, transit)
            path = transit
        except OSError:
            pass  # removed where it is
    try:
        entries = [e for e in os.scandir(path) if e.name != STAGING_MARKER]
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            _unlink_quietly(Path(entry.path))
    _unlink_quietly(path / STAGING_MARKER)
    _remove_if_empty(path)


def _remove_if_empty(path: Path) -> bool:
    try:
        os.rmdir(path)  # never removes content: fails unless the folder is empty
        return True
    except OSError:
        return False


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


@contextmanager
def _staging_lock(path: Path) -> Iterator[bool]:
    """True while holding the lock of a staging folder the kit made (its marker is a regular
    file, not a link) that no live build holds; False for a live build's, or one not the kit's."""
    try:
        fd = os.open(path / STAGING_MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield False  # no marker: not the kit's (or already gone)
        return
    try:
        held = False
        if stat.S_ISREG(os.fstat(fd).st_mode):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except OSError:
                pass  # a live build holds it
        yield held
    finally:
        os.close(fd)


@contextmanager
def staging_dir(out_dir: Path) -> Iterator[Path]:
    """A scratch folder inside `out_dir` (same filesystem: publishing is a rename), removed on
    exit whatever happens; one left by a SIGKILL is removed by the next build. It is made
    under the transit name and gets its staging name only once this process holds the lock of
    its marker, so no cleaner ever finds a live build's staging folder unlocked."""
    tmp, lock = _locked_staging(out_dir)
    try:
        yield tmp
    finally:
        _remove_staging(tmp)
        os.close(lock)  # after the removal: the folder is never unlocked while it exists


def _locked_staging(out_dir: Path) -> tuple[Path, int]:
    for attempt in range(3):
        try:
            made = Path(tempfile.mkdtemp(prefix=f"{TRANSIT_PREFIX}{os.getpid()}.", dir=out_dir))
            lock = os.open(made / STAGING_MARKER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileNotFoundError as exc:
            if attempt < 2 and os.path.isdir(out_dir):
                continue  # another build's cleaner took the folder while it was still empty
            raise os_error(exc, f"cannot write in the output folder {out_dir}") from None
        except OSError as exc:
            raise os_error(exc, f"cannot write in the output folder {out_dir}") from None
        staged = made.with_name(STAGING_PREFIX + made.name[len(TRANSIT_PREFIX) :])
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            os.rename(made, staged)
            return staged, lock
        except OSError as exc:
            os.close(lock)
            _remove_staging(made)
            if isinstance(exc, FileNotFoundError) and attempt < 2:
                continue  # a cleaner took it in the instant before the lock: make another
            raise os_error(exc, f"cannot write in the output folder {out_dir}") from None
    raise AssertionError("unreachable")


def keep_staged(stage: Path) -> Path:
    """Moves what a failing step read out of the staging folder (which is removed) into a
    temp folder of its own, and returns it: the output folder stays untouched."""
    keep = Path(tempfile.mkdtemp(prefix="kitdispatch-failed-"))
    for f in stage.iterdir():
        if not f.name.startswith("."):  # the staging folder's marker and lock stay
            shutil.move(str(f), keep / f.name)
    return keep


def keep_for_rerun(exc: ToolError, stage: Path, *, kept: str) -> IreeCompileError:
    """`exc` of a tool run in `stage`, with its inputs kept (`keep_staged`) and every path in
    its command, log and location moved with them, so the printed command re-runs as it is.
    `kept` says what was kept, for the fix."""
    keep = keep_staged(stage)

    def moved(text: str) -> str:  # a worker names the stage by its absolute path
        return text.replace(str(stage.absolute()), str(keep)).replace(str(stage), str(keep))

    return IreeCompileError(
        exc.what,
        where=moved(exc.where or "") or None,
        argv=[moved(a) for a in exc.argv or []],
        returncode=exc.returncode,
        log=moved(exc.log),
        fix=f"{exc.fix + '; ' if exc.fix else ''}{kept} are kept in {keep}",
    )


class OutputFolder:
    """One module's files in one output folder, and what the kit may do to them.

    `record` names the file that lists what the build wrote (default: the module's build
    record); `claims` reads that list ({name: sha256}) from it. `protected` names the project's
    own files in this folder (its manifest, sources, reference): never the kit's, whatever a
    record says. A record or journal is acted on only when the kit can show it wrote it (see
    `_check_written_by_kit`), and every name in it must be a plain file name of this folder."""

    def __init__(self, out_dir: Path, module: str, *, record: str | None = None, claims: Callable[[Path], dict[str, str]] | None = None, protected: Iterable[str] = ()) -> None:
        self.dir = Path(out_dir)
        self.module = module
        self.record = record or record_name(module)
        self.journal = f".{self.record}{JOURNAL_SUFFIX}" if record else journal_name(module)
        self._claims = claims or _claimed_files
        self.protected = frozenset(protected)
        self.owned = self._owned()

    def _owned(self) -> dict[str, set[str]]:
        """Names the kit wrote here for this module -> the contents (hashes) it wrote."""
        owned: dict[str, set[str]] = {}
        record = self.dir / self.record
        if _present(record):
            _check_written_by_kit(record, "build record")
            try:
                previous = self._claims(record)
            except RecordError as exc:
                raise OutputError(
                    f"{record} is not a build record this kitdispatch can read ({exc.what}), so the "
                    "files beside it cannot be told apart from yours",
                    where=str(record),
                    fix="move the folder's old build away (or delete it yourself), or build into another folder",
                ) from None
            self._add_claims(owned, previous, record)
            owned.setdefault(self.record, set()).add(ANY_CONTENT)  # it read as the kit's record
        journal = self.dir / self.journal
        if _present(journal):  # an interrupted publish: its files are the kit's too
            _check_written_by_kit(journal, "publishing journal")
            self._add_claims(owned, _journal_files(journal), journal)
        return owned

    def _add_claims(self, owned: dict[str, set[str]], claims: dict[str, str], source: Path) -> None:
        for name, digest in claims.items():
            _check_claim(name, source)
            if name not in self.protected:  # a record never makes the project's own file the kit's
                owned.setdefault(name, set()).add(digest)

    def check_conflicts(self, outputs: dict[str, bytes]) -> None:
        """Every output name is free, identical already, or the kit's own unchanged file; none
        is a file of the project itself or of another module's build in this folder."""
        others = _claims_of_other_builds(self.dir, {self.record, self.journal})
        for name, data in outputs.items():
            path = self.dir / name
            if name in self.protected:
                raise OutputError(
                    f"the build's output {name!r} would take the place of the project's own file {path}",
                    fix="build into another folder (-o), or rename the module or the file",
                )
            if name in others:
                raise OutputError(
                    f"{path} belongs to the build recorded in {self.dir / others[name]}; two modules built into "
                    "one folder must not share a file",
                    fix="build each module into a folder of its own (`kitdispatch build A B -o DIR` makes one per module)",
                )
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
        if _present(self.dir / self.journal) or not (self.dir / self.record).is_file():
            return False
        names = set(outputs)
        stale = [n for n in self.owned if n not in names and n != self.record]
        if any(_present(self.dir / n) for n in stale):
            return False
        for name, data in outputs.items():
            try:
                if read_regular_file(self.dir / name, limit=len(data)) != data:
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
            # Written in the staging folder and renamed: a kill mid-write leaves nothing here.
            write_atomic(stage / self.journal, json.dumps({"files": files}).encode())
            os.replace(stage / self.journal, self.dir / self.journal)
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
            if name in keep or name == self.record or name in self.protected or not _is_regular(path):
                continue
            if _digest(path) in digests or ANY_CONTENT in digests:
                path.unlink()
                removed.append(name)
        return removed


ANY_CONTENT = "*"


def _present(path: Path) -> bool:
    return os.path.lexists(path)


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _check_written_by_kit(path: Path, what: str) -> None:
    """What the kit can show of a record or journal it wrote: a regular file (not a link),
    owned by the user who builds (another user of a shared folder cannot plant one), with no
    second name (the kit writes them by rename, never links them). Anything else is reported
    and nothing it names is touched."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise os_error(exc, f"cannot read the {what} {path}") from None
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = "it is not a regular file"
    elif hasattr(os, "getuid") and st.st_uid != os.getuid():
        why = f"it belongs to another user (uid {st.st_uid})"
    elif st.st_nlink != 1:
        why = f"it has {st.st_nlink} hard links"
    if why is not None:
        raise OutputError(
            f"{path} is not a {what} kitdispatch can show it wrote ({why}), so it acts on none of the files "
            "it names; nothing in the folder was changed",
            fix="build into a folder of your own, or remove that file yourself if you know where it came from",
        )


_KIT_INTERNAL = (STAGING_PREFIX, STAGING_MARKER, TRANSIT_PREFIX)


def _check_claim(name: str, source: Path) -> None:
    """A name a record or journal claims: a plain file name of its folder, never one of the
    kit's own bookkeeping files, so acting on it cannot reach outside the folder."""
    bad = (
        not is_plain_name(name)
        or name.startswith(_KIT_INTERNAL)
        or name.endswith(JOURNAL_SUFFIX)
        or is_temp_file(name)
    )
    if bad:
        raise OutputError(
            f"{source} names {name!r}, which is not a plain file name of its folder; kitdispatch did not write "
            "it, so it acts on none of the files it names and nothing in the folder was changed",
            fix=f"remove {source.name} yourself if you know where it came from, or build into another folder",
        )


def _journal_files(path: Path) -> dict[str, str]:
    try:
        entries = json.loads(read_regular_file(path, limit=MAX_RECORD_BYTES))["files"]
        if isinstance(entries, dict) and all(isinstance(v, str) for v in entries.values()):
            return entries
    except (OSError, ValueError, KeyError, TypeError):
        pass
    raise OutputError(
        f"{path} is not a publishing journal kitdispatch wrote (the kit writes it whole, by rename); "
        "nothing in the folder was changed",
        fix=f"remove {path.name} yourself if you know where it came from, or build into another folder",
    )


def _claims_of_other_builds(folder: Path, mine: set[str]) -> dict[str, str]:
    """Files other builds in this folder list (other modules' records and journals) -> the
    list's name. Read as plain JSON: they are only refused, never acted on."""
    claims: dict[str, str] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return claims
    for name in names:
        if name in mine or not name.endswith((RECORD_SUFFIX, MODEL_RECORD_SUFFIX, JOURNAL_SUFFIX)):
            continue
        try:
            files = json.loads(read_regular_file(folder / name, limit=MAX_RECORD_BYTES)).get("files")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(files, dict):
            claims.update({str(f): name for f in files if str(f) != name})
    return claims


def _claimed_files(path: Path) -> dict[str, str]:
    """The files a previous record claims (a journal beside it is handled by the caller).
    Records of schema 1 (kitdispatch 0.1) listed their files without hashes: what they name
    is taken as the kit's whatever its content, so folders built before stay usable."""
    try:
        raw = read_regular_file(path, limit=MAX_RECORD_BYTES)
    except OSError as exc:
        raise RecordError(f"it cannot be read: {exc.strerror}", where=str(path)) from None
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


class DiskFull(OutputError):
    """The output folder's disk (or quota) is full: the build failed, the input was fine."""

    exit_code = 1


FULL_BELOW = 1 << 20  # free bytes under which a tool's failure to write is taken as a full disk


def disk_full(folder: Path, log: str = "") -> bool:
    """After a tool failed writing into `folder`: was it the disk? (IREE aborts, or crashes
    its worker, on a write error, and its message may be lost.)"""
    if "No space left on device" in log or "Disk quota exceeded" in log:
        return True
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < FULL_BELOW


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
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"{what}: disk full ({exc.strerror or exc})", where=where, fix=fixes[exc.errno])
    return OutputError(f"{what}: {exc.strerror or exc}", where=where, fix=fixes.get(exc.errno, "check the folder and try again"))
