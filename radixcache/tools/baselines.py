"""Full-block hashing, vLLM's prefix cache, as a simulator: the baseline for hit rates.

Only *full* blocks are cached, each under a chain hash, so a hit is always a whole
number of blocks::

    prompt  | b0 (16) | b1 (16) | b2 (16) | 7 more |      block_size B = 16
    hash    h0 = H("", b0)   h1 = H(h0, b1)   h2 = H(h1, b2)   (the tail is never cached)

A request hits the leading run of its prompt's blocks whose hashes are cached. Blocks
are refcounted while a request runs; a block whose refcount drops to 0 keeps its hash
and goes to the back of the free queue; allocation takes blocks from the front and
evicts the hash of a block it takes (LRU on demand, as vLLM's ``FreeKVCacheBlockQueue``).

Deliberate choices where vLLM leaves room:
- a request frees its blocks tail first (as vLLM does), so its tail is evicted first;
- a freed block without a hash (a partial tail, or a duplicate) goes to the *front* of
  the free queue: it holds nothing, so it is reused before any cached block is evicted;
- a request that cannot get its blocks even after evicting every unreferenced block is
  counted as a miss (0 hit tokens) and leaves the cache untouched.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from radixcache.core import tokens as tk

REPLAY_BATCH = 8


class BaselineResult(NamedTuple):
    """Totals of one replay; ``hit_rate = hit_tokens / prompt_tokens`` (0.0 when empty)."""

    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float
    skipped: int  # requests that could not fit (counted as misses, not cached)
    evicted_blocks: int


@dataclass
class BlockRequest:
    """A running request: its block hashes, its blocks (refs held) and its hit blocks.

    ``hashes`` covers the full blocks of the cached sequence (prompt + output[:-1]);
    ``blocks[i]`` is the physical block of logical block ``i`` (one more for a tail).
    """

    hashes: list[bytes]
    blocks: list[int] = field(default_factory=list)
    hit_blocks: int = 0


def chain_hashes(tokens: npt.NDArray[np.uint32], block_size: int) -> list[bytes]:
    """The chain hash of every full block of ``tokens``: blake2b-128(parent + LE uint32s)."""
    data = tk.from_ids(tokens)
    step = 4 * block_size
    parent = b""
    out = []
    for start in range(0, (len(data) // step) * step, step):
        parent = hashlib.blake2b(parent + data[start : start + step], digest_size=16).digest()
        out.append(parent)
    return out


class BlockHashCache:
    """A pool of ``capacity_blocks`` blocks with refcounts, a hash map and an LRU free queue.

    Invariants (``check()``): a block is in the free queue iff its refcount is 0; a
    block has a hash iff the map sends that hash to it.
    """

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        if capacity_blocks <= 0 or block_size <= 0:
            raise ValueError("capacity_blocks and block_size must be positive")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.evicted_blocks = 0
        self._ref = [0] * capacity_blocks
        self._hash: list[bytes | None] = [None] * capacity_blocks
        self._by_hash: dict[bytes, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(capacity_blocks))

    @property
    def cached_blocks(self) -> int:
        """Blocks that hold a hash (referenced or not)."""
        return len(self._by_hash)

    def free_order(self) -> list[int]:
        """The free queue, front (next to be taken) first."""
        return list(self._free)

    def match(self, hashes: list[bytes]) -> int:
        """How many leading ``hashes`` are cached; changes nothing."""
        n = 0
        for h in hashes:
            if h not in self._by_hash:
                break
            n += 1
        return n

    def start(self, hashes: list[bytes], prompt_len: int, seq_len: int) -> BlockRequest | None:
        """Match the prompt, lock the hit blocks and allocate the rest for ``seq_len`` tokens.

        ``hashes`` are the chain hashes of the sequence's full blocks. Returns None, with
        no change at all, when the blocks cannot be had even by evicting every free block.
        """
        hit = self.match(hashes[: prompt_len // self.block_size])
        hit_blocks = [self._by_hash[h] for h in hashes[:hit]]
        need = -(-seq_len // self.block_size) - hit
        free_hits = sum(1 for b in hit_blocks if self._ref[b] == 0)
        if len(self._free) - free_hits < need:
            return None
        for b in hit_blocks:
            self._ref_up(b)
        req = BlockRequest(hashes, hit_blocks, hit)
        req.blocks.extend(self._allocate() for _ in range(need))
        return req

    def insert(self, req: BlockRequest) -> None:
        """Cache every full block of ``req`` under its hash; a hash already cached (by another
        request meanwhile) takes the cached block and frees the request's own copy."""
        for i in range(req.hit_blocks, len(req.hashes)):
            h, own = req.hashes[i], req.blocks[i]
            cached = self._by_hash.get(h)
            if cached is None:
                self._by_hash[h] = own
                self._hash[own] = h
            elif cached != own:
                self._ref_up(cached)
                req.blocks[i] = cached
                self._ref_down(own)

    def finish(self, req: BlockRequest) -> None:
        """Drop the request's refs, tail block first; ``req`` holds nothing afterwards."""
        for b in reversed(req.blocks):
            self._ref_down(b)
        req.blocks.clear()

    def check(self) -> None:
        """Raise AssertionError when an invariant does not hold."""
        for b in range(self.capacity_blocks):
            if (self._ref[b] == 0) != (b in self._free):
                raise AssertionError(f"block {b}: ref {self._ref[b]} vs free queue")
            h = self._hash[b]
            if h is not None and self._by_hash.get(h) != b:
                raise AssertionError(f"block {b}: hash not mapped back")
        if len(self._by_hash) != sum(h is not None for h in self._hash):
            raise AssertionError("hash map and block hashes disagree")

    def _allocate(self) -> int:
        block, _ = self._free.popitem(last=False)
        h = self._hash[block]
        if h is not None:
            del self._by_hash[h]
            self._hash[block] = None
            self.evicted_blocks += 1
        self._ref[block] = 1
        return block

    def _ref_up(self, block: int) -> None:
        if self._ref[block] == 0:
            del self._free[block]
        self._ref[block] += 1

    def _ref_down(self, block: int) -> None:
        self._ref[block] -= 1
        if self._ref[block] == 0:
            self._free[block] = None
            if self._hash[block] is None:
                self._free.move_to_end(block, last=False)


