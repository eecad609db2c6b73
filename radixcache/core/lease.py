"""Leases: the blocks a running request reserves between ``allocate`` and ``insert``/``release``
(in place or copy-on-write at the boundary block), and the boundary copies a new leaf needs.

``Leases`` owns the set of outstanding leases and the in-place reservations; it asks the
``Evictor`` for room and the ``BlockAllocator`` for blocks. The tree's lock guards it: every
method runs under that lock (the tree's public methods take it).
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from radixcache.core import events as ev
from radixcache.core.eventlog import EventLog
from radixcache.core.evict import Evictor
from radixcache.core.nodes import (
    Lease,
    MatchResult,
    NotPinned,
    PromptTooLarge,
    RadixNode,
    TreeStats,
)
from radixcache.core.tokens import InvalidTokens

if TYPE_CHECKING:
    from radixcache.core.pool import KVPool


class Leases:
    """The outstanding leases of one tree and the blocks they hold privately."""

    def __init__(self, pool: KVPool, evictor: Evictor, stats: TreeStats, log: EventLog) -> None:
        self.pool = pool
        self.alloc = pool.allocator
        self.B = pool.block_size
        self.evictor = evictor
        self.stats = stats
        self.log = log
        self._open: set[Lease] = set()  # allocated, not yet inserted/released
        self._inplace: set[int] = set()  # tree-owned blocks a lease continues in place

    def __bool__(self) -> bool:
        """True while any lease is outstanding."""
        return bool(self._open)

    def clear(self) -> None:
        """Forget every lease (the tree was emptied; its blocks are free again)."""
        self._open = set()
        self._inplace = set()

    def request_blocks(self) -> set[int]:
        """Blocks held privately by outstanding leases (allocated, not yet inserted)."""
        return {b for lease in self._open for b in lease.table[lease.private_from :]}

    def inplace_blocks(self) -> frozenset[int]:
        """Tree-owned blocks an outstanding lease has reserved to continue in place."""
        return frozenset(self._inplace)

    # -- allocate --------------------------------------------------------------------------
    def allocate(self, match: MatchResult, total: int) -> Lease:
        """See ``RadixTree.allocate`` (the caller checked that ``match.node`` is alive)."""
        B = self.B
        m, node, matched_table = match  # one unpack, not three field reads
        if total <= 0 or total < m:
            raise InvalidTokens(f"total {total} must be positive and >= matched {m}")
        blocks_total = (total + B - 1) // B
        if blocks_total > self.alloc.num_blocks:
            raise PromptTooLarge(
                f"{total} tokens need {blocks_total} blocks; the pool has {self.alloc.num_blocks}"
            )
        if node.pins <= 0:
            raise NotPinned(f"allocate needs a pin on node {node.id} (match_and_pin)")
        table = array("i", matched_table)
        if total == m:  # nothing to write: the lease holds no block of its own
            lease = Lease(node, m, total, table, len(table))
            self._open.add(lease)
            return lease
        j0, partial = m // B, m % B
        new = blocks_total - len(table)
        if partial and self.alloc.claim(table[j0]) != partial:
            new += 1
        self.evictor.make_room(new)
        if partial and self.alloc.claim(table[j0]) == partial:
            x = table[j0]
            lease = Lease(node, m, total, table, j0 + 1, x, partial)
            self.alloc.set_claim(x, min(B, total - j0 * B))
            self._inplace.add(x)
            new = blocks_total - len(table)
        else:
            lease = Lease(node, m, total, table, j0)
        blocks = self.alloc.alloc(new)
        if partial and lease.inplace is None:
            src = table[j0]
            table[j0] = blocks[0]
            self.pool.copy_slots(src, blocks[0], partial)
            self._count_copy(partial)
            if self.log.on:
                self.log.emit(ev.Cow(src, blocks[0], partial))
            table.extend(blocks[1:])
        else:
            table.extend(blocks)
        if len(table) > lease.private_from:  # the last block is claimed up to ``total``
            self.alloc.set_claim(table[-1], total - (len(table) - 1) * B)
        self._open.add(lease)
        if self.log.on and blocks:
            self.log.emit(ev.BlockAlloc(blocks))
        return lease

    def grow(self, lease: Lease, total: int) -> int:
        """Extend ``lease`` to cover ``total`` positions (a growing lease, ``--reserve grow``):
        the block it writes in last is claimed further, and a block is taken for each block
        boundary it crosses (evicting LRU leaves for it). Returns the blocks taken; raises
        ``PoolExhausted`` (nothing changed) when they cannot be had.

        The lease's last block is its own (private, or the tree block it continues in place,
        whose slots after the match it claimed): nobody else claims past the lease's end, so
        raising that claim never touches another request's slots."""
        B, table = self.B, lease.table
        if total <= lease.total:
            return 0
        new = -(-total // B) - len(table)
        if new > 0:
            self.evictor.make_room(new)
        j = len(table) - 1
        if lease.total % B and j >= 0:  # the last block is partly claimed: it is ours
            assert j >= lease.private_from or table[j] == lease.inplace, "foreign last block"
            self.alloc.set_claim(table[j], min(B, total - j * B))
        if new > 0:
            blocks = self.alloc.alloc(new)
            table.extend(blocks)
            self.alloc.set_claim(table[-1], total - (len(table) - 1) * B)
            if self.log.on:
                self.log.emit(ev.BlockAlloc(blocks))
        lease.total = total
        return max(new, 0)

    def _count_copy(self, slots: int) -> None:
        self.stats.cow_copies += 1
        self.stats.slots_copied += slots

    def copy_out(self, src: int, slots: int, keep: RadixNode) -> int | None:
        """A private copy of ``src``'s first ``slots`` slots, or None when no block can be had.

        With the pool full it evicts one LRU leaf, holding ``keep``'s path (where the copy's
        leaf will hang) for the duration; the hold nets to zero, so it emits no pin event."""
        if self.alloc.free_count == 0:
            self.evictor.evict_sparing(1, keep)
            if self.alloc.free_count == 0:
                return None
        dst = self.alloc.alloc(1)[0]
        self.pool.copy_slots(src, dst, slots)
        self.alloc.set_claim(dst, slots)  # the leaf being attached takes it at once
        self._count_copy(slots)
        if self.log.on:
            self.log.emit(ev.BlockAlloc([dst]))
            self.log.emit(ev.Cow(src, dst, slots))
        return dst

    # -- settle ----------------------------------------------------------------------------
    def finish(
        self, lease: Lease, taken: tuple[int, int] | None = None, *, inplace_used: bool = False
    ) -> int:
        """Free the lease's blocks the tree did not take; settle the in-place claim. Returns
        the blocks freed.

        ``taken = (pos, n)``: the tree took ``table[pos // B : (n - 1) // B + 1]`` for the
        positions ``[pos, n)`` (the first may have been replaced by a copy); ``inplace_used``:
        it continued in place in the lease's in-place block."""
        table, first = lease.table, lease.private_from
        if taken is None:
            dup = table[first:]
        else:
            pos, n = taken
            dup = table[first : max(first, pos // self.B)] + table[(n - 1) // self.B + 1 :]
        if lease.inplace is not None:
            self._inplace.discard(lease.inplace)
            if not inplace_used:
                self.alloc.set_claim(lease.inplace, lease.prev_claim)
        freed = 0
        if dup:  # private blocks: none is shared
            freed = len(self.alloc.release_run(dup))
            if self.log.on:
                self.log.emit(ev.BlockFree(dup))
        self._open.discard(lease)
        lease.done = True
        return freed


class ForwardCopies:
    """The blocks one step's first forward writes that are in the tree already (a prompt
    published before it is computed, ``serving.scheduler``), and the boundary copies of them
    that forward makes again, after each layer's writes (``TinyTransformer.forward``).

    A request whose match ends inside such a block got its boundary copy at allocation, of
    slots not written yet. With B = 16, block 12 published and written by this forward, and a
    match ending 8 slots into it (its lease copied them into block 15)::

        block 12  | s0 .. s7 | s8 .. s15 |   written by the forward, layer by layer
                    └── copied again after each layer: pool slots 192..199 -> 240..247
        block 15  | c0 .. c7 |  ...       |   the lease's own copy

    A copy of a copied slot reads the first source (the forward makes every copy of a layer
    at once, after that layer's writes)."""

    def __init__(self, block_size: int) -> None:
        self.B = block_size
        self._written: set[int] = set()
        self._src: list[int] = []
        self._dst: list[int] = []
        self._origin: dict[int, int] = {}  # a copied slot's first source

    def __bool__(self) -> bool:
        """True once any published block is written by this forward."""
        return bool(self._written)

    def whole(self, tokens: int) -> int:
        """The tokens of ``tokens`` up to the last whole block (what can be published)."""
        return tokens // self.B * self.B

    def write(self, match: MatchResult, start: int, end: int) -> None:
        """The forward writes positions ``[start, end)`` of ``match``'s blocks."""
        self._written.update(match.block_table[start // self.B : -(-end // self.B)])

    def reads(self, match: MatchResult) -> bool:
        """Whether ``match`` reads a block this forward writes."""
        return not self._written.isdisjoint(match.block_table)

    def redo(self, match: MatchResult, lease: Lease) -> None:
        """When ``match`` ends inside a block this forward writes, the forward makes the
        lease's boundary copy of it again (the copy made at allocation read unwritten
        slots)."""
        B = self.B
        j, partial = divmod(match.length, B)
        if not partial or match.block_table[j] not in self._written:
            return
        assert lease.inplace is None  # published blocks are claimed whole: it copied
        src, dst = match.block_table[j] * B, lease.table[j] * B
        for i in range(partial):
            origin = self._origin.get(src + i, src + i)
            self._src.append(origin)
            self._dst.append(dst + i)
            self._origin[dst + i] = origin

    def slots(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(from slots, to slots) of every copy, flat pool slots; None when there is none."""
        return (tuple(self._src), tuple(self._dst)) if self._src else None
