"""BlockAllocator: the free list, per-block refcounts and claims (no torch: the tree, the mirror
and the inspector import it without loading torch).

Each block has a *claim*: how many leading slots are spoken for (by cached nodes or by a
running request that reserved them). A sequence may continue writing in place in a partly
filled block only when the claim ends exactly where its own prefix ends; otherwise it takes a
copy of the leading slots (copy-on-write). Nothing outside ``BlockAllocator`` writes a refcount
or a claim.

Representation, chosen so that no operation does Python work per block (a request takes and
returns ~25 blocks; Python loops over them cost ~30% of all tree time on the ShareGPT trace):

- block ids travel as ``array('i')`` (the free list, ``alloc``'s result, a node's blocks): a
  slice or an ``extend`` is one memcpy, with no Python int made per block;
- a block is in use exactly when it is not on the free list, and then holds one reference
  plus ``_extra[block]`` (only shared blocks -- a boundary block held by a parent and a
  child -- have an entry);
- a block in use is fully claimed unless ``_partial`` says otherwise (only the last block of
  a node or of a request has an entry).

``release_run`` returns a node's or a request's blocks in O(1) Python steps: only the first and
the last block of such a run can be shared or partly claimed (the tree's ``check()`` verifies
that). The price: the allocator does not notice a block freed twice at the call (that needs
per-block state); ``refcounts()`` and the tree's ``check()`` report it (a duplicate on the free
list), and ``check()`` runs after every step of the tests.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

_COMPACT = 1024  # drop the consumed front of the free list after this many allocations


class PoolError(Exception):
    """Base class of the pool's errors."""


class PoolExhausted(PoolError):
    """Not enough free blocks right now; the caller may wait and retry."""


class BlockStateError(PoolError):
    """A refcount or claim operation the allocator can tell is wrong (a bug in the caller)."""


