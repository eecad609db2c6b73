"""``radixcache bench events``: the event stream from a tree driver to a mirror in another
process -- events/s, what publishing costs the tree, a late joiner's sync time, and
(``verify_drops``) the digest after every batch with a fraction of batches dropped.

Measures the stream, not the model: chat requests (prompt + forced answer) run through the
radix tree with no model (``serving.driver.serve_request``), as fast as the tree goes.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import NamedTuple

import numpy as np
from rich.progress import Progress

from radixcache.core import events as ev
from radixcache.core.pool import KVPool
from radixcache.core.tree import RadixTree
from radixcache.serving.driver import TreeDriver, serve_request
from radixcache.serving.loop import LoopConfig, ServiceLoop
from radixcache.tools.lossy import HashDrop, LossyHop
from radixcache.traffic.workloads import build_workload
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.mirror import Mirror
from radixcache.wire.publisher import Publisher, SnapshotAt
from radixcache.wire.subscriber import Subscriber


class _Stream:
    """A tree driver that the bench steps request by request (it times tree operations one by
    one), published through the one ``ServiceLoop``: its state lock, digest cadence and
    snapshots. It is the loop's sink, so it can keep each batch's events (``keep``) and count
    them on the way to the publisher."""

    def __init__(self, num_blocks: int, *, digest_every: int = 0, ring: int = 4096,
                 heartbeat_s: float = 0.5, hwm: int = 10_000,
                 keep: list[list[ev.AnyEvent]] | None = None) -> None:
        self.driver = TreeDriver(num_blocks)
        self.tree = self.driver.tree
        self.keep, self.events = keep, 0
        loops: list[ServiceLoop] = []
        self.pub = Publisher(Endpoints.tcp("127.0.0.1", 0), lambda: loops[0].snapshot_at(),
                             ring=ring, heartbeat_s=heartbeat_s, hwm=hwm)
        self.loop = ServiceLoop(self.driver, self,
                                LoopConfig(digest_every, sample_every_s=float("inf")))
        loops.append(self.loop)

    @property
    def seq(self) -> int:
        """The publisher's last seq (the loop's ``Sink``)."""
        return self.pub.seq

    def publish(self, events: list[ev.AnyEvent]) -> int:
        """Keep (when asked) and count ``events``, then publish them."""
        if self.keep is not None:
            self.keep.append(events)
        self.events += len(events)
        return self.pub.publish(events)


def _workload_prompts(name: str, requests: int) -> list[np.ndarray]:
    """Model-free prompts (prompt + forced answer) for ``bench events``."""
    out: list[np.ndarray] = []
    seed = 0
    while len(out) < requests:
        w = build_workload(name, {"seed": seed})
        for r in w.requests:
            extra = r.forced_output if r.forced_output is not None else np.zeros(0, np.uint32)
            out.append(np.concatenate([r.prompt, extra]).astype(np.uint32))
        seed += 1
    return out[:requests]



# -- the figures -------------------------------------------------------------------------------
class BenchResult(NamedTuple):
    """What `bench events` measured."""

    events: int
    events_per_s: float
    lost: int
    recovered: int
    digest_equal: bool
    publish_overhead: float
    events_overhead: float
    late_join_seconds: float
    late_join_nodes: int
    tree_seconds_events_off: float
    tree_seconds_events_on: float
    publish_seconds: float
    driver_events_per_s: float


def _mirror_process(endpoints: tuple[str, str, str], conn: Connection) -> None:
    """Child process: follow the stream until told the last seq, then report."""
    done = threading.Event()
    target: list[int] = []

    def on_batch(batch: ev.Batch) -> None:
        if target and batch.seq >= target[0]:
            done.set()

    t0 = time.monotonic()
    sub = Subscriber(Endpoints(*endpoints), on_batch=on_batch).start()
    sub.wait_synced(60)
    conn.send(("synced", time.monotonic() - t0))
    target.append(conn.recv())
    if sub.seq >= target[0]:
        done.set()
    done.wait(300)
    conn.send((time.monotonic(), sub.seq, asdict(sub.stats), sub.mirror.digest(),
               time.monotonic() - t0))
    sub.stop()


class _Child(NamedTuple):
    process: BaseProcess
    conn: Connection


def _spawn_mirror(pub: Publisher) -> tuple[_Child, float]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_mirror_process, args=(tuple(pub.endpoints), child), daemon=True)
    proc.start()
    _, synced_s = parent.recv()
    return _Child(proc, parent), synced_s


def _finish(child: _Child, last_seq: int) -> tuple[float, int, dict[str, int], str, float]:
    child.conn.send(last_seq)
    t_done, seq, stats, digest, total = child.conn.recv()
    child.process.join(10)
    return t_done, last_seq - seq, stats, digest, total


def _phase_cost(prompts: list[np.ndarray], per_step: int, progress: Progress) -> tuple[
        list[float], _Stream, list[list[ev.AnyEvent]], ev.Snapshot]:
    """Same run, step by step: tree ops with events off, with events on, and publishing."""
    off = RadixTree(KVPool(4096, 16), record_events=False)
    kept: list[list[ev.AnyEvent]] = []
    # a digest every 256 batches, as a served stream has
    source = _Stream(4096, digest_every=256, ring=1 << 17, keep=kept)
    snap0 = source.tree.snapshot()
    pub = source.pub
    times = [0.0, 0.0, 0.0]
    task = progress.add_task("engine: events off vs on", total=len(prompts))
    with pub:
        child, _ = _spawn_mirror(pub)
        for i in range(0, len(prompts), per_step):
            step = prompts[i:i + per_step]
            times[0] += _timed(off, step)
            with source.loop.changing():
                times[1] += _timed(source.tree, step)
                t = time.perf_counter()
            times[2] += time.perf_counter() - t  # the loop's flush: take, digest, publish
            progress.advance(task, len(step))
        _finish(child, pub.seq)
    return times, source, kept, snap0


def _timed(tree: RadixTree, step: list[np.ndarray]) -> float:
    t = time.perf_counter()
    for tokens in step:
        serve_request(tree, tokens)
    return time.perf_counter() - t


def _phase_throughput(batches: list[list[ev.AnyEvent]], snap0: ev.Snapshot, digest: str,
                      progress: Progress) -> tuple[float, int, int, bool]:
    """Publish recorded tree batches at full speed to a mirror in another process."""
    task = progress.add_task("stream: engine -> mirror", total=1)
    holder: list[Publisher] = []
    pub = Publisher(Endpoints.tcp("127.0.0.1", 0), lambda: SnapshotAt(snap0, holder[0].seq),
                    ring=1 << 17, hwm=100_000)
    holder.append(pub)
    with pub:
        child, _ = _spawn_mirror(pub)
        t0 = time.monotonic()
        for events in batches:
            pub.publish(events)
        t_done, lost, stats, got, _ = _finish(child, pub.seq)
    progress.advance(task)
    n = sum(len(b) for b in batches)
    return n / (t_done - t0), lost, stats["replayed_batches"], got == digest


def _big_tree(nodes: int, progress: Progress) -> _Stream:
    source = _Stream(nodes * 2 + 1024)
    rng = np.random.default_rng(0)
    task = progress.add_task(f"late join: building {nodes:,} nodes", total=nodes)
    tree = source.tree
    while len(tree) < nodes:
        before = len(tree)
        for _ in range(256):
            serve_request(tree, rng.integers(0, 64, int(rng.integers(3, 9)), dtype=np.uint32))
        tree.take_events()
        progress.advance(task, len(tree) - before)
    return source


def _phase_late_join(nodes: int, progress: Progress) -> tuple[float, int]:
    source = _big_tree(nodes, progress)
    pub = source.pub
    with pub:
        child, synced_s = _spawn_mirror(pub)
        _, lost, _, digest, _ = _finish(child, pub.seq)
    if lost or digest != source.tree.digest():
        raise RuntimeError("late joiner did not converge")
    return synced_s, len(source.tree)


def run_bench(requests: int, per_step: int, late_nodes: int, progress: Progress) -> BenchResult:
    """The figures of ``bench events`` (progress bars go to ``progress``)."""
    prompts = _workload_prompts("chat", requests)
    times, source, kept, snap0 = _phase_cost(prompts, per_step, progress)
    events = sum(len(b) for b in kept)
    rate, lost, recovered, equal = _phase_throughput(kept, snap0, source.tree.digest(),
                                                     progress)
    late_s, late_n = _phase_late_join(late_nodes, progress) if late_nodes else (0.0, 0)
    off, on, pub = times
    return BenchResult(events, round(rate), lost, recovered, equal, round(pub / on, 4),
                       round((on + pub - off) / off, 4), round(late_s, 3), late_n,
                       round(off, 3), round(on, 3), round(pub, 3), round(events / on))


# -- bench events --verify-every-batch ----------------------------------------------------------
class DropCheck(NamedTuple):
    """What ``verify_drops`` saw: every batch the subscriber applied was checked against the
    tree's digest recorded by the driver for that seq."""

    events: int
    batches: int
    batches_checked: int
    batches_digest_equal: int
    dropped: int
    recovered: int
    replayed_batches: int
    gaps: int
    snapshots: int
    seconds: float
    events_per_s: float


