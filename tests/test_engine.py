"""The request engine: concurrency, admission (rejection, waiting, the no-deadlock fallback),
workload ordering, exact metrics, cache off, reset, pause and the event stream."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from typer.testing import CliRunner

from radixcache.core import events as ev
from radixcache.serving.engine import (
    Engine,
    EngineConfig,
    RequestCancelled,
    RequestHandle,
    RequestRejected,
)
from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
from radixcache.serving.model import ModelConfig
from radixcache.traffic.workloads import build_workload
from radixcache.wire.mirror import Mirror

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)


def _engine(num_blocks: int = 64, *, cache: bool = True, events: bool = False) -> Engine:
    return Engine(EngineConfig(num_blocks=num_blocks, model=SMALL, cache=cache,
                               record_events=events))


def _words(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 100_000, n).tolist()


def _run(engine: Engine, handles: list[RequestHandle]) -> None:
    while not all(h.done() for h in handles):
        engine.step()


def _assert_idle_and_consistent(engine: Engine) -> None:
    """No lock left, every block referenced by a node, and the tree's invariants."""
    engine.check()
    snap = engine.tree.snapshot()
    assert [n.pins for n in snap.nodes] == [0] * len(snap.nodes)
    assert snap.request_blocks == []
    held = {b for n in snap.nodes for b in n.blocks}
    assert engine.pool.allocator.used_count == len(held)


def _stepped(engine: Engine, on_batch: Callable[[ev.Batch], None] | None = None) -> ServiceLoop:
    """``engine`` stepped on a thread by the one service loop (as ``serve`` steps it)."""
    sink = BatchSink(on_batch if on_batch is not None else (lambda _: None))
    return ServiceLoop(engine, sink, LoopConfig(0, float("inf"))).start()


