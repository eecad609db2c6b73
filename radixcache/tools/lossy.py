"""Batches lost on the wire, for ``bench events --drop`` and the tests of recovery.

``LossyHop`` subscribes to a publisher's PUB and republishes every frame on a PUB of its own
(127.0.0.1, a free port), except the batches its ``drop(seq)`` picks. A subscriber given
``hop.endpoints`` (the hop's events, the publisher's own control and command sockets) loses
those batches as it would to a real loss and recovers them the same way (replay, or a
snapshot when they are older than the ring): no hook inside the subscriber.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import zmq

from radixcache.core.guard import Guard
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.validate import decode_head


class HashDrop:
    """A deterministic pseudo-random ``fraction`` of seqs: multiplicative hashing of the seq
    into [0, 2**32), dropped below ``fraction * 2**32``. Records what it dropped."""

    def __init__(self, fraction: float) -> None:
        self.threshold = int(fraction * 2**32)
        self.dropped: set[int] = set()

    def __call__(self, seq: int) -> bool:
        """True when ``seq`` is to be dropped (and remembered in ``dropped``)."""
        if (seq * 2654435761) % 2**32 < self.threshold:
            self.dropped.add(seq)
            return True
        return False


class LossyHop:
    """A SUB -> PUB relay on its own thread that leaves out the batches ``drop`` picks."""

    def __init__(self, upstream: Endpoints, drop: Callable[[int], bool]) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sub = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RCVHWM, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(upstream.events)
        self._pub = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, 0)
        port = self._pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoints = upstream._replace(events=f"tcp://127.0.0.1:{port}")
        self.drop = drop
        self.guard = Guard()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LossyHop:
        self._thread = self.guard.start("rc-lossy-hop", self._run)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._sub.close(linger=0)
        self._pub.close(linger=0)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._sub.poll(50):
                continue
            while True:
                try:
                    data = self._sub.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if not self.drop(decode_head(data).seq):
                    self._pub.send(data)
