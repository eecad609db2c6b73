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

from dataclasses import dataclass

import numpy as np
import torch

from radixcache.core.blocks import BlockAllocator, BlockStateError, PoolError, PoolExhausted

__all__ = [
    "BlockAllocator",
    "BlockStateError",
    "KVPool",
    "KVShape",
    "PoolError",
    "PoolExhausted",
]


@dataclass(frozen=True, slots=True)
class KVShape:
    """The model-side shape of one token's K/V: layers, KV heads, head dim, dtype."""

    num_layers: int = 1
    num_kv_heads: int = 1
    head_dim: int = 1
    dtype: torch.dtype = torch.float32


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
    def free_blocks(self) -> int:
        """Blocks on the free list now."""
        return self.allocator.free_count

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
