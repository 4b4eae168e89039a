"""A compiler worker: runs NVRTC compiles and IREE links for a kitdispatch build in a process of
its own, so that the build can kill one that hangs (a macro that expands without end) and a
Ctrl-C never lands inside a compiler library of the user's process.

Started by `kitdispatch._workers` as `python _worker_main.py`; it imports nothing of kitdispatch
(fast start, no numpy). Requests and replies are length-prefixed pickles on stdin/stdout.
"""

from __future__ import annotations

import os
import struct
import sys

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # the package folder is not a place to import top-level modules from

import pickle  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (fast start)
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any


_LOADED = []


def _load(libraries: list[str]):
    """The NVRTC the build chose (and its builtins), loaded before cuda-python looks for one:
    it takes a library already loaded under its name."""
    if _LOADED or not libraries:
        return
    import ctypes

    for library in libraries:
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    _LOADED.append(True)


def nvrtc_info(libraries: list[str]):
    _load(libraries)
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    _check(nvrtc, err, "nvrtcVersion")
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(nvrtc, err, "nvrtcGetSupportedArchs")
    return {"version": f"{major}.{minor}", "archs": list(archs)}


def nvrtc_compile(request: dict[str, Any]):
    """request: source (bytes), name (str), options (list of str), names (name expressions),
    cubin (bool), libraries (to load first). Returns ok, log, ptx, cubin, lowered names."""
    _load(request["libraries"])
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(request["source"], request["name"].encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        for expr in request["names"]:
            (err,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode())
            _check(nvrtc, err, f"nvrtcAddNameExpression({expr})")
        options = [o.encode() for o in request["options"]]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        log = _nvrtc_bytes(nvrtc, prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog).decode(errors="replace")
        reply = {"ok": result == nvrtc.nvrtcResult.NVRTC_SUCCESS, "log": log, "ptx": None, "cubin": None, "lowered": {}}
        if not reply["ok"]:
            return reply
        reply["ptx"] = _nvrtc_bytes(nvrtc, prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        if request["cubin"]:
            reply["cubin"] = _nvrtc_bytes(nvrtc, prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, strip=False)
        for expr in request["names"]:
            err, lowered = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            _check(nvrtc, err, f"nvrtcGetLoweredName({expr})")
            reply["lowered"][expr] = lowered.decode() if isinstance(lowered, bytes) else str(lowered)
        return reply
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def iree_link(request: dict[str, Any]):
    """request: mlir (str), buffer_name, output (path), flags, cwd: the folder holding the
    objects, which the MLIR names relative to it (the in-process API takes no object search
    path; this process is the worker's own, so changing its folder is harmless). Returns ok and
    what the compiler printed (its diagnostics go to stderr, captured here)."""
    os.chdir(request["cwd"])
    try:
        from iree.compiler import api
    except ImportError as exc:
        return {"ok": False, "log": f"iree.compiler is not importable: {exc}"}
    with _captured_stderr() as captured:
        session = api.Session()
        try:
            session.set_flags(*request["flags"])
            invocation = session.invocation()
            invocation.enable_console_diagnostics()
            source = api.Source.wrap_buffer(session, request["mlir"].encode(), buffer_name=request["buffer_name"])
            ok = bool(invocation.parse_source(source) and invocation.execute())
            if ok:
                output = api.Output.open_file(request["output"])
                invocation.output_vm_bytecode(output)
                output.keep()
        finally:
            session.close()
    return {"ok": ok, "log": captured.text}


class _Captured:
    text = ""


class _captured_stderr:
    """fd 2 into a temp file for the duration: compiler libraries print there, not to Python."""

    def __enter__(self):
        self.result = _Captured()
        sys.stderr.flush()
        self.saved = os.dup(2)
        self.file = tempfile.TemporaryFile()
        os.dup2(self.file.fileno(), 2)
        return self.result

    def __exit__(self, *exc: object):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        self.result.text = self.file.read().decode(errors="replace")
        self.file.close()


def _nvrtc_bytes(nvrtc: ModuleType, prog: object, size_fn: Callable[..., tuple[Any, int]], get_fn: Callable[..., tuple[Any]], strip: bool = True):
    err, size = size_fn(prog)
    _check(nvrtc, err, size_fn.__name__)
    buf = bytearray(size)
    (err,) = get_fn(prog, buf)
    _check(nvrtc, err, get_fn.__name__)
    return bytes(buf).rstrip(b"\0") if strip else bytes(buf)


def _check(nvrtc: ModuleType, err: object, what: str):
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC call {what} failed: {err}")


def nvjitlink_cubin(request: dict[str, Any]):
    """request: ptx (NUL-terminated bytes), options. Returns ok, log, cubin (bridge.py)."""
    from cuda.bindings import nvjitlink

    handle = nvjitlink.create(len(request["options"]), request["options"])
    try:
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, request["ptx"], len(request["ptx"]), "bridged.ptx")
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError:
            return {"ok": False, "log": _nvjitlink_log(nvjitlink, handle, error=True), "cubin": None}
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return {"ok": True, "log": _nvjitlink_log(nvjitlink, handle, error=False), "cubin": bytes(cubin)}
    finally:
        nvjitlink.destroy(handle)


def _nvjitlink_log(nvjitlink: ModuleType, handle: int, *, error: bool):
    size = (nvjitlink.get_error_log_size if error else nvjitlink.get_info_log_size)(handle)
    buf = bytearray(size)
    if size:
        (nvjitlink.get_error_log if error else nvjitlink.get_info_log)(handle, buf)
    return buf.rstrip(b"\0").decode(errors="replace").strip()


FUNCTIONS = {"nvrtc_info": nvrtc_info, "nvrtc_compile": nvrtc_compile, "iree_link": iree_link, "nvjitlink_cubin": nvjitlink_cubin}


def _die_with_parent():
    """If the build is killed, its workers go too, even one stuck inside a compile: a thread
    watches for the parent's exit (reparenting). PR_SET_PDEATHSIG is no use here: it fires when
    the parent *thread* that started the worker ends, and builds start workers on short-lived
    threads."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the build decides what a Ctrl-C stops
    _die_with_parent()
    requests = sys.stdin.buffer
    # Replies go to a private copy of fd 1; fd 1 itself goes to stderr so that anything a
    # library prints cannot corrupt the protocol.
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    while True:
        header = requests.read(8)
        if len(header) < 8:
            return
        (size,) = struct.unpack("<Q", header)
        name, payload = pickle.loads(requests.read(size))
        try:
            reply = ("ok", FUNCTIONS[name](payload))
        except Exception as exc:  # reported to the build, which raises the kit's error
            reply = ("error", f"{type(exc).__name__}: {exc}")
        blob = pickle.dumps(reply)
        replies.write(struct.pack("<Q", len(blob)) + blob)
        replies.flush()


if __name__ == "__main__":
    main()
    os._exit(0)  # the build has gone: nothing to flush, and its stderr may be closed already
