"""One guard for every worker thread: nothing dies silently.

A thread started with ``Guard.start`` runs its target inside a handler that, when the target
raises, records the exception as a ``ThreadFault`` (thread name, one line, the traceback),
prints the traceback to stderr, and calls the owner's ``on_fault`` (which publishes a
``Fault`` event, shows a banner, or makes ``serve`` exit non-zero). The fault stays readable on
``Guard.fault`` for whoever polls.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable
from typing import NamedTuple


class ThreadFault(NamedTuple):
    """How a worker thread died."""

    thread: str
    error: str  # "TypeName: message", one line
    traceback: str

    def line(self) -> str:
        """One line for a person: which thread died of what."""
        return f"thread {self.thread} died: {self.error}"


class Guard:
    """Starts guarded threads and keeps the first fault among them."""

    def __init__(self, on_fault: Callable[[ThreadFault], None] | None = None) -> None:
        self.on_fault = on_fault
        self.fault: ThreadFault | None = None
        self._lock = threading.Lock()

    def start(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """Start ``target`` on a daemon thread named ``name`` under this guard."""
        t = threading.Thread(target=self._run, args=(name, target), name=name, daemon=True)
        t.start()
        return t

    def _run(self, name: str, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception as exc:  # the guard's purpose: record whatever killed the thread
            self.record(name, exc)

    def record(self, name: str, exc: BaseException) -> ThreadFault:
        """Record ``exc`` as the death of thread ``name``; report it (stderr, ``on_fault``)."""
        tb = "".join(traceback.format_exception(exc))
        first = str(exc).splitlines()[0] if str(exc) else ""
        fault = ThreadFault(name, f"{type(exc).__name__}: {first}".rstrip(": "), tb)
        with self._lock:
            if self.fault is None:
                self.fault = fault
        print(f"radixcache: {fault.line()}\n{tb}", file=sys.stderr, flush=True)
        if self.on_fault is not None:
            try:
                self.on_fault(fault)
            except Exception as report_exc:  # reporting must not hide the first fault
                print(f"radixcache: reporting the fault failed: {report_exc!r}",
                      file=sys.stderr, flush=True)
        return fault
