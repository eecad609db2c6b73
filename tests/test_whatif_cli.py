"""`radixcache whatif` end to end: trace formats, bad lines, the JSON contract, plots,
recordings, and `bench whatif`."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

from cli.main import main
from radixcache.analysis.answers import capacity_for, knee_tokens
from radixcache.analysis.whatif import one_pass
from radixcache.serving.engine import fold_answers
from radixcache.traffic.mooncake import generate_mooncake, read_mooncake
from radixcache.traffic.traces import Access, TraceError, detect_format, read_recording
from radixcache.traffic.workloads import build_workload


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    with pytest.raises(SystemExit) as exc:
        main(["whatif", *args, "--json"])
    out = capsys.readouterr()
    assert exc.value.code == 0, out.err
    result: dict[str, object] = json.loads(out.out)
    return result


def run_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err


def write_lines(path: Path, lines: list[object]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


TOKENS = [  # a conversation of two turns and a stranger; block size 4 in the tests
    {"prompt": [1, 2, 3, 4, 5, 6], "output": [7, 8, 9]},
    {"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 10, 11]},
    {"prompt": [20, 21, 22, 23, 24], "output": [25]},
]


def test_token_jsonl_curve_misses_and_answers(tmp_path, capsys):
    path = write_lines(tmp_path / "t.jsonl", TOKENS)
    fig = run_json([str(path), "--block-size", "4", "--at", "12", "--policies", "lru",
                    "--pool-blocks", "2", "--alignment"], capsys)
    assert (fig["format"], fig["requests"], fig["prompt_tokens"], fig["block_size"]) == (
        "tokens", 3, 21, 4)
    # turn 2 (10 tokens) matches turn 1's cached 1..8 = 2 whole blocks = 8 tokens (at block 1:
    # the same 8); the stranger misses; blocks of turn 2 sit at distances 0 and 1
    assert fig["capacities_tokens"] == [0, 4, 8, 12]
    assert fig["hit_rate"] == [0.0, 4 / 21, 8 / 21, 8 / 21]
    assert fig["max_hit_rate"] == 8 / 21
    assert fig["capacity_for"] == {"0.5": 4, "0.9": 8, "0.99": 8}
    assert fig["misses"] == {"compulsory": [13] * 4, "capacity": [8, 4, 0, 0],
                             "alignment": [0] * 4}
    assert fig["pool"] == {"blocks": 2, "tokens": 8, "of_max": 1.0, "of_max_2x": 1.0,
                           "given_by": "option", "exact": True}
    # an exact pass: every point says so, with no bound; so do the knee and the capacities
    assert fig["exact"] == [True] * 4 and fig["bound_points"] == [0.0] * 4
    assert fig["knee_exact"] is True and "exact_up_to_tokens" not in fig
    assert fig["capacity_for_exact"] == {"0.5": True, "0.9": True, "0.99": True}
    assert fig["policies"]["lru"]["hit_rate"] == fig["policies"]["lru"]["lru_hit_rate"]
    # a capacity between blocks is listed as given and holds its whole blocks
    fig = run_json([str(path), "--block-size", "4", "--at", "7", "--policies", "none"], capsys)
    assert (fig["capacities_tokens"], fig["capacities_blocks"]) == ([0, 4, 7, 8], [0, 1, 1, 2])
    assert fig["hit_rate"][2] == 4 / 21


def test_alignment_misses_are_what_block_size_1_would_hit(tmp_path, capsys):
    # the second prompt shares 6 tokens with the first: 1 whole block of 4 at block size 4
    path = write_lines(tmp_path / "t.jsonl", [{"prompt": [1, 2, 3, 4, 5, 6]},
                                              {"prompt": [1, 2, 3, 4, 5, 6, 9, 9]}])
    fig = run_json([str(path), "--block-size", "4", "--alignment"], capsys)
    assert fig["max_hit_rate"] == 4 / 14
    misses = fig["misses"]
    assert (misses["compulsory"][-1], misses["alignment"][-1]) == (8, 2)
    hits = [round(r * 14) for r in fig["hit_rate"]]
    for i, h in enumerate(hits):
        assert h + sum(misses[k][i] for k in misses) == 14


def test_mooncake_trace_and_the_hit_token_rule(tmp_path, capsys):
    path = write_lines(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 9, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 20, "input_length": 700, "output_length": 5, "hash_ids": [1, 6]},
    ])
    assert detect_format(str(path)).value == "mooncake"
    fig = run_json([str(path), "--model", "llama-3-8b"], capsys)
    # request 2 hits 2 whole blocks = 1024 tokens; request 3 hits block 1 only = 512
    assert fig["prompt_tokens"] == 3224 and fig["block_size"] == 512
    assert fig["max_hit_rate"] == 1536 / 3224
    assert fig["capacities_gib"][1] == 512 * 131072 / 2**30
    assert "pool" not in fig and fig["policies"] == {}  # none given, none replayed
    assert fig["misses"]["alignment"] == [0] * len(fig["capacities_tokens"])


def test_a_hash_id_names_one_block_of_one_length(tmp_path, capsys):
    """aiperf's rule: block 2 made with 488 tokens (a partial last block) cannot be asked
    for later as a whole block of 512."""
    path = write_lines(tmp_path / "m.jsonl", [
        {"input_length": 1000, "hash_ids": [1, 2]},
        {"input_length": 1500, "hash_ids": [1, 2, 3]},
    ])
    assert run_error(["whatif", str(path)], capsys) == (
        f"error: {path}:2: hash id 2 is asked for at 512 tokens but was made at 488 tokens "
        "(a hash id names one block of one length)\n")
    path = write_lines(tmp_path / "m.jsonl", [
        {"input_length": 1024, "hash_ids": [1, 2]},
        {"input_length": 1024, "hash_ids": [7, 2]},  # block 2 under another parent
    ])
    assert f"{path}:2: hash id 2 appears out of its place" in run_error(
        ["whatif", str(path)], capsys)


def test_bad_lines_are_named(tmp_path, capsys):
    good = {"input_length": 10, "hash_ids": [1]}
    path = write_lines(tmp_path / "m.jsonl", [good, good, {"input_length": 10}])
    assert ":3: not a Mooncake-format request" in run_error(["whatif", str(path)], capsys)
    path = write_lines(tmp_path / "m.jsonl", [good, {"input_length": 600, "hash_ids": [1]}])
    assert ":2: 1 hash ids for 600 tokens: blocks of 512 tokens need exactly 2" in run_error(
        ["whatif", str(path)], capsys)
    path = write_lines(tmp_path / "t.jsonl", [{"prompt": [1]}, {"prompt": [-1]}])
    assert ":2: need a non-empty prompt" in run_error(["whatif", str(path)], capsys)
    path = tmp_path / "x.jsonl"
    path.write_text('{"prompt": [1]}\n{oops\n')
    assert "x.jsonl:2: not a token request" in run_error(["whatif", str(path)], capsys)
    path.write_text('{"text": "hi"}\n')
    assert "x.jsonl:1: neither a Mooncake request" in run_error(["whatif", str(path)], capsys)
    path.write_text("\n")
    assert "empty trace" in run_error(["whatif", str(path)], capsys)
    path.write_bytes(b"\xff\xfe{}\n")
    assert "x.jsonl:1: not JSON" in run_error(["whatif", str(path)], capsys)
    assert "cannot open" in run_error(["whatif", str(tmp_path / "none.jsonl")], capsys)


def test_plots_svg_and_png(tmp_path, capsys):
    path = write_lines(tmp_path / "t.jsonl", TOKENS)
    run_json([str(path), "--block-size", "1", "--policies", "fifo", "--pool-blocks", "4",
              "--plot", str(tmp_path / "c.svg")], capsys)
    svg = (tmp_path / "c.svg").read_text()
    for text in ("What-if: t.jsonl, block 1", "capacity (tokens, log scale)", "token hit rate",
                 "capacity (blocks of 1 tokens)", "LRU (one pass, exact)", "FIFO (libCacheSim)",
                 "maximum 38.1% (infinite cache)", "50% of max at 4 tokens", "knee at ",
                 "your pool: 4 blocks = 4 tokens (50% of max)"):
        assert text in svg, text
    run_json([str(path), "--model", "llama-3-8b", "--plot", str(tmp_path / "c.png")], capsys)
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run_json([str(path), "--model", "llama-3-8b", "--plot", str(tmp_path / "d.svg")], capsys)
    svg = (tmp_path / "d.svg").read_text()
    assert "KV cache (GiB)" in svg and "your pool" not in svg  # no pool given, none drawn
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(path), "--plot", str(tmp_path / "c.gif")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Invalid value for --plot" in err


def test_human_output_has_the_answers_plot_and_table(tmp_path, capsys):
    path = write_lines(tmp_path / "t.jsonl", TOKENS)
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(path), "--block-size", "4", "--pool-blocks", "1"])
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the console's width
    assert exc.value.code == 0
    assert "maximum hit rate 38.10% (infinite cache)" in out
    assert ("your pool of 1 blocks (4 tokens) reaches 50.00% of the maximum; 2x reaches "
            "100.00%") in out
    assert "token hit rate against capacity (tokens, log scale)" in out
    assert "compulsory" in out


def test_generated_mooncake_trace_is_seeded_and_streams(tmp_path):
    a, b = list(generate_mooncake(300, 5)), list(generate_mooncake(300, 5))
    assert a == b and a != list(generate_mooncake(300, 6))
    path = write_lines(tmp_path / "m.jsonl", [msgspec.to_builtins(x) for x in a])
    acc = list(read_mooncake(path))
    assert len(acc) == 300 and all(isinstance(x, Access) for x in acc)
    curve = one_pass(iter(acc), 8, 512)
    assert curve.requests == 300
    assert capacity_for(curve, 0.5) <= capacity_for(curve, 0.9) <= capacity_for(curve, 0.99)
    assert 0 < knee_tokens(curve) <= curve.saturation_units * 512


def test_a_recording_yields_the_requests_the_engine_finished(tmp_path, capsys):
    out = tmp_path / "chat.rcx"
    with pytest.raises(SystemExit) as exc:
        main(["record", "--workload", "chat", "--workload-args", "3",
              "--requests", "12", "--blocks", "512", "--out", str(out)])
    assert exc.value.code == 0
    capsys.readouterr()
    notes: list[str] = []
    got = list(read_recording(out, notes))
    want = fold_answers(build_workload("chat", {"conversations": 3})).requests[:12]
    # prefill mode folds each answer into the prompt and generates one token: the engine
    # caches exactly the folded prompt
    assert sorted(r.cached.tobytes() for r in got) == sorted(r.prompt.tobytes() for r in want)
    assert notes == []
    fig = run_json([str(out), "--policies", "none"], capsys)
    assert (fig["format"], fig["requests"]) == ("recording", len(want))


def test_a_damaged_recording_is_read_up_to_the_damage(tmp_path, capsys):
    out = tmp_path / "chat.rcx"
    with pytest.raises(SystemExit):
        main(["record", "--workload", "chat", "--requests", "6", "--blocks", "512",
              "--out", str(out)])
    data = out.read_bytes()
    out.write_bytes(data[: len(data) * 2 // 3])
    notes: list[str] = []
    got = list(read_recording(out, notes))
    assert len(got) < 6 and len(notes) == 1 and "read up to byte" in notes[0]
    with pytest.raises(TraceError):
        detect_format(str(tmp_path / "missing.jsonl"))


def test_bench_whatif_json(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "whatif", "--limit", "300", "--requests", "3000", "--json"])
    assert exc.value.code == 0
    fig = json.loads(capsys.readouterr().out)
    s, m = fig["sharegpt"], fig["mooncake"]
    assert s["requests"] == 300 and m["requests"] == 3000
    assert s["direct_lru_block_16"]["equal"] is True
    assert len(s["direct_lru_block_16"]["capacities_tokens"]) == 8
    assert m["direct_lru_first_100k"]["equal"] is True
    assert set(s["tree_block_1"]) >= {"tree_hits", "curve_hits", "max_abs_diff_points"}
    assert set(fig) == {"sharegpt", "mooncake", "follow"}
    f = fig["follow"]
    assert (f["requests"], f["explained"], f["curve_equal"], f["spans_cover_misses"]) == (
        300, 300, True, True)
    assert sum(f["missed_tokens_by_cause"].values()) > 0
    assert f["follow_events_per_s"] > 0 and f["bare_events_per_s"] > 0
    assert np.all(np.diff(s["tree_block_1"]["capacities_tokens"]) > 0)


def test_routing_over_replicas_in_the_json(tmp_path, capsys):
    path = write_lines(tmp_path / "t.jsonl", TOKENS)
    fig = run_json([str(path), "--block-size", "1", "--policies", "none", "--replicas", "2",
                    "--router", "round_robin,cache_aware", "--pool-blocks", "64"], capsys)
    r = fig["routing"]
    assert (r["replicas"], r["capacity_blocks"], r["block_size"]) == (2, 64, 1)
    assert list(r["policies"]) == ["round_robin", "cache_aware"]
    # round robin sends turn 2 to the other replica (no hit); cache_aware back to turn 1's
    assert r["policies"]["round_robin"]["hit_rate"] == 0.0
    assert r["policies"]["cache_aware"]["hit_rate"] == 8 / 21 == r["shared"]["hit_rate"]
    assert r["policies"]["round_robin"]["requests"] == [2, 1]
    assert r["policies"]["round_robin"]["duplicated_tokens"] == 8  # turn 1 on both
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(path), "--replicas", "2", "--router", "sticky"])
    assert exc.value.code == 2


def test_why_explains_requests_of_a_recording(tmp_path, capsys):
    """`whatif FILE --why N`: the recording followed as the inspector follows a stream. Every
    served request's spans cover what it missed; an evicted span names a batch that evicted."""
    from radixcache.core import events as ev
    from radixcache.serving.server import record_file
    from radixcache.wire.recording import RecordingReader

    path = tmp_path / "chat.rcx"
    record_file(path, build_workload("chat", ["6", "--seed", "3"]), model=False, blocks=160,
                keyframe_every=200, step_requests=4)
    batches = [r.item for r in RecordingReader(path).records() if isinstance(r.item, ev.Batch)]
    starts = {e.req: e for b in batches for e in b.events if isinstance(e, ev.RequestStart)}
    evicting = {b.seq for b in batches if any(isinstance(e, ev.Evict) for e in b.events)}
    by_seq = {b.seq: b for b in batches}
    fig = run_json([str(path), *[a for r in sorted(starts) for a in ("--why", str(r))]], capsys)
    assert fig["source"] == str(path) and [w["req"] for w in fig["why"]] == sorted(starts)
    causes = set()
    for w in fig["why"]:
        s = starts[w["req"]]
        assert (w["seen"], w["prompt_tokens"], w["hit_tokens"]) == (True, s.prompt_tokens,
                                                                     s.hit_tokens)
        if w["spans"] is None:  # not served: the pool could not hold it
            continue
        assert sum(x["end"] - x["start"] for x in w["spans"]) == s.prompt_tokens - s.hit_tokens
        for x in w["spans"]:
            causes.add(x["cause"])
            if x["cause"] == "evicted":  # before its match: an earlier batch, or earlier in
                assert x["seq"] in evicting and x["seq"] <= w["seq"]  # its own batch
                if x["seq"] == w["seq"]:
                    order = [type(e) for e in by_seq[w["seq"]].events
                             if isinstance(e, ev.Evict) or (isinstance(e, ev.RequestStart)
                                                            and e.req == w["req"])]
                    assert order.index(ev.Evict) < order.index(ev.RequestStart)
    assert {"evicted", "never seen"} <= causes
    code = main_code([str(path), "--why", "3"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[0].startswith("request 3, admitted in batch ")
    assert out[1].startswith("matched path: ")
    assert main_code(["sharegpt", "--why", "3"]) == 2  # not a recording
    assert "--why needs a recording" in capsys.readouterr().err


def main_code(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(["whatif", *args])
    return int(exc.value.code or 0)
