"""StateLock: the service loop's state lock, fair to the threads that wait on the loop.

A plain ``threading.Lock`` is not fair. The stepping thread releases it at the end of a step
and takes it again at once, before a command or snapshot thread blocked on it has woken and
won the GIL: under ``serve --workload 'flood 2000'`` a ``stats`` command waited up to 4 s.

Here every acquirer but the stepping thread counts itself as waiting, and the stepping thread
(``turn()``) lets all current waiters in before it takes the lock again. A command therefore
waits at most for the step in progress (plus the commands ahead of it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class StateLock:
    """``with lock:`` for commands, snapshots and samples; ``with lock.turn():`` for steps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cv = threading.Condition(threading.Lock())
        self._waiting = 0

    def __enter__(self) -> StateLock:
        with self._cv:
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._cv:
                self._waiting -= 1
                if not self._waiting:
                    self._cv.notify_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def locked(self) -> bool:
        """True while someone holds the lock."""
        return self._lock.locked()

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the lock for one step, after everyone already waiting for it has had it."""
        with self._cv:
            while self._waiting:
                self._cv.wait()
        with self._lock:
            yield
