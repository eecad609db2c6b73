"""BlockAllocator: the free list, per-block refcounts and claims (no torch: the tree, the mirror
and the inspector import it without loading torch).

Each block has a *claim*: how many leading slots are spoken for (by cached nodes or by a
running request that reserved them). A sequence may continue writing in place in a partly
filled block only when the claim ends exactly where its own prefix ends; otherwise it takes a
copy of the leading slots (copy-on-write). Nothing outside ``BlockAllocator`` writes a refcount
or a claim.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

_VECTOR_MIN = 48  # below this many blocks a Python loop beats numpy's per-call cost


class PoolError(Exception):
    """Base class of the pool's errors."""


class PoolExhausted(PoolError):
    """Not enough free blocks right now; the caller may wait and retry."""


class BlockStateError(PoolError):
    """A refcount or claim operation on a block in the wrong state (a bug in the caller)."""


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
        # FIFO free list: a list read from ``_head`` (slices run in C, unlike deque pops)
        self._free: list[int] = list(range(num_blocks))
        self._head = 0
        # int32 arrays: 8 bytes a block in all, where lists would take 16 plus int objects
        self._ref = array("i", bytes(4 * num_blocks))
        self._claim = array("i", bytes(4 * num_blocks))

    # -- figures ---------------------------------------------------------------------------
    @property
    def free_count(self) -> int:
        """Number of blocks on the free list."""
        return len(self._free) - self._head

    @property
    def used_count(self) -> int:
        """Number of blocks with a refcount above zero."""
        return self.num_blocks - len(self._free) + self._head

    @property
    def used_fraction(self) -> float:
        """Used blocks over all blocks, in [0, 1]."""
        return self.used_count / self.num_blocks

    def refcount(self, block: int) -> int:
        """References held on ``block`` (0 when free)."""
        return self._ref[block]

    def claim(self, block: int) -> int:
        """Leading slots of ``block`` that are spoken for (0..block_size)."""
        return self._claim[block]

    def free_blocks(self) -> list[int]:
        """The free list in allocation order (a copy)."""
        return self._free[self._head :]

    # -- mutation --------------------------------------------------------------------------
    def alloc(self, n: int) -> list[int]:
        """Take ``n`` blocks off the free list, each with refcount 1 and fully claimed.

        Raises ``PoolExhausted`` (and takes nothing) when fewer than ``n`` are free.
        """
        head = self._head
        if n > len(self._free) - head:
            raise PoolExhausted(f"need {n} blocks, {len(self._free) - head} free")
        out = self._free[head : head + n]
        head += n
        if head > 256:  # drop the consumed front (memmove of the few free ids behind it)
            del self._free[:head]
            head = 0
        self._head = head
        ref, claim, size = self._ref, self._claim, self.block_size
        for b in out:
            ref[b] = 1
            claim[b] = size
        return out

    def incref(self, block: int) -> None:
        """Add one reference to a block that is in use."""
        if self._ref[block] <= 0:
            raise BlockStateError(f"incref of free block {block}")
        self._ref[block] += 1

    def decref(self, block: int) -> bool:
        """Drop one reference; returns True when that freed the block (back on the free list)."""
        r = self._ref[block] - 1
        if r < 0:
            raise BlockStateError(f"decref of free block {block}")
        self._ref[block] = r
        if r == 0:
            self._claim[block] = 0
            self._free.append(block)
            return True
        return False

    def decref_many(self, blocks: Sequence[int]) -> list[int]:
        """``decref`` each of ``blocks`` (distinct ids); returns those that went back to the
        free list, in order. Long runs (a whole evicted node) go through numpy."""
        if len(blocks) >= _VECTOR_MIN:
            return self._decref_vector(np.asarray(blocks, dtype=np.int32))
        ref, claim, free = self._ref, self._claim, self._free
        freed = []
        for b in blocks:
            r = ref[b] - 1
            if r < 0:
                raise BlockStateError(f"decref of free block {b}")
            ref[b] = r
            if r == 0:
                claim[b] = 0
                free.append(b)
                freed.append(b)
        return freed

    def _decref_vector(self, idx: np.ndarray) -> list[int]:
        ref = np.frombuffer(self._ref, dtype=np.int32)  # views: the arrays stay the truth
        left = ref[idx] - 1
        if left.min() < 0:
            raise BlockStateError(f"decref of free block {int(idx[np.argmin(left)])}")
        ref[idx] = left
        gone = idx[left == 0]
        np.frombuffer(self._claim, dtype=np.int32)[gone] = 0
        freed: list[int] = gone.tolist()
        self._free.extend(freed)
        return freed

    def set_claim(self, block: int, slots: int) -> None:
        """Set how many leading slots of an in-use block are spoken for."""
        if self._ref[block] <= 0 or not 0 <= slots <= self.block_size:
            raise BlockStateError(f"claim {slots} on block {block} (ref {self._ref[block]})")
        self._claim[block] = slots

    def reset(self) -> None:
        """Return every block to the free list (for an engine reset)."""
        self._free = list(range(self.num_blocks))
        self._head = 0
        self._ref = array("i", bytes(4 * self.num_blocks))
        self._claim = array("i", bytes(4 * self.num_blocks))
