"""``radixcache bench engine``: one workload served with the cache on, then off, on the tiny
model: prefill tokens computed, TTFT, decode rate."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from radixcache.serving.engine import Engine, EngineConfig, RequestResult, percentiles
from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
from radixcache.traffic.workloads import Workload


class ModeFigures(NamedTuple):
    """One pass of the workload (cache on or off)."""

    requests: int
    failed: int
    prompt_tokens: int
    hit_tokens: int
    prefill_tokens: int
    output_tokens: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    decode_tokens_per_s: float  # output tokens / wall time of the pass
    wall_s: float
    device: str


def serve_pass(workload: Workload, limit: int, cfg: EngineConfig,
               progress: Callable[[int, int], None]) -> ModeFigures:
    """Serve the first ``limit`` requests of ``workload`` on a fresh engine stepped by a
    ``ServiceLoop`` (as ``serve`` steps it); ``progress(done, total)`` while it runs."""
    engine = Engine(cfg)
    loop = ServiceLoop(engine, BatchSink(lambda _: None), LoopConfig(0, float("inf"))).start()
    t0 = time.perf_counter()
    run = engine.run_workload(workload, limit)
    loop.wake()
    while not all(h.done() for h in run.handles):
        progress(sum(h.done() for h in run.handles), len(run.handles))
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    outcomes = run.wait(0)
    device = str(engine.model.device)
    loop.close()
    done = [r.metrics for r in outcomes if isinstance(r, RequestResult)]
    p50, p99 = percentiles([m.ttft_ms for m in done])
    out = sum(m.output_tokens for m in done)
    return ModeFigures(
        len(outcomes), len(outcomes) - len(done), sum(m.prompt_tokens for m in done),
        sum(m.hit_tokens for m in done), sum(m.prefill_tokens for m in done), out, p50, p99,
        out / wall if wall else 0.0, wall, device,
    )


def _ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else 0.0


def report(name: str, on: ModeFigures, off: ModeFigures) -> dict[str, float | int | str | bool]:
    hit_rate = on.hit_tokens / on.prompt_tokens if on.prompt_tokens else 0.0
    reduction = 1 - on.prefill_tokens / off.prefill_tokens if off.prefill_tokens else 0.0
    return {
        "workload": name,
        "requests": on.requests,
        "failed": on.failed + off.failed,
        "prompt_tokens": on.prompt_tokens,
        "hit_rate": round(hit_rate, 4),
        "prefill_tokens_on": on.prefill_tokens,
        "prefill_tokens_off": off.prefill_tokens,
        "prefill_reduction": round(reduction, 4),
        "prefill_reduction_at_least_hit_rate": reduction >= hit_rate - 1e-9,
        "ttft_p50_on_ms": round(on.ttft_p50_ms, 2),
        "ttft_p50_off_ms": round(off.ttft_p50_ms, 2),
        "ttft_p99_on_ms": round(on.ttft_p99_ms, 2),
        "ttft_p99_off_ms": round(off.ttft_p99_ms, 2),
        "ttft_p50_ratio_off_on": _ratio(off.ttft_p50_ms, on.ttft_p50_ms),
        "ttft_p99_ratio_off_on": _ratio(off.ttft_p99_ms, on.ttft_p99_ms),
        "decode_tokens_per_s_on": round(on.decode_tokens_per_s, 1),
        "decode_tokens_per_s_off": round(off.decode_tokens_per_s, 1),
        "wall_s_on": round(on.wall_s, 2),
        "wall_s_off": round(off.wall_s, 2),
        "device": on.device,
    }


