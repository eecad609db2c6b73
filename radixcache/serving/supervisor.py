"""The cluster's supervisor: keeps its replicas and its router running, and the router's rotation
to the replicas that answer.

Two threads, each every ``interval_s`` (a router start that takes seconds never delays a
replica's restart):

- the replicas: one whose process has ended (killed, crashed on a request) is started again on
  its ports after a backoff that doubles from ``backoff_s`` to ``backoff_cap_s`` with each
  restart and starts over once the replica has answered for ``stable_s``; one that does not
  answer ``/health`` within ``startup_s`` of its start is killed (and so started again);
  ``replicas()`` gives each one's restart count and what happens next, for the cluster screen;
- the router: when its process has ended, start it again (with the replicas now up as its
  workers), after a backoff that doubles from ``backoff_s`` to ``backoff_cap_s`` while the
  restarts keep failing and starts over once one stays up; ``state()`` says what it does, for
  the cluster screen;
- the rotation (the router's thread): the router's workers (``GET /workers``) are made the
  replicas whose ``/health`` answers within ``probe_s``: one that does not (killed, starting,
  or stopped with SIGSTOP: a stopped process still accepts connections, so the router's own
  checks keep sending to it) is removed (sglang-router 0.3.2's ``DELETE /workers/{id}``; it has
  no ``/remove_worker``), one that answers and is not listed is added (``POST /workers``, which
  is idempotent: the same id for the same url; there is no ``/add_worker``). A replica the
  supervisor restarted is removed and added again even if no round saw it down, so the router
  forgets the old process's circuit breaker and load.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from radixcache.core.guard import Guard


class RouterState(NamedTuple):
    """What the supervisor knows of the router, for a screen."""

    up: bool
    restarts: int
    note: str  # "" while up; else what happens next ("restarting in 2 s: exited -9")
    out_of_rotation: tuple[int, ...]  # ranks the router does not send to now


class ReplicaState(NamedTuple):
    """What the supervisor knows of one replica, for a screen."""

    rank: int
    up: bool  # its /health answered at the last round
    restarts: int
    note: str  # "" while up; else what happens next ("restarting in 1 s: exited -9")


class Supervised(Protocol):
    """What the supervisor drives: the processes of a ``Cluster``."""

    @property
    def router_backend_url(self) -> str:
        """The router's own HTTP address (not the public front)."""
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

    def replica_exit(self, rank: int) -> int | None:
        """The exit status of replica ``rank``'s process (None while it runs)."""
        ...

    def spawn_replica(self, rank: int) -> None:
        """Start replica ``rank`` again on its ports; returns at once."""
        ...

    def kill(self, rank: int) -> None:
        """SIGKILL replica ``rank`` and reap it."""
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


@dataclass(slots=True)
class _Watch:
    """One replica as the supervisor thread sees it (written there, read under its lock)."""

    delay: float
    restarts: int = 0
    up: bool = True
    note: str = ""
    due: float | None = None  # when its next start is due (it has exited)
    started: float | None = None  # when the supervisor last started it
    up_since: float | None = None


