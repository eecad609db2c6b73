"""The one front end: the command handler's replies, the loop's batches and cadence, the queue
cap, the thread guard, and the snapshot budget of the publisher."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import zmq

from radixcache.core import events as ev
from radixcache.core.guard import Guard, ThreadFault
from radixcache.serving.driver import TreeDriver, serve_request
from radixcache.serving.loop import BatchSink, LoopConfig, Sampling, ServiceLoop
from radixcache.serving.server import Server
from radixcache.serving.service import MAX_WAITING
from radixcache.serving.stats import Stats
from radixcache.traffic.workloads import build_workload
from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from radixcache.wire.endpoints import Endpoints, u64
from radixcache.wire.publisher import SNAPSHOT_BUDGET
from tests.helpers.stream import prompts, tree_server, wait_for


def _loop(driver: TreeDriver, digest_every: int = 0) -> tuple[ServiceLoop, list[ev.Batch]]:
    batches: list[ev.Batch] = []
    config = LoopConfig(digest_every, sampling=Sampling.EVERY_BATCH)
    return ServiceLoop(driver, BatchSink(batches.append), config), batches


def _kinds(batch: ev.Batch) -> list[str]:
    return [type(e).__name__ for e in batch.events]


def test_replies_name_their_unit_and_the_paused_state() -> None:
    loop, _ = _loop(TreeDriver(256))
    assert loop.command_line("system 5") == (
        "system: 5 requests submitted (synthetic: 5 users behind a 512-token system prompt)")
    assert loop.command_line("pause") == "paused, 5 waiting stay queued"
    assert loop.command_line("fork 2") == (
        "fork: 3 requests queued (engine paused) (synthetic fork of 2 branches)")
    assert loop.command_line("watermark 0.9 0.8") == "watermarks high 90% low 80%"
    assert loop.command_line("reset") == "reset: the cache is empty (8 requests cancelled)"


def test_evict_says_why_nothing_went() -> None:
    loop, _ = _loop(TreeDriver(256))
    assert loop.command_line("evict 64") == (
        "evicted nothing of 64 tokens: no unpinned leaf (every cached node is pinned by a "
        "running request, or the cache is empty)")
    serve_request(loop.service.tree, list(range(40)))  # type: ignore[attr-defined]
    assert loop.command_line("evict 4096") == (
        "evicted 1 nodes, 40 tokens, 3 blocks (all that was evictable)")


def test_bad_command_lines_say_their_usage() -> None:
    loop, _ = _loop(TreeDriver(256))
    assert loop.command_line("evict abc") == "error: usage: evict TOKENS (e.g. evict 4096)"
    assert loop.command_line("watermark 0.5 0.9") == (
        "error: watermark needs 0 < LOW <= HIGH <= 1, e.g. watermark 0.9 0.8")
    assert loop.command_line("schedule") == (
        "error: usage: schedule fcfs|lpm|dfs-weight (e.g. schedule lpm)")
    assert loop.command_line("schedule sjf") == (
        "error: unknown schedule 'sjf': choose one of fcfs, lpm, dfs-weight")
    assert loop.command_line("schedule lpm") == (
        "error: schedule lpm: the tree driver has no scheduler (it serves requests one at a "
        "time, in order)")
    assert loop.command_line("blah").startswith("error: unknown workload 'blah' (known: ")


def test_one_batch_per_step_and_per_command_with_samples_and_digest_cadence() -> None:
    driver = TreeDriver(256, step_requests=2)
    loop, batches = _loop(driver, digest_every=3)
    loop.command(cmd.StartWorkload("flood", ["4"]))
    assert [b.seq for b in batches] == [1]
    assert _kinds(batches[0])[-2:] == ["Watermark", "Counters"]
    assert loop.step_once() and loop.step_once() and not loop.step_once()
    assert [b.seq for b in batches] == [1, 2, 3]
    assert _kinds(batches[2])[-3:] == ["Watermark", "Counters", "Digest"]  # every 3rd batch
    assert batches[2].events[-1] == ev.Digest(driver.digest())
    counters = batches[2].events[-2]
    assert isinstance(counters, ev.Counters)
    assert (counters.submitted, counters.finished, counters.waiting) == (4, 4, 0)
    reply = cmd.stats_reply(loop.command(cmd.Stats()))
    assert Stats.of(reply) == driver.stats()
    assert (Stats.of(reply).submitted, Stats.of(reply).finished) == (4, 4)
    assert reply.stream is not None and reply.stream.timeline["timeline_steps"] == 2
    moving = "timeline_gc_collections"  # the process's, counted on between the two reads
    assert {k: v for k, v in reply.stream.timeline.items() if k != moving} == {
        k: v for k, v in loop.timeline.figures().items() if k != moving}
    assert reply.stream == cmd.StreamFigures(seq=3, batches=3, digest=driver.digest(),
                                             program_rounds=0, timeline=reply.stream.timeline)
    assert reply.socket is None  # not through a command socket
    assert len(batches) == 3  # stats publishes nothing


def test_counters_restart_with_a_new_generation_after_reset() -> None:
    driver = TreeDriver(256)
    loop, batches = _loop(driver)
    loop.command(cmd.StartWorkload("flood", ["3"]))
    loop.command(cmd.StartWorkload("chat", ["4"]))
    while loop.step_once():
        pass
    loop.command(cmd.Evict(10_000))
    before = driver.stats()
    assert (before.splits, before.merges, before.cow_copies, before.evicted_nodes) == (
        2, 2, 4, 8)
    loop.command(cmd.Reset())
    last = batches[-1].events[-1]
    assert isinstance(last, ev.Counters)
    assert (last.generation, last.submitted, last.finished, last.hit_tokens) == (1, 0, 0, 0)
    after = driver.stats()  # the tree's counts restart with the generation too
    assert (after.generation, after.splits, after.merges, after.cow_copies,
            after.evicted_nodes) == (1, 0, 0, 0, 0)


def test_a_full_queue_refuses_the_whole_workload() -> None:
    driver = TreeDriver(256)
    loop, _ = _loop(driver)
    loop.command(cmd.Pause())
    assert loop.command_line("flood 10000").startswith("flood: 10000 requests queued")
    assert loop.command_line("flood 10000").startswith("flood: 10000 requests queued")
    assert loop.command_line("flood 1") == (
        f"error: queue full: {MAX_WAITING} requests waiting, 1 more would pass the limit of "
        f"{MAX_WAITING}")
    assert driver.counters().waiting == MAX_WAITING


class _Breaks(TreeDriver):
    """A driver whose third step raises (a bug in a step)."""

    steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("boom in step 3")
        super().step()


def test_a_dying_loop_thread_publishes_a_fault_and_says_so_in_stats() -> None:
    driver = _Breaks(256, step_requests=1)
    loop, batches = _loop(driver)
    loop.command(cmd.StartWorkload("flood", ["10"]))
    loop.start()
    assert wait_for(lambda: loop.fault is not None)
    assert loop.fault is not None
    assert (loop.fault.thread, loop.fault.error) == ("rc-service-loop",
                                                     "RuntimeError: boom in step 3")
    assert batches[-1].events[-1] == ev.Fault("rc-service-loop", "RuntimeError: boom in step 3")
    stream = cmd.stats_reply(loop.command(cmd.Stats())).stream
    assert stream is not None
    assert stream.fault == "thread rc-service-loop died: RuntimeError: boom in step 3"
    loop.close()
    driver.tree.check()


def test_the_guard_reports_to_its_owner_once_and_keeps_the_first_fault(
        capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[ThreadFault] = []
    guard = Guard(seen.append)

    def fail(message: str) -> None:
        raise ValueError(message)

    for name in ("first", "second"):
        guard.start(name, lambda n=name: fail(f"{n} bug")).join()
    assert [f.error for f in seen] == ["ValueError: first bug", "ValueError: second bug"]
    assert guard.fault is not None and guard.fault.thread == "first"
    assert "radixcache: thread first died: ValueError: first bug" in capsys.readouterr().err


def test_a_client_that_never_reads_its_snapshots_is_cut_off_at_the_budget() -> None:
    server = tree_server(4096).start()
    try:
        with server.loop.changing():
            for tokens in prompts(300, seed=3):
                serve_request(server.service.tree, tokens)  # type: ignore[attr-defined]
        ctx = zmq.Context.instance()
        with ctx.socket(zmq.DEALER) as reader, ctx.socket(zmq.DEALER) as hog:
            for sock in (reader, hog):
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(server.publisher.endpoints.control)
            reader.send_multipart([b"snapshot", b"r"])
            assert reader.poll(5000)
            size = len(reader.recv_multipart()[-1])
            asks = SNAPSHOT_BUDGET // size + 5
            for i in range(asks):
                hog.send_multipart([b"snapshot", u64(i)])
            assert wait_for(lambda: server.publisher.stats().snapshots_refused >= 5, 20)
            served = server.publisher.stats().snapshots_served - 1  # the reader's
            assert served * size <= SNAPSHOT_BUDGET
            assert served + server.publisher.stats().snapshots_refused == asks
    finally:
        server.close()


def test_the_engine_and_the_driver_serve_one_workload_through_the_same_loop() -> None:
    from radixcache.serving.engine import Answers, Engine, EngineConfig
    from radixcache.serving.model import tiny_model

    w = build_workload("tot", ["2", "2"])
    driver = TreeDriver(512)
    engine = Engine(EngineConfig(num_blocks=512, model=tiny_model(), answers=Answers.PREFILL))
    try:
        named: list[set[str]] = []  # the names on the wire of each one's ``stats`` reply
        for service in (driver, engine):
            loop = ServiceLoop(service, BatchSink(lambda _: None), LoopConfig(0))
            loop.command(cmd.StartWorkload("tot", ["2", "2"]))
            steps = loop.run_until_idle(max_steps=10_000)
            assert steps > 0 and not service.busy()
            reply = cmd.encode_reply(loop.command(cmd.Stats()))
            named.append(set(msgspec.msgpack.decode(reply)[1]))
        assert driver.counters().finished == engine.counters().finished == len(w.requests)
        # one typed Stats: both answer ``stats`` with the same keys, those old clients of
        # either read among them
        keys = {"generation", "submitted", "finished", "rejected", "cancelled", "waiting",
                "running", "paused", "steps", "prompt_tokens", "hit_tokens", "prefill_tokens",
                "output_tokens", "busy_s", "nodes",
                "used_blocks", "num_blocks", "splits", "merges", "cow_copies", "evicted_nodes",
                "evicted_tokens", "cache", "model", "device", "schedule", "held_for_sharing",
                "shared_in_forward",
                "aged", "waiting_order", "waiting_sharing", "waiting_pool", "waiting_batch",
                "waiting_paused", "failed", "kv_bytes_per_block", "kv_bytes_per_token",
                "model_dir", "reserve", "retractions", "retracted_tokens",
                "retracted_from_tree", "retracted_recomputed"}
        assert named == [keys, keys]
        d, e = driver.stats(), engine.stats()
        assert (d.finished, e.finished, d.model, d.paused) == (
            len(w.requests), len(w.requests), "none (tree driver)", False)
        assert d.prefill_tokens == d.prompt_tokens - d.hit_tokens
        assert (e.model, e.device, e.cache) == ("tiny transformer (layers=1)", "cpu", "on")
        # the engine inserts prompt + output[:-1] (the last token's K/V is never computed),
        # the driver prompt + output: the same tree but for one token per leaf
        assert len(driver.snapshot().nodes) == len(engine.snapshot().nodes)
        engine.tree.check()
        driver.tree.check()
    finally:
        engine.close()


def test_the_ipv6_loopback_binds_and_serves_commands() -> None:
    server = Server(TreeDriver(64), Endpoints.tcp("::1", 0)).start()
    try:
        assert server.publisher.endpoints.commands.startswith("tcp://[::1]:")
        reply = send_command(server.publisher.endpoints.commands, cmd.Stats())
        assert Stats.of(reply).nodes == 0
    finally:
        server.close()


def test_a_closed_publisher_leaves_no_socket_files(tmp_path: Path) -> None:
    server = Server(TreeDriver(64), Endpoints.ipc(str(tmp_path / "engine"))).start()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["engine-commands", "engine-control", "engine-events"]
    server.close()
    assert list(tmp_path.iterdir()) == []
