"""Scheduling policies (fcfs, lpm, dfs-weight), in-batch prefix sharing, aging, the queue's
visibility (``Queue`` events, ``stats``) and the one thing reordering must never do: change an
answer."""

from __future__ import annotations

import json
from array import array

import msgspec
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.app import app
from radixcache.core import events as ev
from radixcache.core.nodes import NodeId, RadixNode
from radixcache.serving.engine import Engine, EngineConfig, RequestHandle, RequestResult
from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
from radixcache.serving.model import ModelConfig, SlotCopy
from radixcache.serving.policy import Candidate, SchedulePolicy, ordered
from radixcache.serving.requests import Request
from radixcache.serving.running import Planned
from radixcache.tools.bench_schedule import PolicyFigures, combined, pass_order
from radixcache.traffic.workloads import build_workload
from radixcache.wire import commands as cmd
from radixcache.wire.mirror import Mirror
from radixcache.wire.validate import Malformed, check_event

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)


def _engine(policy: SchedulePolicy, *, blocks: int = 64, step_tokens: int = 64, running: int = 64,
            max_wait: int = 64, beside: bool = True) -> Engine:
    return Engine(EngineConfig(num_blocks=blocks, model=SMALL, schedule=policy,
                               max_step_tokens=step_tokens, max_running=running,
                               max_wait_steps=max_wait, share_in_forward=beside))


def _words(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 100_000, n).tolist()


def _node(nid: int, parent: RadixNode | None) -> RadixNode:
    return RadixNode(NodeId(nid), parent, 0, 0, b"", array("i"))


def test_lpm_and_dfs_weight_orders() -> None:
    """lpm: most cached first, ties in arrival order. dfs-weight: the heavier subtree first,
    a node's own requests after its subtree's (root -> a(3) -> b(2); root -> c(2))."""
    root = _node(0, None)
    a, c = _node(1, root), _node(3, root)
    b = _node(2, a)
    at = [c, b, a, b, c]
    cands = [Candidate(i, n, cached) for i, (n, cached) in enumerate(zip(at, [30, 50, 20, 50, 10],
                                                                        strict=True))]
    assert [x.position for x in ordered(SchedulePolicy.FCFS, cands)] == [0, 1, 2, 3, 4]
    assert [x.position for x in ordered(SchedulePolicy.LPM, cands)] == [1, 3, 0, 2, 4]
    assert [x.position for x in ordered(SchedulePolicy.DFS_WEIGHT, cands)] == [1, 3, 2, 0, 4]
    assert SchedulePolicy.parse("dfs-weight") is SchedulePolicy.DFS_WEIGHT
    with pytest.raises(ValueError, match="unknown schedule 'sjf': choose one of fcfs, lpm, dfs"):
        SchedulePolicy.parse("sjf")


def _queue_events(engine: Engine) -> list[ev.Queue]:
    return [e for e in engine.take_events() if isinstance(e, ev.Queue)]


def _sharing_pair(engine: Engine) -> tuple[RequestHandle, RequestHandle]:
    """A (200 shared + 10 own tokens) admitted and prefilling 64 tokens a step; then B
    (the same 200 + 10 others) arrives."""
    shared = _words(1, 200)
    a = engine.submit(shared + _words(2, 10), 4)
    engine.step()
    b = engine.submit(shared + _words(3, 10), 4)
    return a, b


def test_a_request_waits_for_the_insert_of_the_prefix_a_running_request_computes() -> None:
    engine = _engine(SchedulePolicy.LPM, beside=False)
    a, b = _sharing_pair(engine)
    engine.take_events()
    engine.step()  # A has computed 128 of 210: B is held, and says why
    held = ev.Waiting(1, ev.WaitReason.SHARING, 1, on_req=0, node=0, shared=200)
    assert _queue_events(engine) == [ev.Queue("lpm", 2, 1, [held])]
    stats = engine.stats()
    assert (stats.schedule, stats.waiting_sharing, stats.held_for_sharing) == ("lpm", 1, 1)
    assert (stats.schedule, stats.waiting_sharing, stats.waiting_order) == ("lpm", 1, 0)
    engine.step()
    report = engine.step()  # A's prefill ends: its prompt is inserted while it decodes, and B,
    events = engine.take_events()  # held for it, is admitted in the same step and prefills
    cached = [i for i, e in enumerate(events) if isinstance(e, ev.RequestCached) and e.req == 0]
    start = [i for i, e in enumerate(events) if isinstance(e, ev.RequestStart) and e.req == 1]
    assert cached and start and cached[0] < start[0]
    assert events[start[0]] == ev.RequestStart(1, 210, 200)  # B reads the 200 tokens A computed
    assert [e for e in events if isinstance(e, ev.Queue)][-1] == ev.Queue("lpm", 4, 0, [])
    # two forwards: A's last 18 prompt tokens, then B's own 10 (its first token in this step)
    assert (report.admitted, report.forwards, report.prefill_tokens) == (1, 2, 28)
    engine.check()
    while not (a.done() and b.done()):
        engine.step()
    assert (b.result().metrics.hit_tokens, b.result().metrics.queue_ms > 0) == (200, True)
    engine.tree.check()


