"""The evictor: which cached leaf goes next and when eviction runs (LRU order, watermarks).

``Evictor`` owns the logical access clock, the heap of evictable leaves and the watermarks.
It decides *who* gives up blocks and *how many*; how a leaf is cut (its blocks freed, its
parent merged or re-offered, the events) is the tree's, behind the ``Cutter`` protocol. The
tree's lock guards it like the rest of the tree: every method runs under that lock.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable
from typing import Protocol

from radixcache.core import recency
from radixcache.core.blocks import BlockAllocator, PoolExhausted
from radixcache.core.nodes import EvictResult, RadixNode, TreeStats

# What cutting one leaf did: (blocks back on the free list, its parent's merge included;
# tokens no longer cached; the leaf's parent when the leaf went whole and the parent became
# an evictable leaf, to be offered, else None). A plain tuple, not a NamedTuple: a cut runs
# on nearly every allocation of a full pool, and a NamedTuple's ``__new__`` is a Python call
# (~0.35 us, ten times a tuple's).
Cut = tuple[int, int, RadixNode | None]


class Cutter(Protocol):
    """What the evictor asks of the tree's structure."""

    def cut(self, leaf: RadixNode, want: int) -> Cut:
        """Free blocks of the evictable ``leaf``'s least recent tokens (as few as give
        ``want``)."""
        ...

    def live_nodes(self) -> Iterable[RadixNode]:
        """Every node of the tree (the root included)."""
        ...

    def __len__(self) -> int:
        """The number of nodes, the root included."""
        ...


