"""``/metrics`` on ``prometheus_client``, under the names vLLM's and SGLang's stock Grafana
dashboards read (``docs/grafana-radixcache.json`` draws every panel from them).

Two sources, one registry per front:

- the engine's figures, read at each scrape (``EngineCollector``): requests running and
  waiting, prefix-cache queries and hits (tokens), prompt tokens, the KV pool, retractions
  (``vllm:num_preemptions_total``: vLLM's preemptions, here retractions into the tree). vLLM's
  ``kv_cache_usage_perc`` means what vLLM means: blocks held by running requests over all
  blocks (cached blocks no request pins are evictable, so they count as free, as vLLM's free
  queue counts them); ``radixcache:kv_cache_cached_perc`` is the cached share on its own.
- each HTTP request as it is served (``RequestMetrics``): time to first token, inter-token
  latency (also as vLLM's older ``time_per_output_token``), end-to-end latency, queue time,
  prefill and decode time, prompt and generation lengths, finished requests by
  ``finished_reason`` (``stop``, ``length``, ``abort``), and generated tokens counted as each
  one is produced (so the rate moves while requests run, not when they end).

Every series carries ``model_name``, as both servers label theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# vLLM's buckets (seconds, tokens)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
LENGTH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                  100000)
FINISHED_REASONS = ("stop", "length", "abort")


class Counters(NamedTuple):
    """The engine's figures a scrape reports: totals since start (or reset) and gauges now."""

    finished: int
    prompt_tokens: int  # of admitted requests: the prefix cache's queried tokens
    hit_tokens: int
    output_tokens: int
    running: int
    waiting: int
    used_blocks: int
    num_blocks: int
    pinned_blocks: int  # held by running requests and holds; used - pinned: cached, evictable
    block_size: int
    retractions: int = 0  # running requests retracted into the tree (``--reserve grow``)


class RequestTimes(NamedTuple):
    """One finished HTTP request, in seconds and tokens."""

    queue_s: float
    ttft_s: float
    e2e_s: float
    prompt_tokens: int
    output_tokens: int
    reason: str  # one of FINISHED_REASONS


class EngineCollector(Collector):
    """The engine's counters and gauges, read at scrape time."""

    def __init__(self, counters: Callable[[], Counters], model: str) -> None:
        self._counters, self._model = counters, model

    def collect(self) -> Iterator[Metric]:
        """One family per name."""
        c, labels = self._counters(), [self._model]
        blocks = c.num_blocks or 1
        usage = c.pinned_blocks / blocks
        gauges = (
            ("vllm:num_requests_running", "Requests running now.", c.running),
            ("vllm:num_requests_waiting", "Requests queued now.", c.waiting),
            ("vllm:kv_cache_usage_perc", "KV blocks held by running requests (fraction; "
             "cached blocks no request holds count as free).", usage),
            ("radixcache:kv_cache_cached_perc", "KV blocks cached and evictable (fraction).",
             (c.used_blocks - c.pinned_blocks) / blocks),
            ("sglang:num_running_reqs", "Requests running now.", c.running),
            ("sglang:num_queue_reqs", "Requests queued now.", c.waiting),
            ("sglang:token_usage", "KV pool used by running requests (fraction).", usage),
            ("sglang:num_used_tokens", "KV token slots held by running requests.",
             c.pinned_blocks * c.block_size),
            ("sglang:cache_hit_rate", "Prefix-cache hit rate since start (tokens).",
             c.hit_tokens / c.prompt_tokens if c.prompt_tokens else 0.0),
        )
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(labels, value)
            yield g
        counters = (
            ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             c.prompt_tokens),
            ("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.",
             c.hit_tokens),
            ("vllm:prompt_tokens", "Prompt tokens of admitted requests.", c.prompt_tokens),
            ("sglang:prompt_tokens", "Prompt tokens of admitted requests.", c.prompt_tokens),
            ("sglang:cached_tokens", "Prompt tokens served from the prefix cache.",
             c.hit_tokens),
            ("vllm:num_preemptions", "Running requests retracted (preempted) when a step found "
             "no KV block; their computed tokens went into the tree.", c.retractions),
        )
        for name, doc, value in counters:
            f = CounterMetricFamily(name, doc, labels=["model_name"])
            f.add_metric(labels, value)
            yield f


class RequestMetrics:
    """The per-request histograms and counters of one front (its own registry)."""

    def __init__(self, counters: Callable[[], Counters], model: str) -> None:
        self.registry = r = CollectorRegistry()
        self.model = model
        r.register(EngineCollector(counters, model))
        lab = ["model_name"]

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, lab, buckets=buckets, registry=r)

        self.ttft = [hist(f"{p}:time_to_first_token_seconds", "Time to first token.",
                          TTFT_BUCKETS) for p in ("vllm", "sglang")]
        self.itl = [hist(n, "Time between two output tokens.", ITL_BUCKETS) for n in (
            "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
            "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")]
        self.e2e = [hist(f"{p}:e2e_request_latency_seconds", "Request latency, end to end.",
                         LATENCY_BUCKETS) for p in ("vllm", "sglang")]
        self.queue = [hist(n, "Time waiting before admission.", LATENCY_BUCKETS) for n in (
            "vllm:request_queue_time_seconds", "sglang:queue_time_seconds")]
        self.prefill = hist("vllm:request_prefill_time_seconds", "Admission to first token.",
                            LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", "First to last token.",
                           LATENCY_BUCKETS)
        self.prompt_len = hist("vllm:request_prompt_tokens", "Prompt length (tokens).",
                               LENGTH_BUCKETS)
        self.gen_len = [hist(n, "Generated tokens of a request.", LENGTH_BUCKETS) for n in (
            "vllm:request_generation_tokens", "vllm:request_max_num_generation_tokens")]
        self.success = Counter("vllm:request_success", "Finished requests by reason.",
                               [*lab, "finished_reason"], registry=r)
        self.requests = Counter("sglang:num_requests", "Finished requests.", lab, registry=r)
        self.tokens = [Counter(n, "Generated tokens (counted as each is produced).", lab,
                               registry=r) for n in ("vllm:generation_tokens",
                                                     "sglang:generation_tokens")]
        for reason in FINISHED_REASONS:  # every series exists from the first scrape
            self.success.labels(model, reason)
        for h in (*self.ttft, *self.itl, *self.e2e, *self.queue, self.prefill, self.decode,
                  self.prompt_len, *self.gen_len, self.requests, *self.tokens):
            h.labels(model)

    def token(self, gap_s: float | None) -> None:
        """One generated token, ``gap_s`` after the one before it (None for the first)."""
        for c in self.tokens:
            c.labels(self.model).inc()
        if gap_s is not None:
            for h in self.itl:
                h.labels(self.model).observe(gap_s)

    def finished(self, t: RequestTimes) -> None:
        """One request done (answered, stopped or aborted)."""
        m = self.model
        self.success.labels(m, t.reason).inc()
        self.requests.labels(m).inc()
        self.prompt_len.labels(m).observe(t.prompt_tokens)
        for h in self.gen_len:
            h.labels(m).observe(t.output_tokens)
        for h in self.e2e:
            h.labels(m).observe(t.e2e_s)
        for h in self.queue:
            h.labels(m).observe(t.queue_s)
        if t.output_tokens:
            for h in self.ttft:
                h.labels(m).observe(t.ttft_s)
            self.prefill.labels(m).observe(max(0.0, t.ttft_s - t.queue_s))
            self.decode.labels(m).observe(max(0.0, t.e2e_s - t.ttft_s))

    def text(self) -> bytes:
        """The exposition text of one scrape."""
        return generate_latest(self.registry)