class BlockAllocator:
    """Free list, per-block refcounts and claims. Not thread-safe: the tree's lock guards it.

    Blocks are handed out from the front of the free list and returned to its back, so
    a block freed recently is reused last (its K/V stay readable longest for debugging).
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(
                f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        # FIFO free list: an int32 array read from ``_head`` (slices are one memcpy)
        self._free = array("i")
        self._head = 0
        self._extra: dict[int, int] = {}  # shared block -> references beyond the first
        self._partial: dict[int, int] = {}  # in-use block -> claim, when below block_size
        self.reset()

    # -- figures ---------------------------------------------------------------------------
    @property
    def free_count(self) -> int:
        """Number of blocks on the free list."""
        return len(self._free) - self._head

    @property
    def used_count(self) -> int:
        """Number of blocks in use (refcount above zero)."""
        return self.num_blocks - len(self._free) + self._head

    @property
    def used_fraction(self) -> float:
        """Used blocks over all blocks, in [0, 1]."""
        return self.used_count / self.num_blocks

    def free_blocks(self) -> list[int]:
        """The free list in allocation order (a copy)."""
        return self._free[self._head :].tolist()

    def refcounts(self) -> list[int]:
        """Every block's refcount, from the free list and the shared-block table (O(blocks)).

        A block on the free list twice (freed twice) reads as -1; one that is free yet
        shared reads as its extra references minus one."""
        out = [1] * self.num_blocks
        for b in self._free[self._head :]:
            out[b] -= 1
        for b, extra in self._extra.items():
            out[b] += extra
        return out

    def refcount(self, block: int) -> int:
        """References held on ``block`` (0 when free). O(free blocks): for tests and tools."""
        self._check_id(block)
        try:
            self._free.index(block, self._head)
        except ValueError:
            return 1 + self._extra.get(block, 0)
        return 0

    def claim(self, block: int) -> int:
        """Leading slots of an in-use ``block`` that are spoken for (0..block_size).

        O(1); a free block has no claim (``claims()`` reports it as 0)."""
        return self._partial.get(block, self.block_size)

    def claims(self) -> list[int]:
        """Every block's claim, 0 for free blocks (O(blocks))."""
        out = [self.block_size] * self.num_blocks
        for b, slots in self._partial.items():
            out[b] = slots
        for b in self._free[self._head :]:
            out[b] = 0
        return out

    def shared(self) -> dict[int, int]:
        """Blocks with more than one reference -> their references beyond the first (a copy)."""
        return dict(self._extra)

    # -- mutation --------------------------------------------------------------------------
    def alloc(self, n: int) -> array[int]:
        """Take ``n`` blocks off the free list, each with refcount 1 and fully claimed.

        Raises ``PoolExhausted`` (and takes nothing) when fewer than ``n`` are free.
        """
        head = self._head
        free = self._free
        if n > len(free) - head:
            raise PoolExhausted(f"need {n} blocks, {len(free) - head} free")
        out = free[head : head + n]
        head += n
        if head >= _COMPACT:  # drop the consumed front (one memmove of the ids behind it)
            del free[:head]
            head = 0
        self._head = head
        return out

    def incref(self, block: int) -> None:
        """Add one reference to a block that is in use."""
        self._check_id(block)
        self._extra[block] = self._extra.get(block, 0) + 1

    def decref(self, block: int) -> bool:
        """Drop one reference; returns True when that freed the block (back on the free list)."""
        self._check_id(block)
        if self._drop_extra(block):
            return False
        self._partial.pop(block, None)
        self._free.append(block)
        return True

    def decref_many(self, blocks: Iterable[int]) -> list[int]:
        """``decref`` each of ``blocks`` in order; returns those that went back to the free list."""
        return [b for b in blocks if self.decref(b)]

    def release_run(self, run: array[int]) -> array[int]:
        """Drop one reference on each block of ``run``, the blocks of one node or one request in
        order, of which only the first and the last can be shared or partly claimed. Returns
        the blocks that went back to the free list (all but a shared end), in order."""
        lo, hi = 0, len(run)
        if not hi:
            return run
        extra = self._extra
        if extra:  # a membership test first: most runs share neither end
            if run[0] in extra and self._drop_extra(run[0]):
                lo = 1
            if hi > lo and run[-1] in extra and self._drop_extra(run[-1]):
                hi -= 1
        freed = run[lo:hi] if lo or hi < len(run) else run
        if freed and self._partial:
            self._partial.pop(freed[0], None)
            self._partial.pop(freed[-1], None)
        self._free.extend(freed)
        return freed

    def free_tail(self, run: array[int]) -> None:
        """Return ``run`` to the free list: the tail of a leaf cut back to a block boundary,
        blocks held by that leaf alone (only a node's first block is ever shared, and a leaf
        has no child continuing in its last), of which only the last can be partly claimed.
        ``release_run`` without its checks of shared ends: eviction calls it on nearly every
        allocation of a full pool."""
        if run:
            self._partial.pop(run[-1], None)
            self._free.extend(run)

    def _drop_extra(self, block: int) -> bool:
        """Drop one extra reference of ``block`` if it has one; True when it had."""
        extra = self._extra.get(block)
        if not extra:
            return False
        if extra == 1:
            del self._extra[block]
        else:
            self._extra[block] = extra - 1
        return True

    def set_claim(self, block: int, slots: int) -> None:
        """Set how many leading slots of an in-use block are spoken for."""
        size = self.block_size
        if not 0 <= slots <= size:
            raise BlockStateError(f"claim {slots} on block {block}: outside 0..{size}")
        if not 0 <= block < self.num_blocks:  # ``_check_id`` inline: ~3 calls a request
            self._check_id(block)
        if slots < size:
            self._partial[block] = slots
        else:
            self._partial.pop(block, None)

    def _check_id(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise BlockStateError(f"block {block} outside 0..{self.num_blocks - 1}")

    def reset(self) -> None:
        """Return every block to the free list (for an engine reset)."""
        self._free = array("i", range(self.num_blocks))
        self._head = 0
        self._extra = {}
        self._partial = {}

    def check(self) -> list[str]:
        """What is wrong with the allocator's own state (empty when all is well)."""
        out = []
        free = self.free_blocks()
        if len(set(free)) != len(free):
            out.append("free list holds a block twice")
        bad = sorted(set(free) & (self._extra.keys() | self._partial.keys()))
        if bad:
            out.append(f"free blocks {bad[:5]} still shared or claimed")
        return out