def _three(policy: SchedulePolicy, *, beside: bool = False
           ) -> tuple[list[list[int]], list[list[list[tuple[int, int]]]]]:
    """C (id 0) decoding, then A (1: 200 shared + 10 own tokens) prefilling 64 tokens a step
    and B (2: the same 200 + 10 others) arriving: the three outputs, and every later step's
    forwards as (request, tokens) pairs (a spy around the real forwards)."""
    engine = _engine(policy, beside=beside)
    c = engine.submit(_words(9, 20), 16)
    engine.step()
    a, b = _sharing_pair(engine)
    seen: list[list[tuple[int, int]]] = []
    forward = engine.running._forward

    def spy(group: Planned, prefilled: list[Request], copy: SlotCopy | None = None) -> None:
        seen.append([(r.id, len(s.tokens)) for r, s in group])
        forward(group, prefilled, copy)

    engine.running._forward = spy  # type: ignore[method-assign]
    steps = []
    while not all(h.done() for h in (a, b, c)):
        seen.clear()
        engine.step()
        steps.append(list(seen))
    engine.tree.check()
    return [h.result().tokens for h in (a, b, c)], steps


def test_a_held_request_waits_for_its_sharers_prefill_forward_only() -> None:
    """The step that ends A's prefill runs it alone first; B, admitted once A's prompt is
    inserted, prefills in the forward of C's decode: two forwards, as many as without the
    hold, and B waits for A's last chunk only, not for a forward with every decode in it."""
    outputs, steps = _three(SchedulePolicy.LPM)
    assert steps[:4] == [[[(0, 1), (1, 63)]], [[(0, 1), (1, 63)]],
                         [[(1, 21)], [(0, 1), (2, 10)]],  # B reads the 200 tokens A computed
                         [[(0, 1), (1, 1), (2, 1)]]]
    fcfs_outputs, fcfs_steps = _three(SchedulePolicy.FCFS)
    assert fcfs_steps[2] == [[(1, 21), (2, 42)], [(0, 1)]]  # fcfs: B computes them again
    assert outputs == fcfs_outputs


def test_a_request_reads_its_sharers_blocks_in_the_forward_that_writes_them() -> None:
    """In the same forward: once A's prefill ends in the step's forward, A's prompt goes in the
    tree before it is computed and B is admitted beside it, prefilling in A's forward (C's
    decode in one of its own, as under fcfs).
    B's match ends 8 tokens into a block A writes in that forward (B shares 200 tokens): B's
    copy of those 8 slots, made at its admission when they are not written yet, is made
    again by that forward after each layer's writes. The answers are fcfs's, token for
    token."""
    outputs, steps = _three(SchedulePolicy.LPM, beside=True)
    assert steps[:3] == [[[(0, 1), (1, 63)]], [[(0, 1), (1, 63)]],
                         [[(1, 21), (2, 10)], [(0, 1)]]]  # B computes its own 10 only
    assert outputs == _three(SchedulePolicy.FCFS)[0]


