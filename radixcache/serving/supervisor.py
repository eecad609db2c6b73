"""The cluster's supervisor: keeps its router running and its rotation to the replicas that answer.

One thread, every ``interval_s``:

- the router: when its process has ended, start it again (with the replicas now up as its
  workers), after a backoff that doubles from ``backoff_s`` to ``backoff_cap_s`` while the
  restarts keep failing and starts over once one stays up; ``state()`` says what it does, for
  the cluster screen;
- the rotation: a replica whose ``/health`` does not answer within ``probe_s`` (killed, or
  stopped with SIGSTOP: a stopped process still accepts connections, so the router's own
  checks keep sending to it) is removed from the router's workers (sglang-router's
  ``DELETE /workers/{id}``), and added back (``POST /workers``) once it answers again.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import NamedTuple, Protocol

from radixcache.core.guard import Guard


class RouterState(NamedTuple):
    """What the supervisor knows of the router, for a screen."""

    up: bool
    restarts: int
    note: str  # "" while up; else what happens next ("restarting in 2 s: exited -9")
    out_of_rotation: tuple[int, ...]  # ranks the router does not send to now


class Supervised(Protocol):
    """What the supervisor drives: the processes of a ``Cluster``."""

    @property
    def router_url(self) -> str:
        """The router's HTTP address."""
        ...

    def replica_urls(self) -> list[str]:
        """Each rank's HTTP front, by rank."""
        ...

    def router_alive(self) -> bool:
        """True while the router process runs."""
        ...

    def router_exit(self) -> int | None:
        """The exit status of the router process (None while it runs)."""
        ...

    def start_router(self, workers: list[str]) -> None:
        """Start the router with ``workers`` and wait until it answers; raises
        ``RuntimeError`` (one line) when it cannot."""
        ...


def http_json(method: str, url: str, body: object = None,
              timeout: float = 2.0) -> dict[str, object] | None:
    """The JSON answer to one request, or None when it fails (any way)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer = json.loads(resp.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def answers(url: str, timeout: float) -> bool:
    """True when ``GET url`` answers 200 within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def router_workers(router_url: str) -> dict[str, str] | None:
    """The router's workers, url -> id (``GET /workers``); None when it does not answer."""
    answer = http_json("GET", f"{router_url}/workers")
    if answer is None or not isinstance(answer.get("workers"), list):
        return None
    workers = answer["workers"]
    assert isinstance(workers, list)
    return {str(w["url"]): str(w["id"]) for w in workers
            if isinstance(w, dict) and "url" in w and "id" in w}


class Supervisor:
    """Restarts the router of ``cluster`` and keeps its rotation to the replicas that answer."""

    def __init__(self, cluster: Supervised, *, interval_s: float = 0.25, probe_s: float = 0.5,
                 backoff_s: float = 0.5, backoff_cap_s: float = 8.0) -> None:
        self.cluster = cluster
        self.interval_s, self.probe_s = interval_s, probe_s
        self.backoff_s, self.backoff_cap_s = backoff_s, backoff_cap_s
        self._delay = backoff_s
        self._due: float | None = None  # when the next router start is due
        self._restarts, self._note = 0, ""
        self._out: set[int] = set()
        self._lock = threading.Lock()  # state() reads from the screen's thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.guard = Guard()  # a fault ends supervision and shows in ``state().note``

    def start(self) -> Supervisor:
        """Run in a daemon thread; returns self."""
        self._thread = self.guard.start("rc-supervisor", self._run)
        return self

    def stop(self) -> None:
        """Stop supervising (before the processes are stopped)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def state(self) -> RouterState:
        """The router's state now (any thread)."""
        fault = self.guard.fault
        with self._lock:
            note = f"supervisor stopped: {fault.line()}" if fault is not None else self._note
            return RouterState(self.cluster.router_alive() and not note, self._restarts,
                               note, tuple(sorted(self._out)))

    def restart_now(self) -> None:
        """Start the router at the next round, without backoff (the screen's `restart router`;
        the caller has stopped the old one)."""
        with self._lock:
            self._due, self._delay = time.monotonic(), self.backoff_s
            self._note = "restarting: asked"

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._watch_router()
            self._watch_rotation()

    def _watch_router(self) -> None:
        c = self.cluster
        now = time.monotonic()
        if c.router_alive():
            return
        with self._lock:
            if self._due is None:  # just found dead
                self._due = now + self._delay
                self._note = f"restarting in {self._delay:g} s: exited {c.router_exit()}"
            if now < self._due:
                return
            self._note = "starting"
        up = [u for r, u in enumerate(c.replica_urls()) if r not in self._out]
        try:
            c.start_router(up or c.replica_urls())
        except RuntimeError as exc:
            with self._lock:
                self._delay = min(self.backoff_cap_s, self._delay * 2)
                self._due = time.monotonic() + self._delay
                self._note = f"restarting in {self._delay:g} s: {exc}"
            return
        with self._lock:
            self._restarts += 1
            self._due, self._note, self._delay = None, "", self.backoff_s

    def _watch_rotation(self) -> None:
        c = self.cluster
        if not c.router_alive():
            return
        for rank, url in enumerate(c.replica_urls()):
            up = answers(f"{url}/health", self.probe_s)
            if up == (rank not in self._out):
                continue
            router = self.cluster.router_url
            if up and http_json("POST", f"{router}/workers", {"url": url}) is not None:
                with self._lock:
                    self._out.discard(rank)
            elif not up and self._remove(url):
                with self._lock:
                    self._out.add(rank)

    def _remove(self, url: str) -> bool:
        """Take ``url`` out of the router's workers; True when it is out."""
        router = self.cluster.router_url
        workers = router_workers(router)
        if workers is None:
            return False
        if url not in workers:
            return True
        return http_json("DELETE", f"{router}/workers/{workers[url]}") is not None
