"""`radixcache load --trace FILE`: a Mooncake-format or ShareGPT file as the requests sent over
HTTP, so `whatif FILE` can be compared with what an engine measured on the same requests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from radixcache.traffic.load import LoadConfig, load
from radixcache.traffic.trace_load import trace_workload
from radixcache.traffic.traces import TraceError
from tests.helpers.http import http_engine

MOONCAKE = [  # blocks of 8 tokens: block 3 is partial (4 tokens), so is block 4 (4)
    {"timestamp": 1000, "input_length": 16, "output_length": 3, "hash_ids": [1, 2]},
    {"timestamp": 1100, "input_length": 20, "output_length": 50, "hash_ids": [1, 2, 3]},
    {"timestamp": 1250, "input_length": 12, "output_length": 3, "hash_ids": [1, 4]},
]
SHAREGPT = [
    {"id": "a", "conversations": [
        {"from": "human", "value": "write a poem about the sea"},
        {"from": "gpt", "value": "the sea is wide"},
        {"from": "human", "value": "make it longer"},
        {"from": "gpt", "value": "the sea is wide and deep"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "hello"}]},  # no request in it
]


def write_jsonl(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_a_mooncake_trace_becomes_prompts_that_share_what_their_hash_ids_share(tmp_path):
    tw = trace_workload(str(write_jsonl(tmp_path / "m.jsonl", MOONCAKE)), 100, 8, 16)
    a, b, c = (r.prompt.tolist() for r in tw.workload.requests)
    assert (len(a), len(b), len(c)) == (16, 20, 12)
    assert b[:16] == a and c[:8] == a[:8] and c[8:] != a[8:12]
    assert tw.times == pytest.approx([0.0, 0.1, 0.25])  # ms from the first request
    assert [r.max_new_tokens for r in tw.workload.requests] == [3, 16, 3]  # capped at 16
    assert trace_workload(str(tmp_path / "m.jsonl"), 2, 8, 16).workload.requests[1].tag == (
        "line 2")
    with pytest.raises(TraceError, match="1 hash ids for 16 tokens"):  # whatif's rule
        trace_workload(str(write_jsonl(tmp_path / "x.jsonl", [
            {"input_length": 16, "hash_ids": [1]}])), 10, 8, 16)


def test_a_sharegpt_file_becomes_turns_that_carry_the_real_answers(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SHAREGPT))
    tw = trace_workload(str(path), 100)
    first, second = tw.workload.requests
    assert tw.times is None and (first.after, second.after) == (None, 0)
    assert first.forced_output is not None
    known = np.concatenate((first.prompt, first.forced_output)).tolist()
    assert second.prompt.tolist()[: len(known)] == known  # the next turn extends it
    path.write_text('{"not": "a list"}')
    with pytest.raises(TraceError, match="want a JSON array"):
        trace_workload(str(path), 100)


def test_load_replays_a_trace_over_http(tmp_path):
    tw = trace_workload(str(write_jsonl(tmp_path / "m.jsonl", MOONCAKE)), 100, 8, 4)
    cfg = LoadConfig("", rate=1.0, max_tokens=4)
    with http_engine(512) as front:
        first = load(cfg._replace(url=front.url), tw.workload, None, tw.times)
        again = load(cfg._replace(url=front.url), tw.workload, None, tw.times)
    assert [r.error for r in first.replies + again.replies] == [None] * 6
    # the second time every prompt was sent whole before (no request is in flight then)
    assert all(r.cached_tokens > 0 for r in again.replies)
    assert [r.prompt_tokens for r in again.replies] == [r.prompt_tokens for r in first.replies]


def test_load_trace_on_the_command_line_refuses_what_it_cannot_send(tmp_path, capsys):
    tokens = write_jsonl(tmp_path / "t.jsonl", [{"prompt": [1, 2, 3]}])
    with pytest.raises(SystemExit) as exc:
        main(["load", "--url", "http://127.0.0.1:9", "--trace", str(tokens)])
    assert exc.value.code == 1
    assert "--trace takes a Mooncake-format JSONL or a ShareGPT .json" in capsys.readouterr().err
    share = tmp_path / "s.json"
    share.write_text(json.dumps(SHAREGPT))
    with pytest.raises(SystemExit) as exc:
        main(["load", "--url", "http://127.0.0.1:9", "--trace", str(share)])
    err = " ".join(capsys.readouterr().err.replace("│", " ").split())
    assert exc.value.code == 2 and "has no timestamps: give --rate" in err
