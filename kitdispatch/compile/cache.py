"""The object cache: compiled objects and linked modules, content-addressed.

Keys are built from labelled, length-prefixed fields (schema, kit version, compiler and its
version, the versions of the header packages it reads, architecture, format, canonical options,
the source and every header it includes, found the way the compiler finds them). Entries are
single files written atomically, checksummed, and holding their own key: an entry that is
corrupt, or that sits under another key than its own, is a miss, never handed to the driver,
and an object is checked to be what its key says (format, architecture) before it is used.
Many processes may share the cache: concurrency rests on atomic rename, so a killed writer
leaves no lock and no visible partial entry (its temp file is removed later).

The cache folder carries a CACHEDIR.TAG naming kitdispatch. A folder that holds other files
and no tag is not used, and eviction and `cache clear` delete only files that are entries
(a kitdispatch header under an entry's name) or jinja2's compiled templates.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import struct
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kitdispatch._version import __version__
from kitdispatch._files import FileTooLarge, is_temp_file, read_regular_file, remove_stale_temp_files, write_atomic
from kitdispatch.compile.archs import Arch
from kitdispatch.compile.compilers import CompileOptions, Compiler, IncludeSearch, ObjectCode
from kitdispatch.errors import KitError, ManifestError

SCHEMA = 2
MAGIC = b"KDC2"
OLD_MAGICS = (b"KDC1",)  # entries of earlier kitdispatch versions: misses, still evictable
TAG_NAME = "CACHEDIR.TAG"
TAG = b"Signature: 8a477f597d28d172789f06886806bc55\n# This is a kitdispatch cache: https://bford.info/cachedir/\n"
KINDS = ("object", "vmfb", "checks")
_KEY_RE = re.compile(r"^[0-9a-f]{64}\Z")
_TEMPLATE_RE = re.compile(r"^__jinja2_[0-9a-f]{40}\.cache\Z")
DEFAULT_MAX_BYTES = 2 * 1024**3
ENV_DIR = "KITDISPATCH_CACHE_DIR"
ENV_MAX_BYTES = "KITDISPATCH_CACHE_MAX_BYTES"

_INCLUDE_RE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*(?:"([^"\n]+)"|<([^>\n]+)>|(\S+))', re.M)


TEMPLATES = "templates"  # beside the entries: jinja2's own checksummed, atomically written files


class CacheWarning(UserWarning):
    """The cache folder is unsafe or unusable; the build goes on without it."""


def default_cache_dir() -> Path:
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    # The XDG spec: a relative XDG_CACHE_HOME is invalid and ignored (it would name a folder
    # under whatever the current folder is).
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "kitdispatch"


# ------------------------------------------------------------------------------- keys


class KeyBuilder:
    """Labelled, length-prefixed fields: no two different field lists hash alike."""

    def __init__(self, kind: str) -> None:
        self._h = hashlib.sha256()
        self.add("schema", str(SCHEMA))
        self.add("kitdispatch", __version__)
        self.add("kind", kind)

    def add(self, label: str, value: str | bytes) -> "KeyBuilder":
        raw = value.encode() if isinstance(value, str) else value
        for part in (label.encode(), raw):
            self._h.update(struct.pack("<Q", len(part)))
            self._h.update(part)
        return self

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class Uncacheable(Exception):
    """The key cannot see everything the compile reads (e.g. a computed #include)."""


def source_closure(source: Path, search: IncludeSearch) -> list[tuple[str, bytes]]:
    """The source and every header it includes, recursively, each found where the compiler
    looks: a quoted include in the including file's folder first, then the -I folders in order
    (for NVRTC these end with the source's folder), then the toolchain's own headers, whose
    package versions are in the key instead of their text.

    A computed include, or a quoted one that resolves nowhere, makes the compile uncacheable.
    An include that is not a regular file (a FIFO would block the compiler) is an error.
    Conditional includes (#if) are followed too: the key may see more than the compile reads,
    never less.
    """
    dirs = [Path(d) for d in search.dirs]
    toolchain = [Path(d) for d in search.toolchain_dirs]
    seen: dict[Path, bytes] = {}
    todo = [source.resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        try:
            seen[path] = _read_included(path, source)
        except FileTooLarge as exc:
            if path == source.resolve():
                raise ManifestError(f"the kernel source {exc.strerror}", where=str(path), fix="split it, or generate less code") from None
            # The compile may never read it (under `#if 0`); the key cannot hold it either.
            raise Uncacheable(f"{path}: {exc.kind}") from None
        for quoted, angled, computed in _INCLUDE_RE.findall(seen[path]):
            if computed:
                raise Uncacheable(f"{path}: computed #include {computed.decode(errors='replace')}")
            name = (quoted or angled).decode(errors="replace")
            candidates = ([path.parent] if quoted else []) + dirs
            found = next((d / name for d in candidates if _exists(d / name)), None)
            if found is not None:
                todo.append(found.resolve())
            elif any(_exists(d / name) for d in toolchain):
                continue  # the toolchain's header: its package version is in the key
            elif quoted:
                raise Uncacheable(f"{path}: #include \"{name}\" not found locally")
    return [(str(p), d) for p, d in seen.items()]  # discovery order: follows content, not paths


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _read_included(path: Path, source: Path) -> bytes:
    try:
        return read_regular_file(path)
    except (FileNotFoundError, FileTooLarge):
        raise  # the compiler reports a missing source best; source_closure decides on a large one
    except OSError as exc:
        what = "kernel source" if path == source.resolve() else f"header {path}, included by the kernel source {source},"
        raise KitError(
            f"the {what} is {getattr(exc, 'kind', exc.strerror)}; reading it would block the build",
            where=str(path),
            fix="include regular files only",
        ) from None


def object_key(
    compiler: str,
    compiler_version: str,
    fmt: str,
    archs: Iterable[Arch],
    options: CompileOptions,
    source: Path,
    search: IncludeSearch,
) -> str:
    key = KeyBuilder("object")
    key.add("compiler", compiler).add("compiler_version", compiler_version).add("format", fmt)
    key.add("header_packages", json.dumps(list(search.header_versions)))
    key.add("archs", ",".join(a.name for a in archs))
    key.add("options", json.dumps(options.flags()))
    key.add("name_expressions", json.dumps(list(options.name_expressions)))
    key.add("bridges", json.dumps(list(options.bridges)))
    for i, (_, data) in enumerate(source_closure(source, search)):
        # Paths stay out: the same text compiles to the same object wherever it lives.
        key.add(f"file{i}", data)
    return key.hexdigest()


# ----------------------------------------------------------------------------- cache


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    uncacheable: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def bump(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)


class Cache:
    """A folder of checksummed entries with a size bound and least-recently-used eviction."""

    def __init__(self, root: Path | None = None, *, max_bytes: int | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.max_bytes = max_bytes or max_bytes_setting()
        self.stats = CacheStats()
        self._warned_write = False
        self.usable = self._check_safe()

    @classmethod
    def disabled(cls) -> "Cache":
        """A cache that stores nothing (--no-cache)."""
        cache = cls.__new__(cls)
        cache.root = Path(os.devnull)
        cache.max_bytes = 0
        cache.stats = CacheStats()
        cache._warned_write = True
        cache.usable = False
        return cache

    # -- safety ----------------------------------------------------------------------

    def _check_safe(self) -> bool:
        if "\0" in str(self.root):
            return self._refuse("contains a NUL character")
        try:
            if self.root.is_symlink():
                return self._refuse("is a symbolic link")
            if self.root.exists() and not self.root.is_dir():
                return self._refuse("is not a folder")
            self.root.parent.mkdir(parents=True, exist_ok=True)
            self.root.mkdir(mode=0o700, exist_ok=True)
            st = self.root.stat()
        except OSError as exc:
            return self._refuse(f"cannot be created: {exc.strerror}")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            return self._refuse(f"belongs to another user (uid {st.st_uid})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return self._refuse(f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")
        return self._claim()

    def _claim(self) -> bool:
        """The folder is the kit's when it carries the tag, or is empty, or holds only the
        kit's own subfolders (a cache of kitdispatch 0.1); otherwise it is someone else's."""
        tag = self.root / TAG_NAME
        if tag.is_file() and _starts_with(tag, TAG):
            return True
        try:
            others = [p.name for p in self.root.iterdir() if p.name not in (*KINDS, TEMPLATES) and not is_temp_file(p.name)]
        except OSError as exc:
            return self._refuse(f"cannot be read: {exc.strerror}")
        if others:
            shown = ", ".join(sorted(others)[:3]) + (" ..." if len(others) > 3 else "")
            return self._refuse(f"holds files kitdispatch did not write ({shown}) and no {TAG_NAME} of its own")
        try:
            write_atomic(tag, TAG)
        except OSError as exc:
            return self._refuse(f"cannot be written: {exc.strerror}")
        return True

    def _refuse(self, why: str) -> bool:
        self.refusal = why
        warnings.warn(
            f"not using the cache {self.root}: it {why}; building without it "
            f"(fix the folder, or point {ENV_DIR} elsewhere)",
            CacheWarning,
            stacklevel=3,
        )
        return False

    refusal: str | None = None

    # -- entries ---------------------------------------------------------------------

    def _path(self, kind: str, key: str) -> Path:
        return self.root / kind / key[:2] / key

    def get(self, kind: str, key: str) -> tuple[dict, bytes] | None:
        """The entry stored under `key`, if it is intact and really is that key's."""
        if not self.usable:
            return None
        path = self._path(kind, key)
        try:
            blob = read_regular_file(path, limit=None)
        except FileNotFoundError:
            self.stats.bump("misses")
            return None
        except OSError:  # a folder or a FIFO where an entry would be: not ours, left alone
            self.stats.bump("corrupt")
            self.stats.bump("misses")
            return None
        entry = _decode(blob)
        if entry is None or entry[0].get("key") != key or entry[0].get("kind") != kind:
            self.stats.bump("corrupt")
            self.stats.bump("misses")
            if blob.startswith(MAGIC):
                _unlink(path)  # the kit's own entry, damaged or misplaced: replaced by the next put
            return None
        self.stats.bump("hits")
        try:
            os.utime(path)  # recency for LRU eviction
        except OSError:
            pass
        return entry

    def put(self, kind: str, key: str, meta: dict, payload: bytes) -> None:
        if not self.usable:
            return
        blob = _encode({**meta, "key": key, "kind": kind}, payload)
        for attempt in range(2):
            try:
                write_atomic(self._path(kind, key), blob)
                break
            except FileNotFoundError:
                if attempt == 0:
                    continue  # `cache clear` removed the entry's folder meanwhile: make it again
                self._warn_write("its folders keep vanishing (a `cache clear` running meanwhile?)")
                return
            except OSError as exc:  # a full disk, a read-only cache...: the build goes on without it
                self._warn_write(exc.strerror or str(exc))
                return
        self.evict()

    def _warn_write(self, why: str) -> None:
        if not self._warned_write:
            self._warned_write = True
            warnings.warn(f"cannot write to the cache {self.root}: {why}; going on without storing", CacheWarning, stacklevel=3)

    @property
    def template_dir(self) -> Path | None:
        """Where the MLIR templates' compiled form is kept (jinja2 bytecode), if anywhere."""
        return self.root / TEMPLATES if self.usable else None

    # -- management ------------------------------------------------------------------

    def entries(self, kind: str | None = None) -> list[Path]:
        """The kit's entries (of one kind, or all): files named by a key, in that key's folder,
        starting with one of the kit's entry headers. Anything else under the cache folder is
        not touched."""
        if not self.usable or not self.root.is_dir():
            return []
        found = []
        for kind in (kind,) if kind else KINDS:
            for path in (self.root / kind).glob("??/*"):
                if _KEY_RE.match(path.name) and path.parent.name == path.name[:2] and _is_entry(path):
                    found.append(path)
        return found

    def size(self) -> int:
        return sum(_size(p) for p in self.entries())

    def evict(self) -> int:
        """Drops least recently used entries until the cache is within its bound, and temp
        files of writers that were killed."""
        for kind in KINDS:
            for folder in (self.root / kind).glob("??"):
                remove_stale_temp_files(folder)
        entries = self.entries()
        total = sum(_size(p) for p in entries)
        if total <= self.max_bytes:
            return 0
        removed = 0
        for path in sorted(entries, key=_mtime):
            if total <= self.max_bytes * 0.9:
                break
            total -= _size(path)
            _unlink(path)
            removed += 1
        return removed

    def clear(self) -> int:
        """Removes every entry and compiled template; nothing else."""
        if not self.usable:
            raise KitError(
                f"{self.root} is not a cache kitdispatch can use ({self.refusal}); nothing was removed",
                fix=f"check the folder; point {ENV_DIR} at kitdispatch's cache",
            )
        entries = self.entries()
        templates = [p for p in (self.root / TEMPLATES).glob("*") if _TEMPLATE_RE.match(p.name) and p.is_file()]
        for path in entries + templates:
            _unlink(path)
        for folder in [*(self.root / k for k in KINDS), self.root / TEMPLATES]:
            for sub in sorted(folder.glob("??"), reverse=True) + [folder]:
                try:
                    sub.rmdir()  # only when empty: a folder holding anything else stays
                except OSError:
                    pass
        return len(entries)

    def info(self) -> dict:
        entries = self.entries()
        return {
            "path": str(self.root),
            "usable": self.usable,
            "entries": len(entries),
            "bytes": sum(_size(p) for p in entries),
            "max_bytes": self.max_bytes,
        }


def max_bytes_setting() -> int:
    raw = os.environ.get(ENV_MAX_BYTES)
    if raw is None or raw.strip() == "":
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value <= 0:
        raise KitError(
            f"{ENV_MAX_BYTES}={raw!r} is not a positive number of bytes",
            fix=f"set it to a byte count such as {DEFAULT_MAX_BYTES}, or unset it",
        )
    return value


def _starts_with(path: Path, prefix: bytes) -> bool:
    try:
        return read_regular_file(path, limit=None)[: len(prefix)] == prefix
    except OSError:
        return False


def _is_entry(path: Path) -> bool:
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return False
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) in (MAGIC, *OLD_MAGICS)
    except OSError:
        return False


def _encode(meta: dict, payload: bytes) -> bytes:
    head = json.dumps(meta, sort_keys=True).encode()
    digest = hashlib.sha256(head + payload).digest()
    return MAGIC + struct.pack("<QQ", len(head), len(payload)) + digest + head + payload


def _decode(blob: bytes) -> tuple[dict, bytes] | None:
    fixed = len(MAGIC) + 16 + 32
    if len(blob) < fixed or not blob.startswith(MAGIC):
        return None
    head_len, payload_len = struct.unpack("<QQ", blob[4:20])
    digest = blob[20:52]
    body = blob[52:]
    if len(body) != head_len + payload_len or hashlib.sha256(body).digest() != digest:
        return None
    try:
        return json.loads(body[:head_len]), body[head_len:]
    except ValueError:
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


# ------------------------------------------------------------------- cached compiler


class CachedCompiler:
    """Any compiler backend behind the cache: same contract, compiles only on a miss."""

    def __init__(self, compiler: Compiler, cache: Cache) -> None:
        self.inner = compiler
        self.cache = cache
        self.name = compiler.name
        self._version = compiler.version()
        self.compiles = 0  # compiler runs, for tests and benchmarks
        self._lock = threading.Lock()

    def version(self) -> str:
        return self._version

    def supported_archs(self) -> tuple[Arch, ...]:
        return self.inner.supported_archs()

    def include_search(self, source: Path, options: CompileOptions) -> IncludeSearch:
        return self.inner.include_search(source, options)

    def compile(self, source: Path, arch: Arch, fmt: str, options: CompileOptions) -> ObjectCode:
        return self._cached(source, (arch,), fmt, options, lambda: self.inner.compile(source, arch, fmt, options))

    def compile_fatbin(self, source: Path, archs: tuple[Arch, ...], options: CompileOptions) -> ObjectCode:
        return self._cached(source, archs, "fatbin", options, lambda: self.inner.compile_fatbin(source, archs, options))

    def lookup(self, source: Path, archs: tuple[Arch, ...], fmt: str, options: CompileOptions) -> ObjectCode | None:
        """The cached object, if there is one: the build asks first, and starts threads
        only for what it must compile."""
        return self._get(source, archs, fmt, self._key(source, archs, fmt, options))

    def _key(self, source: Path, archs: tuple[Arch, ...], fmt: str, options: CompileOptions) -> str | None:
        if not self.cache.usable:
            return None
        try:
            return object_key(self.name, self._version, fmt, archs, options, source, self.inner.include_search(source, options))
        except Uncacheable:
            self.cache.stats.bump("uncacheable")
        except (FileNotFoundError, NotADirectoryError):
            pass  # a missing source: let the compiler report it
        return None

    def _get(self, source: Path, archs: tuple[Arch, ...], fmt: str, key: str | None) -> ObjectCode | None:
        """The entry as an object, only if it is one of `fmt` for `archs` (the key's own)."""
        hit = self.cache.get("object", key) if key is not None else None
        if hit is None:
            return None
        meta, payload = hit
        try:
            data, ptx = payload[: meta["data_len"]], payload[meta["data_len"] :] or None
            if meta["format"] == "ptx" and ptx is None:
                ptx = data  # a bridged PTX object keeps the compiler's PTX after its own
            obj = ObjectCode(
                data, meta["format"], tuple(Arch.parse(a) for a in meta["archs"]), source, self.name, ptx,
                lowered=tuple((str(a), str(b)) for a, b in meta.get("lowered", [])),
                diagnostics=tuple(str(d) for d in meta.get("diagnostics", [])),
            )
        except (KeyError, TypeError, ValueError, KitError):
            obj = None
        if obj is None or obj.format != fmt or obj.archs != tuple(archs) or obj.check_content() is not None:
            self.cache.stats.bump("corrupt")
            return None
        return obj

    def _cached(self, source: Path, archs: tuple[Arch, ...], fmt: str, options: CompileOptions, make: Callable[[], ObjectCode]) -> ObjectCode:
        key = self._key(source, archs, fmt, options)
        found = self._get(source, archs, fmt, key)
        if found is not None:
            return found
        obj = self._run(make)
        if key is not None:
            meta = {
                "format": obj.format,
                "archs": [a.name for a in obj.archs],
                "data_len": len(obj.data),
                "lowered": [list(p) for p in obj.lowered],
                "diagnostics": list(obj.diagnostics),
            }
            extra_ptx = obj.ptx if obj.ptx is not None and obj.ptx != obj.data else b""
            self.cache.put("object", key, meta, obj.data + extra_ptx)
        return obj

    def _run(self, make: Callable[[], ObjectCode]) -> ObjectCode:
        with self._lock:
            self.compiles += 1
        return make()


def checks_key(kernels: str, objects: Iterable[tuple[bytes, bytes | None]], compiler: str) -> str:
    """The verdict of the build's checks of objects against kernel descriptions: the
    descriptions (their repr, which holds every field), each object's bytes and PTX, and the
    compiler (nvcc sources get a probe PTX of their own)."""
    key = KeyBuilder("checks").add("kernels", kernels).add("compiler", compiler)
    for data, ptx in objects:
        key.add("object", hashlib.sha256(data).digest()).add("ptx", hashlib.sha256(ptx or b"").digest())
    return key.hexdigest()


def vmfb_key(mlir_text: str, objects: Iterable[tuple[str, bytes]], flags: Iterable[str], iree_version: str) -> str:
    """The link step's inputs: generated MLIR, object bytes by name, flags, IREE version."""
    key = KeyBuilder("vmfb").add("iree", iree_version).add("flags", json.dumps(list(flags)))
    key.add("mlir", mlir_text)
    for name, data in sorted(objects):
        key.add("object_name", name).add("object", data)
    return key.hexdigest()


@dataclass(frozen=True)
class Linked:
    """A linked module: its bytes, its functions as IREE declares them, what the linker said."""

    vmfb: bytes
    declarations: dict[str, str]
    diagnostics: tuple[str, ...]
    ran: bool  # False: it came from the cache


class CachedLinker:
    """The link step behind the cache: `link()` runs only when no module was linked from the
    very same MLIR, object bytes, flags and IREE version."""

    def __init__(self, cache: Cache | None, iree_version: str) -> None:
        self.cache = cache
        self.iree_version = iree_version

    def link(self, mlir_text: str, objects: Sequence[tuple[str, bytes]], flags: Sequence[str], link: Callable[[], tuple[bytes, Sequence[str]]]) -> Linked:
        key = None
        if self.cache is not None and self.cache.usable:
            key = vmfb_key(mlir_text, objects, flags, self.iree_version)
            hit = self.cache.get("vmfb", key)
            if hit is not None and isinstance(hit[0].get("declarations"), dict):
                meta, data = hit
                return Linked(data, meta["declarations"], tuple(meta.get("diagnostics", [])), False)
        data, diagnostics = link()
        declarations = module_declarations(data)
        if key is not None:
            self.cache.put("vmfb", key, {"declarations": declarations, "diagnostics": list(diagnostics)}, data)
        return Linked(data, declarations, tuple(diagnostics), True)


def module_declarations(vmfb: bytes) -> dict[str, str]:
    """Each exported function's declaration as IREE's reflection states it
    (`sync func @f(%input0: tensor<?xf32>) -> (%output0: tensor<?xf32>)`); needs no device."""
    import iree.runtime as rt

    module = rt.VmModule.copy_buffer(rt.VmInstance(), vmfb)
    out = {}
    for name in module.function_names:
        if name.startswith("__"):
            continue
        fn = module.lookup_function(name)
        out[name] = (fn.reflection or {}).get("iree.abi.declaration", "") if fn is not None else ""
    return out
