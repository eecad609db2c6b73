"""``/metrics`` in Prometheus' text format, named as vLLM and SGLang name theirs.

A dashboard built for vLLM (``vllm:prefix_cache_hits_total`` over
``vllm:prefix_cache_queries_total`` is its prefix-cache hit rate, in tokens) or for SGLang
(``sglang:cache_hit_rate``, ``sglang:token_usage``) reads a radixcache replica unchanged. Every
series carries ``model_name``, as both label theirs.
"""

from __future__ import annotations

import bisect
import threading

from radixcache.serving.stats import Stats

# vLLM's time_to_first_token_seconds buckets (upper bounds, seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class Histogram:
    """A cumulative histogram over fixed bounds (thread-safe)."""

    def __init__(self, bounds: tuple[float, ...] = TTFT_BUCKETS) -> None:
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf only)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        """Count one observation."""
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, value)] += 1
            self._sum += value

    def lines(self, name: str, labels: str) -> list[str]:
        """The ``_bucket`` (cumulative, ``le``), ``_sum`` and ``_count`` lines."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        out, running = [], 0
        for bound, c in zip((*self.bounds, float("inf")), counts, strict=True):
            running += c
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
        out += [f"{name}_sum{{{labels}}} {total!r}", f"{name}_count{{{labels}}} {running}"]
        return out


def _metric(lines: list[str], name: str, kind: str, doc: str, value: float, labels: str) -> None:
    lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value}"]


def prometheus_text(c: Stats, ttft: Histogram, model: str) -> str:
    """The exposition text of one scrape (ends with a newline)."""
    labels = f'model_name="{model}"'
    usage = c.used_blocks / c.num_blocks if c.num_blocks else 0.0
    lines: list[str] = []
    for name, kind, doc, value in (
        ("vllm:prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.", c.prompt_tokens),
        ("vllm:prefix_cache_hits_total", "counter",
         "Prompt tokens served from the prefix cache.", c.hit_tokens),
        ("vllm:prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
         c.prompt_tokens),
        ("vllm:generation_tokens_total", "counter", "Generated tokens.", c.output_tokens),
        ("vllm:request_success_total", "counter", "Finished requests.", c.finished),
        ("vllm:num_requests_running", "gauge", "Requests running now.", c.running),
        ("vllm:num_requests_waiting", "gauge", "Requests queued now.", c.waiting),
        ("vllm:kv_cache_usage_perc", "gauge", "KV pool blocks in use (fraction).", usage),
        ("sglang:token_usage", "gauge", "KV pool blocks in use (fraction).", usage),
        ("sglang:cache_hit_rate", "gauge", "Prefix-cache hit rate since start (tokens).",
         c.hit_rate),
        ("sglang:num_running_reqs", "gauge", "Requests running now.", c.running),
        ("sglang:num_queue_reqs", "gauge", "Requests queued now.", c.waiting),
    ):
        _metric(lines, name, kind, doc, value, labels)
    name = "vllm:time_to_first_token_seconds"
    lines += [f"# HELP {name} Time to first token of HTTP requests.", f"# TYPE {name} histogram"]
    lines += ttft.lines(name, labels)
    return "\n".join(lines) + "\n"
