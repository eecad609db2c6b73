"""Shared helpers of the stream tests: a tree driven without a model, published over loopback."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import zmq

from radixcache.serving.driver import TreeDriver, serve_request
from radixcache.serving.loop import LoopConfig, ServiceLoop
from radixcache.serving.server import Server, ServerConfig
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.publisher import Publisher
from radixcache.wire.subscriber import Subscriber

LOCAL = Endpoints.tcp("127.0.0.1", 0)


def prompts(n: int, seed: int = 0) -> list[np.ndarray]:
    """Requests that share prefixes: 8 system prompts, each continued by 1-3 turns."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 1000, int(rng.integers(5, 40)), dtype=np.uint32) for _ in range(8)]
    out = []
    for _ in range(n):
        base = systems[int(rng.integers(0, 8))]
        tail = rng.integers(0, 1000, int(rng.integers(1, 60)), dtype=np.uint32)
        out.append(np.concatenate([base, tail]))
    return out


class Driven:
    """A tree driver that the test steps request by request; ``serving`` publishes it through
    the one ``ServiceLoop`` (its state lock, digest cadence and snapshots)."""

    def __init__(self, num_blocks: int, digest_every: int) -> None:
        self.driver = TreeDriver(num_blocks)
        self.tree = self.driver.tree
        self.digest_every = digest_every
        self.loop: ServiceLoop | None = None


def make_source(num_blocks: int = 256, digest_every: int = 4) -> Driven:
    """A fresh tree over a small pool (it evicts under load)."""
    return Driven(num_blocks, digest_every)


@contextmanager
def serving(
    source: Driven, endpoints: Endpoints = LOCAL, *, epoch: int | None = None, ring: int = 4096
) -> Iterator[Publisher]:
    """A started publisher over ``source`` (closed on exit)."""
    loops: list[ServiceLoop] = []
    pub = Publisher(endpoints, lambda: loops[0].snapshot_at(), ring=ring, heartbeat_s=0.05,
                    epoch=epoch)
    config = LoopConfig(source.digest_every, sample_every_s=float("inf"))
    source.loop = ServiceLoop(source.driver, pub, config)
    loops.append(source.loop)
    with pub:
        yield pub
    source.loop = None


def drive(source: Driven, requests: list[np.ndarray], per_step: int = 1) -> None:
    """Serve the requests, publishing one batch per ``per_step`` requests (nothing is
    published while ``source`` is not being served: its events stay in the tree)."""
    for i in range(0, len(requests), per_step):
        step = requests[i:i + per_step]
        if source.loop is None:
            for tokens in step:
                serve_request(source.tree, tokens)
            continue
        with source.loop.changing():
            for tokens in step:
                serve_request(source.tree, tokens)


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``cond`` every 10 ms until true or ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def caught_up(sub: Subscriber, pub: Publisher) -> Callable[[], bool]:
    """True once the subscriber applied every batch the publisher has assigned."""
    return lambda: sub.epoch == pub.epoch and sub.seq >= pub.seq


class Relay:
    """A real PUB between a publisher and a subscriber: every frame of ``upstream``'s PUB is
    forwarded in order, and ``inject(frame)`` slips a crafted frame into the stream (how a
    broken or hostile peer looks to the subscriber). ``endpoints`` are what the subscriber
    connects to: the relay's PUB, the publisher's control and command sockets."""

    def __init__(self, upstream: Endpoints) -> None:
        ctx = zmq.Context.instance()
        self._sub = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.connect(upstream.events)
        self._pub = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind("tcp://127.0.0.1:*")
        self.endpoints = Endpoints(self._pub.getsockopt_string(zmq.LAST_ENDPOINT),
                                   upstream.control, upstream.commands)
        self._inject: list[bytes] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)

    def inject(self, frame: bytes) -> None:
        """Send ``frame`` downstream after the frames forwarded so far."""
        with self._lock:
            self._inject.append(frame)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sub.poll(5):
                self._pub.send(self._sub.recv())
            with self._lock:
                frames, self._inject = self._inject, []
            for frame in frames:
                self._pub.send(frame)

    def __enter__(self) -> Relay:
        self._thread.start()
        time.sleep(0.1)  # the SUB's subscription reaches the publisher
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sub.close()
        self._pub.close()


def tree_server(num_blocks: int, **kwargs: object) -> Server:
    """A ``Server`` over a ``TreeDriver`` on free loopback ports (not started)."""
    return Server(TreeDriver(num_blocks), Endpoints.tcp("127.0.0.1", 0),
                  ServerConfig(num_blocks=num_blocks), **kwargs)  # type: ignore[arg-type]
