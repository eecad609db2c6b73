"""The load client against one HTTP front (no router): every next turn carries the server's
real answer, so the engine serves all of the previous turn from its cache; and the merged
tree of two mirrors."""

from __future__ import annotations

import numpy as np

from radixcache.core.pool import KVPool
from radixcache.core.tree import RadixTree
from radixcache.traffic.load import LoadConfig, arrivals, load
from radixcache.traffic.tokenizer import shipped
from radixcache.traffic.workloads import build_workload
from radixcache.wire.fleet import merge
from radixcache.wire.mirror import Mirror
from tests.conftest import toks
from tests.helpers.http import http_engine


def test_next_turns_hit_everything_the_previous_turn_cached() -> None:
    w = build_workload("chat", {"conversations": 2})
    tok = shipped()
    with http_engine(512) as front:
        result = load(LoadConfig(front.url, rate=50.0, max_tokens=4), w)
    assert [r.error for r in result.replies] == [None] * len(w.requests)
    sent = {r.request: (r.prompt_tokens, r.output_tokens) for r in result.replies}
    firsts = [tok.encode(w.text(req.prompt)) for req in w.requests if req.after is None]
    for r, req in zip(result.replies, w.requests, strict=True):
        assert r.output_tokens == min(4, req.max_new_tokens)
        if req.after is not None:
            # a next turn hits at least its predecessor's prompt, at most that and the
            # answer but its last token (whose K/V the engine never writes): the server
            # re-encodes the answer's text, which may split into other tokens
            prompt, answer = sent[req.after]
            assert prompt <= r.cached_tokens <= prompt + answer - 1
        else:  # a first turn hits what it shares with another conversation's first turn,
            # if that one was cached before this one arrived
            mine = tok.encode(w.text(req.prompt))
            assert r.prompt_tokens == len(mine)
            shared = max(_common(mine, f) for f in firsts if f != mine)
            assert r.cached_tokens in (0, shared)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_arrivals_are_seeded_poisson() -> None:
    a = arrivals(4, 10.0, seed=3)
    assert a == arrivals(4, 10.0, seed=3)
    assert a == sorted(a) and a != arrivals(4, 10.0, seed=4)


def _mirror_of(seqs: list[list[int]]) -> Mirror:
    tree = RadixTree(KVPool(64, 16))
    for seq in seqs:
        m = tree.match_and_pin(toks(seq))
        tree.insert(toks(seq), tree.allocate(m, len(seq)))
        tree.unpin(m.node)
    mirror = Mirror(16, 64)
    mirror.load_snapshot(tree.snapshot())
    return mirror


def test_merge_marks_each_node_with_its_replicas() -> None:
    a = list(range(1, 41))
    r0 = _mirror_of([a, [*a[:30], 900, 901]])
    r1 = _mirror_of([[*a[:20], 700]])
    tree = merge([r0, r1, None])
    rows = sorted((len(n.tokens), sorted(n.holders), int(n.tokens[0])) for n in tree.walk())
    assert rows == [(1, [1], 700), (2, [0], 900), (10, [0], 21), (10, [0], 31),
                    (20, [0, 1], 1)]
    s = tree.stats()
    assert (s.unique_tokens, s.held_tokens, s.duplicated_tokens) == (43, 63, 20)
    assert s.replication == {1: 23, 2: 20}
    assert np.array_equal(tree.root.children[1].tokens, np.arange(1, 21, dtype=np.uint32))