class Evictor:
    """LRU over the evictable leaves (unpinned, childless, not the root): one heap entry a
    leaf, keyed by the access time of its deepest tokens (``tail_clock``) when queued, with
    lazy re-queue.

    A touch does not push (entries only ever understate a clock): the eviction loop re-queues
    an entry whose node was used since, so the first entry it finds current is the least
    recently used leaf (exact LRU, O(log n) a step). A parent that becomes a leaf enters at its own
    access time, which an append-only queue could not do."""

    def __init__(
        self, tree: Cutter, alloc: BlockAllocator, stats: TreeStats, high: float, low: float
    ) -> None:
        self._tree = tree
        self.alloc = alloc
        self.stats = stats
        self.set_watermarks(high, low)
        self.clock = 0  # the logical time of the last access; the walk stamps nodes with it
        # time each pass into stats.last_evict_ns (bench tree's timed replay): off, a pass
        # runs on nearly every allocation of a full pool and two clock reads are ~5% of it
        self.clocked = False
        self._heap: list[tuple[int, int, RadixNode]] = []

    def clear(self) -> None:
        """Forget every leaf and restart the clock (the tree was emptied)."""
        self._heap = []
        self.clock = 0

    def touch(self, node: RadixNode, upto: int) -> int:
        """Stamp the path root..``node`` used now, ``node`` itself up to position ``upto``
        (its tokens from there on keep their older time); returns the new clock."""
        self.clock += 1
        c = self.clock
        if upto < node.end:
            B = self.alloc.block_size
            node.older = recency.stamp(node.clock, node.older, node.end, upto, c, B)
        else:
            node.older = ()
        node.clock = c
        n = node.parent
        while n is not None:
            n.clock = c
            if n.older:
                n.older = ()
            n = n.parent
        return c

    # -- the LRU heap ----------------------------------------------------------------------
    def offer(self, node: RadixNode) -> None:
        """Queue ``node`` if it became an evictable leaf and has no entry yet."""
        if not node.queued and node.evictable:
            node.queued = True
            heapq.heappush(self._heap, (node.tail_clock, node.id, node))

    def entries(self) -> list[tuple[int, int, RadixNode]]:
        """The heap's entries (clock when queued, id, node), stale ones included (a copy)."""
        return list(self._heap)

    def order(self, limit: int) -> list[RadixNode]:
        """The next ``limit`` victims in order (changes nothing)."""
        live = [(n.tail_clock, n.id, n) for _, _, n in self._heap if n.alive and n.evictable]
        return [n for _, _, n in heapq.nsmallest(limit, live)]

    def _rebuild(self, tree: Cutter) -> None:
        heap: list[tuple[int, int, RadixNode]] = []
        for n in tree.live_nodes():
            n.queued = n.evictable
            if n.queued:
                heap.append((n.tail_clock, n.id, n))
        heapq.heapify(heap)
        self._heap = heap

    # -- eviction --------------------------------------------------------------------------
    def evict(self, want: int) -> EvictResult:
        """Free ``want`` blocks (or all that can go) from the tails of LRU leaves: the least
        recently used leaf gives up its least recent tokens, tail first, as few blocks as
        complete ``want``, and stays cached with the rest. Per block this is exact LRU (the
        deepest tokens of the leaf with the oldest tail are the least recent of all)."""
        nodes, tokens, freed = self._evict(want)
        return EvictResult(nodes, tokens, freed, freed < want)

    def _evict(self, want: int) -> tuple[int, int, int]:
        """``evict``'s loop: (leaves removed whole, tokens, blocks freed). It runs on nearly
        every allocation once the pool is full, so it reads the heap's top in place: a leaf
        that gives up only its tail keeps its entry there (its tail time is unchanged, or
        newer when its deepest stretch went whole, which the next look re-queues)."""
        tree, heap = self._tree, self._heap
        freed = nodes = tokens = 0
        while freed < want and heap:
            clock, _, node = heap[0]
            # ``node.evictable`` spelled out (entries are never the root): no property call
            if not node.alive or node.children or node.pins:
                heapq.heappop(heap)  # offered again once it is an evictable leaf
                node.queued = False
                continue
            older = node.older
            tail = older[-1][1] if older else node.clock
            if tail != clock:  # used (or cut) since it was queued: re-queue at that time
                heapq.heapreplace(heap, (tail, node.id, node))
                continue
            blocks, cut, exposed = tree.cut(node, want - freed)
            freed += blocks
            tokens += cut
            if not node.alive:  # its entry is still on top: cutting pushes nothing
                heapq.heappop(heap)
                node.queued = False
                nodes += 1
                if exposed is not None:
                    self.offer(exposed)
        if nodes and len(heap) > 2 * len(tree) + 32:  # entries of merged-away nodes linger
            self._rebuild(tree)
        return nodes, tokens, freed

    def evict_sparing(self, want: int, keep: RadixNode) -> None:
        """``evict`` while holding ``keep``'s path (a pin that nets to zero: no event)."""
        keep.pins += 1
        try:
            self.evict(want)
        finally:
            keep.pins -= 1
        self.offer(keep)  # its entry was dropped if it came up during the hold

    def make_room(self, need: int) -> None:
        """Evict so that ``need`` blocks are free, and down to ``low`` once past ``high``.
        Raises ``PoolExhausted`` when that many cannot be had."""
        a = self.alloc
        free = a.free_count
        if free < need + self._reserve and a.num_blocks - free + need > self._high_blocks:
            t0 = time.perf_counter_ns() if self.clocked else 0
            free += self._evict(need + self._reserve - free)[2]
            if t0:
                self.stats.last_evict_ns = time.perf_counter_ns() - t0
            self.stats.evict_calls += 1
        if free < need:
            raise PoolExhausted(f"need {need} blocks, {free} free and nothing more evictable")

    def set_watermarks(self, high: float, low: float) -> None:
        """Past ``high`` (fraction of blocks used) evict down to ``low``."""
        check_watermarks(high, low)
        self.high, self.low = high, low
        self._high_blocks = high * self.alloc.num_blocks  # eviction starts past this use
        self._reserve = round(self.alloc.num_blocks * (1 - low))  # and frees down to this


def check_watermarks(high: float, low: float) -> None:
    """Raise ``ValueError`` unless ``0 < low <= high <= 1``."""
    if not 0.0 < low <= high <= 1.0:
        raise ValueError(f"watermarks need 0 < low <= high <= 1, got high={high} low={low}")
