"""One frame, one truth: the fidelity check under a flood, the selection through merge, evict
and reset, the engine's counters, replay counters at the playhead, the block map at a glance."""

from __future__ import annotations

import dataclasses
import gc

import msgspec
import numpy as np
from textual import events

from inspector.feed import Feed
from inspector.fidelity import Fidelity
from inspector.frame import Cell
from inspector.replay import Recording, ReplaySource
from inspector.widgets.block_map import cell_codes
from inspector.widgets.event_log import EventLog, describe
from inspector.widgets.stats import StatsPane
from radixcache.core import events as ev
from radixcache.serving.memory import MemorySource
from radixcache.wire import commands as cmd
from radixcache.wire.mirror import Mirror
from tests.helpers.local import LocalSource
from tests.helpers.pilot import (
    T0,
    Flooded,
    ManualSource,
    NoNvml,
    app_for,
    sync,
    tokens,
    type_line,
    wait_until,
)

SIZE = (150, 44)
WORKLOADS = ("flood 40", "tot 2 3", "fork 8", "system 12", "fork 4")


def local(num_blocks: int = 1024, recording: Recording | None = None) -> LocalSource:
    return LocalSource(num_blocks, clock=lambda: T0, recording=recording,
                       memory=MemorySource(nvml=NoNvml()))  # type: ignore[arg-type]


def counters(generation: int = 0, *, paused: bool = False) -> ev.Counters:
    return ev.Counters(generation=generation, submitted=64, finished=60, rejected=0,
                       prompt_tokens=10_000, hit_tokens=7_830, evicted_nodes=12,
                       evicted_tokens=1_016, cow_copies=3, waiting=2, running=4, paused=paused)


# -- the fidelity check ----------------------------------------------------------------------


@sync
async def test_every_pane_agrees_with_the_mirror_at_100_frames_under_a_50k_flood() -> None:
    """A real tree (128 blocks, so it evicts, splits and merges) fed workload after workload,
    its stream flooded to 50,000 events/s; every frame checked while the selection moves."""
    check = Fidelity(every=1)
    src = Flooded(local(128))
    app = app_for(src, check=check)
    kinds: set[str] = set()
    wanted = {"create", "split", "evict", "cow", "extend", "merge"}
    async with app.run_test(size=SIZE) as pilot:
        sent = 0
        while check.checked < 100 or not wanted <= kinds:
            assert check.checked < 3_000, f"kinds seen: {sorted(kinds)}"
            if app.replies == sent:  # the next workload once the previous one is queued
                app.commands.submit(WORKLOADS[sent % len(WORKLOADS)])
                sent += 1
            # keys as the terminal driver posts them (pilot.press waits for an idle screen,
            # which a flood never gives)
            app.post_message(events.Key("down" if check.checked % 20 < 12 else "up", None))
            await pilot.pause(0.02)
            kinds |= {entry.kind for entry in app.panes.of(EventLog).kept}
        assert check.violations == []


@sync
async def test_the_check_catches_a_pane_that_lags_the_mirror() -> None:
    """The same check flags a block map one batch behind the mirror (it is not vacuous)."""
    src = ManualSource(64)
    check = Fidelity(every=1)
    app = app_for(src, check=check)
    async with app.run_test(size=SIZE) as pilot:
        src.push([ev.BlockAlloc([3]), ev.NodeCreated(1, 0, 0, tokens(5, 6), [3],
                                                     shared_first=False)])
        await wait_until(pilot, lambda: app.view.used_blocks == 1)
        with app.feed.lock:
            app.feed.mirror.ref[9] += 1  # a change the map was never told about
            check.check(app)
            app.feed.mirror.ref[9] -= 1
        assert check.violations == [
            "seq 1: block map free 63 != 62", "seq 1: block map cached 1 != 2",
            "seq 1: block map title 'block map 1/64' != 2/64",
            "seq 1: header does not show blocks 2/64",
            "seq 1: memory pane does not show pool 2/64"]


# -- the selection ---------------------------------------------------------------------------


def _two_children() -> list[ev.AnyEvent]:
    """root -> n1 [5 6] -> (n2 [7 8] continuing in block 0, n3 [9 9] in block 1)."""
    return [ev.BlockAlloc([0, 1]),
            ev.NodeCreated(1, 0, 0, tokens(5, 6), [0], shared_first=False),
            ev.NodeCreated(2, 1, 2, tokens(7, 8), [0], shared_first=True),
            ev.NodeCreated(3, 1, 2, tokens(9, 9), [1], shared_first=False)]


