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
slots the tree spends beyond its tokens are measured (``waste_slots``): the curve at
``capacity - waste`` is the floor. The ceiling is not the curve at ``capacity``: a block is as
recent as its most recent token, so a block used in part keeps its unused tail tokens for free
(they share its slots), and a later request can hit them where the token-granular LRU had
dropped them. That is the only way past the curve: the tree holds whole blocks whose first
token is in the curve's top D tokens (D <= capacity), so a request's hit ends at most at the
block boundary after its hit in the curve, and never past what it could match at all
(``block_rounded_hits``, from the same one pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from radixcache.analysis.stackdist import Curve, StackDistances
from radixcache.core.pool import KVPool, KVShape
from radixcache.core.tokens import TOKEN_BYTES
from radixcache.core.tree import RadixTree
from radixcache.traffic.traces import TokenRequest, token_access

Runs = list[tuple[int, int, int]]  # one request's matched prompt runs (``StackDistances.add``)


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


def token_pass(requests: Sequence[TokenRequest]) -> tuple[Curve, list[Runs]]:
    """The one-pass curve at block 1 and each request's matched runs (their distances)."""
    sd = StackDistances(TOKEN_BYTES, 1)
    runs = [sd.add(token_access(r, 1)) for r in requests]
    return sd.curve(), runs


def block_rounded_hits(runs: Sequence[Runs], capacity_tokens: int, block_size: int) -> int:
    """The most a tree of ``capacity_tokens`` slots at ``block_size`` can hit (see the module
    docstring): each request's hit in the block-1 curve at that capacity, rounded up to a block
    boundary, capped at its longest possible match. Equal to the curve at block 1."""
    total = 0
    for request in runs:
        hit = 0
        for dist, lo, hi in request:  # shallow first, contiguous from depth 0
            take = min(hi - lo, capacity_tokens - dist)
            if take <= 0:
                break
            hit = lo + take
            if hit < hi:
                break
        if hit:
            total += min(-(-hit // block_size) * block_size, request[-1][2])
    return total
