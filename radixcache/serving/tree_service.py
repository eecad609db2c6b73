"""TreeService: the half of a ``CacheService`` that the engine and the tree driver share.

Both serve a ``RadixTree`` and answer the same questions about it the same way: its snapshot
and digest, evictions and watermarks, a memory sample, pause and resume, the counters since
start or the last reset, and ``stats``. ``Engine`` and ``TreeDriver`` subclass it and add
only what differs: how requests are queued, stepped and cancelled (``submit_workload``,
``busy``, ``step``, ``take_events``, ``reset``), and their queue depths (``depths``).

The subclass counts into ``totals`` (public, zeroed by ``new_generation``) and calls
``new_generation`` from its ``reset`` once its requests are gone.
"""

from __future__ import annotations

import dataclasses

from radixcache.core import events as ev
from radixcache.core.nodes import TreeStats
from radixcache.core.tree import EvictResult, RadixTree
from radixcache.serving.memory import MemorySource
from radixcache.serving.stats import Stats, Totals


class TreeService:
    """The shared state of a served tree: the tree, its memory source, the running totals
    and the counter generation. Not thread-safe by itself: ``ServiceLoop`` calls it under
    its state lock."""

    def __init__(self, tree: RadixTree, memory: MemorySource, *, model: str, device: str,
                 cache: bool = True) -> None:
        self.tree = tree
        self.totals = Totals()
        self.generation = 0  # resets since start
        self._memory = memory
        self._label = (model, device, "on" if cache else "off")
        self._paused = False
        self._base = TreeStats()  # the tree's lifetime counters at the last reset

    # -- what differs (the subclass says) ---------------------------------------------------
    def depths(self) -> tuple[int, int]:
        """(waiting, running) requests now."""
        raise NotImplementedError

    # -- pause ------------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        """True between ``pause()`` and ``resume()``."""
        return self._paused

    def pause(self) -> None:
        """Stop admitting waiting requests; running ones go on to finish."""
        self._paused = True

    def resume(self) -> None:
        """Admit waiting requests again."""
        self._paused = False

    # -- the tree ---------------------------------------------------------------------------
    def evict(self, tokens: int) -> EvictResult:
        """Evict at least ``tokens`` tokens of unpinned LRU leaves (or as many as can go)."""
        return self.tree.evict(tokens)

    def set_watermarks(self, high: float, low: float) -> None:
        """Set the eviction band (fractions of used blocks); ``ValueError`` unless
        0 < low <= high <= 1."""
        self.tree.set_watermarks(high, low)

    def snapshot(self) -> ev.Snapshot:
        """The tree's snapshot (running requests' blocks included)."""
        return self.tree.snapshot()

    def digest(self) -> str:
        """The tree's structure digest."""
        return self.tree.digest()

    def watermark(self) -> ev.Watermark:
        """A memory sample now: pool blocks used/total, the marks, NVML device memory (or why
        it is missing)."""
        a, kv = self.tree.alloc, self.tree.pool.kv
        s = self._memory.sample(a.used_count, a.num_blocks, kv.numel() * kv.element_size())
        return ev.Watermark(a.used_count, a.num_blocks, self.tree.high, self.tree.low,
                            s.device_used_bytes, s.device_total_bytes, s.nvml_error)

    def new_generation(self) -> None:
        """Empty the tree, zero the totals, count one more reset (the caller has cancelled
        or dropped every request first)."""
        self.tree.reset()
        self.totals = Totals()
        self.generation += 1
        self._base = dataclasses.replace(self.tree.stats)

    # -- figures ----------------------------------------------------------------------------
    def stats(self) -> Stats:
        """Every figure now, counted since start or the last reset (``generation``)."""
        t, s, b = self.totals, self.tree.stats, self._base
        waiting, running = self.depths()
        model, device, cache = self._label
        return Stats(
            generation=self.generation, submitted=t.submitted, finished=t.finished,
            rejected=t.rejected, cancelled=t.cancelled, waiting=waiting, running=running,
            paused=self._paused, steps=t.steps, prompt_tokens=t.prompt_tokens,
            hit_tokens=t.hit_tokens, prefill_tokens=t.prefill_tokens,
            output_tokens=t.output_tokens, busy_s=t.busy_s, nodes=len(self.tree),
            used_blocks=self.tree.alloc.used_count, num_blocks=self.tree.alloc.num_blocks,
            splits=s.splits - b.splits, merges=s.merges - b.merges,
            cow_copies=s.cow_copies - b.cow_copies,
            evicted_nodes=s.evicted_nodes - b.evicted_nodes,
            evicted_tokens=s.evicted_tokens - b.evicted_tokens,
            cache=cache, model=model, device=device,
            kv_bytes_per_block=self.tree.pool.bytes_per_block(),
            kv_bytes_per_token=self.tree.pool.bytes_per_block() // self.tree.pool.block_size)

    def counters(self) -> ev.Counters:
        """The heartbeat's counters (``stats().counters()``)."""
        return self.stats().counters()

    def close(self) -> None:
        """Release the memory source."""
        self._memory.close()
