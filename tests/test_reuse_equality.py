"""Proof of correct reuse: requests served with cache hits produce the same greedy tokens and,
within float32 tolerance, the same logits as with the cache off and as a dense recomputation
from scratch (``reference_logits``). Covers a full hit, a partial hit, a divergence inside a
block (copy-on-write), a continuation in the parent's partial block (in place), requests after
eviction and merge, and a concurrent batch with chunked prefill."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixcache.serving.engine import Engine, EngineConfig, RequestResult
from radixcache.serving.model import ModelConfig

ATOL = 1e-4  # float32; observed differences are ~2e-6
SMALL = ModelConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)


def _engine(*, cache: bool, num_blocks: int = 64, max_step_tokens: int = 512) -> Engine:
    cfg = EngineConfig(num_blocks=num_blocks, model=SMALL, cache=cache,
                       max_step_tokens=max_step_tokens, record_events=False)
    return Engine(cfg)


def _serve(engine: Engine, prompt: list[int], max_new: int = 6) -> RequestResult:
    """One request, stepped synchronously to completion."""
    h = engine.submit(prompt, max_new, keep_logits=True)
    while not h.done():
        engine.step()
    engine.tree.check()
    return h.result(0)


def _assert_same(on: RequestResult, off: RequestResult, engine: Engine, prompt: list[int]) -> None:
    assert on.tokens == off.tokens
    assert on.logits is not None and off.logits is not None
    torch.testing.assert_close(on.logits, off.logits, atol=ATOL, rtol=0)
    ref = engine.model.reference_logits(prompt + on.tokens[:-1])[len(prompt) - 1 :]
    torch.testing.assert_close(on.logits, ref, atol=ATOL, rtol=0)
    assert on.tokens == ref.argmax(-1).tolist()


def _words(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 100_000, n).tolist()


@pytest.fixture(scope="module")
def engines() -> tuple[Engine, Engine]:
    return _engine(cache=True), _engine(cache=False)


def test_hits_of_every_kind_match_cache_off_and_reference(engines: tuple[Engine, Engine]) -> None:
    on, off = engines
    a = _words(1, 37)
    first = _serve(on, a)
    _assert_same(first, _serve(off, a), on, a)
    assert first.metrics.hit_tokens == 0
    stats = on.tree.stats

    # full hit: all but the last prompt token come from the cache; the boundary block at 36
    # is claimed by the cached answer, so the request writes a copy of its 4 slots
    cow = stats.cow_copies
    full = _serve(on, a)
    assert (full.metrics.hit_tokens, full.metrics.prefill_tokens) == (36, 1)
    assert stats.cow_copies == cow + 1
    _assert_same(full, _serve(off, a), on, a)

    # partial hit on a block boundary: no copy
    b = a[:32] + _words(2, 10)
    cow = stats.cow_copies
    part = _serve(on, b)
    assert part.metrics.hit_tokens == 32
    assert stats.cow_copies == cow
    _assert_same(part, _serve(off, b), on, b)

    # divergence inside block 1 (position 20): copy-on-write of its first 4 slots
    c = a[:20] + _words(3, 15)
    cow, slots = stats.cow_copies, stats.slots_copied
    div = _serve(on, c)
    assert div.metrics.hit_tokens == 20
    assert (stats.cow_copies, stats.slots_copied) == (cow + 1, slots + 4)
    _assert_same(div, _serve(off, c), on, c)

    # next turn: prompt + answer + more, continues in the cached node's partial block in place
    d = a + first.tokens + _words(4, 8)
    cow = stats.cow_copies
    cont = _serve(on, d)
    assert cont.metrics.hit_tokens == len(a) + len(first.tokens) - 1
    assert stats.cow_copies == cow
    _assert_same(cont, _serve(off, d), on, d)


def test_requests_after_eviction_and_merge_match() -> None:
    on, off = _engine(cache=True, num_blocks=12), _engine(cache=False, num_blocks=12)
    base = _words(10, 40)
    p1, p2 = base + _words(11, 20), base + _words(12, 20)
    f1, f2 = _words(20, 70), _words(21, 20)
    # 12 blocks: p1 4, p2 +2 (split at 40, boundary copy), f1 +5 = 11. p2 again: its match
    # ends inside its own node (split there, merged back at unpin) and its answer passes the
    # high mark: the LRU leaf, p1's tail (23 tokens), goes whole and the shared prefix merges
    # into p2's tail. f2 fits. p2 a third time (split, merge) needs room again: the next LRU
    # leaf, f1, gives up only its last 25 tokens and stays cached (per-block tail eviction).
    # p1 then splits the merged node at 40.
    results = []
    for prompt in [p1, p2, f1, p2, f2, p2, p1]:
        results.append((_serve(on, prompt, 4), _serve(off, prompt, 4), prompt))
    s = on.tree.stats
    assert (s.splits, s.evicted_nodes, s.merges, s.evict_calls) == (4, 1, 3, 2)
    assert s.evicted_tokens == 23 + 25
    assert [r.metrics.hit_tokens for r, _, _ in results] == [0, 40, 0, 59, 0, 59, 40]
    for r_on, r_off, prompt in results:
        _assert_same(r_on, r_off, on, prompt)


def test_concurrent_batch_with_chunked_prefill_matches_reference() -> None:
    on = _engine(cache=True, max_step_tokens=24)
    off = _engine(cache=False, max_step_tokens=24)
    shared = _words(30, 45)
    prompts = [shared + _words(31 + i, 5 + 7 * i) for i in range(5)]
    _serve(on, shared, 2)  # warm the shared prefix
    outs = []
    for engine in (on, off):
        handles = [engine.submit(p, 5, keep_logits=True) for p in prompts]
        while not all(h.done() for h in handles):
            engine.step()
            engine.tree.check()
        outs.append([h.result(0) for h in handles])
    for r_on, r_off, prompt in zip(*outs, prompts, strict=True):
        assert r_on.metrics.hit_tokens == 45  # the whole shared prefix
        _assert_same(r_on, r_off, on, prompt)


def test_decodes_split_by_context_match_reference() -> None:
    """One 1,000-token request decoding beside six short ones: padding the six to its context
    would waste more than the step computes, so their decodes run in a forward of their own,
    and every token and logit still matches the cache-off engine and the reference."""
    on = _engine(cache=True, num_blocks=128)
    off = _engine(cache=False, num_blocks=128)
    prompts = [_words(40, 1000)] + [_words(41 + i, 8 + i) for i in range(6)]
    outs, forwards = [], []
    for engine in (on, off):
        handles = [engine.submit(p, 5, keep_logits=True) for p in prompts]
        while not all(h.done() for h in handles):
            report = engine.step()
            if report.prefill_tokens == 0:
                forwards.append(report.forwards)
            engine.tree.check()
        outs.append([h.result(0) for h in handles])
    # per engine, four decode-only steps: seven decodes in two forwards three times, then the
    # long one and the three shorts left, whose waste (4 x 1,005 pairs for ~1,050) is not
    # worth a forward
    assert forwards == [2, 2, 2, 1] * 2
    for r_on, r_off, prompt in zip(*outs, prompts, strict=True):
        _assert_same(r_on, r_off, on, prompt)