@sync
async def test_selection_follows_a_merge_and_clears_on_evict_and_reset() -> None:
    src = ManualSource(64)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        src.push(_two_children())
        await wait_until(pilot, lambda: len(app.tree_pane.rows) == 4)
        await pilot.press("down")  # n1
        await wait_until(pilot, lambda: app.view.selection is not None)
        assert app.tree_pane.border_subtitle == "n1: 2 tok @0 b0 r0 · not a victim yet"
        src.push([ev.Evict(3, 2, [1]), ev.Merge(1, 2, 0)])
        await wait_until(pilot, lambda: app.view.node_count == 1)
        assert app.messages[-1] == "n1 merged into n2: selection follows"
        assert app.tree_pane.border_subtitle == "n2: 4 tok @0 b0 r0 · LRU #1"
        assert app.blocks.drawn()[Cell.SELECTED] == 1
        src.push([ev.Evict(2, 4, [0])])
        await wait_until(pilot, lambda: app.view.node_count == 0)
        assert app.messages[-1] == "n2 was evicted at seq 3: selection cleared"
        assert (app.tree_pane.border_subtitle, app.view.selection) == ("", None)
        src.push(_two_children())
        await wait_until(pilot, lambda: app.view.node_count == 3)
        await pilot.press("home", "down", "down")  # n2
        await wait_until(pilot, lambda: app.view.selection is not None)
        src.push([ev.Reset()])
        await wait_until(pilot, lambda: app.view.node_count == 0)
        assert app.messages[-1] == "n2 left when the cache was reset at seq 5: selection cleared"
        assert app.blocks.drawn() == {**dict.fromkeys(Cell, 0), Cell.FREE: 64}


# -- the engine's counters -------------------------------------------------------------------


@sync
async def test_the_engines_counters_are_shown_since_start_then_since_reset() -> None:
    src = ManualSource(64)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        src.push([ev.RequestStart(0, 100, 98)])  # what this inspector saw: 98.0%
        await wait_until(pilot, lambda: app.view.stats.requests == 1)
        assert "hit 98.0%" in str(app.panes.header.render())
        assert app.panes.of(StatsPane).border_title == "stats · seen here"
        src.push([counters()])
        await wait_until(pilot, lambda: app.view.counters is not None)
        assert "hit 78.3%" in str(app.panes.header.render())
        assert app.panes.of(StatsPane).border_title == "stats · since engine start"
        assert app.panes.of(StatsPane).rows()[:4] == [
            ("hit rate", "78.3%"), ("prefill saved", "7,830 tok"), ("requests", "64 (0 done/s)"),
            ("waiting/running", "2 / 4")]
        src.push([counters(generation=3, paused=True)])
        stats = app.panes.of(StatsPane)
        await wait_until(pilot, lambda: stats.border_title == "stats · since reset 3")
        # pause stops admission: the 4 running requests still step, and the header says so
        assert "⏸ admission paused, 4 running  hit" in str(app.panes.header.render())
        src.push([msgspec.structs.replace(counters(generation=3, paused=True), running=0)])
        await wait_until(pilot, lambda: "⏸ paused  hit" in str(app.panes.header.render()))
        src.reply = cmd.Ok("system: 55 requests queued (engine paused) (synthetic)",
                           {"requests": 55})
        await type_line(pilot, "system 50")
        await wait_until(pilot, lambda: app.replies == 1)
        assert app.messages[-1] == ("✓ system: 55 requests queued (engine paused) (synthetic); "
                                    "50 users' first questions + 5 second questions")


@sync
async def test_a_fault_shows_a_banner() -> None:
    src = ManualSource(64)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        assert app.panes.fault.display is False
        src.push([ev.Fault("engine-step", "ZeroDivisionError: division by zero")])
        await wait_until(pilot, lambda: app.panes.fault.display)
        assert str(app.panes.fault.render()).strip() == (
            "✗ the engine's engine-step thread died: ZeroDivisionError: division by zero "
            "— it no longer serves; its log has the traceback")


def _clean_pass(rec: Recording, upto: int) -> Mirror:
    m = Mirror()
    m.load_snapshot(rec.keyframes[0][1])
    for b in rec.batches[:upto]:
        m.apply_batch(b)
    return m


