"""The inspector: command parsing, Pilot tests on a seeded in-process source, replay, snapshots."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from inspector.app import InspectorApp
from inspector.embedded import EmbeddedSource
from inspector.feed import Feed
from inspector.frame import Cell
from inspector.layout import block_ranges, flatten
from inspector.live import LiveSource
from inspector.replay import Recording, ReplaySource, load_recording
from inspector.shots import record_demo
from inspector.sources import ConnState, SourceStatus
from inspector.widgets.command_line import complete, parse
from inspector.widgets.lru import LruPane
from inspector.widgets.stats import StatsPane
from radixcache.core import events as ev
from radixcache.serving.driver import TreeDriver
from radixcache.serving.memory import MemorySource
from radixcache.traffic.workloads import build_workload
from radixcache.wire import commands as cmd
from radixcache.wire.endpoints import free_ports
from radixcache.wire.mirror import Mirror, next_victims
from tests.helpers.local import LocalSource
from tests.helpers.pilot import T0, NoNvml, sync, type_line, wait_until

STATES_AFTER_EVICT = {"SELECTED": 10, "CACHED": 9, "COW": 1, "EVICTED": 37, "FREE": 967}
SIZE = (150, 44)
FRAME_S = 0.02  # tests wait on conditions, never on an idle screen


def local(recording: Recording | None = None) -> LocalSource:
    return LocalSource(1024, clock=lambda: T0, recording=recording,
                       memory=MemorySource(nvml=NoNvml()))  # type: ignore[arg-type]


async def settle(app: InspectorApp, pilot, source: EmbeddedSource, replies: int) -> None:  # type: ignore[no-untyped-def]
    """Wait for ``replies`` command replies, an idle source and every batch on screen."""
    await wait_until(pilot, lambda: app.replies >= replies and source.idle()
                     and app.caught_up())


# -- units ---------------------------------------------------------------------------------


def test_parse_builds_typed_commands_and_explains_errors() -> None:
    assert parse("tot 3 4").command == cmd.StartWorkload("tot", ["3", "4"])
    assert parse("watermark 0.9 0.8").command == cmd.SetWatermark(0.9, 0.8)
    assert parse("evict 4096").command == cmd.Evict(4096)
    assert parse("schedule dfs-weight").command == cmd.SetSchedule("dfs-weight")
    assert parse("schedule sjf").error == (
        "unknown schedule 'sjf': choose one of fcfs, lpm, dfs-weight")
    assert parse("schedule").error == "usage: schedule fcfs|lpm|dfs-weight (e.g. schedule lpm)"
    assert parse("pause").command == cmd.Pause()
    assert parse("filter split evict").local == ("filter", "split", "evict")
    assert parse("bogus 1").error == (
        "unknown command 'bogus' (commands: chat evict filter flood fork help pause quit reset "
        "resume schedule snapshot stats system tot watermark why)")
    assert parse("chat 0").error == ("chat: conversations must be between 1 and 1000, got 0 "
                                     "(usage: chat CONVERSATIONS [--seed N] (e.g. chat 20))")
    assert parse("evict abc").error == "usage: evict TOKENS (e.g. evict 4096)"
    assert parse("watermark 0.9").error == (
        "usage: watermark HIGH LOW, fractions of the pool (e.g. watermark 0.9 0.8)")
    assert parse("tot 3 4").note == "tree of thought 1 + 4 + 16 + 64"
    assert parse("fork 8").note == "1 base + 8 branches"
    assert parse("system 50").note == "50 users' first questions + 5 second questions"
    assert parse("watermark 0.8 0.9").error == (
        "watermark needs 0 < LOW <= HIGH <= 1, e.g. watermark 0.9 0.8")
    assert parse("pause now").error == "pause takes no arguments"


def test_completion_and_block_ranges() -> None:
    assert complete("ch") == "chat "
    assert complete("re") == "res"
    assert complete("wat") == "watermark "
    assert complete("tot 3") == "tot 3"
    assert block_ranges([3, 4, 5, 9, 11, 12]) == "b3-5,9,11-12"
    assert block_ranges([]) == "-"
    assert block_ranges(list(range(0, 100, 2)), 12) == "b0,2,4,6,8,…"


def test_feed_follows_a_local_tree_exactly() -> None:
    feed, src = Feed(), local()
    src.start(feed)
    try:
        assert src.send(cmd.StartWorkload("tot", ["2", "3"])) == cmd.Ok(
            "tot: 13 requests submitted (synthetic tree of thought, depth 2, branching 3)",
            {"requests": 13})
        while not src.idle():
            time.sleep(0.01)
        assert feed.mirror.digest() == src.service.tree.digest()  # type: ignore[attr-defined]
        assert [r.node.id for r in flatten(feed.mirror, set())] == [
            0, 2, 5, 1, 6, 7, 8, 3, 9, 10, 11, 4, 12, 13]  # the first branches grew in place
        assert [n.id for n, _ in next_victims(feed.mirror, 20)] == [1, 6, 7, 3, 9, 10, 4, 12, 13]
    finally:
        src.stop()


# -- Pilot ---------------------------------------------------------------------------------


@sync
async def test_typed_command_is_sent_and_tree_and_stats_show_the_workload() -> None:
    src = local()
    app = InspectorApp(src, flash_s=0, frame_interval=FRAME_S)
    async with app.run_test(size=SIZE) as pilot:
        await type_line(pilot, "tot 2 3")
        await settle(app, pilot, src, 1)
        assert src.service.stats().submitted == 13  # it reached the service, once
        assert app.messages[-1] == (
            "✓ tot: 13 requests submitted (synthetic tree of thought, depth 2, branching 3); "
            "tree of thought 1 + 3 + 9")
        assert [r.node.id for r in app.tree_pane.rows] == [
            0, 2, 5, 1, 6, 7, 8, 3, 9, 10, 11, 4, 12, 13]
        s = app.feed.mirror.stats
        figures = (s.requests, s.prompt_tokens, s.hit_tokens, s.splits, s.merges, s.extends)
        assert figures == (13, 1747, 1521, 4, 0, 4)  # each branch's first leaf grew in place
        assert f"{s.hit_rate:.1%}" == "87.1%"
        assert "hit 87.1%" in str(app.query_one("#header").render())


@sync
async def test_wrong_command_shows_a_message_and_sends_nothing() -> None:
    src = local()
    app = InspectorApp(src, flash_s=0, frame_interval=FRAME_S)
    async with app.run_test(size=SIZE) as pilot:
        await type_line(pilot, "tot 2 x")
        await pilot.pause(0.05)
        assert src.service.stats().submitted == 0
        assert app.replies == 0  # nothing reached the service: no reply came back
        assert app.messages == ["✗ tot: branching must be an integer, got 'x' (usage: tot "
                                "DEPTH BRANCHING [--seed N] (e.g. tot 3 4)) — nothing sent"]


@sync
async def test_evict_empties_the_lru_queue() -> None:
    src = local()
    app = InspectorApp(src, flash_s=0, frame_interval=FRAME_S)
    async with app.run_test(size=SIZE) as pilot:
        await type_line(pilot, "tot 2 3")
        await settle(app, pilot, src, 1)
        assert app.query_one(LruPane).victims == [1, 6, 7, 3, 9, 10, 4, 12, 13]
        await type_line(pilot, "evict 100000")
        await settle(app, pilot, src, 2)
        assert app.messages[-1] == (
            "✓ evicted 9 nodes, 562 tokens, 43 blocks (all that was evictable)")
        assert app.query_one(LruPane).victims == []
        assert [r.node.id for r in app.tree_pane.rows] == [0]
        assert (app.feed.mirror.stats.evictions, app.feed.mirror.used_blocks) == (9, 0)


@sync
async def test_selecting_a_node_highlights_its_blocks_and_lru_place() -> None:
    src = local()
    app = InspectorApp(src, flash_s=0, frame_interval=FRAME_S)
    async with app.run_test(size=SIZE) as pilot:
        await type_line(pilot, "tot 2 3")
        await settle(app, pilot, src, 1)
        await pilot.press("escape", "down", "down", "down")  # root, n2, n5, n1
        await pilot.pause(0.05)
        node = app.feed.mirror.nodes[1]
        assert app.builder.selected == set(node.blocks) == {8, 14, 15, 16}
        assert app.blocks.drawn()[Cell.SELECTED] == 4
        assert app.query_one(LruPane).victims[0] == 1
        assert str(app.tree_pane.border_subtitle) == "n1: 46 tok @142 b8,14-16 r0 · LRU #1"


def _recording() -> Recording:
    rec = Recording(name="test.rcrec")
    feed, src = Feed(), local(rec)
    src.start(feed)
    try:
        src.send(cmd.StartWorkload("fork", ["4"]))
        while not src.idle():
            time.sleep(0.01)
    finally:
        src.stop()
    return rec


@sync
async def test_replay_step_applies_exactly_the_next_batch() -> None:
    rec = _recording()
    assert len(rec.batches) == 4
    expected = Mirror()
    expected.load_snapshot(rec.keyframes[0][1])
    digests = [expected.digest()]
    for b in rec.batches:
        expected.apply_batch(b)
        digests.append(expected.digest())
    app = InspectorApp(ReplaySource(rec), flash_s=0)
    async with app.run_test(size=SIZE) as pilot:
        assert app.feed.mirror.digest() == digests[0]
        for i in (1, 2, 3):
            await pilot.press("full_stop")
            assert app.feed.mirror.digest() == digests[i]
            assert app.feed.seq == rec.batches[i - 1].seq
        await pilot.press("comma")
        assert app.feed.mirror.digest() == digests[2]
        await pilot.press("less_than_sign")
        assert app.feed.mirror.digest() == digests[0]
        await pilot.pause(0.05)
        assert len(app.tree_pane.rows) == 1


class FastSource:
    """Streams 50,000 Access events per second (batches of 500 every 10 ms) from its thread,
    over a small tree-of-thought tree."""

    def __init__(self) -> None:
        self.driver = TreeDriver(256, memory=MemorySource(nvml=NoNvml()))  # type: ignore[arg-type]
        self.streamed = 0

    def start(self, feed: Feed) -> None:
        self.feed_ = feed
        self.driver.submit_workload(build_workload("tot", ["1", "3"]))
        while self.driver.busy():
            self.driver.step()
        self.driver.take_events()
        feed.load(self.driver.snapshot(), 0, T0)
        self._halt = threading.Event()
        self._t = threading.Thread(target=self._flood, daemon=True)
        self._t.start()

    def _flood(self) -> None:
        seq, clock = 1, 1
        while not self._halt.is_set():
            events: list[ev.AnyEvent] = []
            for _ in range(500):
                events.append(ev.Access(0, clock))
                clock += 1
            self.feed_.apply(ev.Batch(seq, 1, T0, "fast", events))
            self.streamed += len(events)
            seq += 1
            self._halt.wait(0.01)

    def stop(self) -> None:
        self._halt.set()
        self._t.join(5)

    def status(self) -> SourceStatus:
        return SourceStatus(ConnState.LOCAL, "fast", T0)

    def send(self, command: cmd.AnyCommand) -> cmd.AnyReply:
        return cmd.Error("the fast source takes no commands")

    def vocabulary(self) -> None:
        return None


@sync
async def test_key_press_is_handled_while_a_fast_source_streams() -> None:
    src = FastSource()
    app = InspectorApp(src)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: src.streamed >= 1_000)  # the stream runs
        cursor = app.tree_pane.cursor
        await pilot.press("down")
        # handled while the stream runs (liveness, not speed: `radixcache bench tui` measures
        # the latency target; a count of events per moment depends on the machine's speed)
        assert app.tree_pane.cursor == cursor + 1
        during = src.streamed
        await wait_until(pilot, lambda: src.streamed > during)  # it did not stall behind it
        assert app.tree_pane.cursor == cursor + 1  # and the stream did not move the cursor


# -- snapshots -----------------------------------------------------------------------------


def _snap_app(line: str) -> tuple[InspectorApp, object]:
    src = local()
    app = InspectorApp(src, flash_s=0, evicted_s=3600)

    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        for i, part in enumerate(line.split(";")):
            await type_line(pilot, part)
            await settle(app, pilot, src, i + 1)
        await pilot.press("escape", "down", "down")
        await pilot.pause(0.1)

    return app, run_before


@sync
async def test_block_map_under_eviction_marks_freed_blocks() -> None:
    app, run_before = _snap_app("fork 8;evict 600")
    async with app.run_test(size=SIZE) as pilot:
        await run_before(pilot)
        states = {s.name: n for s, n in app.blocks.drawn().items() if n}
        # 600 tokens are 38 blocks: 7 leaves go whole, the next gives up its tail
        assert app.messages[-1] == "✓ evicted 7 nodes, 499 tokens, 38 blocks"
        assert states == STATES_AFTER_EVICT


def test_snapshot_replay(snap_compare) -> None:  # type: ignore[no-untyped-def]
    app = InspectorApp(ReplaySource(_recording()), flash_s=0)
    assert snap_compare(app, terminal_size=SIZE, press=["full_stop", "full_stop", "_"])


@pytest.mark.parametrize("line", ["help"])
@sync
async def test_help_command_opens_help(line: str) -> None:
    app = InspectorApp(local())
    async with app.run_test(size=SIZE) as pilot:
        await type_line(pilot, line)
        await pilot.pause(0.05)
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        assert type(app.screen).__name__ == "Screen"


# -- real recordings, a real engine process, the KV-event view ----------------------------


def test_load_recording_reads_record_files_and_stops_at_damage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = record_demo(tmp_path / "tot.rcx", requests=30)
    rec = load_recording(path)
    # 30 one-request steps and the closing batch (a memory and counter sample, a digest)
    assert (len(rec.batches), [i for i, _ in rec.keyframes], rec.damage) == (31, [0, 12, 24], "")
    data = path.read_bytes()
    (tmp_path / "cut.rcx").write_bytes(data[: len(data) * 2 // 3])
    cut = load_recording(tmp_path / "cut.rcx")
    assert len(cut.batches) < 30
    assert cut.damage.startswith("stopped at byte ")
    src = ReplaySource(cut)
    assert src.position().note == cut.damage
    assert src.status().detail.endswith("· damaged file")


@sync
async def test_replay_of_a_record_file_seeks_by_its_keyframes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rec = load_recording(record_demo(tmp_path / "tot.rcx", requests=30))
    expected = Mirror()
    expected.load_snapshot(rec.keyframes[0][1])
    for b in rec.batches[:12]:
        expected.apply_batch(b)
    app = InspectorApp(ReplaySource(rec), flash_s=0, frame_interval=FRAME_S)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("greater_than_sign")
        assert app.feed.mirror.digest() == expected.digest()
        assert app.source.position().index == 12  # type: ignore[attr-defined]


@sync
async def test_against_a_real_engine_process() -> None:
    port = free_ports(3)
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--port", str(port),
                             "--blocks", "2048"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        app = InspectorApp(LiveSource(f"tcp://127.0.0.1:{port}"), flash_s=0,
                           frame_interval=FRAME_S)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.feed.seq > 0, timeout=30)
            await type_line(pilot, "tot 2 2")
            await wait_until(pilot, lambda: app.replies == 1)
            assert app.messages[-1] == ("✓ tot: 7 requests submitted (synthetic tree of "
                                        "thought, depth 2, branching 2); tree of thought 1 + 2 + 4")
            await wait_until(pilot, lambda: len(app.feed.mirror.nodes) == 8 and app.caught_up())
            assert [r.node.num_tokens for r in app.tree_pane.rows][:1] == [0]
            assert len(app.query_one(LruPane).victims) == 4
            await wait_until(pilot, lambda: app.feed.mirror.stats.requests == 7)
            s = app.feed.mirror.stats
            assert (s.requests, s.prompt_tokens, s.hit_tokens) == (7, 904, 740)
            # the header shows the engine's own counters, from its next heartbeat
            await wait_until(pilot, lambda: app.view.counters is not None
                             and app.view.counters.prompt_tokens == 904)
            c = app.view.counters
            assert (c.submitted, c.prompt_tokens, c.hit_tokens, c.generation) == (7, 904, 740, 0)
            assert "hit 81.9%" in str(app.query_one("#header").render())
            assert app.panes.of(StatsPane).border_title == "stats · since engine start"
            await type_line(pilot, "evict 100000")
            await wait_until(pilot, lambda: app.replies == 2)
            await wait_until(pilot, lambda: len(app.feed.mirror.nodes) == 1 and app.caught_up())
            assert app.query_one(LruPane).victims == []
            assert app.feed.mirror.used_blocks == 0
    finally:
        proc.kill()
        proc.wait(10)