def test_eight_threads_submitting_at_once_leave_a_clean_tree() -> None:
    engine = _engine(96)
    loop = _stepped(engine)
    system = _words(1, 40)
    prompts = [[system + _words(100 + 10 * t + i, 3 + i) for i in range(4)] for t in range(8)]
    handles: list[list[RequestHandle]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def client(t: int) -> None:
        barrier.wait()
        handles[t] = [engine.submit(p, 3) for p in prompts[t]]

    threads = [threading.Thread(target=client, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    results = [[h.result(60) for h in hs] for hs in handles]
    loop.stop()
    _assert_idle_and_consistent(engine)
    m = engine.stats()
    assert (m.submitted, m.finished, m.waiting, m.running) == (32, 32, 0, 0)
    assert m.output_tokens == 96
    # greedy tokens are those of the same prompts served one by one without the cache
    off = _engine(96, cache=False)
    flat = [p for ps in prompts for p in ps]
    alone = [off.submit(p, 3) for p in flat]
    _run(off, alone)
    assert [r.tokens for rs in results for r in rs] == [h.result(0).tokens for h in alone]
    assert off.pool.allocator.used_count == 0
    engine.close()


def test_request_larger_than_the_pool_is_rejected_at_once() -> None:
    engine = _engine(4)
    h = engine.submit(_words(2, 70), 1)  # 70 positions = 5 blocks of 16; the pool has 4
    assert h.done()
    with pytest.raises(RequestRejected, match="70 positions need 5 blocks; the pool has 4"):
        h.result(0)
    m = engine.stats()
    assert (m.submitted, m.rejected, m.waiting) == (1, 1, 0)


def test_full_pool_of_locked_blocks_makes_a_request_wait_then_proceed() -> None:
    engine = _engine(8)
    a = engine.submit(_words(3, 90), 4)  # 93 positions: 6 of the 8 blocks
    b = engine.submit(_words(4, 40), 4)  # 43 positions: 3 blocks, only 2 free while a runs
    assert engine.step().admitted == 1
    assert (engine.stats().running, engine.stats().waiting) == (1, 1)
    steps = [engine.step() for _ in range(3)]  # a decodes its 2nd..4th token and finishes
    assert [s.admitted for s in steps] == [0, 0, 0]
    assert a.done() and not b.done()
    assert engine.step().admitted == 1  # a's blocks are cached, unpinned: evicted for b
    _run(engine, [b])
    assert b.result(0).metrics.output_tokens == 4
    # b needs 3 blocks and the low watermark 1 more: a gives up its last 2 (13 + 16 tokens)
    # and stays cached with the rest
    s = engine.tree.stats
    assert (s.evicted_nodes, s.evicted_tokens) == (0, 29)
    _assert_idle_and_consistent(engine)


def test_a_request_that_only_its_own_match_blocks_is_served_without_it() -> None:
    engine = _engine(4)
    a = _words(5, 40)
    _run(engine, [engine.submit(a, 1)])  # cached: 40 tokens in 3 blocks
    # 63 + 2 - 1 = 64 positions = the whole pool; matching a[:36] would need a boundary copy
    b = engine.submit(a[:36] + _words(6, 27), 2)
    _run(engine, [b])
    assert b.result(0).metrics.hit_tokens == 0
    # b's match split a at 36: a's unmatched rest went first, the rest once b gave up its match
    s = engine.tree.stats
    assert (s.evicted_nodes, s.evicted_tokens) == (2, 40)
    _assert_idle_and_consistent(engine)


def test_workload_after_ordering_and_forced_outputs() -> None:
    seen: list[ev.AnyEvent] = []
    engine = Engine(EngineConfig(num_blocks=256, model=SMALL))
    loop = _stepped(engine, lambda batch: seen.extend(batch.events))
    w = build_workload("tot", ["2", "2"])
    run = engine.run_workload(w)
    outcomes = run.wait(60)
    loop.stop()
    order = [(type(e).__name__, e.req) for e in seen
             if isinstance(e, ev.RequestStart | ev.RequestFinish)]
    for i, r in enumerate(w.requests):
        result = outcomes[i]
        assert not isinstance(result, Exception)
        assert r.forced_output is not None
        assert result.tokens == r.forced_output.tolist()
        if r.after is not None:
            parent_done = order.index(("RequestFinish", run.handles[r.after].id))
            assert order.index(("RequestStart", run.handles[i].id)) > parent_done
    assert len(order) == 2 * len(w.requests) == 14
    _assert_idle_and_consistent(engine)
    engine.close()


def test_metrics_are_exact_for_a_repeated_request() -> None:
    engine = _engine()
    p = _words(7, 50)
    first, second = engine.submit(p, 4), engine.submit(p, 4)
    _run(engine, [first, second])  # FIFO: the second is admitted with the first (no hit yet)
    third = engine.submit(p, 4)
    _run(engine, [third])
    hits = [h.result(0).metrics for h in (first, second, third)]
    assert [(m.hit_tokens, m.prefill_tokens, m.output_tokens) for m in hits] == [
        (0, 50, 4), (0, 50, 4), (49, 1, 4)]
    m = engine.stats()
    assert (m.prompt_tokens, m.hit_tokens, m.prefill_tokens, m.output_tokens) == (150, 49, 101, 12)
    assert m.hit_rate == pytest.approx(49 / 150)
    assert hits[2].ttft_ms >= hits[2].queue_ms


def test_cache_off_serves_without_reuse_and_keeps_nothing() -> None:
    engine = _engine(cache=False)
    p = _words(8, 50)
    hs = [engine.submit(p, 3) for _ in range(2)]
    _run(engine, hs)
    _run(engine, [h3 := engine.submit(p, 3)])
    assert [h.result(0).metrics.hit_tokens for h in [*hs, h3]] == [0, 0, 0]
    assert (len(engine.tree), engine.pool.allocator.used_count) == (0, 0)
    assert engine.stats().prefill_tokens == 150


def test_reset_cancels_running_and_waiting_requests() -> None:
    engine = _engine(8)
    running = engine.submit(_words(9, 90), 4)
    engine.step()
    waiting = engine.submit(_words(10, 40), 4)
    engine.reset()
    for h in (running, waiting):
        with pytest.raises(RequestCancelled):
            h.result(0)
    assert (len(engine.tree), engine.pool.allocator.used_count) == (0, 0)
    assert engine.stats().running == engine.stats().waiting == 0


def test_pause_stops_admission_until_resume() -> None:
    engine = _engine()
    engine.pause()
    h = engine.submit(_words(11, 20), 2)
    assert engine.step().admitted == 0
    assert engine.stats().waiting == 1
    engine.resume()
    _run(engine, [h])
    assert h.result(0).metrics.output_tokens == 2


def test_pause_says_that_running_requests_go_on_to_finish() -> None:
    """``pause`` stops admission, not stepping: the reply says how many still run, so a user
    who reads it is not surprised that blocks keep moving (issue 21)."""
    from radixcache.serving.service import handle
    from radixcache.wire import commands as cmd

    engine = _engine(256)
    running = [engine.submit(_words(s, 20), 8) for s in range(3)]
    assert engine.step().admitted == 3
    engine.submit(_words(9, 20), 8)
    assert handle(engine, cmd.Pause()) == cmd.Ok(
        "admission paused: 3 running requests go on to finish, 1 waiting stay queued "
        "(resume admits them)", {"running": 3, "waiting": 1})
    engine.check()  # three running: three pins, their leases' blocks
    _run(engine, running)  # they do finish, paused
    engine.check()  # drained: no pin, no private block (nothing may be drawn "locked")
    assert handle(engine, cmd.Pause()) == cmd.Ok("paused, 1 waiting stay queued",
                                                 {"running": 0, "waiting": 1})


def test_check_finds_a_pin_or_a_lease_that_outlived_its_request() -> None:
    """The check a paused, drained demo needed: block 1408 was drawn "locked" with nothing
    running. A leaked pin, or a lease no running request holds, raises."""
    from radixcache.core.invariants import InvariantError

    engine = _engine(256)
    h = engine.submit(_words(1, 40), 4)
    _run(engine, [h])
    engine.check()
    leaked = engine.tree.match_and_pin(np.asarray(_words(1, 40), dtype=np.uint32))
    with pytest.raises(InvariantError, match="1 pins in the tree for 0 running requests"):
        engine.check()
    lease = engine.tree.allocate(leaked, leaked.length + 20)
    with pytest.raises(InvariantError, match="belong to no running request"):
        engine.check()
    engine.tree.release(lease)
    engine.tree.unpin(leaked.node)
    engine.check()


def test_events_rebuild_the_tree_in_a_mirror() -> None:
    engine = _engine(32, events=True)
    mirror = Mirror(16, 32)
    mirror.load_snapshot(engine.tree.snapshot())
    p = _words(12, 40)
    hs = [engine.submit(p + _words(13 + i, 9), 3) for i in range(3)]
    while not all(h.done() for h in hs):
        engine.step()
        for e in engine.take_events():
            mirror.apply(e)
        assert mirror.digest() == engine.tree.digest()
    engine.evict(1000)
    for e in engine.take_events():
        mirror.apply(e)
    assert mirror.digest() == engine.tree.digest()
    assert (mirror.stats.requests, mirror.stats.finished) == (3, 3)
    assert engine.pool.allocator.used_count == 0


def test_gpu_check_without_cuda_exits_1_with_the_reason() -> None:
    import cli.main  # noqa: F401  (registers every command)
    from cli.app import app

    result = CliRunner().invoke(app, ["doctor", "--gpu"])
    assert result.exit_code == 1
    assert result.output.startswith("CUDA unavailable: ")


def test_reset_ends_a_workload_instead_of_feeding_its_later_turns() -> None:
    engine = _engine(256)
    wl = build_workload("tot", ["2", "2"])  # 7 requests; 6 wait on a parent
    run = engine.run_workload(wl)
    engine.reset()  # cancels the 1 root request before it ever ran
    outcomes = run.wait(timeout=10)
    assert [type(o).__name__ for o in outcomes] == ["RequestCancelled"] * 7
    assert engine.step().admitted == 0  # nothing dependent was submitted afterwards
    assert (engine.stats().waiting, engine.stats().running) == (0, 0)
    _assert_idle_and_consistent(engine)


def test_watermark_samples_say_why_device_figures_are_missing() -> None:
    pytest.importorskip("pynvml")
    w = _engine(64).watermark()
    assert (w.used_blocks, w.total_blocks) == (0, 64)
    if w.device_total is None:  # no NVML driver here: the sample carries the reason
        assert w.note is not None and w.note.startswith("NVML unavailable: ")
    else:
        assert w.note is None