class Supervisor:
    """Restarts the replicas and the router of ``cluster`` and keeps the router's rotation to
    the replicas that answer (see the module doc)."""

    def __init__(self, cluster: Supervised, *, interval_s: float = 0.25, probe_s: float = 0.5,
                 backoff_s: float = 0.5, backoff_cap_s: float = 8.0, stable_s: float = 30.0,
                 startup_s: float = 60.0) -> None:
        self.cluster = cluster
        self.interval_s, self.probe_s = interval_s, probe_s
        self.backoff_s, self.backoff_cap_s = backoff_s, backoff_cap_s
        self.stable_s, self.startup_s = stable_s, startup_s
        self._delay = backoff_s
        self._due: float | None = None  # when the next router start is due
        self._restarts, self._note = 0, ""
        self._out: set[int] = set()
        self._watch = [_Watch(backoff_s) for _ in cluster.replica_urls()]
        self._told = [0] * len(self._watch)  # each rank's restarts the router has caught up on
        self._lock = threading.Lock()  # state() and replicas() read from the screen's thread
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.guard = Guard()  # a fault ends supervision and shows in ``state().note``

    def start(self) -> Supervisor:
        """Run in two daemon threads (see the module doc); returns self."""
        self._threads = [self.guard.start(f"rc-supervisor-{part}", run) for part, run in
                         (("replicas", self._run_replicas), ("router", self._run_router))]
        return self

    def stop(self) -> None:
        """Stop supervising (before the processes are stopped)."""
        self._stop.set()
        for t in self._threads:
            t.join(70)  # a router start in progress ends within its startup_s

    def state(self) -> RouterState:
        """The router's state now (any thread)."""
        fault = self.guard.fault
        with self._lock:
            note = f"supervisor stopped: {fault.line()}" if fault is not None else self._note
            return RouterState(self.cluster.router_alive() and not note, self._restarts,
                               note, tuple(sorted(self._out)))

    def replicas(self) -> tuple[ReplicaState, ...]:
        """Every replica's state now, by rank (any thread)."""
        with self._lock:
            return tuple(ReplicaState(r, w.up, w.restarts, w.note)
                         for r, w in enumerate(self._watch))

    def restart_now(self) -> None:
        """Start the router at the next round, without backoff (the screen's `restart router`;
        the caller has stopped the old one)."""
        with self._lock:
            self._due, self._delay = time.monotonic(), self.backoff_s
            self._note = "restarting: asked"

    def restart_replica_now(self, rank: int) -> None:
        """Start replica ``rank`` at the next round, without backoff (the screen's `restart R`;
        the caller has stopped it)."""
        with self._lock:
            w = self._watch[rank]
            w.due, w.delay, w.note = time.monotonic(), self.backoff_s, "restarting: asked"

    def _run_replicas(self) -> None:
        while not self._stop.wait(self.interval_s):
            for rank, url in enumerate(self.cluster.replica_urls()):
                self._watch_replica(rank, up=answers(f"{url}/health", self.probe_s))

    def _run_router(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._watch_router()
            self._watch_rotation()

    def _watch_replica(self, rank: int, *, up: bool) -> None:
        c, now = self.cluster, time.monotonic()
        code = c.replica_exit(rank)
        with self._lock:
            w = self._watch[rank]
            w.up = up and code is None
            if code is None:
                if not up and w.started is not None and now - w.started > self.startup_s:
                    w.started, w.note = None, f"not healthy {self.startup_s:g} s after start"
                    kill = True
                else:
                    self._running(w, now)
                    return
            else:
                w.up_since = None
                if w.due is None:  # just found dead
                    w.due = now + w.delay
                    w.note = f"restarting in {w.delay:g} s: exited {code}"
                if now < w.due:
                    return
                w.due, w.started, w.note = None, now, "starting"
                w.restarts += 1
                w.delay = min(self.backoff_cap_s, w.delay * 2)
                kill = False
        if kill:
            c.kill(rank)  # found dead next round, started again after its backoff
        else:
            c.spawn_replica(rank)

    def _running(self, w: _Watch, now: float) -> None:
        """Book-keeping for a replica whose process runs (under the lock)."""
        if not w.up:
            w.up_since = None
            return
        w.note, w.started = "", None
        if w.up_since is None:
            w.up_since = now
        elif now - w.up_since >= self.stable_s:
            w.delay = self.backoff_s  # it stayed up: the next crash restarts it soon again

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
        """Make the router's workers the replicas that answer (see the module doc)."""
        c = self.cluster
        if not c.router_alive():
            return
        router = c.router_backend_url
        listed = router_workers(router)
        if listed is None:
            return
        out = set()
        with self._lock:
            restarts = [w.restarts for w in self._watch]
        for rank, url in enumerate(c.replica_urls()):
            up, routed = answers(f"{url}/health", self.probe_s), url in listed
            fresh = restarts[rank] != self._told[rank]  # a new process behind the same url
            if routed and (fresh or not up):
                # the router forgets the old process (its circuit breaker, its load) even when
                # the new one answered before a round saw the old one down
                routed = http_json("DELETE", f"{router}/workers/{listed[url]}") is None
            if not routed:
                self._told[rank] = restarts[rank]
            if up and not routed:
                routed = http_json("POST", f"{router}/workers", {"url": url}) is not None
            if not (up and routed):
                out.add(rank)
        with self._lock:
            self._out = out