def test_sharing_in_the_forward_publishes_the_prompt_before_it_is_computed() -> None:
    engine = _engine(SchedulePolicy.LPM)
    a, b = _sharing_pair(engine)
    engine.step()
    engine.step()  # A has computed 128 of 210: 82 left, more than a step's 64: B waits
    assert [w.reason for w in engine.scheduler.entries()] == [ev.WaitReason.SHARING]
    engine.take_events()
    report = engine.step()  # A's last 18 tokens: its prompt's 13 whole blocks are published
    events = engine.take_events()
    kinds = [e for e in events if isinstance(e, ev.RequestCached | ev.RequestStart)]
    assert kinds == [ev.RequestCached(0, 208), ev.RequestStart(1, 210, 200),  # after the
                     ev.RequestCached(0, 210), ev.RequestCached(1, 210)]  # forward: the rest
    assert (report.admitted, report.forwards, report.prefill_tokens) == (1, 1, 28)
    assert [e for e in events if isinstance(e, ev.Cow)] == [ev.Cow(12, 15, 8)]
    kv = engine.pool.kv  # B's copy holds what A wrote in that forward, made again after it
    assert torch.equal(kv[:, :, 15, :8], kv[:, :, 12, :8])
    stats = engine.stats()
    assert (stats.held_for_sharing, stats.shared_in_forward, stats.waiting) == (1, 1, 0)
    engine.check()
    while not (a.done() and b.done()):
        engine.step()
        engine.check()
    reference = _engine(SchedulePolicy.FCFS)
    ra, rb = _sharing_pair(reference)
    while not (ra.done() and rb.done()):
        reference.step()
    assert (a.result().tokens, b.result().tokens) == (ra.result().tokens, rb.result().tokens)
    assert b.result().metrics.hit_tokens == 200


def test_a_burst_behind_a_new_system_prompt_is_admitted_in_one_step() -> None:
    """Six users of a new 64-token system prompt arriving together: the first computes it and
    the five others are admitted in the same step, reading it in the same forward; nobody
    waits a step for it. Their answers are fcfs's."""
    outputs = []
    for policy in (SchedulePolicy.FCFS, SchedulePolicy.DFS_WEIGHT):
        engine = _engine(policy, blocks=128, step_tokens=512)
        handles = engine.run_workload(build_workload("system", ["6", "64"])).handles
        report = engine.step()
        engine.check()
        started = [e for e in engine.take_events() if isinstance(e, ev.RequestStart)]
        assert (report.admitted, len(engine.scheduler), report.forwards) == (6, 0, 1)
        while not all(h.done() for h in handles):
            engine.step()
        engine.tree.check()
        outputs.append([h.result().tokens for h in handles])
        if policy is SchedulePolicy.DFS_WEIGHT:
            # the system prompt and the 3 tokens that open a user's turn, 3 into a block
            assert [e.hit_tokens for e in started] == [0, 67, 67, 67, 67, 67]
            assert (engine.scheduler.held, engine.scheduler.shared) == (0, 5)
    assert outputs[0] == outputs[1]


def test_fcfs_computes_the_shared_prefix_twice() -> None:
    engine = _engine(SchedulePolicy.FCFS)
    a, b = _sharing_pair(engine)
    while not (a.done() and b.done()):
        engine.step()
    assert (a.result().metrics.hit_tokens, b.result().metrics.hit_tokens) == (0, 0)
    assert engine.scheduler.held == 0


def test_a_hold_ends_at_the_aging_bound() -> None:
    """A held request is admitted once it waited ``max_wait_steps`` steps, even though the
    prefix it waits for is still being computed (then it computes it itself)."""
    engine = _engine(SchedulePolicy.LPM, max_wait=2, beside=False)
    a, b = _sharing_pair(engine)
    engine.step()
    assert engine.scheduler.entries()[0].reason is ev.WaitReason.SHARING
    engine.step()  # waited 2 steps: aged, admitted before A's prompt is in the tree
    assert (len(engine.scheduler), engine.scheduler.aged) == (0, 1)
    while not (a.done() and b.done()):
        engine.step()
    assert b.result().metrics.hit_tokens == 0


def _flood(max_wait: int, steps: int) -> tuple[int | None, int]:
    """lpm, one request running at a time: a lone request with nothing cached, then one
    request behind a cached prefix arriving every step (lpm always prefers them). Returns the
    step the lone request started at (None: never) and the step it was queued at."""
    engine = _engine(SchedulePolicy.LPM, blocks=256, running=1, max_wait=max_wait)
    prefix = _words(5, 64)
    first = engine.submit(prefix + _words(6, 4), 1)
    while not first.done():
        engine.step()
    lone = engine.submit(_words(7, 40), 1)
    queued = engine.scheduler.steps
    for i in range(steps):
        engine.submit(prefix + _words(100 + i, 8), 1)
        engine.step()
        if lone.done():
            return queued + i + 1, queued
    return None, queued


def test_nothing_starves_under_a_flood() -> None:
    started, queued = _flood(max_wait=5, steps=30)
    assert started == queued + 5
    assert _flood(max_wait=10_000, steps=30)[0] is None  # without aging it would starve


