"""`bench events` key ``hostile``: a subscriber against a real peer process that misbehaves.

The peer is another process with raw ZeroMQ sockets (an XPUB for batches, a ROUTER that
answers snapshot and replay requests honestly from a ring). It drives a real radix tree (no
model) and, in the hostile run, injects into its event stream:

- 1% malformed frames (one garbage frame after every 100th batch, taking no seq),
- 0.1% gaps (every 1000th batch is not published, only kept for replay),
- one self-parent event (a batch whose ``create`` names its own id as parent: it cannot fit,
  so the subscriber must resync from a snapshot),
- one oversized frame (past the subscriber's ``MAX_BATCH_BYTES``: ZeroMQ drops it and the
  connection, and the subscriber recovers what it missed by replay).

The subscriber runs in a third process so that its peak RSS is its own. A clean run (the same
stream, nothing injected) gives the RSS to compare with.
"""

from __future__ import annotations

import enum
import multiprocessing as mp
import resource
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import NamedTuple

import msgspec
import numpy as np
import zmq

from radixcache.core import events as ev
from radixcache.wire.endpoints import Endpoints, from_u64, u64
from radixcache.wire.subscriber import Subscriber
from radixcache.wire.validate import MAX_BATCH_BYTES

GARBAGE = b"\x93\xc1garbage"
_ENC = msgspec.msgpack.Encoder(enc_hook=ev.enc_hook)


class Mode(enum.Enum):
    """What the peer injects."""

    CLEAN = "clean"
    HOSTILE = "hostile"


class HostileResult(NamedTuple):
    """What the hostile run measured (``bench events --json`` key ``hostile``)."""

    batches: int
    malformed_sent: int
    gaps_sent: int
    malformed_counted: int
    resyncs: int
    replayed_batches: int
    subscriber_crashes: int
    digest_equal_after_recovery: bool
    peak_rss_mb: float
    clean_peak_rss_mb: float
    rss_ratio: float
    seconds: float


class _Peer:
    """The misbehaving engine (runs in its own process)."""

    def __init__(self, mode: Mode) -> None:
        # imported here: the pool imports torch, which the follower process must not load
        # (its peak RSS is the figure)
        from radixcache.core.pool import KVPool
        from radixcache.core.tree import RadixTree
        from radixcache.serving.driver import serve_request

        self.hostile = mode is Mode.HOSTILE
        self.serve_request = serve_request
        self.tree = RadixTree(KVPool(1024, 16))
        self.ring: deque[tuple[int, bytes]] = deque(maxlen=1 << 14)
        self.seq, self.epoch = 0, 5
        self.rng = np.random.default_rng(0)
        self.bases = [self.rng.integers(0, 500, 40, dtype=np.uint32) for _ in range(16)]
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.pub, self.router = ctx.socket(zmq.XPUB), ctx.socket(zmq.ROUTER)
        for s in (self.pub, self.router):
            s.setsockopt(zmq.LINGER, 0)
            s.bind("tcp://127.0.0.1:*")
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.sent = {"malformed": 0, "gaps": 0}

    def endpoints(self) -> tuple[str, str, str]:
        """The bound addresses (events, control, an unused command endpoint)."""
        return (self.pub.getsockopt_string(zmq.LAST_ENDPOINT),
                self.router.getsockopt_string(zmq.LAST_ENDPOINT), "tcp://127.0.0.1:9")

    def step(self) -> None:
        for _ in range(2):
            base = self.bases[int(self.rng.integers(0, 16))]
            tail = self.rng.integers(0, 500, int(self.rng.integers(1, 40)), dtype=np.uint32)
            self.serve_request(self.tree, np.concatenate([base, tail]))
        events = self.tree.take_events()
        if self.seq % 8 == 7:
            events.append(ev.Digest(self.tree.digest()))
        self.publish(events)

    def publish(self, events: list[ev.AnyEvent]) -> None:
        self.seq += 1
        data = ev.encode_batch(ev.Batch(self.seq, self.epoch, time.time(), "peer", events))
        self.ring.append((self.seq, data))
        if self.hostile and self.seq % 1000 == 500:
            self.sent["gaps"] += 1
            return
        self.pub.send(data)
        if self.hostile and self.seq % 100 == 0:
            self.pub.send(GARBAGE)
            self.sent["malformed"] += 1

    def inject(self, batches: int) -> None:
        """The self-parent event and the oversized frame, once each, mid-run."""
        if not self.hostile:
            return
        if self.seq == batches // 3:
            node = 10**9
            bad = ev.NodeCreated(node, node, 0, b"\x01\x00\x00\x00", [0], shared_first=False)
            self.pub.send(ev.encode_batch(ev.Batch(self.seq + 1, self.epoch, 0.0, "x", [bad])))
        if self.seq == 2 * batches // 3:
            self.pub.send(b"\x00" * (MAX_BATCH_BYTES + 1))

    def serve(self) -> None:
        while self.router.poll(0):
            ident, *body = self.router.recv_multipart()
            if body[:1] == [b"snapshot"] and len(body) == 2:
                snap = _ENC.encode(self.tree.snapshot())
                self.router.send_multipart([ident, b"snap", body[1], u64(self.epoch),
                                            u64(self.seq), snap])
            elif body[:1] == [b"replay"] and len(body) == 3:
                self.replay(ident, body[1], from_u64(body[2]))

    def replay(self, ident: bytes, req: bytes, start: int) -> None:
        if not self.ring or start < self.ring[0][0]:
            self.router.send_multipart([ident, b"too-old", req, u64(0)])
            return
        last = start - 1
        for seq, data in self.ring:
            if seq >= start:
                self.router.send_multipart([ident, b"batch", req, data])
                last = seq
        self.router.send_multipart([ident, b"end", req, u64(last)])


