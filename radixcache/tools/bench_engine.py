"""``radixcache bench engine``: one workload served with the cache on, then off, on the tiny
model: prefill tokens computed, TTFT, decode rate; and its memory section: ShareGPT requests
submitted at once under ``--reserve full`` and ``grow`` (``serving.reserve``), side by side."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from radixcache.serving.engine import Engine, EngineConfig, RequestResult, percentiles
from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
from radixcache.serving.requests import StopAfter, TokenArray
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




# -- the memory section (issue 35): --reserve full against grow -----------------------------------
class MemoryFigures(NamedTuple):
    """One pass of the memory section under one ``Reserve`` rule."""

    requests: int
    failed: int
    running_mean: float  # running requests, mean over steps
    written_over_held: float  # blocks written / blocks held by running requests, mean over steps
    retractions: int
    retracted_tokens_from_tree: int
    retracted_tokens_recomputed: int
    requests_per_s: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    steps: int
    wall_s: float
    outputs: list[list[int] | None]


MEMORY_PROMPTS = ("first", "trace")


def memory_requests(n: int, prompts: str = "first") -> list[tuple[TokenArray, int]]:
    """``n`` ShareGPT requests: (prompt, recorded answer length). ``first``: the first turn of
    each of the first ``n`` conversations (in the trace's arrival order), as serving
    benchmarks sample ShareGPT (SGLang's and vLLM's ``bench_serving``: the first human message
    is the prompt, the first answer's length the output's); ``trace``: the trace's first ``n``
    requests, later turns carrying their conversation so far. Raises ``DatasetUnavailable``
    without the dataset, ``ValueError`` for another ``prompts``."""
    from radixcache.traffic.sharegpt import load_trace

    if prompts not in MEMORY_PROMPTS:
        raise ValueError(f"unknown prompts {prompts!r} ({', '.join(MEMORY_PROMPTS)})")
    if prompts == "trace":
        chosen = load_trace(n).requests
    else:
        chosen = [r for r in load_trace().requests if r.turn == 0][:n]
    return [(np.asarray(r.prompt, dtype=np.uint32), max(1, len(r.output))) for r in chosen]


def memory_pass(reqs: list[tuple[TokenArray, int]], max_tokens: int, cfg: EngineConfig,
                progress: Callable[[int, int], None]) -> MemoryFigures:
    """Submit every request at once with ``max_tokens``, each ending at its recorded answer
    length (``StopAfter``: the stand-in for an end of sequence), and step the engine until all
    are done, sampling after each step how many run and how many of their blocks they wrote."""
    engine = Engine(cfg)
    B = cfg.block_size
    t0 = time.perf_counter()
    handles = [engine.submit(p, max_tokens, policy=StopAfter(min(a, max_tokens)))
               for p, a in reqs]
    running = written = 0.0
    steps = 0
    while engine.busy():
        engine.step()
        steps += 1
        rs = engine.running.requests
        running += len(rs)
        held: set[int] = set()
        wrote: set[int] = set()
        for r in rs:
            if r.lease is not None:
                held.update(r.lease.table)
                wrote.update(r.lease.table[: -(-r.computed // B)])
        written += len(wrote) / len(held) if held else 1.0
        if steps % 16 == 0:
            progress(sum(h.done() for h in handles), len(handles))
    wall = time.perf_counter() - t0
    stats = engine.stats()
    engine.close()
    outs: list[list[int] | None] = []
    ttfts = []
    for h in handles:
        if h.exception(0) is None:
            res = h.result(0)
            outs.append(res.tokens)
            ttfts.append(res.metrics.ttft_ms)
        else:
            outs.append(None)
    p50, p99 = percentiles(ttfts)
    done = len(ttfts)
    return MemoryFigures(len(handles), len(handles) - done, running / max(steps, 1),
                         written / max(steps, 1), stats.retractions, stats.retracted_from_tree,
                         stats.retracted_recomputed, done / wall if wall else 0.0, p50, p99,
                         steps, wall, outs)


def memory_report(full: MemoryFigures, grow: MemoryFigures, *, blocks: int,
                  max_tokens: int, prompts: str = "first") -> dict[str, object]:
    """The section's JSON: ``memory.full`` and ``memory.grow`` (stable keys) and the ratios."""
    equal = full.outputs == grow.outputs and None not in grow.outputs

    def one(f: MemoryFigures) -> dict[str, float | int | bool]:
        return {"requests": f.requests, "running_mean": round(f.running_mean, 2),
                "written_over_held": round(f.written_over_held, 4),
                "retractions": f.retractions,
                "retracted_tokens_from_tree": f.retracted_tokens_from_tree,
                "retracted_tokens_recomputed": f.retracted_tokens_recomputed,
                "requests_per_s": round(f.requests_per_s, 3),
                "ttft_ms_p50": round(f.ttft_ms_p50, 1), "ttft_ms_p99": round(f.ttft_ms_p99, 1),
                "failed": f.failed, "outputs_equal": equal, "steps": f.steps,
                "wall_s": round(f.wall_s, 2)}

    return {"memory": {"full": one(full), "grow": one(grow), "blocks": blocks,
                       "max_tokens": max_tokens, "prompts": prompts,
                       "running_ratio": _ratio(grow.running_mean, full.running_mean),
                       "requests_per_s_ratio": _ratio(grow.requests_per_s, full.requests_per_s)}}
