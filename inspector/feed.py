"""Feed: the one place where batches meet the mirror.

A source's thread calls ``Feed.apply`` for every batch it decodes; the UI's frame timer calls
``Feed.take`` once per frame and gets a ``Delta``: what changed since the previous frame
(structure, touched blocks, nodes to flash, the newest events for the log). Both hold
``Feed.lock``, so the UI reads a mirror that is never half-way through a batch.

Besides the mirror the feed keeps the few indexes the panes need and the mirror does not
have: the set of pinned nodes (so the block map finds pinned blocks without a scan) and the
wall time of each access clock (so the tree and LRU panes can show ages).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import assert_never

from inspector.fates import Fates
from inspector.retractions import Retractions
from radixcache.analysis.follow import Follower
from radixcache.core import events as ev
from radixcache.core.kinds import tag
from radixcache.wire.mirror import Mirror, MirrorError, MirrorNode

UNLOGGED = (ev.Access, ev.Pin)  # most of a stream, and each only repeats a request's path


class Flash(Enum):
    """Why a node is highlighted for a moment."""

    CREATE = "create"
    EXTEND = "extend"
    SPLIT = "split"
    MERGE = "merge"
    EVICT = "evict"


class LogEntry:
    """One event as the log shows it, with the time of its batch."""

    __slots__ = ("event", "kind", "seq", "ts")

    def __init__(self, ts: float, seq: int, event: ev.AnyEvent) -> None:
        self.ts = ts
        self.seq = seq
        self.event = event
        self.kind = tag(event)


@dataclass
class Delta:
    """What changed between two frames. ``rebuild`` means the tree rows must be redone from
    scratch (snapshot, reset, resync); ``structure`` that nodes appeared or went away."""

    batches: int = 0
    events: int = 0
    structure: bool = False
    rebuild: bool = False
    watermarks: list[ev.Watermark] = field(default_factory=list)  # every sample, in order
    blocks: set[int] = field(default_factory=set)
    flashes: dict[int, Flash] = field(default_factory=dict)
    log: list[LogEntry] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    merged: dict[int, int] = field(default_factory=dict)  # merged parent id -> the child
    evicted: set[int] = field(default_factory=set)  # node ids evicted since the last frame

    @property
    def empty(self) -> bool:
        """True when nothing at all happened."""
        return self.events == 0 and self.batches == 0 and not self.errors


class Feed:
    """Applies batches to a mirror (any thread) and hands out per-frame deltas (UI thread)."""

    def __init__(self, mirror: Mirror | None = None) -> None:
        self.lock = threading.Lock()
        self.mirror = mirror if mirror is not None else Mirror()
        self.pinned: set[int] = set()  # nodes with pins > 0 (the root too), after each batch
        self._touched: set[int] = set()  # nodes whose path's pins a noted event changed
        self.seq = -1
        self.epoch = -1
        self.engine = ""
        self.last_ts = 0.0
        self.out_of_sync = False
        self._clocks: list[int] = []
        self._clock_ts: list[float] = []
        self._delta = Delta()
        self._nodes = self.mirror.nodes  # the node table last seen (a new one: tree replaced)
        # the what-if curve since the inspector began and why each request missed: follows
        # every event the mirror applies, under this lock (the what-if and why screens)
        self.follow = Follower(self.mirror)
        self.fates = Fates()  # what became of the nodes that left (the selection's note)
        self.retractions = Retractions()  # each request's retractions (the why screen)

    # -- writer side (source threads) ------------------------------------------------------
    def apply(self, batch: ev.Batch) -> bool:
        """Apply a whole batch under the lock. Returns False (and marks the feed out of sync,
        keeping what applied) when an event does not fit; a snapshot batch repairs it.

        Yields the GIL afterwards, so a source applying back to back cannot starve the UI
        thread of the lock (Python locks are not fair)."""
        try:
            return self._apply(batch)
        finally:
            time.sleep(0)

    def _begin(self, batch: ev.Batch) -> Delta:
        """Count ``batch`` into the frame's delta and take its position (lock held)."""
        d = self._delta
        d.batches += 1
        self.seq, self.epoch, self.engine = batch.seq, batch.epoch, batch.engine
        self.mirror.seq = batch.seq
        self.last_ts = batch.ts
        return d

    def _apply(self, batch: ev.Batch) -> bool:
        with self.lock:
            d = self._begin(batch)
            for e in batch.events:
                try:
                    self.mirror.apply(e)
                except MirrorError as err:
                    self.out_of_sync = True
                    d.errors.append(f"seq {batch.seq}: {err}")
                    d.rebuild = True
                    return False
                self._note(d, batch, e)
            self._settle_pins()
            return True

    def observe(self, batch: ev.Batch) -> None:
        """Record the deltas of a batch someone else already applied to ``mirror`` (a
        subscriber that shares ``lock``); call with the lock NOT held."""
        with self.lock:
            d = self._begin(batch)
            for e in batch.events:
                self._note(d, batch, e)
            self._settle_pins()

    def resynced(self, ts: float) -> None:
        """The mirror was replaced behind the feed's back (a subscriber loaded a snapshot)."""
        with self.lock:
            self._after_snapshot(self._delta, ts, "a snapshot replaced the tree (a resync)")

    def load(self, snapshot: ev.Snapshot, seq: int, ts: float,
             restore: Callable[[Mirror], None] | None = None) -> None:
        """Replace everything with ``snapshot`` (join, resync, replay seek); ``restore`` then
        sets what a snapshot does not hold (a replay's counters at that point), in the same
        lock hold, so no frame shows the tree of one point with the counts of another."""
        with self.lock:
            if seq < self.seq:  # back (a replay's seek): its retractions come again
                self.retractions.clear()
            self.mirror.load_snapshot(snapshot, seq)
            if restore is not None:
                restore(self.mirror)
            self.seq, self.last_ts = seq, ts
            self._after_snapshot(self._delta, ts, "a snapshot replaced the tree")

    def _after_snapshot(self, d: Delta, ts: float, why: str) -> None:
        self.fates.wiped(why, self.seq, max(self._nodes, default=0) + 1)
        self._unlink_dropped()
        self.out_of_sync = False
        self.pinned = {n.id for n in self.mirror.nodes.values() if n.pins > 0}
        self._touched.clear()  # the events before the snapshot are superseded by it
        self._clocks, self._clock_ts = [self.mirror.clock], [ts]
        d.rebuild = d.structure = True
        d.blocks.update(range(self.mirror.num_blocks))

    def _note(self, d: Delta, batch: ev.Batch, e: ev.AnyEvent) -> None:  # noqa: C901
        d.events += 1
        if not isinstance(e, UNLOGGED):
            d.log.append(LogEntry(batch.ts, batch.seq, e))
        match e:
            case ev.Access():
                # one entry per batch time (the batch's first clock) keeps this bounded
                if not self._clock_ts or self._clock_ts[-1] != batch.ts:
                    self._clocks.append(e.clock)
                    self._clock_ts.append(batch.ts)
            case ev.Pin():
                self._touched.add(e.node)
            case ev.NodeCreated() | ev.Extend():
                d.structure = True
                d.flashes[e.node] = Flash.CREATE if isinstance(e, ev.NodeCreated) else Flash.EXTEND
                d.blocks.update(e.blocks)
            case ev.Split():
                d.structure = True
                d.flashes[e.node] = d.flashes[e.prefix] = Flash.SPLIT
                d.blocks.update(e.suffix_blocks[:1])  # the boundary block may now be shared
                self._touched.add(e.prefix)
            case ev.Merge():
                d.structure = True
                d.flashes[e.child] = Flash.MERGE
                d.merged[e.parent] = e.child
                self.fates.merged(e.parent, e.child, batch.seq)
                if e.dropped is not None:
                    d.blocks.add(e.dropped)
                self._touched.add(e.child)  # the joined node, heir of the parent's pins
            case ev.Evict():
                d.structure = True
                d.flashes[e.node] = Flash.EVICT
                d.evicted.add(e.node)
                self.fates.evicted(e.node, batch.seq)
                d.blocks.update(e.freed)
            case ev.BlockAlloc() | ev.BlockFree():
                d.blocks.update(e.blocks)
            case ev.Cow():
                d.blocks.update((e.src, e.dst))
            case ev.Watermark():
                d.watermarks.append(e)
            case ev.Snapshot():
                self._after_snapshot(d, batch.ts, "a snapshot replaced the tree")
            case ev.Reset():
                self._after_snapshot(d, batch.ts, "the cache was reset")
            case ev.Retract():
                self.retractions.retracted(e, batch.seq, batch.ts)
            case ev.RequestStart():
                self.retractions.started(e, batch.seq, batch.ts)
            case ev.RequestFinish():
                self.retractions.finished(e, batch.seq, batch.ts)
            case (ev.Counters() | ev.Fault() | ev.Digest() | ev.RequestCached() | ev.Queue()):
                pass  # the log has them; the panes read them off the mirror
            case _:
                assert_never(e)

    def _unlink_dropped(self) -> None:
        """Break the parent/child cycles of a tree the mirror just dropped (snapshot, reset,
        resync), so reference counting frees it at once: the app freezes long-lived objects
        out of the cyclic collector's sight (``gc.freeze``), and a frozen cycle would stay
        pinned for the rest of the session."""
        old, self._nodes = self._nodes, self.mirror.nodes
        if old is self._nodes:
            return
        for n in old.values():
            n.parent = None
            n.children = {}

    def _settle_pins(self) -> None:
        """Bring ``pinned`` up to date once a batch is noted: drop the nodes gone or no longer
        pinned, then walk up from every node a Pin, Split or Merge touched that still exists.
        Per event was not enough: a live feed notes a batch after the subscriber applied all
        of it, and a request that unpinned its path and whose node was then evicted or merged
        away in the same step left the rest of the path in ``pinned`` (its blocks drawn pinned
        with every node r0). Costs one pass over ``pinned`` (the running requests' paths)."""
        nodes = self.mirror.nodes
        self.pinned = {i for i in self.pinned if (n := nodes.get(i)) is not None and n.pins > 0}
        for nid in self._touched:
            self._repin(nodes.get(nid))
        self._touched.clear()

    def _repin(self, n: MirrorNode | None) -> None:
        """Bring ``pinned`` up to date along the path from ``n`` to the root."""
        while n is not None:
            if n.pins > 0:
                self.pinned.add(n.id)
            else:
                self.pinned.discard(n.id)
            n = n.parent

    # -- reader side (UI thread) -----------------------------------------------------------
    def take(self) -> Delta:
        """The changes since the previous call (call with the lock NOT held)."""
        with self.lock:
            return self.take_locked()

    def take_locked(self) -> Delta:
        """``take`` for a caller that holds the lock (and builds its frame in the same hold)."""
        d, self._delta = self._delta, Delta()
        return d

    def idle(self) -> bool:
        """True when nothing arrived since the last ``take`` (a racy read, for polling)."""
        return self._delta.empty

    def access_time(self, clock: int) -> float | None:
        """Wall time of the access at logical ``clock`` (or the latest before it)."""
        i = bisect_right(self._clocks, clock) - 1
        return self._clock_ts[i] if i >= 0 else None

    def pinned_blocks(self) -> set[int]:
        """Blocks held by pinned nodes or by running requests (call under the lock)."""
        out = set(self.mirror.request_blocks)
        nodes = self.mirror.nodes
        for nid in self.pinned:
            n = nodes.get(nid)
            if n is not None and n.parent is not None:
                out.update(n.blocks)
        return out

    def now(self) -> float:
        """The time ages are measured against: the newest batch's (replay shows the recorded
        moment), or the wall clock before any batch arrived."""
        return self.last_ts or time.time()
