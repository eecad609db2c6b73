"""`radixcache bench whatif`: the one-pass curve's speed and exactness.

ShareGPT (the trace `bench tree` replays): the whole curve at block 16 against one `bench tree`
replay timed in the same run; the curve against direct LRU replays at ``checks`` capacities
(exact: they must be equal), and against the real tree replayed sequentially at block 1 (equal
at every capacity: per-block tail eviction is the curve's LRU) and block 16 (between the curve
at the capacity less the tree's partial-block waste and at the capacity: ``within_waste_at``)
and with `bench tree`'s batches of 8 (measured: see ``radixcache.analysis.treecheck``).
Mooncake format: a seeded trace of ``requests`` requests is generated to a temporary file and
analysed in a fresh process, so its time and peak memory are its own.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from radixcache.analysis.answers import FRACTIONS, capacity_for
from radixcache.analysis.replay import ReplayCache, replay
from radixcache.analysis.stackdist import Curve
from radixcache.analysis.whatif import one_pass
from radixcache.tools.bench_whatif_scale import peak_rss_mb as _peak_rss_mb
from radixcache.traffic.mooncake import read_mooncake, write_mooncake
from radixcache.traffic.traces import (
    MOONCAKE_BLOCK,
    Access,
    TokenRequest,
    token_access,
)

if TYPE_CHECKING:  # treecheck imports torch (the pool): imported where used
    from radixcache.analysis.treecheck import Runs

NewTask = Callable[[str, int | None], int]
Advance = Callable[[int, int], None]
Figures = dict[str, object]
Request = tuple[np.ndarray, np.ndarray]  # (prompt, output), as bench tree replays them
MOONCAKE_CHECK_REQUESTS = 100_000  # direct replays of 1M requests take ~30 s each


def _check_caps(curve: Curve, checks: int, floor_tokens: int) -> list[int]:
    """``checks`` capacities (tokens, whole blocks) from where the tree surely fits a request
    (``floor_tokens``) or the curve's 10% point, to saturation; log-spaced."""
    b = curve.block_tokens
    lo = max(floor_tokens, capacity_for(curve, 0.1), b)
    hi = max(lo * 2, curve.saturation_units * b)
    return [int(c) // b * b for c in np.geomspace(lo, hi, checks)]


def _direct(acc: Sequence[Access], curve: Curve, caps: list[int], width: int) -> Figures:
    b = curve.block_tokens
    replayed = [replay(acc, ReplayCache(c // b, width, b)) for c in caps]
    predicted = [int(h) for h in curve.hits(np.asarray(caps) // b)]
    return {"capacities_tokens": caps, "curve_hits": predicted, "replay_hits": replayed,
            "equal": replayed == predicted}


def _tree(reqs: list[TokenRequest], token_curve: Curve, hit_runs: list[Runs], caps: list[int],
          block: int) -> Figures:
    """The real tree at ``block`` against the block-1 curve: below it by at most the partial-
    block waste (the curve at capacity - waste), above it by at most the free tails of blocks
    used in part (``block_rounded_hits``; equal to the curve at block 1)."""
    from radixcache.analysis.treecheck import block_rounded_hits
    from radixcache.analysis.treecheck import replay_tree as tree_replay  # imports torch

    runs = [tree_replay(reqs, c, block, sample_every=997) for c in caps]
    predicted = [int(h) for h in token_curve.hits(np.asarray(caps))]
    lower = [int(token_curve.hits(np.asarray([max(0, c - r.peak_waste_slots)]))[0])
             for c, r in zip(caps, runs, strict=True)]
    upper = [block_rounded_hits(hit_runs, c, block) for c in caps]
    p = max(token_curve.prompt_tokens, 1)
    diffs = [(r.hit_tokens - h) / p for r, h in zip(runs, predicted, strict=True)]
    return {"capacities_tokens": caps, "curve_hits": predicted,
            "tree_hits": [r.hit_tokens for r in runs], "curve_hits_at_capacity_minus_waste": lower,
            "curve_hits_block_rounded": upper,
            "peak_waste_slots": [r.peak_waste_slots for r in runs],
            "max_abs_diff_points": 100 * max(abs(d) for d in diffs),
            "equal_at": sum(r.hit_tokens == h for r, h in zip(runs, predicted, strict=True)),
            "within_waste_at": sum(lo <= r.hit_tokens <= hi
                                   for r, lo, hi in zip(runs, lower, upper, strict=True))}


def _batched(pairs: list[Request], token_curve: Curve, caps: list[int]) -> Figures:
    from radixcache.tools.benchtree import TreeBenchConfig
    from radixcache.tools.benchtree import replay_tree as bench_replay

    runs = [bench_replay(pairs, TreeBenchConfig(16, c, record_events=False)) for c in caps]
    p = max(token_curve.prompt_tokens, 1)
    predicted = [int(h) for h in token_curve.hits(np.asarray(caps))]
    return {"capacities_tokens": caps, "curve_hit_rate": [h / p for h in predicted],
            "tree_hit_rate": [r.hit_rate for r in runs],
            "max_abs_diff_points": 100 * max(abs(r.hit_rate - h / p)
                                             for r, h in zip(runs, predicted, strict=True))}


def sharegpt(limit: int | None, checks: int, new: NewTask, advance: Advance) -> Figures:
    """The ShareGPT figures (see the module docstring)."""
    from radixcache.tools.benchtree import TreeBenchConfig
    from radixcache.tools.benchtree import replay_tree as bench_replay
    from radixcache.traffic.sharegpt import load_trace

    trace = load_trace(limit)
    pairs = [(r.prompt, r.output) for r in trace.requests]
    reqs = [TokenRequest(p, np.concatenate((p, o[:-1]))) for p, o in pairs]
    task = new("bench tree replay (block 16)", len(pairs))
    t0 = time.perf_counter()
    bench_replay(pairs, TreeBenchConfig(), lambda n: advance(task, n))
    tree_s = time.perf_counter() - t0
    task = new("one-pass curve (block 16)", len(reqs))
    t0 = time.perf_counter()
    curve = one_pass((token_access(r, 16) for r in reqs), 64, 16, lambda n: advance(task, n))
    curve_s = time.perf_counter() - t0
    from radixcache.analysis.treecheck import token_pass

    token_curve, hit_runs = token_pass(reqs)
    longest = max(len(r.cached) for r in reqs)
    caps16 = _check_caps(curve, checks, 4 * longest)
    caps1 = _check_caps(token_curve, checks, 4 * longest)
    task = new("exactness replays", 4)
    direct = _direct([token_access(r, 16) for r in reqs], curve, caps16, 64)
    advance(task, 1)
    tree1 = _tree(reqs, token_curve, hit_runs, caps1, 1)
    advance(task, 1)
    tree16 = _tree(reqs, token_curve, hit_runs, caps1, 16)
    advance(task, 1)
    # bench tree holds 8 requests' paths at once: its smallest size must fit 8 of the longest
    batched = _batched(pairs, token_curve, _check_caps(token_curve, checks, 16 * longest))
    advance(task, 1)
    p = max(curve.prompt_tokens, 1)
    return {
        "requests": curve.requests, "prompt_tokens": curve.prompt_tokens,
        "curve_seconds": curve_s, "tree_replay_seconds": tree_s, "ratio": curve_s / tree_s,
        "max_hit_rate": curve.max_hits / p, "max_hit_rate_block_size_1": token_curve.max_hits / p,
        "capacity_for": {f: capacity_for(curve, float(f)) for f in FRACTIONS},
        "direct_lru_block_16": direct, "tree_block_1": tree1, "tree_block_16": tree16,
        "tree_batched_block_16": batched,
    }


def mooncake_figures(path: Path, checks: int) -> Figures:
    """The one pass over a Mooncake-format file, its time and this process's peak RSS, and
    direct LRU replays of its first 100k requests at ``checks`` capacities."""
    from radixcache.analysis.whatif import WhatIfConfig, analyse

    start_mb = _peak_rss_mb()  # the interpreter and imports
    t0 = time.perf_counter()
    curve = analyse(WhatIfConfig(str(path))).curve  # the array pass, as `whatif FILE` runs it
    seconds = time.perf_counter() - t0
    peak_mb = _peak_rss_mb()
    head = list(itertools.islice(read_mooncake(path), MOONCAKE_CHECK_REQUESTS))
    head_curve = one_pass(head, 8, MOONCAKE_BLOCK)
    caps = _check_caps(head_curve, checks, MOONCAKE_BLOCK)
    p = max(curve.prompt_tokens, 1)
    return {
        "requests": curve.requests, "prompt_tokens": curve.prompt_tokens, "seconds": seconds,
        "peak_rss_mb": peak_mb, "rss_before_mb": start_mb, "max_hit_rate": curve.max_hits / p,
        "distinct_blocks": len(curve.cum) - 1,
        "capacity_for": {f: capacity_for(curve, float(f)) for f in FRACTIONS},
        "direct_lru_first_100k": _direct(head, head_curve, caps, 8),
    }


def mooncake(requests: int, seed: int, checks: int) -> Figures:
    """Generate the trace, then analyse it in a fresh interpreter (``python -m`` this module:
    no torch, nothing of this process), so its time and peak RSS are its own."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mooncake.jsonl"
        t0 = time.perf_counter()
        write_mooncake(path, requests, seed)
        gen_s = time.perf_counter() - t0
        cmd = [sys.executable, "-m", "radixcache.tools.bench_whatif", str(path), str(checks)]
        done = subprocess.run(cmd, capture_output=True, check=True)
    fig: Figures = json.loads(done.stdout)
    fig["generate_seconds"] = gen_s
    fig["seed"] = seed
    return fig


def run_bench(
    requests: int, limit: int | None, checks: int, seed: int, new: NewTask, advance: Advance,
    scale: tuple[int, list[float]] | None = None,
) -> Figures:
    """The ``--json`` object (keys: ``sharegpt``, ``follow``, ``mooncake``, and ``scale``
    when ``scale`` = (requests, sample rates) is given: ``bench_whatif_scale``)."""
    fig: Figures = {"sharegpt": sharegpt(limit, checks, new, advance)}
    fig["follow"] = follow_sharegpt(limit, new, advance)
    task = new(f"Mooncake format, {requests:,} requests", None)
    fig["mooncake"] = mooncake(requests, seed, checks)
    advance(task, requests)
    if scale is not None:
        from radixcache.tools.bench_whatif_scale import run_scale

        task = new(f"scale: {scale[0]:,} requests, {2 + 4 * len(scale[1])} passes", None)
        fig["scale"] = run_scale(scale[0], seed, scale[1])
        advance(task, scale[0])
    return fig


def follow_sharegpt(limit: int | None, new: NewTask, advance: Advance) -> Figures:
    """The inspector's follower over the ShareGPT trace served with `bench tree`'s pool
    (``radixcache.tools.bench_follow``)."""
    from radixcache.tools.bench_follow import follow
    from radixcache.tools.benchtree import TreeBenchConfig
    from radixcache.traffic.sharegpt import load_trace

    cfg = TreeBenchConfig()
    pairs = [(r.prompt, r.output) for r in load_trace(limit).requests]
    task = new("inspector follower (serve, then follow)", 2)
    return follow(pairs, cfg.capacity // cfg.block_size, lambda n: advance(task, n))


def table_rows(fig: Figures) -> list[tuple[str, str]]:
    """The human table's rows."""
    s, m, f = fig["sharegpt"], fig["mooncake"], fig["follow"]
    assert isinstance(s, dict) and isinstance(m, dict) and isinstance(f, dict)
    causes = f["missed_tokens_by_cause"]
    return [
        ("ShareGPT requests", f"{s['requests']:,}"),
        ("curve at block 16 (s)", f"{s['curve_seconds']:.2f}"),
        ("one bench tree replay (s)", f"{s['tree_replay_seconds']:.2f}"),
        ("curve / replay", f"{s['ratio']:.2f}x"),
        ("max hit rate (block 16 / block 1)",
         f"{100 * s['max_hit_rate']:.2f}% / {100 * s['max_hit_rate_block_size_1']:.2f}%"),
        ("direct LRU replays equal", str(s["direct_lru_block_16"]["equal"])),
        ("real tree block 1: max diff (points), equal at",
         f"{s['tree_block_1']['max_abs_diff_points']:.3f}, {s['tree_block_1']['equal_at']}/"
         f"{len(s['tree_block_1']['tree_hits'])}"),
        ("real tree block 16: max diff (points), equal at, within waste at",
         f"{s['tree_block_16']['max_abs_diff_points']:.3f}, {s['tree_block_16']['equal_at']}/"
         f"{len(s['tree_block_16']['tree_hits'])}, {s['tree_block_16']['within_waste_at']}/"
         f"{len(s['tree_block_16']['tree_hits'])}"),
        ("bench tree batches: max diff (points)",
         f"{s['tree_batched_block_16']['max_abs_diff_points']:.3f}"),
        ("inspector follower: events/s (bare mirror)",
         f"{f['follow_events_per_s']:,.0f} ({f['bare_events_per_s']:,.0f}), "
         f"{f['overhead']:.1f}x"),
        ("follower curve equals the offline one", str(f["curve_equal"])),
        ("follower predicted / measured at the pool",
         f"{100 * f['predicted_hit_rate']:.2f}% / {100 * f['measured_hit_rate']:.2f}%"),
        (f"missed tokens by cause (last {f['explained']:,} requests)",
         ", ".join(f"{k} {v:,}" for k, v in causes.items() if v)),
        ("Mooncake requests", f"{m['requests']:,}"),
        ("Mooncake one pass (s)", f"{m['seconds']:.2f}"),
        ("Mooncake peak RSS (MB; before the pass)",
         f"{m['peak_rss_mb']:.0f} ({m['rss_before_mb']:.0f})"),
        ("Mooncake max hit rate", f"{100 * m['max_hit_rate']:.2f}%"),
        ("Mooncake direct LRU equal (first 100k)", str(m["direct_lru_first_100k"]["equal"])),
        *_scale_rows(fig),
    ]


def _scale_rows(fig: Figures) -> list[tuple[str, str]]:
    scale = fig.get("scale")
    if not isinstance(scale, dict):
        return []
    from radixcache.tools.bench_whatif_scale import table_rows as scale_rows

    return scale_rows(scale)


if __name__ == "__main__":  # the Mooncake half, run by ``mooncake`` in a fresh interpreter
    print(json.dumps(mooncake_figures(Path(sys.argv[1]), int(sys.argv[2]))))