def _peer_main(conn: Connection, mode: Mode, batches: int) -> None:
    peer = _Peer(mode)
    conn.send(peer.endpoints())
    assert peer.pub.poll(30_000)
    peer.pub.recv()  # the subscriber subscribed
    while not peer.router.poll(10):
        pass  # and asked for its snapshot
    peer.serve()
    for _ in range(batches):
        peer.inject(batches)
        peer.step()
        peer.serve()
    conn.send((peer.seq, peer.tree.digest(), peer.sent))
    while not conn.poll(0.05):  # heartbeats reveal a lost last batch; keep answering
        peer.publish([])
        peer.serve()


def _follower_main(endpoints: tuple[str, str, str], conn: Connection) -> None:
    sub = Subscriber(Endpoints(*endpoints), request_timeout_s=1.0).start()
    last, digest = conn.recv()
    end = time.monotonic() + 120
    while sub.seq < last and time.monotonic() < end:
        time.sleep(0.01)
    thread = sub._thread  # the thread must still be alive: it never dies of its input
    alive = thread is not None and thread.is_alive()
    with sub.lock:
        equal = sub.seq >= last and sub.mirror.digest() == digest
    st = sub.stats
    crashes = int(not alive) + st.internal_errors
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    conn.send((crashes, equal, st.malformed, st.resyncs, st.replayed_batches, rss_mb))
    sub.stop()


class _Run(NamedTuple):
    crashes: int
    equal: bool
    malformed: int
    resyncs: int
    replayed: int
    rss_mb: float
    sent: dict[str, int]


def _run(batches: int, mode: Mode) -> _Run:
    ctx = mp.get_context("spawn")
    peer_conn, peer_child = ctx.Pipe()
    peer = ctx.Process(target=_peer_main, args=(peer_child, mode, batches), daemon=True)
    peer.start()
    endpoints = peer_conn.recv()
    sub_conn, sub_child = ctx.Pipe()
    follower = ctx.Process(target=_follower_main, args=(endpoints, sub_child), daemon=True)
    follower.start()
    last, digest, sent = peer_conn.recv()
    sub_conn.send((last, digest))
    crashes, equal, malformed, resyncs, replayed, rss = sub_conn.recv()
    peer_conn.send("stop")
    follower.join(10)
    peer.join(10)
    crashes += int(follower.exitcode not in (0, None))
    return _Run(crashes, equal, malformed, resyncs, replayed, rss, sent)


def run_hostile(batches: int = 5000) -> HostileResult:
    """A clean run and a hostile run of ``batches`` batches each (see the module doc)."""
    t0 = time.perf_counter()
    clean = _run(batches, Mode.CLEAN)
    bad = _run(batches, Mode.HOSTILE)
    return HostileResult(
        batches, bad.sent["malformed"], bad.sent["gaps"], bad.malformed, bad.resyncs,
        bad.replayed, bad.crashes + clean.crashes, bad.equal and clean.equal,
        round(bad.rss_mb, 1), round(clean.rss_mb, 1), round(bad.rss_mb / clean.rss_mb, 3),
        round(time.perf_counter() - t0, 2))


def hostile_rows(r: HostileResult) -> list[tuple[str, str]]:
    """The human table's rows for the hostile run."""
    return [
        ("hostile: malformed / gaps injected", f"{r.malformed_sent} / {r.gaps_sent} "
                                               f"(+1 self-parent, +1 oversized)"),
        ("hostile: malformed counted / resyncs / replayed",
         f"{r.malformed_counted} / {r.resyncs} / {r.replayed_batches}"),
        ("hostile: subscriber crashes", str(r.subscriber_crashes)),
        ("hostile: digest equal after recovery", str(r.digest_equal_after_recovery)),
        ("hostile: peak subscriber RSS (clean run)",
         f"{r.peak_rss_mb:.1f} MB ({r.clean_peak_rss_mb:.1f} MB, x{r.rss_ratio:.2f})"),
    ]
