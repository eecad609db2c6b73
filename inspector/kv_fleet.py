"""The cluster screen over a vLLM or SGLang deployment: one KV-event stream per rank.

``KVFleet`` follows every rank's publisher (``radixcache.wire.kvevents.KVEventsClient``, with
its replay endpoint when given) from one thread and offers what ``inspector.cluster`` reads:
a row per rank and the ranks' block chains merged into one prefix tree
(``FleetTree.add_blocks``). KV events carry neither hit rates nor queues, and a publisher
sends nothing while idle, so a rank shows up once it published a batch and its figures other
than blocks held read ``n/a``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from inspector.cluster import ReplicaView
from radixcache.core.guard import Guard
from radixcache.wire.fleet import FleetTree
from radixcache.wire.kvevents import KVEventsClient

POLL_S = 0.02


class KVFleet:
    """Every rank's KV events (``start()``, then ``close()``); a ``FleetView``."""

    def __init__(self, endpoints: Sequence[str], replays: Sequence[str | None] = ()) -> None:
        if replays and len(replays) != len(endpoints):
            raise ValueError(f"{len(replays)} replay endpoints for {len(endpoints)} publishers")
        self.endpoints = list(endpoints)
        self.replays = list(replays) if replays else [None] * len(self.endpoints)
        self._clients: list[KVEventsClient] = []
        self._lock = threading.Lock()  # the clients' trees change on the polling thread
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.guard = Guard()  # the polling thread's (its fault: ``guard.fault``, on stderr)
        self._thread: threading.Thread | None = None

    def start(self) -> KVFleet:
        """Connect every rank (on the polling thread, which owns the sockets)."""
        self._thread = self.guard.start("rc-kv-fleet", self._run)
        self._ready.wait(5)
        return self

    def _run(self) -> None:
        clients = [KVEventsClient(e, r) for e, r in zip(self.endpoints, self.replays,
                                                          strict=True)]
        with self._lock:
            self._clients = clients
        self._ready.set()
        try:
            # wait with the lock free (a frame reading the views never waits on a socket),
            # then take what arrived under it, waiting on nothing
            while not self._stop.wait(POLL_S):
                with self._lock:
                    for c in clients:
                        c.poll(0)
        finally:
            for c in clients:
                c.close()

    def close(self) -> None:
        """Stop polling and close the sockets."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def views(self) -> list[ReplicaView]:
        """A row per rank: blocks held; up once it published."""
        with self._lock:
            return [ReplicaView(rank, e, c.stats.batches > 0, len(c.blocks), 0, None,
                                None, None)
                    for rank, (e, c) in enumerate(zip(self.endpoints, self._clients,
                                                      strict=True))]

    def merged(self) -> FleetTree:
        """The ranks' block chains as one prefix tree."""
        tree = FleetTree()
        with self._lock:
            for rank, c in enumerate(self._clients):
                tree.add_blocks(rank, c.view)
        return tree
