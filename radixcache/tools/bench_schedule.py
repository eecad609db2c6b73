"""``radixcache bench engine --schedule fcfs,lpm,dfs-weight``: the demo's mix served under each
scheduling policy, on the tiny model, as ``radixcache demo`` serves it.

Each pass starts a fresh engine (``ServiceLoop`` steps it, as ``serve`` does) and submits the
mix's workloads as the demo's ``MixLoop`` does: round after round with the next seed, one every
``interval_s`` seconds unless ``MAX_QUEUED`` requests wait; then it waits for every request.
The batches it published are kept and followed afterwards (``analysis.follow.Follower``, out
of the engine's way): the measured hit rate beside the sequential what-if curve at the same
pool, and the tokens missed because another running request was computing them ("in
flight"). Every request's output tokens are compared with the first policy's: reordering must
never change an answer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from radixcache.analysis.follow import Follower
from radixcache.analysis.misses import Cause
from radixcache.core import events as ev
from radixcache.serving.engine import Engine, EngineConfig, RequestResult, percentiles
from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
from radixcache.serving.policy import SchedulePolicy
from radixcache.serving.requests import WorkloadRun
from radixcache.tools.demo import MAX_QUEUED
from radixcache.traffic.workloads import Workload, build_workload
from radixcache.wire.mirror import Mirror

Progress = Callable[[int, int], None]


class PolicyFigures(NamedTuple):
    """One pass of the mix under one policy."""

    policy: SchedulePolicy
    requests: int
    failed: int
    hit_rate: float  # measured: hit tokens over prompt tokens of the finished requests
    curve_hit_rate: float  # the sequential LRU curve of the same requests at the same pool
    in_flight_tokens: int
    queue_wait_ms: tuple[float, float]  # p50, p99
    ttft_ms: tuple[float, float]
    requests_per_s: float  # finished requests over the wall time from first submit to last
    wall_s: float
    cpu_s: float  # CPU time of this process over the pass (less noisy on a shared machine)
    held: int  # requests held for a running request's insert
    shared: int  # requests admitted beside the running request whose blocks they read
    aged: int  # requests that reached the aging bound
    outputs: list[list[int] | None]  # per request of the mix, in order (None: failed)


def mix_workloads(mix: Sequence[str], rounds: int) -> list[Workload]:
    """``rounds`` rounds of ``mix`` (workload lines as typed in the inspector), round r with
    ``--seed r``, as the demo sends them."""
    out = []
    for r in range(rounds):
        for line in mix:
            name, *args = line.split()
            out.append(build_workload(name, [*args, "--seed", str(r)]))
    return out


def policy_pass(workloads: list[Workload], interval_s: float, cfg: EngineConfig,
                progress: Progress) -> PolicyFigures:
    """Serve ``workloads`` (one every ``interval_s``) on a fresh engine under ``cfg``."""
    engine = Engine(cfg)
    batches: list[ev.Batch] = []
    loop = ServiceLoop(engine, BatchSink(batches.append), LoopConfig(0, float("inf"))).start()
    total = sum(len(w.requests) for w in workloads)
    runs: list[WorkloadRun] = []
    t0, cpu0, sent = time.perf_counter(), time.process_time(), -interval_s
    while True:
        now = time.perf_counter() - t0
        if len(runs) < len(workloads) and now - sent >= interval_s \
                and len(engine.scheduler) < MAX_QUEUED:
            runs.append(engine.run_workload(workloads[len(runs)]))
            sent = now
            loop.wake()
        done = sum(h.done() for run in runs for h in run.handles)
        progress(done, total)
        if len(runs) == len(workloads) and done == total:
            break
        time.sleep(0.02)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    loop.close()
    outcomes = [o for run in runs for o in run.wait(0)]
    return _figures(cfg, engine, batches, outcomes, (wall, cpu))


def _figures(cfg: EngineConfig, engine: Engine, batches: list[ev.Batch],
             outcomes: Sequence[RequestResult | Exception],
             times: tuple[float, float]) -> PolicyFigures:
    mirror = Mirror(cfg.block_size, cfg.num_blocks)
    follower = Follower(mirror)
    for b in batches:
        mirror.apply_batch(b)
    done = [o for o in outcomes if isinstance(o, RequestResult)]
    curve, (wall, cpu) = follower.curve, times
    return PolicyFigures(
        cfg.schedule, len(outcomes), len(outcomes) - len(done), curve.measured_rate,
        curve.curve().hit_rate_at(curve.capacity_tokens),
        follower.misses.totals()[Cause.IN_FLIGHT.value],
        percentiles([r.metrics.queue_ms for r in done]),
        percentiles([r.metrics.ttft_ms for r in done]),
        len(done) / wall if wall else 0.0, wall, cpu, engine.scheduler.held,
        engine.scheduler.shared,
        engine.scheduler.aged,
        [o.tokens if isinstance(o, RequestResult) else None for o in outcomes])


Figures = dict[str, float | int | bool]


def policy_report(f: PolicyFigures, first: PolicyFigures) -> Figures:
    """One policy's keys of the JSON report; ``outputs_equal``: every request finished with
    the same output tokens as under ``first``."""
    return {
        "hit_rate": round(f.hit_rate, 4),
        "curve_hit_rate": round(f.curve_hit_rate, 4),
        "in_flight_tokens": f.in_flight_tokens,
        "queue_wait_ms_p50": round(f.queue_wait_ms[0], 2),
        "queue_wait_ms_p99": round(f.queue_wait_ms[1], 2),
        "ttft_ms_p50": round(f.ttft_ms[0], 2),
        "ttft_ms_p99": round(f.ttft_ms[1], 2),
        "requests_per_s": round(f.requests_per_s, 2),
        "outputs_equal": f.outputs == first.outputs and None not in f.outputs,
        "failed": f.failed,
        "held_for_sharing": f.held,
        "shared_in_forward": f.shared,
        "aged": f.aged,
        "wall_s": round(f.wall_s, 2),
        "requests_per_cpu_s": round(f.requests / f.cpu_s, 2) if f.cpu_s else 0.0,
    }


def combined(passes: list[PolicyFigures], first: PolicyFigures) -> dict[str, object]:
    """One policy's keys over its ``passes`` (``policy_report`` of each): every number the
    median of the passes (a count the lower median: one pass's own), ``outputs_equal`` only if
    every pass's outputs equal ``first``'s; then ``passes`` and, in pass order, each pass's p99
    queue wait and throughput (the two figures a single pass of a busy machine moves most)."""
    reports = [policy_report(f, first) for f in passes]
    out: dict[str, object] = {}
    for key, value in reports[0].items():
        values = [r[key] for r in reports]
        if isinstance(value, bool):
            out[key] = all(values)
        elif isinstance(value, int):
            out[key] = int(statistics.median_low(values))
        else:
            out[key] = round(statistics.median(values), 4 if key.endswith("hit_rate") else 2)
    out["passes"] = len(passes)
    out["queue_wait_ms_p99_each"] = [r["queue_wait_ms_p99"] for r in reports]
    out["requests_per_s_each"] = [r["requests_per_s"] for r in reports]
    return out


def pass_order(policies: Sequence[SchedulePolicy], repeat: int) -> list[SchedulePolicy]:
    """The policies' passes, ``repeat`` rounds, each round starting one policy later: what the
    machine does over the run (other load, its clock) falls on every policy alike."""
    n = len(policies)
    return [policies[(r + i) % n] for r in range(repeat) for i in range(n)]


def report(figures: dict[SchedulePolicy, list[PolicyFigures]], mix: Sequence[str], rounds: int,
           blocks: int) -> dict[str, object]:
    """The JSON report: the mix, then each policy's ``combined`` keys under its name (outputs
    compared with the first policy's first pass)."""
    passes = next(iter(figures.values()))
    first = passes[0]
    out: dict[str, object] = {"mix": list(mix), "rounds": rounds, "blocks": blocks,
                              "requests": first.requests, "repeat": len(passes)}
    for policy, each in figures.items():
        out[policy.value] = combined(each, first)
    return out