def _serve_mix(policy: SchedulePolicy, beside: bool = True) -> tuple[list[list[int]], int, int]:
    """A mixed workload under ``policy``: every request's output tokens, the hit tokens and
    how many requests were held for sharing or admitted beside their sharer."""
    engine = _engine(policy, blocks=512, step_tokens=96, beside=beside)
    runs = [engine.run_workload(build_workload(name, args)) for name, args in (
        ("system", ["8", "64"]), ("fork", ["4"]), ("tot", ["2", "2"]), ("flood", ["6"]),
        ("system", ["6", "48", "--seed", "1"]))]
    handles = [h for run in runs for h in run.handles]
    while not all(h.done() for h in handles):
        engine.step()
    results = [h.result() for h in handles]
    assert all(isinstance(r, RequestResult) for r in results)
    engine.tree.check()
    return ([r.tokens for r in results], sum(r.metrics.hit_tokens for r in results),
            engine.scheduler.held + engine.scheduler.shared)


def test_every_policy_gives_every_request_the_same_answer() -> None:
    fcfs, fcfs_hits, _ = _serve_mix(SchedulePolicy.FCFS)
    for policy in (SchedulePolicy.LPM, SchedulePolicy.DFS_WEIGHT):
        for beside in (True, False):
            tokens, hits, shared = _serve_mix(policy, beside)
            assert tokens == fcfs  # every request, token for token (greedy decoding)
            assert shared > 0 and hits > fcfs_hits  # the orders did differ, and reused more


def test_the_schedule_command_and_the_heartbeat() -> None:
    engine = _engine(SchedulePolicy.FCFS)
    loop = ServiceLoop(engine, BatchSink(lambda _: None), LoopConfig(0, float("inf")))
    assert loop.command_line("schedule dfs-weight") == (
        "schedule dfs-weight: the waiting queue is ordered by it from the next step")
    assert engine.scheduler.policy is SchedulePolicy.DFS_WEIGHT
    assert engine.counters().schedule == "dfs-weight"
    assert loop.command_line("schedule lpm x") == (
        "error: usage: schedule fcfs|lpm|dfs-weight (e.g. schedule lpm)")
    assert cmd.decode_command(cmd.encode_command(cmd.SetSchedule(SchedulePolicy.LPM))) == (
        cmd.SetSchedule(SchedulePolicy.LPM))
    with pytest.raises(cmd.CommandError, match="not a command"):
        cmd.decode_command(msgspec.msgpack.encode(["schedule", "sjf"]))
    loop.close()


def test_pause_says_every_waiting_request_is_paused() -> None:
    engine = _engine(SchedulePolicy.LPM, running=1)
    engine.submit(_words(1, 20), 2)
    engine.submit(_words(2, 20), 2)
    engine.step()
    assert [w.reason for w in engine.scheduler.entries()] == [ev.WaitReason.BATCH]
    engine.take_events()
    engine.pause()
    assert _queue_events(engine) == [
        ev.Queue("lpm", 1, 1, [ev.Waiting(1, ev.WaitReason.PAUSED, 0)])]


def test_queue_and_rcached_events_travel_validate_and_reach_the_mirror() -> None:
    q = ev.Queue("lpm", 9, 3, [ev.Waiting(4, ev.WaitReason.SHARING, 7, 2, 5, 64),
                               ev.Waiting(6, ev.WaitReason.POOL, 8)])
    batch = ev.Batch(1, 1, 0.0, "t", [q, ev.RequestCached(2, 300)])
    back = ev.decode_batch(ev.encode_batch(batch))
    assert back == batch
    for e in back.events:
        check_event(e, 64)
    with pytest.raises(Malformed, match=r"queue queued 10 out of range \[0, 9\]"):
        check_event(ev.Queue("lpm", 9, 1, [ev.Waiting(4, ev.WaitReason.ORDER, 10)]), 64)
    m = Mirror(16, 64)
    m.apply_batch(back)
    assert m.queue == q
    assert q.counts() == {ev.WaitReason.ORDER: 1, ev.WaitReason.SHARING: 1,
                          ev.WaitReason.POOL: 1, ev.WaitReason.BATCH: 0,
                          ev.WaitReason.PAUSED: 0}


def test_a_schema_3_heartbeat_without_schedule_still_reads() -> None:
    """Schema 5 added ``Counters.schedule``; a schema 3 or 4 stream's Counters has 12 fields."""
    old = {"seq": 1, "epoch": 1, "ts": 0.0, "engine": "schema-3",
           "events": [["counters", 0, 5, 4, 0, 100, 60, 0, 0, 0, 1, 0, False]]}
    batch = ev.decode_batch(msgspec.msgpack.encode(old))
    assert batch.events == [ev.Counters(0, 5, 4, 0, 100, 60, 0, 0, 0, 1, 0, False)]
    assert batch.events[0].schedule is None  # type: ignore[union-attr]


