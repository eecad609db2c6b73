"""``bench model`` on a one-layer random checkpoint of SmolLM2-135M's other shapes: the report's
keys (what ``--json`` prints) and its request counts; no timing is asserted."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from radixcache.tools.bench_model import chat_workload, run_bench, write_checkpoint
from radixcache.traffic.workloads import build_workload


def test_bench_model_reports_both_sides_per_turn(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, layers=1)
    phases: list[str] = []
    report = run_bench(tmp_path, 1, 3, lambda phase, _d, _t: phases.append(phase), blocks=512)
    w = chat_workload(1, 3, 49152)
    turns = sorted({"1" if r.tag.endswith(" t0") else "2+" for r in w.requests})
    keys = {"model", "layers", "requests", "conversations", "max_tokens", "history", "threads",
            "engine",
            "transformers", "engine_requests_per_s", "transformers_padded16_requests_per_s"}
    assert set(msgspec.to_builtins(report)) == keys  # what --json prints
    assert (report.requests, report.layers, report.max_tokens) == (len(w.requests), 1, 3)
    for figures in (report.engine, report.transformers):
        assert sorted(figures) == turns
        assert set(msgspec.to_builtins(figures[turns[0]])) == {
            "requests", "ttft_p50_ms", "ttft_p99_ms", "prefill_tokens_per_s",
            "decode_tokens_per_s"}
        assert sum(f.requests for f in figures.values()) == len(w.requests)
    assert all(max(r.forced_output) < 49152 and len(r.forced_output) <= 3 for r in w.requests
               if r.forced_output is not None)
    assert dict.fromkeys(phases) == dict.fromkeys(
        ["batch 1, alternated", "engine, whole workload",
         "transformers, padded batches"])


def test_later_turns_hold_the_answers_as_served_and_the_trace_s_new_text() -> None:
    """Turn t+1's prompt: turn t's prompt as rebuilt, its answer cut to max_tokens, then the
    trace's new user text (what follows turn t's whole recorded answer in the trace)."""
    trace = {r.tag: r for r in build_workload("chat", ["4"]).requests}
    served = {r.tag: r for r in chat_workload(4, 16, 49152).requests}
    kept = {r.tag: r for r in chat_workload(4, 16, 49152, "trace").requests}
    later = [t for t in served if not t.endswith(" t0")]
    assert later
    for tag in later:
        conv, turn = tag.rsplit(" t", 1)
        before, prior = served[f"{conv} t{int(turn) - 1}"], trace[f"{conv} t{int(turn) - 1}"]
        assert prior.forced_output is not None and before.forced_output is not None
        new_text = trace[tag].prompt[len(prior.prompt) + len(prior.forced_output):]
        want = np.concatenate([before.prompt, before.forced_output, new_text % 49152])
        assert np.array_equal(served[tag].prompt, want)
        assert len(before.forced_output) == 16
        assert np.array_equal(kept[tag].prompt, trace[tag].prompt % 49152)
    with pytest.raises(ValueError, match="history 'whole': one of served, trace"):
        chat_workload(1, 3, 49152, "whole")
