"""Sharing the cores: every CPU-heavy step of a build (a compiler run, a link) takes a slot.

Steps run on plain threads (NVRTC, nvcc's process and IREE's in-process compiler all release
the GIL), so one bound covers kernels, architectures and modules alike, whatever threads they
run on. A step never waits for a slot while holding one, so the slots cannot deadlock.
"""

from __future__ import annotations

import os
import threading


def default_jobs() -> int:
    """One step per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


class CpuSlots:
    """At most `size` CPU-heavy steps at once; used as `with slots: ...`."""

    def __init__(self, size: int | None = None) -> None:
        if size is not None and size < 1:
            raise ValueError(f"jobs must be at least 1, got {size}")
        self.size = size or default_jobs()
        self._semaphore = threading.BoundedSemaphore(self.size)

    def __enter__(self) -> "CpuSlots":
        self._semaphore.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._semaphore.release()