def test_an_early_insert_of_a_prompt_already_cached_copies_its_boundary_block() -> None:
    """Two equal 20-token prompts (under the sharing threshold) prefill in the same step; the
    second one's early insert finds the first's prompt cached and continued in place in its
    last block, so its decode lease copies that block's 4 prompt slots (COW). Under fcfs both
    insert at the finish, the second a duplicate of the first: no copy. Same answers."""
    outputs = []
    for policy in (SchedulePolicy.FCFS, SchedulePolicy.LPM):
        engine = _engine(policy)
        prompt = _words(9, 20)
        a, b = engine.submit(prompt, 4), engine.submit(prompt, 4)
        while not (a.done() and b.done()):
            engine.step()
        engine.tree.check()
        outputs.append((a.result().tokens, b.result().tokens, engine.tree.stats.cow_copies))
    (fa, fb, fcows), (la, lb, lcows) = outputs
    assert (la, lb) == (fa, fb) and fa == fb
    assert (fcows, lcows) == (0, 1)


def _figures(policy: SchedulePolicy, p99: float, rps: float, aged: int, equal: bool
             ) -> PolicyFigures:
    outputs: list[list[int] | None] = [[1, 2]] if equal else [[1, 3]]
    return PolicyFigures(policy, 10, 0, 0.5, 0.6, 7, (1.0, p99), (2.0, 9.0), rps, 1.0, 1.0, 0,
                         0, aged, outputs)


def test_repeated_passes_report_medians_and_every_pass() -> None:
    first = _figures(SchedulePolicy.FCFS, 4.0, 30.0, 0, True)
    passes = [_figures(SchedulePolicy.LPM, 9.0, 31.0, 3, True),
              _figures(SchedulePolicy.LPM, 5.0, 29.0, 1, True),
              _figures(SchedulePolicy.LPM, 6.0, 40.0, 2, False)]
    out = combined(passes, first)
    assert (out["queue_wait_ms_p99"], out["requests_per_s"], out["aged"]) == (6.0, 31.0, 2)
    assert out["queue_wait_ms_p99_each"] == [9.0, 5.0, 6.0]
    assert out["requests_per_s_each"] == [31.0, 29.0, 40.0]
    assert (out["passes"], out["outputs_equal"]) == (3, False)  # one pass answered otherwise
    assert combined(passes[:2], first)["aged"] == 1  # two passes: the lower median, a pass's
    assert pass_order([SchedulePolicy.FCFS, SchedulePolicy.DFS_WEIGHT], 3) == [
        SchedulePolicy.FCFS, SchedulePolicy.DFS_WEIGHT, SchedulePolicy.DFS_WEIGHT,
        SchedulePolicy.FCFS, SchedulePolicy.FCFS, SchedulePolicy.DFS_WEIGHT]


def test_bench_engine_schedule_json_with_repeated_passes() -> None:
    result = CliRunner().invoke(app, ["bench", "engine", "--schedule", "fcfs,dfs-weight",
                                      "--mix", "system 6 64", "--rounds", "1", "--interval",
                                      "0", "--repeat", "2", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["mix"], out["requests"], out["repeat"]) == (["system 6 64"], 6, 2)
    fcfs, dfs = out["fcfs"], out["dfs-weight"]
    for f in (fcfs, dfs):
        assert (f["passes"], len(f["queue_wait_ms_p99_each"]), len(f["requests_per_s_each"]),
                f["outputs_equal"], f["failed"]) == (2, 2, 2, True, 0)
    # six users of one new 64-token system prompt arriving together: fcfs computes it six
    # times; dfs-weight once, the five others admitted beside the first, reading it in the
    # same forward (the curve's rate)
    assert (fcfs["hit_rate"], fcfs["held_for_sharing"], fcfs["shared_in_forward"]) == (0.0, 0, 0)
    assert (dfs["held_for_sharing"], dfs["shared_in_forward"]) == (0, 5)
    assert dfs["hit_rate"] == dfs["curve_hit_rate"] == fcfs["curve_hit_rate"] > 0.6
    assert (dfs["in_flight_tokens"], fcfs["in_flight_tokens"] > 300) == (0, True)
