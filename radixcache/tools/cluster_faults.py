"""``radixcache bench cluster``'s ``faults`` section: what a router kill and a replica kill cost
the clients of a cluster.

``clients`` threads, each an openai client with its default retries (2), send completions
back to back through the cluster's public port. Two phases, one after the other:

- ``router_kill``: once ``warm`` requests are answered, the router is SIGKILLed; the phase ends
  when the supervisor has restarted it and ``after`` more requests are answered. ``failed``:
  the phase's requests that raised (0 is the goal: the front holds them, see
  ``serving.router_front``); ``held``: requests the front held across the gap; ``back_s``:
  from the kill to the restarted router taking requests;
- ``replica_kill``: the last replica is SIGKILLed as soon as its ``/get_load`` counts a
  request (``in_flight``: that count, read just before the kill); the phase ends when the
  supervisor has restarted it, the router routes to it again and ``after`` more requests are
  answered. ``failed`` may be at most its
  ``in_flight`` (sglang-router retries a request whose worker failed on another one);
  ``back_s``: from the kill to the replica back in the router's rotation.

``replica_restarts`` and ``router_restarts`` are the supervisor's counts at the end. Both
phases carry every ``Phase`` field (stable keys): ``held`` is the router's, ``in_flight`` the
replica's, 0 in the other.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import NamedTuple

from radixcache.serving.cluster import Cluster, ClusterConfig, ClusterError, RoutePolicy

MODEL = "radixcache-tiny"
CLIENT_RETRIES = 2  # the openai client's default


class FaultsConfig(NamedTuple):
    """What the faults section runs."""

    replicas: int = 2
    blocks: int = 512
    clients: int = 4
    max_tokens: int = 64
    warm: int = 8  # requests answered before each fault
    after: int = 8  # requests answered after each recovery
    timeout_s: float = 120.0  # for any one wait


class Phase(NamedTuple):
    """One fault's figures (see the module doc)."""

    requests: int
    failed: int
    back_s: float
    held: int = 0
    in_flight: int = 0
    errors: tuple[str, ...] = ()  # the first few failures, one line each


class FaultFigures(NamedTuple):
    """The ``faults`` section."""

    router_kill: Phase
    replica_kill: Phase
    replica_restarts: int
    router_restarts: int

    def doc(self) -> dict[str, object]:
        """The ``--json`` form: ``faults.router_kill.failed`` and so on."""
        return {"clients_retries": CLIENT_RETRIES,
                "router_kill": self.router_kill._asdict(),
                "replica_kill": self.replica_kill._asdict(),
                "replica_restarts": self.replica_restarts,
                "router_restarts": self.router_restarts}


