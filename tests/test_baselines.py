"""Full-block-hash baseline (vLLM-style prefix cache): exact hits, eviction and queue order."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from radixcache.tools.baselines import (
    BaselineResult,
    BlockHashCache,
    chain_hashes,
    replay_block_hash,
)


def arr(*tokens: int) -> np.ndarray:
    return np.array(tokens, dtype=np.uint32)


def seq_of(prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    return np.concatenate([prompt, output[:-1]])


def start(cache: BlockHashCache, prompt: np.ndarray, output: np.ndarray):  # type: ignore[no-untyped-def]
    seq = seq_of(prompt, output)
    return cache.start(chain_hashes(seq, cache.block_size), len(prompt), len(seq))


def serve(cache: BlockHashCache, prompt: np.ndarray, output: np.ndarray) -> int:
    """One request alone: start, insert, finish; returns its hit tokens."""
    req = start(cache, prompt, output)
    assert req is not None
    cache.insert(req)
    cache.finish(req)
    cache.check()
    return req.hit_blocks * cache.block_size


def test_chain_hashes_exact() -> None:
    tokens = np.arange(40, dtype=np.uint32)
    h0 = hashlib.blake2b(struct.pack("<16I", *range(16)), digest_size=16).digest()
    h1 = hashlib.blake2b(h0 + struct.pack("<16I", *range(16, 32)), digest_size=16).digest()
    assert chain_hashes(tokens, 16) == [h0, h1]
    assert chain_hashes(tokens[:15], 16) == []


def test_shared_40_tokens_hit_32_only_across_batches() -> None:
    shared = list(range(1, 41))
    a = (arr(*shared, 1000), arr(7, 8))
    b = (arr(*shared, 2000, 2001), arr(9))
    assert replay_block_hash([a, b], 10_000, 16, batch_size=1) == BaselineResult(
        requests=2, prompt_tokens=83, hit_tokens=32, hit_rate=32 / 83, skipped=0,
        evicted_blocks=0)
    # in one batch, b is matched before a inserts: no hit
    assert replay_block_hash([a, b], 10_000, 16).hit_tokens == 0


def test_lru_eviction_order_exact() -> None:
    cache = BlockHashCache(capacity_blocks=3, block_size=4)
    a = (arr(*range(1, 9)), arr(9))  # caches 2 full blocks
    b = (arr(*range(21, 29)), arr(29))
    assert serve(cache, *a) == 0
    assert cache.free_order() == [2, 1, 0]  # a's tail block freed first: evicted first
    assert serve(cache, *b) == 0  # takes block 2 (empty) and block 1 (evicts a's 2nd block)
    assert cache.free_order() == [0, 1, 2]
    assert cache.evicted_blocks == 1
    assert serve(cache, *a) == 4  # a's 1st block survived in block 0; evicts b's 2nd (block 1)
    assert cache.free_order() == [2, 1, 0]
    assert serve(cache, *b) == 4  # b's 1st block in block 2; evicts a's 2nd again
    assert (cache.evicted_blocks, cache.cached_blocks) == (3, 3)
    assert replay_block_hash([a, b, a, b], 12, 4, batch_size=1) == BaselineResult(
        4, 32, 8, 0.25, 0, 3)


def test_partial_tail_block_is_reused_first() -> None:
    cache = BlockHashCache(capacity_blocks=4, block_size=4)
    assert serve(cache, arr(1, 2, 3, 4, 5, 6), arr(7, 8)) == 0  # 7 tokens: 1 full block + tail
    assert cache.free_order() == [1, 2, 3, 0]  # tail (no hash) in front, cached block at back
    assert cache.cached_blocks == 1


def test_duplicate_in_one_batch_reuses_cached_block() -> None:
    cache = BlockHashCache(capacity_blocks=4, block_size=4)
    prompt, output = arr(1, 2, 3, 4, 5), arr(6)
    x, y = start(cache, prompt, output), start(cache, prompt, output)
    assert x is not None and y is not None
    assert (x.blocks, y.blocks, x.hit_blocks, y.hit_blocks) == ([0, 1], [2, 3], 0, 0)
    cache.insert(x)
    cache.finish(x)
    assert cache.free_order() == [1, 0]
    cache.insert(y)  # same hash already cached in block 0: y takes it and frees block 2
    assert y.blocks == [0, 3]
    assert cache.free_order() == [2, 1]
    cache.finish(y)
    cache.check()
    assert cache.free_order() == [3, 2, 1, 0]
    assert cache.cached_blocks == 1


def test_request_that_cannot_fit_is_a_miss_and_changes_nothing() -> None:
    cache = BlockHashCache(capacity_blocks=3, block_size=4)
    assert serve(cache, arr(*range(1, 9)), arr(9)) == 0  # blocks 0, 1 cached
    before = cache.free_order()
    # 8 cached tokens + 4 more, output 2: 13 tokens = 4 blocks, 2 hit, 2 new, only 1 left
    assert start(cache, arr(*range(1, 13)), arr(50, 51)) is None
    assert cache.free_order() == before
    assert (cache.cached_blocks, cache.evicted_blocks) == (2, 0)
    result = replay_block_hash([(arr(*range(1, 9)), arr(9)), (arr(*range(1, 13)), arr(50, 51))],
                               12, 4, batch_size=1)
    assert result == BaselineResult(2, 20, 0, 0.0, 1, 0)


def test_batch_protocol_and_prompt_only_hits() -> None:
    same = (arr(*range(16)), arr(100, 101))  # 17 cached tokens: 4 full blocks, all in the prompt
    result = replay_block_hash([same] * 9, 1024, 4)
    assert result == BaselineResult(9, 144, 16, 16 / 144, 0, 0)  # only the 9th (2nd batch) hits
    grow = [(arr(*range(n)), arr(500, 501)) for n in (5, 9)]
    # first caches 6 tokens -> 1 block; second's prompt has 2 full blocks, 1 cached
    assert replay_block_hash(grow, 1024, 4, batch_size=1).hit_tokens == 4
    assert replay_block_hash([], 1024, 4) == BaselineResult(0, 0, 0, 0.0, 0, 0)


def test_bad_sizes_rejected() -> None:
    with pytest.raises(ValueError, match="positive"):
        BlockHashCache(0, 16)
    with pytest.raises(ValueError, match="positive"):
        replay_block_hash([], 8, 16)
