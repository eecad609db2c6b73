"""The service loop's step timeline: one row per step that ran, each phase's figures ordered,
the forward clock of the engine inside its step, garbage collection counted."""

from __future__ import annotations

import gc
import math

from radixcache.serving.driver import TreeDriver
from radixcache.serving.engine import Engine, EngineConfig
from radixcache.serving.loop import BatchSink, ServiceLoop
from radixcache.serving.model import tiny_model
from radixcache.serving.timeline import GC_CLOCK, PHASES, StepRow, StepTimeline
from radixcache.wire import commands as cmd


def _ordered(figures: dict[str, float | int]) -> None:
    for phase in PHASES:
        p50, p99, top = (figures[f"timeline_{phase}_ms_{q}"] for q in ("p50", "p99", "max"))
        assert 0 <= p50 <= p99 <= top, phase


def test_one_row_per_step_that_ran_and_none_while_idle() -> None:
    loop = ServiceLoop(TreeDriver(256, step_requests=2), BatchSink(lambda _: None))
    loop.command(cmd.StartWorkload("flood", ["6"]))
    steps = 0
    while loop.step_once():
        steps += 1
    assert steps == 3
    assert not loop.step_once()  # idle: no row
    assert loop.timeline.steps == 3
    rows = list(loop.timeline.rows)
    assert math.isnan(rows[0].gap)  # no step before the first
    assert all(r.forward == 0.0 for r in rows)  # the tree driver has no model
    assert all(r.offcpu <= r.step for r in rows)
    figures = loop.timeline.figures()
    assert figures["timeline_steps"] == 3
    _ordered(figures)
    assert figures["timeline_forward_ms_max"] == 0.0


def test_the_engines_forwards_are_inside_its_steps() -> None:
    engine = Engine(EngineConfig(num_blocks=64, model=tiny_model(), record_events=False))
    loop = ServiceLoop(engine, BatchSink(lambda _: None))
    handle = engine.submit(list(range(1, 40)), 5)
    steps = loop.run_until_idle()
    assert handle.result(0).metrics.output_tokens == 5
    assert loop.timeline.steps == steps == 5  # one prefill step, then one per decode
    rows = list(loop.timeline.rows)
    assert all(0 < r.forward <= r.step for r in rows)
    assert sum(r.forward for r in rows) <= engine.forward_s
    assert not any(math.isnan(r.gap) for r in rows[1:])
    reply = loop.command(cmd.Stats())
    stream = cmd.stats_reply(reply).stream
    assert stream is not None and stream.timeline["timeline_steps"] == 5
    _ordered(loop.timeline.figures())


def test_gc_clock_counts_collections_and_the_window_is_bounded() -> None:
    before, seconds = GC_CLOCK.collections, GC_CLOCK.total_s
    gc.collect()
    assert GC_CLOCK.collections == before + 1
    assert GC_CLOCK.total_s > seconds
    t = StepTimeline(window=4)
    for i in range(10):
        t.record(StepRow(float(i), 0.0, 0.002, 0.001, 0.0, 0.0, 0.0))
    assert (t.steps, len(t.rows)) == (10, 4)
    figures = t.figures()
    assert figures["timeline_gap_ms_max"] == 9000.0  # the last four: 6..9 s
    assert figures["timeline_other_ms_p50"] == 1.0
    t.clear()
    assert t.figures()["timeline_steps"] == 0
