"""KVPool: the paged K/V tensor and the one allocator that owns block refcounts.

Layout of the pool tensor (one tensor for K and V of every layer)::

    kv[layer, kv, block, slot, head, dim]     kv = 0 for K, 1 for V
         L    2    num_blocks  B    H    D

Position ``p`` of a sequence lives in ``block_table[p // B]`` at slot ``p % B``.

The allocator also keeps, for every block, its *claim*: how many leading slots are
spoken for (by cached nodes or by a running request that reserved them). A sequence
may continue writing in place in a partly filled block only when the claim ends
exactly where its own prefix ends; otherwise it takes a copy of the leading slots
(copy-on-write). Nothing outside ``BlockAllocator`` writes a refcount or a claim.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

_VECTOR_MIN = 48  # below this many blocks a Python loop beats numpy's per-call cost


class PoolError(Exception):
    """Base class of the pool's errors."""


class PoolExhausted(PoolError):
    """Not enough free blocks right now; the caller may wait and retry."""


class BlockStateError(PoolError):
    """A refcount or claim operation on a block in the wrong state (a bug in the caller)."""


@dataclass(frozen=True, slots=True)
class KVShape:
    """The model-side shape of one token's K/V: layers, KV heads, head dim, dtype."""

    num_layers: int = 1
    num_kv_heads: int = 1
    head_dim: int = 1
    dtype: torch.dtype = torch.float32


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


def _numpy_view(t: torch.Tensor) -> np.ndarray | None:
    """A numpy array sharing ``t``'s memory, or None for dtypes numpy lacks (bfloat16)."""
    try:
        return t.numpy()
    except TypeError:
        return None


class KVPool:
    """The paged K/V tensor on the device plus its allocator.

    ``kv`` has shape ``(L, 2, num_blocks, block_size, H, D)``; ``device`` defaults to
    ``cuda`` when available, else CPU.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        shape: KVShape | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        self.shape = shape or KVShape()
        self.block_size = block_size
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.allocator = BlockAllocator(num_blocks, block_size)
        s = self.shape
        self.kv = torch.zeros(
            (s.num_layers, 2, num_blocks, block_size, s.num_kv_heads, s.head_dim),
            dtype=s.dtype,
            device=self.device,
        )
        self._by_block = self.kv.permute(2, 0, 1, 3, 4, 5)  # a view: block-major indexing
        # On the CPU a numpy view of the same memory copies a few slots in ~1 us, where a
        # torch indexing op costs ~20 us of dispatch; on a GPU the copy stays a torch op.
        self._host = _numpy_view(self._by_block) if self.device.type == "cpu" else None

    @property
    def num_blocks(self) -> int:
        """Total blocks in the pool."""
        return self.allocator.num_blocks

    @property
    def capacity_tokens(self) -> int:
        """Total token slots in the pool."""
        return self.allocator.num_blocks * self.block_size

    def copy_slots(self, src: int, dst: int, slots: int) -> None:
        """Copy the first ``slots`` slots of block ``src`` into ``dst`` (K and V, every layer).

        This is the copy-on-write of a boundary block: a tensor copy on the pool's device.
        """
        if not 0 < slots <= self.block_size:
            raise ValueError(f"slots must be in 1..{self.block_size}, got {slots}")
        if self._host is not None:
            self._host[dst, :, :, :slots] = self._host[src, :, :, :slots]
        else:
            self._by_block[dst, :, :, :slots].copy_(self._by_block[src, :, :, :slots])

    def copy_slots_batch(self, src: list[int], dst: list[int], slots: list[int]) -> None:
        """Many boundary copies in one pass: whole blocks are gathered, then masked to ``slots``."""
        if not src:
            return
        dev = self.device
        s = torch.tensor(src, device=dev)
        d = torch.tensor(dst, device=dev)
        n = torch.tensor(slots, device=dev)
        mask = torch.arange(self.block_size, device=dev)[None, :] < n[:, None]  # (k, B)
        m = mask[None, None, :, :, None, None]
        self.kv[:, :, d] = torch.where(m, self.kv[:, :, s], self.kv[:, :, d])

    def bytes_per_block(self) -> int:
        """Bytes of K and V one block holds across all layers."""
        s = self.shape
        return (
            2
            * s.num_layers
            * self.block_size
            * s.num_kv_heads
            * s.head_dim
            * self.kv.element_size()
        )
