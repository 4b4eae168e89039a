"""The object cache: compiled objects and linked modules, content-addressed.

Keys are built from labelled, length-prefixed fields (schema, kit version, compiler and its
version, architecture, format, canonical options, the source and every local header it
includes). Entries are single files written atomically and checksummed: a corrupt entry is a
miss, never handed to the driver. Many processes may share the cache: concurrency rests on
atomic rename, so a killed writer leaves no lock and no visible partial entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import struct
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from ._files import write_atomic
from .archs import Arch
from .compilers import CompileOptions, ObjectCode

SCHEMA = 1
MAGIC = b"KDC1"
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
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kitdispatch"


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


def source_closure(source: Path, options: CompileOptions) -> list[tuple[str, bytes]]:
    """The source and every header it includes that resolves to a local file, recursively.

    Headers found in neither the including file's folder nor an -I folder come from the
    toolchain, whose version is in the key. A quoted include that resolves nowhere, or a
    computed include, makes the compile uncacheable.
    """
    search = [Path(d) for d in options.include_dirs]
    seen: dict[Path, bytes] = {}
    todo = [source.resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        data = path.read_bytes()
        seen[path] = data
        for quoted, angled, computed in _INCLUDE_RE.findall(data):
            if computed:
                raise Uncacheable(f"{path}: computed #include {computed.decode(errors='replace')}")
            name = (quoted or angled).decode(errors="replace")
            dirs = ([path.parent] if quoted else []) + search
            found = next((d / name for d in dirs if (d / name).is_file()), None)
            if found is not None:
                todo.append(found.resolve())
            elif quoted:
                raise Uncacheable(f"{path}: #include \"{name}\" not found locally")
    return [(str(p), d) for p, d in seen.items()]  # discovery order: follows content, not paths


def object_key(
    compiler: str, compiler_version: str, fmt: str, archs: Iterable[Arch], options: CompileOptions, source: Path
) -> str:
    key = KeyBuilder("object")
    key.add("compiler", compiler).add("compiler_version", compiler_version).add("format", fmt)
    key.add("archs", ",".join(a.name for a in archs))
    key.add("options", json.dumps(options.flags()))
    key.add("name_expressions", json.dumps(list(options.name_expressions)))
    for i, (_, data) in enumerate(source_closure(source, options)):
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
        self.max_bytes = max_bytes or int(os.environ.get(ENV_MAX_BYTES, DEFAULT_MAX_BYTES))
        self.stats = CacheStats()
        self.usable = self._check_safe()

    @classmethod
    def disabled(cls) -> "Cache":
        """A cache that stores nothing (--no-cache)."""
        cache = cls.__new__(cls)
        cache.root = Path(os.devnull)
        cache.max_bytes = 0
        cache.stats = CacheStats()
        cache.usable = False
        return cache

    # -- safety ----------------------------------------------------------------------

    def _check_safe(self) -> bool:
        try:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            if self.root.is_symlink():
                return self._refuse("is a symbolic link")
            self.root.mkdir(mode=0o700, exist_ok=True)
            st = self.root.stat()
        except OSError as exc:
            return self._refuse(f"cannot be created: {exc.strerror}")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            return self._refuse(f"belongs to another user (uid {st.st_uid})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return self._refuse(f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")
        return True

    def _refuse(self, why: str) -> bool:
        warnings.warn(
            f"kitdispatch: not using the cache {self.root}: it {why}; building without it "
            f"(fix the folder, or point {ENV_DIR} elsewhere)",
            CacheWarning,
            stacklevel=3,
        )
        return False

    # -- entries ---------------------------------------------------------------------

    def _path(self, kind: str, key: str) -> Path:
        return self.root / kind / key[:2] / key

    def get(self, kind: str, key: str) -> tuple[dict, bytes] | None:
        if not self.usable:
            return None
        path = self._path(kind, key)
        try:
            blob = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            self.stats.bump("misses")
            return None
        entry = _decode(blob)
        if entry is None:
            self.stats.bump("corrupt")
            self.stats.bump("misses")
            _unlink(path)
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
        try:
            write_atomic(self._path(kind, key), _encode(meta, payload))
        except OSError as exc:
            warnings.warn(f"kitdispatch: could not write a cache entry: {exc}", CacheWarning, stacklevel=2)
            return
        self.evict()

    @property
    def template_dir(self) -> Path | None:
        """Where the MLIR templates' compiled form is kept (jinja2 bytecode), if anywhere."""
        return self.root / TEMPLATES if self.usable else None

    # -- management ------------------------------------------------------------------

    def entries(self) -> list[Path]:
        if not self.usable or not self.root.is_dir():
            return []
        return [p for p in self.root.glob("*/*/*") if p.is_file() and not p.name.startswith(".")]

    def size(self) -> int:
        return sum(_size(p) for p in self.entries())

    def evict(self) -> int:
        """Drops least recently used entries until the cache is within its bound."""
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
        n = len(self.entries())
        if self.usable:
            for kind in ("object", "vmfb", TEMPLATES):
                shutil.rmtree(self.root / kind, ignore_errors=True)
        return n

    def info(self) -> dict:
        entries = self.entries()
        return {
            "path": str(self.root),
            "usable": self.usable,
            "entries": len(entries),
            "bytes": sum(_size(p) for p in entries),
            "max_bytes": self.max_bytes,
        }


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

    def __init__(self, compiler, cache: Cache) -> None:
        self.inner = compiler
        self.cache = cache
        self.name = compiler.name
        self._version = compiler.version()
        self.compiles = 0  # compiler runs, for tests and benchmarks
        self._lock = threading.Lock()

    def version(self) -> str:
        return self._version

    def supported_archs(self):
        return self.inner.supported_archs()

    def compile(self, source: Path, arch: Arch, fmt: str, options: CompileOptions) -> ObjectCode:
        return self._cached(source, (arch,), fmt, options, lambda: self.inner.compile(source, arch, fmt, options))

    def compile_fatbin(self, source: Path, archs: tuple[Arch, ...], options: CompileOptions) -> ObjectCode:
        return self._cached(source, archs, "fatbin", options, lambda: self.inner.compile_fatbin(source, archs, options))

    def lookup(self, source: Path, archs: tuple[Arch, ...], fmt: str, options: CompileOptions) -> ObjectCode | None:
        """The cached object, if there is one: the build asks first, and starts threads
        only for what it must compile."""
        return self._get(source, self._key(source, archs, fmt, options))

    def _key(self, source: Path, archs, fmt: str, options: CompileOptions) -> str | None:
        try:
            return object_key(self.name, self._version, fmt, archs, options, source)
        except Uncacheable:
            self.cache.stats.bump("uncacheable")
        except OSError:
            pass  # e.g. a missing source: let the compiler report it
        return None

    def _get(self, source: Path, key: str | None) -> ObjectCode | None:
        hit = self.cache.get("object", key) if key is not None else None
        if hit is None:
            return None
        meta, payload = hit
        data, ptx = payload[: meta["data_len"]], payload[meta["data_len"] :] or None
        if meta["format"] == "ptx":
            ptx = data
        return ObjectCode(data, meta["format"], tuple(Arch.parse(a) for a in meta["archs"]), source, self.name, ptx)

    def _cached(self, source: Path, archs, fmt: str, options: CompileOptions, make) -> ObjectCode:
        key = self._key(source, archs, fmt, options)
        found = self._get(source, key)
        if found is not None:
            return found
        obj = self._run(make)
        if key is not None:
            meta = {"format": obj.format, "archs": [a.name for a in obj.archs], "data_len": len(obj.data)}
            extra_ptx = obj.ptx if obj.ptx is not None and obj.format != "ptx" else b""
            self.cache.put("object", key, meta, obj.data + extra_ptx)
        return obj

    def _run(self, make) -> ObjectCode:
        with self._lock:
            self.compiles += 1
        return make()


def vmfb_key(mlir_text: str, objects: Iterable[tuple[str, bytes]], flags: Iterable[str], iree_version: str) -> str:
    """The link step's inputs: generated MLIR, object bytes by name, flags, IREE version."""
    key = KeyBuilder("vmfb").add("iree", iree_version).add("flags", json.dumps(list(flags)))
    key.add("mlir", mlir_text)
    for name, data in sorted(objects):
        key.add("object_name", name).add("object", data)
    return key.hexdigest()
