"""The fixed-size sample (``analysis.fixedsample``, SHARDS' s_max): never more than s_max
blocks, the same as a fixed-rate sample while it never drops, and joined with the exact
bounded pass (``hybrid``) within a point of the exact curve, its bounds holding the exact
value; the CLI's ``--sample-max``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.analysis.fixedsample import FixedSample
from radixcache.analysis.hashstack import HashStack
from radixcache.analysis.hybrid import HybridPass
from radixcache.traffic.mooncake import HashRuns, generate_runs, write_mooncake
from tests.test_whatif_hybrid import run_cli


def exact(runs: list[HashRuns]):  # type: ignore[no-untyped-def]
    hs = HashStack(512)
    for r in runs:
        hs.add(r.ids, r.ends, r.tokens)
    return hs.curve()


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), s_max=st.sampled_from([3500, 4500, 6000]))
def test_joined_with_the_exact_pass_within_a_point_and_inside_its_bounds(seed, s_max):
    """Seeded traces of ~10,000 distinct blocks, the sample ending at a rate of 0.3-0.6
    (sub-samples of 300+ blocks: a bound). Tolerance: under 1 point at every capacity (over
    14 seeds at most 0.45 measured), and the exact value inside the (95%, pointwise) bound at
    75% of the estimated capacities or more (measured 80-100%; the fixed-rate sample's
    98-100%: the rates a fixed-size sample passes through add a spread its bound follows
    less well)."""
    runs = list(generate_runs(4000, seed, batch=500))
    e = exact(runs)
    hy = HybridPass(512, 1.0, 1000, sample_max=s_max)
    for r in runs:
        hy.add(r.ids, r.ends, r.tokens)
    c = hy.curve()
    assert isinstance(hy.sample, FixedSample) and hy.sample.peak <= s_max
    assert hy.sample.rate < 1 and hy.exact.evicted > 0
    grid = np.unique(np.geomspace(1, 2 * e.saturation_units, 300).round().astype(np.int64))
    low = grid <= 1000
    assert np.array_equal(c.exact(grid), low)
    assert np.array_equal(c.hits(grid[low]), e.hits(grid[low]))
    miss = np.abs(c.hits(grid) - e.hits(grid))
    assert 100 * miss.max() / e.prompt_tokens < 1.0
    bound = c.bounds(grid)
    assert c.bound is not None and (bound[~low] > 0).all()
    assert np.mean(miss[~low] <= bound[~low]) >= 0.75


def test_the_set_never_exceeds_s_max():
    runs = list(generate_runs(3000, 5, batch=1))  # one request an add: checked after each
    s_max = 700
    fs = FixedSample(512, s_max)
    most = 0
    for r in runs:
        fs.add(r.ids, r.ends, r.tokens)
        most = max(most, fs.distinct)
        assert fs.distinct <= s_max and fs.peak <= s_max
    assert most == fs.peak > s_max * 9 // 10  # it fills up, then drops
    assert fs.rate < 0.5
    # one request of more new blocks than s_max holds: the threshold falls before it
    wide = np.arange(10_000, 12_000, dtype=np.uint64)
    fs.add(wide, np.asarray([len(wide)]), np.asarray([512 * len(wide)]))
    assert fs.distinct <= s_max


def test_without_a_drop_it_is_the_fixed_rate_sample():
    runs = list(generate_runs(3000, 2, batch=400))
    fs, hs = FixedSample(512, 10**6, 0.1), HashStack(512, 0.1)
    for r in runs:
        fs.add(r.ids, r.ends, r.tokens)
        hs.add(r.ids, r.ends, r.tokens)
    assert fs.rate == hs.rate and fs.peak < 10**6
    a, b = fs.curve(), hs.curve()
    assert np.array_equal(a.cum, b.cum) and a.unit_step == b.unit_step


def test_after_drops_it_reads_like_a_sample_at_its_final_rate():
    runs = list(generate_runs(4000, 3, batch=500))
    e = exact(runs)
    fs = FixedSample(512, 2000)
    for r in runs:
        fs.add(r.ids, r.ends, r.tokens)
    c = fs.curve()
    assert c.unit_step == 1 / fs.rate
    grid = np.unique(np.geomspace(100 / fs.rate, 2 * e.saturation_units, 200).astype(np.int64))
    err = 100 * np.abs(c.hits(grid) - e.hits(grid)) / e.prompt_tokens
    assert err.max() < 1.5  # where a sample resolves (>= 100/R blocks): 0.57-1.02 measured


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("fx") / "mc.jsonl"
    write_mooncake(path, 4000, 6)
    return path


def test_the_cli_reports_the_final_rate(trace, capsys):
    code, out, err = run_cli(["whatif", str(trace), "--sample-max", "2000", "--exact-depth",
                              "500", "--json"], capsys)
    fig = json.loads(out)
    assert code == 0 and 0 < fig["sample_rate"] < 0.5
    assert fig["exact_up_to_tokens"] == 500 * 512
    note = next(n for n in fig["notes"] if n.startswith("fixed-size sample"))
    assert note.startswith("fixed-size sample: at most 2,000 blocks (held ")
    assert f"final rate {fig['sample_rate']:.6g}" in note
    code, out, err = run_cli(["whatif", str(trace), "--s-max", "2000", "--exact-depth", "0",
                              "--json"], capsys)
    alone = json.loads(out)
    assert code == 0 and alone["sample_rate"] == fig["sample_rate"]
    assert "exact_up_to_tokens" not in alone or alone["exact_up_to_tokens"] in (0, None)
    code, _, err = run_cli(["whatif", "sharegpt", "--sample-max", "10"], capsys)
    assert code == 2 and "sampling needs a Mooncake-format trace" in err
