"""Eviction, the LRU heap and merge (path compression) of ``RadixTree``.

A mixin: ``RadixTree`` owns the state declared below and the lock; these methods run under it.
"""

from __future__ import annotations

import heapq
import threading
import time
from array import array
from collections.abc import Callable

from radixcache.core import events as ev
from radixcache.core.blocks import BlockAllocator, PoolExhausted
from radixcache.core.nodes import EvictResult, RadixNode, TreeStats
from radixcache.core.tokens import unpack_token as _first


class EvictMixin:
    """LRU eviction of unpinned leaves (one heap entry a leaf, lazy re-queue) and the merge
    of a node into its only child."""

    root: RadixNode
    B: int
    alloc: BlockAllocator
    stats: TreeStats
    high: float
    low: float
    lock_: threading.Lock
    _emit: Callable[[ev.AnyEvent], None] | None
    _nodes: dict[int, RadixNode]
    _heap: list[tuple[int, int, RadixNode]]

    # -- LRU heap --------------------------------------------------------------------------
    def _offer(self, node: RadixNode) -> None:
        """Queue ``node`` in the LRU heap if it became an evictable leaf (unlocked, childless,
        not the root) and has no entry yet.

        The heap holds at most one entry per node, keyed by the access clock it had when
        queued: a touch does not push (entries only ever understate a clock), and
        ``_pop_victim`` re-queues an entry whose node was used since, so the first entry it
        finds current is the least recently used leaf (exact LRU, O(log n) a step)."""
        if not node.queued and node.evictable:
            node.queued = True
            heapq.heappush(self._heap, (node.clock, node.id, node))

    def _make_room(self, need: int) -> None:
        """Evict so that ``need`` blocks are free, and down to ``low`` once past ``high``."""
        a = self.alloc
        if a.used_count + need > self.high * a.num_blocks:
            target = need + round(a.num_blocks * (1 - self.low))
            if a.free_count < target:
                t0 = time.perf_counter_ns()
                self._evict_blocks(target - a.free_count)
                self.stats.evict_calls += 1
                self.stats.last_evict_ns = time.perf_counter_ns() - t0
        if a.free_count < need:
            raise PoolExhausted(
                f"need {need} blocks, {a.free_count} free and nothing more evictable"
            )

    # -- merge -----------------------------------------------------------------------------
    def _maybe_merge(self, parent: RadixNode) -> int:
        """Join ``parent`` into its only child when both hold the same lock count; returns the
        blocks that freed (the parent's boundary block when only it held it)."""
        if parent is self.root or len(parent.children) != 1:
            return 0
        (child,) = parent.children.values()
        if parent.pins:  # a request locked the parent itself
            return 0
        B = self.B
        dropped: int | None = None
        freed = False
        if child.start % B:
            dropped = parent.blocks[-1]
            freed = self.alloc.decref(dropped)
            if not freed and dropped != child.blocks[0]:
                # the grandparent chain still holds it: its claim falls back to our start
                self.alloc.set_claim(dropped, parent.start % B)
            child.blocks = parent.blocks[:-1] + child.blocks
        else:
            child.blocks = parent.blocks + child.blocks
        grand = parent.parent
        assert grand is not None
        grand.children[_first(parent.tokens, 0)[0]] = child
        child.parent, child.start = grand, parent.start
        child.tokens = parent.tokens + child.tokens
        if parent.clock > child.clock:
            child.clock = parent.clock
            self._offer(child)
        parent.alive = False
        parent.tokens, parent.blocks = b"", array("i")
        del self._nodes[parent.id]
        self.stats.merges += 1
        if self._emit is not None:
            self._emit(ev.Merge(parent.id, child.id, dropped))
        return int(freed)

    # -- eviction --------------------------------------------------------------------------
    def _pop_victim(self) -> RadixNode | None:
        heap = self._heap
        while heap:
            clock, _, node = heap[0]
            if node.alive and node.evictable:
                if node.clock != clock:  # used since it was queued: re-queue at that time
                    heapq.heapreplace(heap, (node.clock, node.id, node))
                    continue
                heapq.heappop(heap)
                node.queued = False
                return node
            heapq.heappop(heap)  # not an evictable leaf now: offered again once it is one
            node.queued = False
        return None

    def _evict_blocks(self, want: int) -> EvictResult:
        """Evict LRU unlocked leaves until ``want`` blocks are freed (or none is left)."""
        freed = nodes = tokens = 0
        while freed < want:
            victim = self._pop_victim()
            if victim is None:
                break
            tokens += victim.num_tokens
            freed += self._evict_leaf(victim)
            nodes += 1
        if len(self._heap) > 2 * len(self._nodes) + 32:  # entries of merged-away nodes linger
            self._rebuild_heap()
        return EvictResult(nodes, tokens, freed)

    def _evict_leaf(self, leaf: RadixNode) -> int:
        parent = leaf.parent
        assert parent is not None
        freed = self.alloc.release_run(leaf.blocks)
        if leaf.start % self.B and parent is not self.root and leaf.blocks[0] == parent.blocks[-1]:
            self.alloc.set_claim(leaf.blocks[0], leaf.start % self.B)
        del parent.children[_first(leaf.tokens, 0)[0]]
        del self._nodes[leaf.id]
        leaf.alive = False
        self.stats.evicted_nodes += 1
        self.stats.evicted_tokens += leaf.num_tokens
        if self._emit is not None:
            self._emit(ev.Evict(leaf.id, leaf.num_tokens, freed))
        leaf.tokens, leaf.blocks = b"", array("i")  # stale heap entries may still point here
        if parent is not self.root:
            if parent.children:
                return len(freed) + self._maybe_merge(parent)
            self._offer(parent)
        return len(freed)

    def _rebuild_heap(self) -> None:
        heap: list[tuple[int, int, RadixNode]] = []
        for n in self._nodes.values():
            n.queued = n.evictable
            if n.queued:
                heap.append((n.clock, n.id, n))
        heapq.heapify(heap)
        self._heap = heap

    def evict(self, n_tokens: int) -> EvictResult:
        """Free at least ``n_tokens`` token slots (rounded up to blocks) of LRU unlocked leaves,
        or as many as can be freed. Locked paths are never evicted."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        with self.lock_:
            return self._evict_blocks((n_tokens + self.B - 1) // self.B)

    def lru_order(self, limit: int) -> list[RadixNode]:
        """The next ``limit`` eviction victims in order (does not change the tree)."""
        with self.lock_:
            live = [(n.clock, n.id, n) for _, _, n in self._heap if n.alive and n.evictable]
            return [n for _, _, n in heapq.nsmallest(limit, live)]

    # -- watermarks ------------------------------------------------------------------------
    @staticmethod
    def _check_watermarks(high: float, low: float) -> None:
        if not 0.0 < low <= high <= 1.0:
            raise ValueError(f"watermarks need 0 < low <= high <= 1, got high={high} low={low}")

    def set_watermarks(self, high: float, low: float) -> None:
        """Set the eviction band: past ``high`` (fraction of blocks used) evict down to ``low``."""
        self._check_watermarks(high, low)
        with self.lock_:
            self.high, self.low = high, low
