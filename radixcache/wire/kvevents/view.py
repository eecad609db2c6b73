"""The consumer's model of a foreign cache: blocks held per (rank, tier), linked by parent hash.

vLLM's offloading and SGLang's hierarchical cache store and remove the *same* hash once per
``medium`` (GPU, CPU_PINNED, disk, ...), and data-parallel ranks each hold their own copy. So a
block is held by a set of ``Holder(rank, medium)``; a removal takes one holder away, and the
block is alive while any holder remains. Parent links are by hash, kept apart from the blocks
(``_kids``), so a parent evicted and stored again finds its children again.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from radixcache.wire.kvevents.codec import BlockHash, Cleared, Decoded, Removed, Stored

CHURN_S = 10.0  # a block removed this soon after it was stored counts as churn
RATE_WINDOW_S = 10.0


class Holder(NamedTuple):
    """Who holds a copy of a block: a data-parallel rank and a storage tier."""

    rank: int
    medium: str


@dataclass(slots=True)
class Block:
    """One block alive in at least one (rank, tier)."""

    hash: BlockHash
    parent: BlockHash | None
    tokens: list[int]
    holders: set[Holder]
    stored_at: float

    @property
    def media(self) -> list[str]:
        """The tiers holding it, sorted."""
        return sorted({h.medium for h in self.holders})

    @property
    def ranks(self) -> list[int]:
        """The ranks holding it, sorted."""
        return sorted({h.rank for h in self.holders})


@dataclass(slots=True)
class ViewStats:
    """Cumulative counters of a ``BlockView`` (blocks are (hash, holder) copies)."""

    stored: int = 0
    removed: int = 0
    cleared: int = 0
    unknown_removed: int = 0
    conflicts: int = 0  # a stored hash already alive under another parent: the event is dropped
    churned: int = 0


class Rates(NamedTuple):
    """Stored and removed copies per second over the last ``RATE_WINDOW_S``."""

    stored_per_s: float
    removed_per_s: float


@dataclass(slots=True)
class _Window:
    """Per-second buckets of (stored, removed), the last ``RATE_WINDOW_S`` of them."""

    buckets: deque[list[int]] = field(default_factory=deque)

    def add(self, second: int, stored: int, removed: int) -> None:
        """Count copies stored/removed in ``second``; forget buckets older than the window."""
        if not self.buckets or self.buckets[-1][0] != second:
            self.buckets.append([second, 0, 0])
        self.buckets[-1][1] += stored
        self.buckets[-1][2] += removed
        while self.buckets and self.buckets[0][0] <= second - RATE_WINDOW_S:
            self.buckets.popleft()

    def rates(self, now: float) -> Rates:
        """Per-second means over the window ending at ``now``."""
        live = [b for b in self.buckets if b[0] > now - RATE_WINDOW_S]
        return Rates(sum(b[1] for b in live) / RATE_WINDOW_S,
                     sum(b[2] for b in live) / RATE_WINDOW_S)


class BlockView:
    """Blocks by hash, each with its holders. ``version`` grows on every applied event."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.blocks: dict[BlockHash, Block] = {}
        self.stats = ViewStats()
        self.version = 0
        self.tiers: Counter[str] = Counter()  # medium -> copies held in it
        self._kids: dict[BlockHash, dict[BlockHash, None]] = {}
        self._clock = clock
        self._window = _Window()

    def keys(self) -> set[tuple[BlockHash, str]]:
        """Every (hash, medium) held by some rank: what the publisher(s) hold."""
        return {(b.hash, h.medium) for b in self.blocks.values() for h in b.holders}

    def children(self, h: BlockHash) -> list[Block]:
        """The alive children of block ``h``, in the order they were first stored."""
        return [self.blocks[c] for c in self._kids.get(h, ()) if c in self.blocks]

    def roots(self) -> list[Block]:
        """Alive blocks whose parent is none or not alive."""
        return [b for b in self.blocks.values() if b.parent is None or b.parent not in self.blocks]

    def rates(self) -> Rates:
        """Stored/removed copies per second, recent."""
        return self._window.rates(self._clock())

    def apply(self, event: Decoded, rank: int = 0) -> None:
        """Apply one decoded event from ``rank``."""
        self.version += 1
        if isinstance(event, Stored):
            self._store(event, rank)
        elif isinstance(event, Removed):
            for h in event.hashes:
                self._remove(h, Holder(rank, event.medium))
        elif isinstance(event, Cleared):
            self._clear(rank)

    def drop_rank(self, rank: int) -> None:
        """Forget every copy ``rank`` holds (its publisher restarted); counters stay cumulative."""
        self.version += 1
        self._drop_rank(rank)

    def _store(self, e: Stored, rank: int) -> None:
        now = self._clock()
        holder = Holder(rank, e.medium)
        parent, size, added = e.parent, e.block_size, 0
        for i, h in enumerate(e.hashes):
            block = self.blocks.get(h)
            if block is None:
                tokens = e.token_ids[i * size:(i + 1) * size]
                self.blocks[h] = block = Block(h, parent, tokens, set(), now)
                if parent is not None:
                    self._kids.setdefault(parent, {})[h] = None
            elif block.parent != parent:
                self.stats.conflicts += 1  # a loop or a collision: keep the tree a tree
                break
            if holder not in block.holders:
                block.holders.add(holder)
                self.tiers[holder.medium] += 1
                added += 1
            parent = h
        self.stats.stored += added
        self._window.add(int(now), added, 0)

    def _remove(self, h: BlockHash, holder: Holder) -> None:
        block = self.blocks.get(h)
        if block is None or holder not in block.holders:
            self.stats.unknown_removed += 1
            return
        now = self._clock()
        self.stats.removed += 1
        self._window.add(int(now), 0, 1)
        if self._drop(block, holder) and now - block.stored_at < CHURN_S:
            self.stats.churned += 1

    def _drop(self, block: Block, holder: Holder) -> bool:
        """Take ``holder``'s copy away; True when that was the last copy (the block is gone)."""
        block.holders.discard(holder)
        self.tiers[holder.medium] -= 1
        if block.holders:
            return False
        del self.blocks[block.hash]
        if block.parent is not None and (kids := self._kids.get(block.parent)) is not None:
            kids.pop(block.hash, None)
            if not kids:
                del self._kids[block.parent]
        return True

    def _clear(self, rank: int) -> None:
        """Everything ``rank`` held is gone (other ranks are separate caches)."""
        self.stats.cleared += 1
        self._drop_rank(rank)

    def _drop_rank(self, rank: int) -> None:
        for block in list(self.blocks.values()):
            for holder in [x for x in block.holders if x.rank == rank]:
                self._drop(block, holder)
        self.tiers = +self.tiers  # forget tiers that emptied
