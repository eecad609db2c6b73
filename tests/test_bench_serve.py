"""``radixcache bench serve`` run tiny through the CLI: every key, consistent counts."""

from __future__ import annotations

import json

import pytest

from cli.main import main

FIGURES = {"ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "requests_per_s",
           "requests", "failed", "itl_samples", "cpu_s_per_request", "wall_s"}


def _check(f: dict[str, float], requests: int, max_tokens: int, http: bool) -> None:
    # through HTTP also the client's own CPU (it shares the machine with the server)
    assert set(f) == FIGURES | ({"client_cpu_s_per_request"} if http else set())
    if http:
        assert f["client_cpu_s_per_request"] > 0
    assert f["requests"] == requests
    assert f["failed"] == 0
    assert f["ttft_ms_p50"] <= f["ttft_ms_p99"]
    assert f["itl_ms_p50"] <= f["itl_ms_p99"]
    assert f["requests_per_s"] > 0
    assert f["cpu_s_per_request"] > 0
    # at most max_tokens - 1 gaps per request (HTTP may join tokens into one chunk)
    assert 0 < f["itl_samples"] <= requests * (max_tokens - 1)


@pytest.mark.parametrize(("extra", "front"), [(["--front-thread"], "thread"), ([], "process")],
                         ids=["front-thread", "front-process"])
def test_bench_serve_json_keys_and_consistent_counts(capsys: pytest.CaptureFixture[str],
                                                     extra: list[str], front: str) -> None:
    argv = ["bench", "serve", "--rates", "20,40", "--seconds", "0.2", "--max-tokens", "4",
            "--blocks", "512", "--json", *extra]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert (out["front"], out["step_tokens"]) == (front, 256)
    assert set(out) >= {"rates", "saturated", "load_average", "timelines"}
    assert [t["pass"] for t in out["timelines"]] == [
        "20/s http", "20/s in process", "40/s http", "40/s in process", "saturated http",
        "saturated in process"]
    assert all(t["timeline_steps"] > 0 for t in out["timelines"])
    assert [r["rate"] for r in out["rates"]] == [20.0, 40.0]
    assert [r["requests"] for r in out["rates"]] == [4, 8]
    for row in out["rates"]:
        assert set(row) == {"rate", "requests", "http", "in_process"}
        for path in ("http", "in_process"):
            _check(row[path], row["requests"], 4, path == "http")
        # the same prompts both ways: the same number of requests answered
        assert row["http"]["requests"] == row["in_process"]["requests"]
    sat = out["saturated"]
    assert set(sat) == {"requests", "http", "in_process"}
    assert sat["requests"] == 8
    for path in ("http", "in_process"):
        _check(sat[path], 8, 4, path == "http")
    # in process every token is one hook call: exactly max_tokens - 1 gaps per request
    # unless a request stopped early (the tiny model has no stop token: it never does)
    assert sat["in_process"]["itl_samples"] == 8 * 3


def test_bench_serve_refuses_bad_rates(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("fast", "0", "-5", ""):
        with pytest.raises(SystemExit) as exit_info:
            main(["bench", "serve", "--rates", bad, "--json"])
        assert exit_info.value.code == 2
        assert "--rates" in capsys.readouterr().err
