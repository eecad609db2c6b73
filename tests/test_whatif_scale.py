"""The array pass over hash-id traces (``analysis.hashstack``) against the trie's one pass, its
SHARDS sample against the exact curve, and generated traces against aiperf's rule."""

from __future__ import annotations

import json
from array import array

import msgspec
import numpy as np
import pytest

from radixcache.analysis.hashstack import HashStack, HashStackError
from radixcache.analysis.whatif import one_pass
from radixcache.traffic.mooncake import (
    HashRuns,
    generate_mooncake,
    generate_runs,
    line_of,
    read_hash_runs,
    read_mooncake,
)
from radixcache.traffic.traces import Access

ODD = 0x9E3779B97F4A7C15  # x -> x * ODD mod 2^64 is a bijection: the same trace, sparse ids


def accesses(runs: list[HashRuns]) -> list[Access]:
    out = []
    for r in runs:
        start = 0
        for end, tok in zip(r.ends.tolist(), r.tokens.tolist(), strict=True):
            ids = array("Q", r.ids[start:end].tolist())
            out.append(Access(ids.tobytes(), end - start, tok))
            start = end
    return out


def stacked(runs: list[HashRuns], rate: float = 1.0) -> HashStack:
    hs = HashStack(512, rate)
    for r in runs:
        hs.add(r.ids, r.ends, r.tokens)
    return hs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_array_pass_equals_the_trie(seed):
    runs = list(generate_runs(4000, seed, batch=1000))
    want = one_pass(accesses(runs), 8, 512)
    got = stacked(runs).curve()
    assert np.array_equal(got.cum, want.cum)
    assert (got.requests, got.prompt_tokens) == (want.requests, want.prompt_tokens) == (
        4000, sum(int(r.tokens.sum()) for r in runs))


def test_sparse_ids_move_the_blocks_to_a_table_mid_run_and_change_nothing():
    runs = list(generate_runs(4000, 3, batch=1000))
    whole = [r._replace(ids=r.ids * np.uint64(ODD)) for r in runs]  # sparse from the start
    hs = stacked(whole)
    assert not hs.dense and np.array_equal(hs.curve().cum, stacked(runs).curve().cum)
    # dense ids for two batches, then sparse ones (a valid trace too): the blocks move to a
    # table after the second batch, and the curve is still the trie's
    mixed = runs[:2] + whole[2:]
    hs = HashStack(512)
    for i, r in enumerate(mixed):
        hs.add(r.ids, r.ends, r.tokens)
        assert hs.dense == (i < 2)
    assert np.array_equal(hs.curve().cum, one_pass(accesses(mixed), 8, 512).cum)


def test_a_sample_estimates_the_curve_within_a_point_where_it_resolves():
    runs = list(generate_runs(100_000, 0))
    exact = stacked(runs).curve()
    caps = np.unique(np.geomspace(1, 2 * exact.saturation_units, 400).astype(np.int64))
    p = exact.prompt_tokens
    for rate in (0.1, 0.01):
        est = stacked(runs, rate).curve()
        assert est.prompt_tokens == p and est.unit_step == pytest.approx(1 / rate, rel=1e-5)
        resolved = caps >= 100 / rate
        err = np.abs(est.hits(caps) - exact.hits(caps))[resolved].max() / p
        assert err < 0.01, (rate, err)


def test_renumbering_a_samples_stamps_changes_no_distance():
    """A sample stamps many more requests than it holds blocks, so its stamps are renumbered
    as it goes (``hashstack.renumber_stamps``): renumbered after every batch of 500 requests or
    never, the histogram and the curve are the same."""
    runs = list(generate_runs(20_000, 4, batch=500))
    often, never = HashStack(512, 0.05), HashStack(512, 0.05)
    often.renumber_floor, never.renumber_floor = 1, 2**40
    often.renumber_ratio = 2
    for r in runs:
        often.add(r.ids, r.ends, r.tokens)
        never.add(r.ids, r.ends, r.tokens)
    assert int(never.st[9]) > int(often.st[9])  # it did renumber
    assert int(often.st[9]) <= often.renumber_ratio * often.distinct + 500
    assert np.array_equal(often.hist, never.hist[: len(often.hist)])
    assert not never.hist[len(often.hist):].any()
    assert np.array_equal(often.curve().cum, never.curve().cum)


def test_generated_traces_obey_aiperfs_rule(tmp_path):
    """Every hash id names one block of one length (aiperf refuses a trace that asks for an id
    at 512 tokens after making it at 338), has one parent, and a request has exactly
    ceil(input_length / 512) ids."""
    length: dict[int, int] = {}
    parent: dict[int, int] = {}
    lines = list(generate_mooncake(5000, 7))
    for rec in lines:
        ids, n = rec.hash_ids, rec.input_length
        assert len(ids) == -(-n // 512)
        for k, h in enumerate(ids):
            size = 512 if k < len(ids) - 1 else n - 512 * (len(ids) - 1)
            assert length.setdefault(h, size) == size, (h, length[h], size)
            assert parent.setdefault(h, ids[k - 1] if k else -1) == (ids[k - 1] if k else -1)
    assert sum(1 for v in length.values() if v < 512) > 1000  # partial blocks do occur
    path = tmp_path / "m.jsonl"
    path.write_text("".join(msgspec.json.encode(x).decode() + "\n" for x in lines))
    hs = HashStack(512)
    for r in read_hash_runs(path):
        hs.add(r.ids, r.ends, r.tokens)
    assert np.array_equal(hs.curve().cum, one_pass(read_mooncake(path), 8, 512).cum)


def test_the_array_reader_reads_what_the_line_reader_reads(tmp_path):
    path = tmp_path / "m.jsonl"
    recs = list(generate_mooncake(50, 1))
    body = "".join(msgspec.json.encode(x).decode() + "\n" + ("\n" if i == 20 else "")
                   for i, x in enumerate(recs))
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())  # a BOM, and a blank line after line 21
    runs = list(read_hash_runs(path))
    assert accesses(runs) == list(read_mooncake(path))
    assert [line_of(runs[0], i) for i in (0, 20, 21, 49)] == [1, 21, 23, 51]