class _Counts:
    def __init__(self) -> None:
        self.checked = self.equal = self.recovered = 0


def _chat_prompts() -> Iterator[np.ndarray]:
    """Endless model-free chat prompts (prompt + forced answer), 1000 conversations a seed
    (building a workload reads the trace: one big one per seed, not one per request)."""
    for seed in itertools.count():
        for r in build_workload("chat", {"conversations": 1000, "seed": seed}).requests:
            out = r.forced_output if r.forced_output is not None else np.zeros(0, np.uint32)
            yield np.concatenate([r.prompt, out]).astype(np.uint32)


def _catch_up(sub: Subscriber, source: _Stream, digests: dict[int, str]) -> None:
    """Wait (<= 60 s) until ``sub`` applied the last seq. A dropped last batch is revealed
    only by a later one (heartbeats are off): publish an empty batch whenever 0.2 s pass
    without progress."""
    pub = source.pub
    end = time.monotonic() + 60
    last, since = sub.seq, time.monotonic()
    while sub.seq < pub.seq and time.monotonic() < end:
        time.sleep(0.01)
        if sub.seq != last:
            last, since = sub.seq, time.monotonic()
        elif time.monotonic() - since > 0.2:
            with source.loop.lock:
                digests[pub.seq + 1] = source.tree.digest()
                pub.publish([])
            since = time.monotonic()


