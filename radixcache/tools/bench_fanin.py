"""``radixcache bench events --publishers N``: one process follows N engine streams at once.

Each of N publishers (one per replica, on its own loopback ports) sends the same recorded
run of chat requests through the tree (the batches a served tree published); one child
process runs N subscribers, one mirror each, as the cluster screen does. Reported: events/s
arriving in total, batches lost (never applied), and how many mirrors ended with the digest
of the tree that made the batches.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import NamedTuple

from radixcache.core import events as ev
from radixcache.core.pool import KVPool
from radixcache.core.tree import RadixTree
from radixcache.serving.driver import serve_request
from radixcache.tools.bench_events import _workload_prompts
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.publisher import Publisher, SnapshotAt
from radixcache.wire.subscriber import Subscriber


class FanInResult(NamedTuple):
    """What ``run_fanin`` measured (the keys of ``bench events --publishers N --json``)."""

    publishers: int
    events: int  # arrived in total, every stream
    events_per_s: float
    lost: int  # batches never applied, every stream
    digests_equal: int  # mirrors whose digest equals the tree's at the end
    resyncs: int
    seconds: float


def _recorded(requests: int, per_step: int) -> tuple[list[list[ev.AnyEvent]], ev.Snapshot, str]:
    """The batches a tree publishes for ``requests`` chat requests, its first snapshot and its
    final digest."""
    tree = RadixTree(KVPool(4096, 16))
    snap0 = tree.snapshot()
    batches: list[list[ev.AnyEvent]] = []
    prompts = _workload_prompts("chat", requests)
    for i in range(0, len(prompts), per_step):
        for tokens in prompts[i:i + per_step]:
            serve_request(tree, tokens)
        batches.append(tree.take_events())
    return batches, snap0, tree.digest()


def _followers(endpoints: list[tuple[str, str, str]], conn: Connection) -> None:
    """Child process: one subscriber per stream; report when each reached its last seq."""
    subs = [Subscriber(Endpoints(*e)) for e in endpoints]
    for s in subs:
        s.start()
    conn.send([s.wait_synced(60) for s in subs])
    last: int = conn.recv()
    end = time.monotonic() + 300
    while any(s.seq < last for s in subs) and time.monotonic() < end:
        time.sleep(0.001)
    done = time.monotonic()
    conn.send((done, [(s.seq, s.stats.batches, s.stats.resyncs, s.mirror.digest())
                      for s in subs]))
    for s in subs:
        s.stop()


def run_fanin(publishers: int, requests: int = 20_000, per_step: int = 16,
              progress: Callable[[str], None] | None = None) -> FanInResult:
    """Publish one recorded run on ``publishers`` streams at full speed to one process that
    follows them all (see the module doc)."""
    say = progress if progress is not None else (lambda _: None)
    say("recording the run")
    batches, snap0, digest = _recorded(requests, per_step)
    pubs = [_publisher(snap0) for _ in range(publishers)]
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_followers, args=([tuple(p.endpoints) for p in pubs], child),
                       daemon=True)
    try:
        proc.start()
        say("subscribers joining")
        if not all(parent.recv()):
            raise RuntimeError("a subscriber did not sync")
        say(f"streaming {len(batches):,} batches on {publishers} publishers")
        t0 = time.monotonic()
        threads = [threading.Thread(target=_publish_all, args=(p, batches)) for p in pubs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        parent.send(len(batches))
        done, ends = parent.recv()
        proc.join(10)
    finally:
        for p in pubs:
            p.close()
    events = sum(len(b) for b in batches) * publishers
    return FanInResult(publishers, events, round(events / (done - t0)),
                       sum(len(batches) - seq for seq, _, _, _ in ends),
                       sum(d == digest for _, _, _, d in ends),
                       sum(r for _, _, r, _ in ends), round(done - t0, 3))


def _publisher(snap0: ev.Snapshot) -> Publisher:
    """A started publisher whose snapshot is the run's first (subscribers join before it
    publishes), with no heartbeats: its seq N is the run's batch N."""
    holder: list[Publisher] = []

    def at() -> SnapshotAt:
        return SnapshotAt(snap0, holder[0].seq)

    holder.append(Publisher(Endpoints.tcp("127.0.0.1", 0), at, ring=1 << 15, hwm=1 << 17,
                            heartbeat_s=1e9))
    return holder[0].start()


def _publish_all(pub: Publisher, batches: list[list[ev.AnyEvent]]) -> None:
    for events in batches:
        pub.publish(list(events))
