"""libCacheSim's policies through `whatif --policy` (``analysis.policies``): its LRU equals the
project's exact one-pass curve at every grid capacity, and every policy's points equal what
libCacheSim itself gives when driven directly over the same requests at the same sizes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

libcachesim = pytest.importorskip("libcachesim")  # the `policies` extra (in `dev`: CI has it)

from cli.main import main  # noqa: E402
from radixcache.analysis.answers import grid_tokens  # noqa: E402
from radixcache.analysis.policies import (  # noqa: E402
    LIBCACHESIM,
    EvictionPolicy,
    replay_hits,
    with_paths,
)
from radixcache.analysis.whatif import one_pass  # noqa: E402
from radixcache.traffic.mooncake import read_mooncake, write_mooncake  # noqa: E402
from radixcache.traffic.sharegpt import load_trace  # noqa: E402
from radixcache.traffic.traces import TokenRequest, token_access  # noqa: E402


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pol") / "mc.jsonl"
    write_mooncake(path, 400, 6)
    return path


def test_libcachesim_lru_is_the_exact_curve_at_every_grid_point(trace):
    acc = list(read_mooncake(trace))
    curve = one_pass(acc, 8, 512)
    paths = list(with_paths(acc, 8))
    caps = [c for c in grid_tokens(curve, []) if c > 0]
    got = [replay_hits(paths, EvictionPolicy.LRU, c // 512, 512) for c in caps]
    assert got == [int(h) for h in curve.hits(np.asarray(caps) // 512)]
    assert len(caps) > 50 and got[-1] == curve.max_hits > 0


def test_libcachesim_lru_is_the_exact_curve_on_token_blocks():
    trace = load_trace(60)
    reqs = [TokenRequest(r.prompt, np.concatenate((r.prompt, r.output[:-1])))
            for r in trace.requests]
    acc = [token_access(r, 16) for r in reqs]
    curve = one_pass(acc, 64, 16)
    paths = list(with_paths(acc, 64))
    units = [u for u in sorted(set(np.geomspace(1, curve.saturation_units + 5, 40).round()
                                   .astype(int).tolist()))]
    got = [replay_hits(paths, EvictionPolicy.LRU, u, 16) for u in units]
    assert got == [int(h) for h in curve.hits(np.asarray(units))]


def direct(trace: Path, name: str, blocks: int) -> int:
    """libCacheSim driven by hand: each request's prompt prefix looked up, then its blocks
    requested deepest-first (the model ``analysis.policies`` documents)."""
    cache = getattr(libcachesim, name)(cache_size=blocks)
    hits = 0
    for line in trace.read_text().splitlines():
        rec = json.loads(line)
        ids, n = rec["hash_ids"], 0
        while n < len(ids) and cache.find(libcachesim.Request(obj_size=1, obj_id=ids[n]),
                                          update_cache=False) is not None:
            n += 1
        hits += min(n * 512, rec["input_length"])
        for x in reversed(ids):
            cache.get(libcachesim.Request(obj_size=1, obj_id=x))
    return hits


def test_every_policy_through_whatif_equals_libcachesim_itself(trace, capsys):
    names = ",".join(p.value for p in EvictionPolicy)
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(trace), "--policy", names, "--samples", "4", "--json"])
    fig = json.loads(capsys.readouterr().out)
    assert exc.value.code == 0 and list(fig["policies"]) == names.split(",")
    for policy in EvictionPolicy:
        pts = fig["policies"][policy.value]
        name, least = LIBCACHESIM[policy]
        assert pts["capacities_tokens"] and min(pts["capacities_tokens"]) >= least * 512
        want = [direct(trace, name, c // 512) / fig["prompt_tokens"]
                for c in pts["capacities_tokens"]]
        assert pts["hit_rate"] == want, policy
    assert fig["policies"]["lru"]["hit_rate"] == fig["policies"]["lru"]["lru_hit_rate"]


def test_an_unknown_policy_is_a_usage_error(trace, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(trace), "--policy", "lru,mru"])
    assert exc.value.code == 2 and "choose from lru, fifo" in capsys.readouterr().err


def test_fifo_and_lfu_on_hand_worked_traces():
    def tok(xs: list[int]) -> np.ndarray:
        return np.asarray(xs, np.uint32)

    a, b, c = tok([1, 2]), tok([3, 4]), tok([5, 6])

    def hits(*seqs: np.ndarray) -> dict[str, int]:
        acc = [token_access(TokenRequest(s, s), 1) for s in seqs]
        paths = list(with_paths(acc, 4))
        return {p.value: replay_hits(paths, p, 4, 1) for p in
                (EvictionPolicy.LRU, EvictionPolicy.FIFO, EvictionPolicy.LFU)}

    # A B A C A (room for two): C evicts B under LRU and LFU (A was used twice, and last),
    # but the first-in A under FIFO, whose last A then misses
    assert hits(a, b, a, c, a) == {"lru": 4, "fifo": 2, "lfu": 4}
    # A A A B C B: C evicts the least recent A under LRU (and the first-in A under FIFO),
    # but B under LFU (1 use against A's 3), whose last B then misses
    assert hits(a, a, a, b, c, b) == {"lru": 6, "fifo": 6, "lfu": 4}
