"""Block reservation of ``RadixTree`` for running requests: allocate a lease (in place or
copy-on-write at the boundary block), copy a boundary block out, settle or release a lease.

A mixin: ``RadixTree`` owns the state declared below and the lock; these methods run under it.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from radixcache.core import events as ev
from radixcache.core.evict import EvictMixin
from radixcache.core.nodes import Lease, MatchResult, NotLocked, PromptTooLarge, RadixNode
from radixcache.core.tokens import InvalidTokens

if TYPE_CHECKING:
    from radixcache.core.pool import KVPool


class LeaseMixin(EvictMixin):
    """Leases: the blocks a request reserves between ``allocate`` and ``insert``/``release``."""

    pool: KVPool
    _leases: set[Lease]
    _inplace: set[int]

    if TYPE_CHECKING:

        def _alive(self, node: RadixNode) -> RadixNode: ...

    # -- allocate --------------------------------------------------------------------------
    def allocate(self, match: MatchResult, total: int) -> Lease:
        """Reserve blocks so a request can hold ``total`` positions after its matched prefix.

        The caller must hold a lock on ``match.node`` (``match_and_lock``). Evicts LRU leaves
        as needed (and down to the low watermark once use passes the high one). The boundary
        block is reserved in place when its claim ends at the match, else copied (COW).
        Raises ``PromptTooLarge`` (never fits; the tree is unchanged) or ``PoolExhausted``
        (retry later): then no block was reserved, but unlocked leaves may already have been
        evicted on the way -- they were the next victims, and the retry needs their room.
        """
        with self.lock_:
            return self._allocate(match, total)

    def _allocate(self, match: MatchResult, total: int) -> Lease:
        B, m = self.B, match.length
        if total <= 0 or total < m:
            raise InvalidTokens(f"total {total} must be positive and >= matched {m}")
        if (total + B - 1) // B > self.alloc.num_blocks:
            raise PromptTooLarge(
                f"{total} tokens need {(total + B - 1) // B} blocks;"
                f" the pool has {self.alloc.num_blocks}"
            )
        if self._alive(match.node).pins <= 0:
            raise NotLocked(f"allocate needs a lock on node {match.node.id} (match_and_lock)")
        table = array("i", match.block_table)
        if total == m:  # nothing to write: the lease holds no block of its own
            lease = Lease(match.node, m, total, table, len(table))
            self._leases.add(lease)
            return lease
        j0, partial = divmod(m, B)
        new = (total + B - 1) // B - len(table)
        if partial and self.alloc.claim(table[j0]) != partial:
            new += 1
        self._make_room(new)
        if partial and self.alloc.claim(table[j0]) == partial:
            x = table[j0]
            lease = Lease(match.node, m, total, table, j0 + 1, x, partial)
            self.alloc.set_claim(x, min(B, total - j0 * B))
            self._inplace.add(x)
            new = (total + B - 1) // B - len(table)
        else:
            lease = Lease(match.node, m, total, table, j0)
        blocks = self.alloc.alloc(new)
        if partial and lease.inplace is None:
            src = table[j0]
            table[j0] = blocks[0]
            self.pool.copy_slots(src, blocks[0], partial)
            self.stats.cow_copies += 1
            self.stats.slots_copied += partial
            if self._emit is not None:
                self._emit(ev.Cow(src, blocks[0], partial))
            table.extend(blocks[1:])
        else:
            table.extend(blocks)
        if len(table) > lease.private_from:  # the last block is claimed up to ``total``
            self.alloc.set_claim(table[-1], total - (len(table) - 1) * B)
        self._leases.add(lease)
        if self._emit is not None and blocks:
            self._emit(ev.BlockAlloc(blocks))
        return lease

    def _copy_out(self, src: int, slots: int, keep: RadixNode) -> int | None:
        """A private copy of ``src``'s first ``slots`` slots, or None when no block can be had.

        With the pool full it evicts one LRU leaf, holding ``keep``'s path (where the copy's
        leaf will hang) for the duration; the hold nets to zero, so it emits no Lock event."""
        if self.alloc.free_count == 0:
            keep.pins += 1
            try:
                self._evict_blocks(1)
            finally:
                keep.pins -= 1
            self._offer(keep)  # its entry was dropped if it came up during the hold
            if self.alloc.free_count == 0:
                return None
        dst = self.alloc.alloc(1)[0]
        self.pool.copy_slots(src, dst, slots)
        self.alloc.set_claim(dst, slots)  # the leaf being attached takes it at once
        self.stats.cow_copies += 1
        self.stats.slots_copied += slots
        if self._emit is not None:
            self._emit(ev.BlockAlloc([dst]))
            self._emit(ev.Cow(src, dst, slots))
        return dst

    def _finish_lease(
        self, lease: Lease, taken: tuple[int, int] | None = None, *, inplace_used: bool = False
    ) -> int:
        """Free the lease's blocks the tree did not take; settle the in-place claim.

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
        freed = len(self.alloc.release_run(dup))  # private blocks: none is shared
        self._leases.discard(lease)
        if self._emit is not None and dup:
            self._emit(ev.BlockFree(dup))
        lease.done = True
        return freed

    def release(self, lease: Lease) -> None:
        """Abort: return every private block of the lease and undo its in-place reservation."""
        with self.lock_:
            if not lease.done:
                self._finish_lease(lease)