def replay_block_hash(
    requests: Iterable[tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]],
    capacity_tokens: int,
    block_size: int,
    batch_size: int = REPLAY_BATCH,
) -> BaselineResult:
    """Replay ``(prompt, output)`` pairs through a ``BlockHashCache`` of ``capacity_tokens``.

    Same protocol as the tree's bench: batches of ``batch_size`` consecutive requests;
    each request of a batch is matched, locked and allocated in turn; then each inserts
    ``prompt + output[:-1]`` and unlocks. Hit tokens = hit blocks * ``block_size``.
    """
    cache = BlockHashCache(capacity_tokens // block_size, block_size)
    totals = [0, 0, 0, 0]  # requests, prompt tokens, hit tokens, skipped
    batch: list[tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]] = []
    for pair in requests:
        batch.append(pair)
        if len(batch) == batch_size:
            _replay_batch(cache, batch, totals)
            batch = []
    _replay_batch(cache, batch, totals)
    n, prompt_tokens, hit_tokens, skipped = totals
    rate = hit_tokens / prompt_tokens if prompt_tokens else 0.0
    return BaselineResult(n, prompt_tokens, hit_tokens, rate, skipped, cache.evicted_blocks)


def _replay_batch(
    cache: BlockHashCache,
    batch: list[tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]],
    totals: list[int],
) -> None:
    running: list[BlockRequest] = []
    for prompt, output in batch:
        seq = np.concatenate([prompt, output[:-1]])
        req = cache.start(chain_hashes(seq, cache.block_size), len(prompt), len(seq))
        totals[0] += 1
        totals[1] += len(prompt)
        if req is None:
            totals[3] += 1
            continue
        totals[2] += req.hit_blocks * cache.block_size
        running.append(req)
    for req in running:
        cache.insert(req)
        cache.finish(req)
