"""The curve against the real ``RadixTree``: the same requests, one at a time, through a tree
with a pool of the given size (evicting on demand only: watermarks at 1.0).

Per request: ``match_and_pin`` of its whole cached sequence (what the curve's request touches),
``allocate`` room for the rest of it, ``insert`` it, ``unpin``. The hit is the matched length
within the prompt. This is the sequential model of the curve, and at block size 1 the tree is
that model exactly: eviction gives up the least recently used leaf's tail, token by token
(per block), and a match that ends inside a node leaves the rest of it at its older access
time (``radixcache.core.recency``), so the tree holds the top ``capacity`` tokens of the
curve's recency stack after every request.

At block size B > 1 a node's last block is partly filled and a branch inside a block takes a
copy (COW) of up to B - 1 slots: capacity that the token-granular curve does not see. The
slots the tree spends beyond its tokens are measured (``waste_slots``), so the curve at
``capacity - waste`` and at ``capacity`` bracket what the tree can hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from radixcache.core.pool import KVPool, KVShape
from radixcache.core.tree import RadixTree
from radixcache.traffic.traces import TokenRequest


class TreeReplay(NamedTuple):
    """What one sequential replay through the real tree measured."""

    capacity_tokens: int
    block_size: int
    hit_tokens: int
    cached_tokens: int  # tokens held by the tree's nodes at the end
    used_slots: int  # blocks in use at the end x block size
    peak_waste_slots: int  # the most slots in use beyond cached tokens, sampled per request

    @property
    def waste_slots(self) -> int:
        """Slots in use at the end that hold no token of their own (partial blocks, copies)."""
        return self.used_slots - self.cached_tokens


def replay_tree(
    requests: Sequence[TokenRequest], capacity_tokens: int, block_size: int, sample_every: int = 0
) -> TreeReplay:
    """Replay ``requests`` sequentially through a fresh tree of ``capacity_tokens // block_size``
    blocks. ``sample_every`` > 0 measures the waste every that many requests (O(nodes) each).
    Raises ``PromptTooLarge``/``PoolExhausted`` when a request cannot fit at this size."""
    num_blocks = capacity_tokens // block_size
    pool = KVPool(num_blocks, block_size, KVShape(1, 1, 1), device="cpu")
    tree = RadixTree(pool, high=1.0, low=1.0, record_events=False)
    hits = peak = 0
    for i, r in enumerate(requests, 1):
        m = tree.match_and_pin(r.cached.tobytes())
        lease = tree.allocate(m, len(r.cached))
        tree.insert(r.cached.tobytes(), lease)
        tree.unpin(m.node)
        hits += min(m.length, len(r.prompt))
        if sample_every and i % sample_every == 0:
            peak = max(peak, tree.alloc.used_count * block_size - tree.cached_tokens)
    used = tree.alloc.used_count * block_size
    return TreeReplay(capacity_tokens, block_size, hits, tree.cached_tokens, used,
                      max(peak, used - tree.cached_tokens))
