"""Fake peers for the hostile-peer tests: raw ZeroMQ sockets on 127.0.0.1, not our Publisher.

``FakeEngine`` binds an XPUB (so the test knows when the subscriber has subscribed: no
slow-joiner races, exact counters) and a ROUTER for snapshot/replay requests, which the test
answers by hand, frame by frame. ``TreeFeed`` produces real batches and snapshots from a real
radix tree (no model) to mix with the crafted ones.
"""

from __future__ import annotations

import time

import msgspec
import numpy as np
import zmq

from radixcache.core import events as ev
from radixcache.core.pool import KVPool
from radixcache.core.tree import RadixTree
from radixcache.serving.driver import serve_request
from radixcache.wire.endpoints import Endpoints, u64

_ENC = msgspec.msgpack.Encoder(enc_hook=ev.enc_hook)


def encode(obj: object) -> bytes:
    """msgpack of any event struct, crafted fields and all."""
    return _ENC.encode(obj)


class FakeEngine:
    """A hostile or broken engine: the test decides every frame it sends."""

    def __init__(self, port: int = 0) -> None:
        """On random ports, or on ``port`` and ``port + 1`` (what a CLI given only the event
        endpoint connects to)."""
        ctx = zmq.Context.instance()
        self.pub: zmq.Socket[bytes] = ctx.socket(zmq.XPUB)
        self.router: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
        for i, s in enumerate((self.pub, self.router)):
            s.setsockopt(zmq.LINGER, 0)
            s.bind(f"tcp://127.0.0.1:{port + i}" if port else "tcp://127.0.0.1:*")
        events = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        control = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.endpoints = Endpoints(events, control, "tcp://127.0.0.1:9")
        self.requests: list[list[bytes]] = []

    def wait_subscribed(self, timeout: float = 5.0) -> None:
        """Block until a subscriber's subscription arrived (skipping the unsubscription a
        dropped connection leaves)."""
        while True:
            assert self.pub.poll(int(timeout * 1000)), "no subscriber"
            if self.pub.recv() == b"\x01":
                return

    def request(self, timeout: float = 5.0) -> tuple[bytes, list[bytes]]:
        """The next request: (the peer's identity, its frames)."""
        assert self.router.poll(int(timeout * 1000)), "no request"
        ident, *body = self.router.recv_multipart()
        self.requests.append(body)
        return ident, body

    def no_request(self, seconds: float) -> int:
        """Requests that arrive within ``seconds`` (an upper-bound check: a slow machine only
        sends fewer)."""
        end, n = time.monotonic() + seconds, 0
        while (left := end - time.monotonic()) > 0:
            if self.router.poll(int(left * 1000) + 1):
                self.router.recv_multipart()
                n += 1
        return n

    def reply(self, ident: bytes, *frames: bytes) -> None:
        """Send ``frames`` back to ``ident``."""
        self.router.send_multipart([ident, *frames])

    def publish(self, data: bytes) -> None:
        """One frame on the event socket."""
        self.pub.send(data)

    def close(self) -> None:
        """Close both sockets."""
        self.pub.close(linger=0)
        self.router.close(linger=0)


class TreeFeed:
    """Real batches of a real tree, numbered from seq 1 in ``epoch``."""

    def __init__(self, epoch: int = 7, num_blocks: int = 64) -> None:
        self.tree = RadixTree(KVPool(num_blocks, 16))
        self.epoch = epoch
        self.seq = 0
        self.rng = np.random.default_rng(0)

    def snapshot_frames(self, req: bytes) -> list[bytes]:
        """A correct ``snap`` reply at the current seq."""
        return [b"snap", req, u64(self.epoch), u64(self.seq), encode(self.tree.snapshot())]

    def batch(self, requests: int = 2) -> bytes:
        """The next batch: ``requests`` served, with the tree's digest at the end."""
        for _ in range(requests):
            serve_request(self.tree, self.rng.integers(0, 50, 20, dtype=np.uint32))
        events = [*self.tree.take_events(), ev.Digest(self.tree.digest())]
        self.seq += 1
        return ev.encode_batch(ev.Batch(self.seq, self.epoch, time.time(), "fake", events))
