"""/metrics reads as vLLM's and SGLang's dashboards expect: every metric their stock Grafana
dashboards query exists, and so does every metric of the dashboard in docs/."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixcache.serving.http import HttpFront
from tests.helpers.http import MODEL, http_engine

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana-radixcache.json"
# what vLLM's (examples/observability) and SGLang's stock dashboards query
STOCK = {
    "vllm:e2e_request_latency_seconds_bucket", "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total", "vllm:inter_token_latency_seconds_bucket",
    "vllm:time_per_output_token_seconds_bucket", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_bucket",
    "vllm:kv_cache_usage_perc", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum", "vllm:request_max_num_generation_tokens_bucket",
    "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
    "sglang:e2e_request_latency_seconds_bucket", "sglang:time_to_first_token_seconds_bucket",
    "sglang:time_per_output_token_seconds_bucket", "sglang:inter_token_latency_seconds_bucket",
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
    "sglang:cache_hit_rate", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
    "sglang:num_used_tokens", "sglang:queue_time_seconds_bucket",
}
_NAME = re.compile(r"\b(?:vllm|sglang|radixcache):[a-z0-9_]+")


@pytest.fixture(scope="module")
def names() -> Iterator[set[str]]:
    with http_engine(64) as f:
        yield _names(f)


def _names(front: HttpFront) -> set[str]:
    text = httpx.get(f"{front.url}/metrics", timeout=30).text
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_stock_dashboards_find_every_metric_before_any_request(names: set[str]) -> None:
    assert sorted(STOCK - names) == []


def test_every_panel_of_the_shipped_dashboard_reads_an_exposed_metric(names: set[str]) -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in _NAME.findall(e)}
    assert len(dash["panels"]) == 17 and len(used) > 30
    assert sorted(used - names) == []
    assert all(_NAME.search(e) for e in exprs)  # no panel without a metric of ours


def _value(text: str, name: str, **labels: str) -> float:
    return next(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_generation_tokens_count_as_they_are_produced() -> None:
    with http_engine(64) as f:
        body = {"model": MODEL, "prompt": "count me", "max_tokens": 400, "stream": True}
        with httpx.stream("POST", f"{f.url}/v1/completions", json=body, timeout=120) as r:
            first = next(line for line in r.iter_lines() if line.startswith("data: {"))
            assert '"finish_reason":null' in first
            text = httpx.get(f"{f.url}/metrics", timeout=30).text
    # counted while the request runs, before it ends with a finish reason
    assert _value(text, "vllm:generation_tokens_total") >= 1
    assert _value(text, "vllm:request_success_total", finished_reason="length") == 0