@sync
async def test_replay_counters_at_the_playhead_equal_a_clean_pass() -> None:
    rec = Recording(name="t.rcx")
    feed, src = Feed(), local(1024, rec)
    src.keyframe_every = 2
    src.start(feed)
    src.send(cmd.StartWorkload("fork", ["6"]))
    src.send(cmd.StartWorkload("tot", ["1", "3"]))
    while not src.idle():
        await __import__("asyncio").sleep(0.01)
    src.stop()
    app = app_for(ReplaySource(rec))
    async with app.run_test(size=SIZE) as pilot:
        for key in ("full_stop",) * 5 + ("comma", "comma", "full_stop", "less_than_sign",
                                         "greater_than_sign", "full_stop"):
            await pilot.press(key)
            at = app.source.position().index  # type: ignore[attr-defined]
            want = _clean_pass(rec, at).stats
            got = app.feed.mirror.stats
            fields = ("requests", "prompt_tokens", "hit_tokens", "splits", "evictions")
            assert [getattr(got, f) for f in fields] == [getattr(want, f) for f in fields], at
        assert dataclasses.replace(app.feed.mirror.stats, events=0, digest_checks=0) == \
            dataclasses.replace(_clean_pass(rec, at).stats, events=0, digest_checks=0)


# -- the block map at a glance ---------------------------------------------------------------


def test_cells_of_k_blocks_show_density_and_dominant_state() -> None:
    cells = bytes([Cell.CACHED, Cell.CACHED, Cell.FREE, Cell.FREE,
                   Cell.PINNED, Cell.FREE, Cell.FREE, Cell.FREE,
                   Cell.FREE, Cell.EVICTED, Cell.FREE, Cell.FREE,
                   Cell.SHARED, Cell.COW, Cell.COW, Cell.SHARED])
    codes = cell_codes(cells, 4)
    assert [(Cell(c >> 3).name, int(c & 7)) for c in codes] == [
        ("CACHED", 2), ("PINNED", 1), ("EVICTED", 0), ("COW", 4)]  # a tie goes to COW
    assert [int(c) >> 3 for c in cell_codes(cells, 1)] == list(cells)


@sync
async def test_a_big_pool_fits_the_map_and_z_zooms_to_one_cell_per_block() -> None:
    src = ManualSource(8192)
    app = app_for(src)
    async with app.run_test(size=(80, 24)) as pilot:
        src.push([ev.BlockAlloc(list(range(25))),
                  ev.NodeCreated(1, 0, 0, tokens(*range(1, 400)), list(range(25)),
                                 shared_first=False)])
        await wait_until(pilot, lambda: app.view.used_blocks == 25)
        bm = app.blocks
        k = bm.per_cell
        assert (bm.size.height > 0, k * bm.size.width * bm.size.height >= 8192) == (True, True)
        assert bm.legend()[0][0] == f"1 cell = {k:,} blocks (z: 1 per block)"
        assert bm.virtual_size.height == bm.size.height  # no scrolling: the whole pool shows
        bm.focus()
        await pilot.press("z")
        assert (bm.per_cell, bm.virtual_size.height) == (1, -(-8192 // bm.size.width))
        assert bm.drawn()[Cell.CACHED] == 25


# -- words -----------------------------------------------------------------------------------


def test_event_lines_say_what_their_numbers_are() -> None:
    assert describe(ev.Split(1446, 255, 1500, [1], [1, 2])) == (
        "n1446 after its first 255 tok → prefix n1500")
    assert describe(ev.NodeCreated(7, 2, 259, tokens(1, 2, 3), [4], shared_first=False)) == (
        "n7 under n2, 3 tok from position 259")


def test_a_dropped_tree_is_unlinked_so_it_is_freed_without_the_collector() -> None:
    """``gc.freeze`` keeps the cyclic collector off the live tree; a tree dropped by a reset,
    seek or resync must then not be a cycle, or it would stay pinned."""
    src, feed = ManualSource(64), Feed()
    src.start(feed)
    src.push(_two_children())
    old = list(feed.mirror.nodes.values())
    gc.disable()
    try:
        src.push([ev.Reset()])
        assert [(n.parent, n.children) for n in old] == [(None, {})] * 4
    finally:
        gc.enable()
    assert np.array_equal(np.array(feed.mirror.ref), np.zeros(64, dtype=np.int64))


@sync
async def test_filter_all_skips_heartbeats_and_event_lines_line_up() -> None:
    src = ManualSource(64)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        src.push([*_two_children(), ev.Watermark(2, 64, 0.92, 0.85),
                  ev.RequestFinish(3502, 16, 1.0)])
        await wait_until(pilot, lambda: app.view.node_count == 3)
        await type_line(pilot, "filter all")
        assert app.messages[-1] == (
            "✓ showing create extend split merge evict cow alloc free rstart rcached rfinish "
            "retract snapshot reset digest fault (heartbeats wm, counters, queue hidden: filter "
            "wm shows them)")
        lines = str(app.panes.of(EventLog).render()).splitlines()
        assert [line.split(" ", 1)[1] for line in lines[-2:]] == [
            "create  n3 under n1, 2 tok from position 2", "rfinish req 3502 +16 tok"]
