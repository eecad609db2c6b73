"""`radixcache bench tree`: the JSON keys scripts rely on, and figures equal to a direct replay."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import cli.cmd_bench_tree as bench_mod
from cli.main import main
from radixcache.tools.baselines import replay_block_hash
from radixcache.tools.benchtree import TreeBenchConfig, replay_tree
from radixcache.traffic.sharegpt import Trace, TraceRequest, fingerprint

CAP = 4000  # token slots: small enough that the replay evicts
CONTRACT = {"requests", "prompt_tokens", "hit_rate", "hit_rate_page_aligned",
            "hit_rate_block_hash", "match_us_mean", "insert_us_mean", "evict_us_mean",
            "tree_op_seconds", "event_overhead", "bytes_per_cached_token", "splits", "merges",
            "cow_copies", "slots_copied"}


def synthetic_trace() -> Trace:
    """12 multi-turn conversations of 4 turns that share openings, interleaved."""
    rng = random.Random(7)
    openings = [[100000, 100001, 100010, 100002, *rng.sample(range(500), 20)] for _ in range(3)]
    convs = []
    for c in range(12):
        ctx = list(openings[c % 3]) + rng.sample(range(500, 1000), 5 + c)
        turns = []
        for t in range(4):
            prompt = [*ctx, 100001, 100011, 100002]
            output = [*rng.sample(range(1000, 2000), 60 + 10 * t), 100003]
            turns.append(TraceRequest(c, t, np.array(prompt, np.uint32),
                                      np.array(output, np.uint32)))
            ctx = [*prompt, *output, 100001, 100010, 100002, *rng.sample(range(500), 9)]
        convs.append(turns)
    requests = [convs[c][t] for t in range(4) for c in range(12)]
    return Trace(requests, 12, 12, None, fingerprint(requests), "synthetic")


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch) -> Trace:
    t = synthetic_trace()
    monkeypatch.setattr(bench_mod, "load_trace", lambda limit=None: t)
    return t


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "tree", "--json", "--capacity", str(CAP), *args])
    assert exit_info.value.code == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_json_keys_and_figures_equal_a_direct_replay(
    trace: Trace, capsys: pytest.CaptureFixture[str]
) -> None:
    fig = run_json(capsys, "--repeat", "2", "--memory")
    assert fig.keys() >= CONTRACT
    reqs = [(r.prompt, r.output) for r in trace.requests]
    direct = replay_tree(reqs, TreeBenchConfig(capacity=CAP))
    aligned = replay_tree(reqs, TreeBenchConfig(capacity=CAP, page_aligned=True))
    block1 = replay_tree(reqs, TreeBenchConfig(block_size=1, capacity=CAP))
    assert (fig["requests"], fig["prompt_tokens"]) == (48, sum(len(p) for p, _ in reqs))
    assert fig["hit_rate"] == direct.hit_rate and 0.5 < direct.hit_rate < 1
    assert fig["hit_rate_page_aligned"] == aligned.hit_rate < direct.hit_rate
    assert fig["hit_rate_block_size_1"] == block1.hit_rate
    assert fig["hit_rate_block_hash"] == replay_block_hash(iter(reqs), CAP, 16).hit_rate
    counts = ("splits", "merges", "extends", "cow_copies", "slots_copied", "tokens_evicted",
              "events")
    assert [fig[k] for k in counts] == [
        direct.splits, direct.merges, direct.extends, direct.cow_copies, direct.slots_copied,
        direct.evicted_tokens, direct.events]
    assert direct.extends > 0  # follow-up turns grew their conversation's leaf
    assert direct.evicted_tokens > 0 and direct.cow_copies > 0  # the pool is small: it evicts
    # eviction passes are timed in a replay of their own, not in the runs whose time counts
    timed = replay_tree(reqs, TreeBenchConfig(capacity=CAP, clock_evictions=True))
    assert direct.times.evict == [] and min(timed.times.evict) > 0
    assert timed.evicted_tokens == direct.evicted_tokens
    assert isinstance(fig["evict_us_mean"], float) and fig["evict_us_mean"] > 0
    runs = fig["tree_op_seconds_runs"]
    assert isinstance(runs, list) and len(runs) == 2 and fig["tree_op_seconds"] == min(runs)
    off = fig["tree_op_seconds_events_off_runs"]
    assert isinstance(off, list) and fig["tree_op_seconds_events_off"] == min(off)
    assert fig["repeat"] == 2
    bpt = fig["bytes_per_cached_token"]
    assert isinstance(bpt, float) and bpt > 0


def test_without_memory_the_bytes_figure_is_null(
    trace: Trace, capsys: pytest.CaptureFixture[str]
) -> None:
    fig = run_json(capsys, "--repeat", "1", "--no-block1")
    assert fig["bytes_per_cached_token"] is None and fig["hit_rate_block_size_1"] is None
    assert fig["tree_op_seconds_runs"] == [fig["tree_op_seconds"]]


def test_human_table(trace: Trace, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "tree", "--capacity", str(CAP), "--repeat", "2", "--no-block1"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for label in ("token hit rate (tree)", "hit rate, page-aligned matching",
                  "tree-op seconds (events on)", "best of", "splits / merges / extends",
                  "metadata bytes per cached token"):
        assert label in out
