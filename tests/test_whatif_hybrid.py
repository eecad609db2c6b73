"""The exact pass bounded to a stack depth (``analysis.boundstack``) against the whole exact
pass, the joined curve (``analysis.hybrid``) against it at every capacity, what each point
says it is, tiny samples, and trace lines without an end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.main import main
from radixcache.analysis.boundstack import BoundedStack
from radixcache.analysis.hashstack import HashStack
from radixcache.analysis.hybrid import HybridPass, default_depth
from radixcache.traffic.mooncake import HashRuns, generate_runs, write_mooncake
from tests.test_whatif_scale import ODD

RUNS = list(generate_runs(6000, 9, batch=700))


def exact_curve(runs: list[HashRuns]):  # type: ignore[no-untyped-def]
    hs = HashStack(512)
    for r in runs:
        hs.add(r.ids, r.ends, r.tokens)
    return hs.curve()


EXACT = exact_curve(RUNS)


def bounded(runs: list[HashRuns], depth: int) -> BoundedStack:
    b = BoundedStack(512, depth)
    for r in runs:
        b.add(r.ids, r.ends, r.tokens)
    return b


@settings(max_examples=12, deadline=None)
@given(depth=st.integers(1, 30_000))
def test_bounded_pass_is_exact_up_to_its_depth(depth):
    b = bounded(RUNS, depth)
    upto = np.arange(min(depth, len(EXACT.cum) - 1) + 1)
    assert np.array_equal(b.curve().hits(upto), EXACT.hits(upto))
    assert b.held <= depth + max(depth, 4096)  # bounded by the depth, not by the trace


def test_bounded_pass_with_sparse_ids_and_nothing_evicted():
    sparse = [r._replace(ids=r.ids * np.uint64(ODD)) for r in RUNS]
    b = bounded(sparse, 300)
    u = np.arange(301)
    assert np.array_equal(b.curve().hits(u), EXACT.hits(u))
    whole = bounded(RUNS, len(EXACT.cum) + 10)
    assert whole.evicted == 0
    assert np.array_equal(whole.curve().cum[: len(EXACT.cum)], EXACT.cum)
    # a depth below the distinct blocks that still evicts nothing (it cuts at 2x): every
    # distance it held is recorded, not only those below the depth
    distinct = len(EXACT.cum) - 2
    held = bounded(RUNS, distinct - 100)
    assert held.evicted == 0
    assert np.array_equal(held.curve().cum[: len(EXACT.cum)], EXACT.cum)


def test_hybrid_is_exact_below_its_depth_and_close_above():
    hy = HybridPass(512, 0.05, depth=2000)  # 100/R: where a sample starts to resolve
    for r in RUNS:
        hy.add(r.ids, r.ends, r.tokens)
    c = hy.curve()
    assert c.exact_units == 2000 and hy.exact.evicted > 0
    grid = np.unique(np.geomspace(1, 4 * EXACT.saturation_units, 300).round().astype(np.int64))
    low = grid <= 2000
    assert np.array_equal(c.exact(grid), low)
    assert np.array_equal(c.hits(grid[low]), EXACT.hits(grid[low]))
    err = 100 * np.abs(c.hits(grid) - EXACT.hits(grid)) / EXACT.prompt_tokens
    assert err.max() < 0.5  # seeded: the error measured on this trace is 0.28 points
    # its 8 sub-samples hold fewer than 300 blocks each: no bound is claimed (-1: unknown)
    assert min(s.distinct for s in hy.subs) < 300 and c.bound is None
    b = c.bounds(grid)
    assert (b[low] == 0).all() and (b[~low] == -1).all()
    assert c.hits(grid).tolist() == sorted(c.hits(grid).tolist())  # still a curve


def test_hybrid_of_a_trace_it_holds_whole_is_the_exact_curve():
    hy = HybridPass(512, 1e-6)
    assert hy.depth == default_depth(1e-6) == 400_000_000
    for r in RUNS:
        hy.add(r.ids, r.ends, r.tokens)
    c = hy.curve()
    assert c.exact_cum is None and c.unit_step == 1.0
    assert np.array_equal(c.cum[: len(EXACT.cum)], EXACT.cum)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else 1), out.out, out.err


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hy") / "mc.jsonl"
    write_mooncake(path, 3000, 4)
    return path


def test_a_tiny_sample_is_answered_exactly_or_refused(trace, capsys):
    """Issue 33: ``--sample 1e-6`` on 3,000 requests said max 0.0 with empty notes."""
    code, out, _ = run_cli(["whatif", str(trace), "--json"], capsys)
    exact = json.loads(out)
    code, out, err = run_cli(["whatif", str(trace), "--sample", "1e-6", "--json"], capsys)
    fig = json.loads(out)
    assert code == 0 and fig["max_hit_rate"] == exact["max_hit_rate"] > 0.7
    assert fig["hit_rate"] == exact["hit_rate"] and all(fig["exact"])
    assert "the exact pass held every block" in fig["notes"][0]
    # the sample alone says how little it saw, or refuses when it saw nothing
    code, out, err = run_cli(["whatif", str(trace), "--sample", "1e-6", "--exact-depth", "0",
                              "--json"], capsys)
    assert code == 0 and json.loads(out)["notes"] == [
        "the 1e-06 sample followed only 1 block: too few to resolve the curve (estimates "
        "rough at every capacity)"]
    one = trace.with_name("one.jsonl")
    one.write_text('{"input_length": 5, "hash_ids": [1]}\n' * 3)
    code, out, err = run_cli(["whatif", str(one), "--sample", "1e-6", "--exact-depth", "0",
                              "--json"], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "--sample 1e-06 followed no block of the trace's" in err


def test_each_point_says_what_it_is(trace, tmp_path, capsys):
    code, out, _ = run_cli(["whatif", str(trace), "--sample", "0.5", "--exact-depth", "50",
                            "--json", "--bytes-per-token", "1000", "--price-per-gib", "2",
                            "--csv", str(tmp_path / "c.csv")], capsys)
    fig = json.loads(out)
    n = len(fig["capacities_tokens"])
    assert code == 0 and len(fig["exact"]) == len(fig["bound_points"]) == n
    assert fig["exact_up_to_tokens"] == 50 * 512 and 50 in fig["capacities_blocks"]
    assert fig["exact"] == [b <= 50 for b in fig["capacities_blocks"]]
    assert all(b == 0.0 for b, e in zip(fig["bound_points"], fig["exact"], strict=True) if e)
    assert fig["knee_exact"] == (fig["knee_tokens"] <= 50 * 512)
    assert fig["capacities_bytes"] == [t * 1000 for t in fig["capacities_tokens"]]
    assert fig["cost"] == [t * 1000 / 2**30 * 2 for t in fig["capacities_tokens"]]
    rows = (tmp_path / "c.csv").read_text().splitlines()
    assert rows[0] == ("capacity_tokens,capacity_blocks,capacity_bytes,hit_rate,"
                       "compulsory_misses,capacity_misses,alignment_misses,exact,bound_points,"
                       "cost")
    assert len(rows) == n + 1
    first_est = fig["exact"].index(False)
    cells = rows[1 + first_est].split(",")
    assert cells[:3] == [str(fig["capacities_tokens"][first_est]),
                         str(fig["capacities_blocks"][first_est]),
                         str(fig["capacities_bytes"][first_est])]
    assert cells[7] == "estimated" and float(cells[8]) == pytest.approx(
        fig["bound_points"][first_est], abs=1e-4)


def test_the_piped_table_cuts_no_number(trace, capsys):
    code, out, _ = run_cli(["whatif", str(trace), "--sample", "0.5", "--exact-depth", "50"],
                           capsys)
    assert code == 0 and "…" not in out
    assert "exact" in out and "±" in out  # the point column: exact rows and estimated ones


def test_model_folder_bytes_per_token(trace, tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "hidden_size": 512, "torch_dtype": "float16"}))
    code, out, _ = run_cli(["whatif", str(trace), "--model", str(tmp_path), "--json"], capsys)
    fig = json.loads(out)
    assert code == 0 and fig["capacities_bytes"][1] == 512 * 2 * 4 * 2 * 64 * 2
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    code, _, err = run_cli(["whatif", str(trace), "--model", str(tmp_path)], capsys)
    assert code == 2 and "no positive integer num_key_value_heads" in err


@pytest.mark.parametrize("reader", ["whatif", "load"])
def test_a_line_without_an_end_is_refused_by_its_offset(tmp_path, capsys, reader):
    """Issue 33: one valid line, then 1 GiB of NULs, raised MemoryError allocating 4 GiB."""
    path = tmp_path / "nul.jsonl"
    line = b'{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
    with path.open("wb") as f:
        f.write(line)
        f.truncate(len(line) + 2**30)  # sparse: NULs that take no disk
    if reader == "whatif":
        code, _, err = run_cli(["whatif", str(path)], capsys)
        assert code == 1 and err.count("\n") == 1
        assert f"the line at byte {len(line)}: longer than 16 MiB without a newline" in err
    else:
        from radixcache.traffic.trace_load import trace_workload
        from radixcache.traffic.traces import TraceError

        with pytest.raises(TraceError, match=r"nul.jsonl:2 \(at byte 73\): longer than 16 MiB"):
            trace_workload(str(path), 10)


def test_the_first_compile_says_so(trace, tmp_path, monkeypatch, capsys):
    """numba compiles the kernels on the first run (30-60 s) and caches them on disk; a run
    that will compile says so on stderr, one that finds the cache says nothing."""
    import importlib.util
    from importlib.machinery import ModuleSpec

    import radixcache.analysis.whatif as whatif
    from radixcache.analysis.whatif import WhatIfConfig, kernels_cached

    src = tmp_path / "pkg" / "hashstack.py"
    src.parent.mkdir()
    src.write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "none"))
    fake = ModuleSpec("m", None, origin=str(src))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: fake)
    cfg = WhatIfConfig(str(trace))
    assert not kernels_cached(cfg)
    (src.parent / "__pycache__").mkdir()
    (src.parent / "__pycache__" / "hashstack._run-99.py311.nbi").write_text("")
    assert kernels_cached(cfg) and kernels_cached(WhatIfConfig("sharegpt"))
    monkeypatch.undo()
    monkeypatch.setattr(whatif, "kernels_cached", lambda cfg: False)
    code, _, err = run_cli(["whatif", str(trace), "--json"], capsys)
    assert code == 0 and err == ("note: compiling the trace kernels (numba; once: cached on "
                                 "disk), 30-60 s\n")
