"""Compiler calls in worker processes, with a deadline each.

NVRTC and IREE's compiler are libraries: called in this process, a compile that never ends
(a macro that expands without end) could not be stopped, and a Ctrl-C arriving while one runs
on a thread can crash the interpreter on its way out. So they run in child processes
(`_worker_main.py`), one call at a time each; a call past its deadline kills its worker, and an
interrupt kills them all. Workers are reused for later calls and leave with this process.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

from kitdispatch.errors import ToolError

_SCRIPT = Path(__file__).with_name("_worker_main.py")


class WorkerCrashed(ToolError):
    """A worker process died during a call (killed, or a crash inside the compiler)."""


class WorkerTimeout(ToolError):
    """A call did not finish within its deadline; its worker was killed."""


class CallsStopped(ToolError):
    """A call refused, or its new worker killed, while an interrupted run stops its calls."""


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C reaches the build, which decides
        )

    def call(self, name: str, payload: object, deadline: float):
        blob = pickle.dumps((name, payload))
        self.proc.stdin.write(struct.pack("<Q", len(blob)) + blob)
        self.proc.stdin.flush()
        (size,) = struct.unpack("<Q", self._read(8, deadline))
        return pickle.loads(self._read(size, deadline))

    def _read(self, size: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        chunks, left = [], size
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class WorkerPool:
    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._lock = threading.Lock()
        self._stopping = 0  # interrupted runs stopping their calls: no call starts meanwhile

    def call(self, name: str, payload: object, *, timeout: float, what: str, argv: list[str] | None = None):
        """Runs `name(payload)` in a worker; returns its reply, or raises WorkerTimeout /
        WorkerCrashed (kit errors naming `what`). A worker-side exception is a WorkerCrashed."""
        worker = self._take()
        deadline = time.monotonic() + timeout
        try:
            status, reply = worker.call(name, payload, deadline)
        except TimeoutError:
            self._discard(worker)
            raise WorkerTimeout(
                f"{what} did not finish within {timeout:g} s and was stopped",
                argv=argv,
                fix="look for a macro or template that expands without end, or raise the limit (--timeout SECONDS)",
            ) from None
        except (EOFError, OSError, struct.error, pickle.UnpicklingError):
            code = worker.proc.poll()
            self._discard(worker)
            raise WorkerCrashed(
                f"{what} crashed the compiler process" + (f" (exit status {code})" if code is not None else ""),
                argv=argv,
                fix="re-run with the command shown; if the crash repeats, report it with the source",
            ) from None
        except BaseException:  # KeyboardInterrupt: the call is abandoned, its worker killed
            self._discard(worker)
            raise
        self._give_back(worker)
        if status != "ok":
            raise WorkerCrashed(f"{what} failed in the compiler process: {reply}", argv=argv, fix="check the toolchain (kitdispatch doctor)")
        return reply

    def _take(self) -> _Worker:
        with self._lock:
            self._refuse_while_stopping()
            worker = self._idle.pop() if self._idle else None
        if worker is None or worker.proc.poll() is not None:
            worker = _Worker()  # slow under load: an interrupt may come meanwhile
        with self._lock:
            stopped = self._stopping > 0
            if not stopped:
                self._busy.add(worker)
        if stopped:
            worker.kill()
            raise _stopped()
        return worker

    def _refuse_while_stopping(self) -> None:
        if self._stopping:
            raise _stopped()

    @contextmanager
    def stopping(self) -> Iterator[None]:
        """While in this context no call starts (a worker started meanwhile is killed), so a
        run's threads can all be made to give up (`_stop_calls`)."""
        with self._lock:
            self._stopping += 1
        try:
            yield
        finally:
            with self._lock:
                self._stopping -= 1

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
            self._idle.append(worker)

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
        worker.kill()

    def kill_all(self) -> None:
        with self._lock:
            workers = list(self._idle) + list(self._busy)
            self._idle.clear()
            self._busy.clear()
        for worker in workers:
            worker.kill()


def _stopped() -> CallsStopped:
    return CallsStopped("the compile was not started: the build was interrupted", fix="run the command again")


POOL = WorkerPool()
atexit.register(POOL.kill_all)


def run_in_threads(fn: Callable, items: Iterable) -> list[Future]:
    """`fn` over `items`, each on a thread of its own (slots and workers bound the real work);
    returns the finished futures. On an interrupt the workers are killed first, so no thread is
    left waiting on a compiler and the interrupt gets through at once."""
    items = list(items)
    pool = ThreadPoolExecutor(max_workers=max(1, len(items)))
    futures = [pool.submit(fn, item) for item in items]
    try:
        wait(futures)
    except BaseException:
        for f in futures:
            f.cancel()
        _stop_calls(futures)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return futures


def _stop_calls(futures: list[Future], limit: float = 60.0) -> None:
    """Kills the workers until every started call has given up, no call starting meanwhile: a
    thread still starting its worker when the interrupt came (seconds, under load) gets it
    killed and gives up, where it once waited out its compile (a Ctrl-C in CI waited past
    60 s). Bounded: never waits forever for a thread busy elsewhere."""
    deadline = time.monotonic() + limit
    with POOL.stopping():
        while True:
            POOL.kill_all()
            _, pending = wait(futures, timeout=0.2)
            if not pending or time.monotonic() > deadline:
                return


def map_in_threads(fn: Callable, items: Iterable) -> list:
    """The results of `run_in_threads`, in order; the first failure is raised."""
    items = list(items)
    if len(items) == 1:
        return [fn(items[0])]
    return [f.result() for f in run_in_threads(fn, items)]