def test_a_broken_rule_names_the_request():
    hs = HashStack(512)
    ids = np.asarray([1, 2, 1, 2, 3], np.uint64)
    with pytest.raises(HashStackError) as exc:
        hs.add(ids, np.asarray([2, 5]), np.asarray([1000, 1500]))
    assert exc.value.index == 1 and "hash id 2 is asked for at 512 tokens" in str(exc.value)
    with pytest.raises(HashStackError, match="hash id 5 appears out of its place"):
        HashStack(512).add(np.asarray([5, 5], np.uint64), np.asarray([2]), np.asarray([1024]))
    with pytest.raises(HashStackError, match="hash id 2 appears out of its place"):  # 2 under 1,
        HashStack(512).add(np.asarray([1, 2, 9, 2], np.uint64),  # then under 9
                           np.asarray([2, 4]), np.asarray([1024, 1024]))


def test_whatif_sample_on_the_command_line(tmp_path, capsys):
    from cli.main import main

    path = tmp_path / "m.jsonl"
    path.write_bytes(b"".join(msgspec.json.encode(x) + b"\n" for x in generate_mooncake(3000, 2)))
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(path), "--sample", "0.5", "--exact-depth", "0", "--json"])
    assert exc.value.code == 0
    fig = json.loads(capsys.readouterr().out)
    assert fig["sample_rate"] == pytest.approx(0.5) and fig["requests"] == 3000
    assert fig["sample_resolves_from_tokens"] == 200 * 512  # about 100 sampled blocks
    # the headline says which answers lie below what the sample resolves
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(path), "--sample", "0.5", "--exact-depth", "0"])
    said = " ".join(capsys.readouterr().out.split())
    low = [f for f in ("0.5", "0.9", "0.99") if fig["capacity_for"][f] < 102_400]
    assert low == ["0.5"] and fig["knee_tokens"] > 102_400  # this small trace: 50% only
    assert ("the sample resolves the curve only from 102,400 tokens up, so its capacity for "
            "50% lies below that and is rough: run without --exact-depth 0 for it") in said
    # joined: exact to 800 blocks, the sample above, each answer saying which
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(path), "--sample", "0.5", "--exact-depth", "800"])
    said = " ".join(capsys.readouterr().out.split())
    assert ("exact up to 409,600 tokens (an exact pass over the top of the stack); estimated "
            "above from a 50.00% sample of the blocks (SHARDS)") in said
    assert f"knee at {fig['knee_tokens']:,} tokens (est.)" not in said  # the join moved it
    # by default (exact to 65,536 blocks at least) this small trace is answered exactly
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(path), "--sample", "0.5"])
    out = capsys.readouterr()
    assert out.err == ("note: the exact pass held every block (at most 65,536): every capacity "
                       "is exact, the 0.5 sample was not needed\n")
    assert "(est.)" not in out.out and "±" not in out.out
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(path), "--limit", "10", "--json"])
    assert json.loads(capsys.readouterr().out)["requests"] == 10
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(path), "--json"])
    assert "sample_resolves_from_tokens" not in json.loads(capsys.readouterr().out)


def test_the_scale_section_has_its_keys():
    """`bench whatif --scale N`'s JSON contract (a small N: the keys, and the exact passes in
    process and from the file agree)."""
    from radixcache.tools.bench_whatif_scale import run_scale

    fig = run_scale(3000, 0, [0.5])
    assert set(fig) == {"requests", "seed", "sample_rates", "load_average", "distinct_blocks",
                        "in_process", "write_seconds", "file"}
    for where in ("in_process", "file"):
        part = fig[where]
        assert set(part) == {"exact", "rates"} and set(part["rates"]) == {"0.5"}
        assert {"seconds", "peak_rss_mb", "max_hit_rate", "jit_seconds"} <= set(part["exact"])
        ways = part["rates"]["0.5"]
        assert set(ways) == {"hybrid", "sample_alone"}
        for est in ways.values():
            wall = ["cli_wall_seconds", "time_over_exact"]
            assert [k for k in est if k not in wall][-4:] == [
                "max_abs_error_points_all", "max_abs_error_points_resolved",
                "resolved_from_tokens", "time_ratio"]
            assert (list(est)[-2:] == wall) == (where == "file")
            assert est["requests"] == part["exact"]["requests"] == 3000
        # the exact pass holds this whole trace (65,536 blocks at least): exact at every size,
        # where the sample alone is not (seeded: 2.78 points)
        assert ways["hybrid"]["max_abs_error_points_all"] == 0.0
        assert ways["sample_alone"]["max_abs_error_points_all"] > 2.0
    assert fig["in_process"]["exact"]["max_hit_rate"] == fig["file"]["exact"]["max_hit_rate"]
    f = fig["file"]
    assert f["rates"]["0.5"]["hybrid"]["time_over_exact"] == pytest.approx(
        f["rates"]["0.5"]["hybrid"]["cli_wall_seconds"] / f["exact"]["cli_wall_seconds"])