def verify_drops(min_events: int, drop: float, per_step: int = 16,
                 ring: int = 1 << 15) -> DropCheck:
    """Drive chat requests through a tree (no model) until ``min_events`` events were published,
    recording the tree's digest for each batch's seq; a subscriber behind a ``LossyHop`` that
    leaves out the batches ``HashDrop(drop)`` picks recovers them (replay, or a snapshot when
    too old), and after every batch it applies compares its mirror's digest with the recorded
    one."""
    source = _Stream(4096, ring=ring, heartbeat_s=1e9,
                     hwm=1 << 17)  # no heartbeats: every seq has a digest
    pub = source.pub
    digests: dict[int, str] = {}
    hook, counts = HashDrop(drop), _Counts()

    def on_batch(batch: ev.Batch) -> None:  # the subscriber's thread, right after applying
        counts.checked += 1
        counts.equal += sub.mirror.digest() == digests.get(batch.seq)
        counts.recovered += batch.seq in hook.dropped

    t0 = time.perf_counter()
    with pub, LossyHop(pub.endpoints, hook) as hop:
        sub = Subscriber(hop.endpoints, Mirror(16, 4096), on_batch=on_batch)
        sub.start()
        if not sub.wait_synced(10):
            raise RuntimeError("the subscriber did not sync")
        prompts = _chat_prompts()
        while source.events < min_events:
            while pub.seq - sub.seq > ring // 2:  # keep the gaps replayable from the ring
                time.sleep(0.001)
            with source.loop.changing():  # publishes what changed as batch pub.seq + 1
                for tokens in itertools.islice(prompts, per_step):
                    serve_request(source.tree, tokens)
                digests[pub.seq + 1] = source.tree.digest()
        _catch_up(sub, source, digests)
        sub.stop()
    seconds = time.perf_counter() - t0
    st = sub.stats
    events = source.events
    return DropCheck(events, pub.seq, counts.checked, counts.equal, len(hook.dropped),
                     counts.recovered, st.replayed_batches, st.gaps, st.snapshots,
                     round(seconds, 2), round(events / seconds))