class Clients:
    """``n`` threads sending completions back to back until ``stop``; every outcome kept."""

    def __init__(self, url: str, n: int, max_tokens: int,
                 on_done: Callable[[], None] | None = None) -> None:
        import openai

        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120.0)
        self.max_tokens, self.on_done = max_tokens, on_done
        self.outcomes: list[str | None] = []  # None: answered; else the error, in finish order
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads = [threading.Thread(name=f"rc-fault-client-{i}", target=self._run,
                                          args=(i,), daemon=True) for i in range(n)]

    def start(self) -> Clients:
        """Start sending; returns self."""
        for t in self._threads:
            t.start()
        return self

    def _run(self, i: int) -> None:
        k = 0
        while not self._stop.is_set():
            prompt = f"client {i} asks question {k} about the radix cache and its blocks"
            try:
                self.client.completions.create(model=MODEL, prompt=prompt,
                                               max_tokens=self.max_tokens)
                outcome = None
            except Exception as exc:  # any failure of a request is the figure
                outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            with self._cond:
                self.outcomes.append(outcome)
                self._cond.notify_all()
            if self.on_done is not None:
                self.on_done()
            k += 1

    def done(self) -> int:
        """Requests finished so far (answered or failed)."""
        with self._cond:
            return len(self.outcomes)

    def wait_done(self, n: int, timeout: float) -> None:
        """Return once ``n`` requests have finished; ``ClusterError`` after ``timeout`` s."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.outcomes) >= n, timeout):
                raise ClusterError(f"{n} requests not finished after {timeout:g} s")

    def stop(self) -> None:
        """Stop sending and wait for the requests in flight."""
        self._stop.set()
        for t in self._threads:
            t.join(300)

    def failures(self, start: int, end: int) -> list[str]:
        """The errors among the requests that finished ``start``-th to ``end``-th."""
        with self._cond:
            return [o for o in self.outcomes[start:end] if o is not None]


def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} not seen after {timeout:g} s")
        time.sleep(0.02)


def _in_flight(url: str) -> int:
    with urllib.request.urlopen(f"{url}/get_load", timeout=10) as r:
        return sum(int(d["num_reqs"]) for d in json.loads(r.read()))


def router_kill(c: Cluster, clients: Clients, config: FaultsConfig) -> Phase:
    """The ``router_kill`` phase (see the module doc)."""
    assert c.front is not None
    start, held = clients.done(), c.front.held
    clients.wait_done(start + config.warm, config.timeout_s)
    restarts = c.router_state().restarts
    killed = time.monotonic()
    c.kill_router()
    _until(lambda: c.router_state().restarts > restarts and c.router_state().up,
           config.timeout_s, "the router restarted")
    back = time.monotonic() - killed
    clients.wait_done(clients.done() + config.after, config.timeout_s)
    end = clients.done()
    errors = clients.failures(start, end)
    return Phase(end - start, len(errors), back, c.front.held - held, 0, tuple(errors[:3]))


def replica_kill(c: Cluster, clients: Clients, config: FaultsConfig) -> Phase:
    """The ``replica_kill`` phase (see the module doc)."""
    rank = len(c.replicas) - 1
    start = clients.done()
    clients.wait_done(start + config.warm, config.timeout_s)
    restarts = c.replica_states()[rank].restarts
    seen: list[int] = []  # the kill is of a replica with requests: read, then kill at once

    def holds() -> bool:
        seen.append(_in_flight(c.replicas[rank].url))
        return seen[-1] > 0

    _until(holds, config.timeout_s, f"a request in flight on replica {rank}")
    in_flight = seen[-1]
    killed = time.monotonic()
    c.kill(rank)
    _until(lambda: (c.replica_states()[rank].restarts > restarts
                    and c.replica_states()[rank].up and not c.router_state().out_of_rotation),
           config.timeout_s, f"replica {rank} back in the rotation")
    back = time.monotonic() - killed
    clients.wait_done(clients.done() + config.after, config.timeout_s)
    end = clients.done()
    errors = clients.failures(start, end)
    return Phase(end - start, len(errors), back, 0, in_flight, tuple(errors[:3]))


def run_faults(cluster: Cluster, config: FaultsConfig,
               on_phase: Callable[[str], None] | None = None,
               on_done: Callable[[], None] | None = None) -> FaultFigures:
    """Both phases against a started ``cluster`` (which keeps running); ``on_phase`` is told
    each phase's name as it begins, ``on_done`` every finished request."""
    clients = Clients(cluster.router_url, config.clients, config.max_tokens, on_done).start()
    try:
        if on_phase is not None:
            on_phase("router_kill")
        router = router_kill(cluster, clients, config)
        if on_phase is not None:
            on_phase("replica_kill")
        replica = replica_kill(cluster, clients, config)
    finally:
        clients.stop()
    return FaultFigures(router, replica, sum(s.restarts for s in cluster.replica_states()),
                        cluster.router_state().restarts)


def bench_faults(config: FaultsConfig, on_phase: Callable[[str], None] | None = None,
                 on_done: Callable[[], None] | None = None) -> FaultFigures:
    """A fresh round-robin cluster (every replica has requests in flight), both phases, stop."""
    cc = ClusterConfig(config.replicas, RoutePolicy.ROUND_ROBIN, config.blocks)
    cluster = Cluster(cc).start()
    try:
        return run_faults(cluster, config, on_phase, on_done)
    finally:
        cluster.close()
