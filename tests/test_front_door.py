"""The front door at 80x24: what a new user meets with every key and command of the README
(issue 38). Each test failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.app import InspectorApp
from inspector.why_screen import WhyScreen
from inspector.widgets.command_line import CommandLine
from inspector.widgets.event_log import EventLog
from radixcache.core import events as ev
from radixcache.wire import commands as cmd
from tests.helpers.local import LocalSource
from tests.helpers.pilot import ManualSource, app_for, sync, wait_until

SIZE = (80, 24)


async def _served(pilot, app: InspectorApp, src: object, line: str) -> None:  # type: ignore[no-untyped-def]
    """Type ``line`` after ``:`` and wait until its workload is served and on screen."""
    await pilot.press("colon", *line, "enter")
    await wait_until(pilot, lambda: app.replies >= 1 and src.idle()  # type: ignore[attr-defined]
                     and app.caught_up(), timeout=20)


@sync
async def test_after_a_command_the_next_colon_opens_a_new_one() -> None:
    """A sent command hands the focus back to the tree, so ``:fork 2`` typed next is the
    command ``fork 2`` (it was ``::fork 2``: "unknown command ':fork'")."""
    src = LocalSource(256)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("colon", *"chat 2", "enter")
        await wait_until(pilot, lambda: app.replies == 1)
        assert app.focused is app.tree_pane
        await pilot.press("colon", *"fork 2")
        line = app.query_one("#command", CommandLine)
        assert (app.focused, line.value) == (line, "fork 2")
        await pilot.press("colon")  # a second ``:`` on an empty line is not text either
        line.value = ""
        await pilot.press("colon", *"stats")
        assert line.value == "stats"


@sync
async def test_escape_from_the_why_dialog_returns_to_the_tree() -> None:
    app = app_for(LocalSource(256))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("colon", *"why 0", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, WhyScreen))
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, WhyScreen))
        assert app.focused is app.tree_pane
        await pilot.press("colon", *"stats")
        assert app.query_one("#command", CommandLine).value == "stats"


@sync
async def test_showing_the_events_or_stats_pane_leaves_the_focus_on_the_tree() -> None:
    app = app_for(LocalSource(256))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.focused is app.tree_pane
        for key in ("f6", "f6", "f7", "f7"):  # hide, show the events; show, hide the stats
            await pilot.press(key)
            assert app.focused is app.tree_pane, key
        await pilot.press("f2")  # the tree hides: the block map takes the focus ...
        assert app.focused is app.blocks
        await pilot.press("f2")  # ... and the tree takes it back
        assert app.focused is app.tree_pane


@sync
async def test_e_then_enter_explains_the_newest_finished_request() -> None:
    src = LocalSource(256)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        await _served(pilot, app, src, "chat 2")
        log = app.panes.of(EventLog)
        finished = [e.event.req for e in log.kept if isinstance(e.event, ev.RequestFinish)]
        assert len(finished) >= 2 and log.kept[-1].kind != "rfinish"  # newest: not a request
        await pilot.press("e")
        assert app.focused is log and log.selected is not None
        assert isinstance(log.selected.event, ev.RequestFinish)
        assert log.selected.event.req == finished[-1]
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, WhyScreen))
        assert isinstance(app.screen, WhyScreen) and app.screen.req == finished[-1]


def _screen(app: object) -> list[str]:
    return [s.text for s in app.screen._compositor.render_strips()]  # type: ignore[attr-defined]


@sync
async def test_a_long_reply_wraps_instead_of_being_cut_at_the_width() -> None:
    src = ManualSource()
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("colon", *"bogus", "enter")
        await pilot.pause()
        text = " ".join(line.strip() for line in _screen(app)).replace("  ", " ")
        assert ("✗ unknown command 'bogus' (commands: chat evict filter flood fork help "
                "pause quit reset resume schedule snapshot stats system tot watermark why) "
                "— nothing sent") in text
        src.reply = cmd.Ok("reset: the cache is empty (3 requests cancelled, 12 waiting "
                           "dropped); the selection and the what-if curve start over")
        await pilot.press("colon", *"reset", "enter")
        await wait_until(pilot, lambda: app.replies == 1)
        await pilot.pause()
        text = " ".join(line.strip() for line in _screen(app))
        assert ("the selection and the what-if curve start over") in text


def test_record_says_its_device_default_and_schedules_as_the_demo(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.cmd_demo import DEMO_SCHEDULE
    from cli.main import app
    from radixcache.wire.recording import RecordingReader

    helped = CliRunner().invoke(app, ["record", "--help"], terminal_width=200)
    words = " ".join(helped.stdout.replace("│", " ").split())
    assert "Headless torch device (default: cuda when present, else cpu)." in words
    out = tmp_path / "r.rcx"
    done = CliRunner().invoke(app, ["record", "--requests", "4", "--blocks", "256",
                                    "--device", "cpu", "--out", str(out)])
    assert done.exit_code == 0, done.output
    with RecordingReader(out) as r:
        assert r.header.config["schedule"] == DEMO_SCHEDULE.value == "dfs-weight"


@sync
async def test_a_paused_engine_with_nothing_running_shows_no_request_rate() -> None:
    """Submissions to a paused engine queue; the header's req/s is what it serves: 0."""
    src = LocalSource(256)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("colon", *"pause", "enter")
        await wait_until(pilot, lambda: app.replies == 1)
        await pilot.press("colon", *"chat 20", "enter")
        await wait_until(pilot, lambda: app.replies == 2 and app.view.counters is not None
                         and app.view.counters.waiting > 0)
        c = app.view.counters
        assert c is not None and (c.paused, c.running, c.finished) == (True, 0, 0)
        assert app.req_per_s == 0.0
        assert " 0 req/s" in str(app.panes.header.render())


@sync
async def test_a_paused_replay_says_paused_and_suggests_the_replay_keys() -> None:
    from inspector.replay import ReplaySource, load_recording

    app = app_for(ReplaySource(load_recording(Path(__file__).parent / "data"
                                              / "schema5-system.rcx")))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        header = str(app.panes.header.render())
        assert "❚❚ replay paused" in header and "▶" not in header  # it starts paused
        line = app.query_one("#command", CommandLine)
        assert "chat" not in line.placeholder and line.placeholder.startswith("p play/pause")


@sync
async def test_a_node_that_left_frames_ago_is_named_with_what_became_of_it() -> None:
    """Rows drawn a moment ago can name a node that already left: the note says how it
    left (it said "the cache was reset or resynced" when neither happened)."""
    from inspector.widgets.tree_view import TreeView
    from tests.helpers.pilot import tokens

    src = ManualSource(64)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        src.push([ev.BlockAlloc([0, 1]),
                  ev.NodeCreated(1, 0, 0, tokens(5, 6), [0], shared_first=False),
                  ev.NodeCreated(2, 1, 2, tokens(7, 8), [0], shared_first=True),
                  ev.NodeCreated(3, 1, 2, tokens(9, 9), [1], shared_first=False)])
        await wait_until(pilot, lambda: app.view.node_count == 3 and app.caught_up())
        src.push([ev.Evict(3, 2, [1])])  # seq 2
        await wait_until(pilot, lambda: app.view.node_count == 2 and app.caught_up())
        app.post_message(TreeView.Selected(3))  # a stale row's node
        await wait_until(pilot, lambda: bool(app.messages))
        assert app.messages[-1] == "n3 was evicted at seq 2: selection cleared"
        app.post_message(TreeView.Selected(9))  # never seen here
        await wait_until(pilot, lambda: len(app.messages) == 2)
        assert app.messages[-1] == ("n9 is not in the tree (it left before the inspector "
                                    "could see how): selection cleared")


@sync
async def test_why_of_a_request_that_fell_out_of_the_history_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from radixcache.analysis import misses

    monkeypatch.setattr(misses, "KEEP_REQUESTS", 4)  # the history keeps 4 requests
    src = LocalSource(256)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        await _served(pilot, app, src, "chat 4")
        with app.feed.lock:
            history = app.feed.follow.misses
            kept = sorted(history.whys)
            admitted = history.forgotten.get(0)
        assert len(kept) == 4 and 0 not in kept and admitted is not None
        await pilot.press("colon", *"why 0", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, WhyScreen))
        assert isinstance(app.screen, WhyScreen)
        assert [line.text for line in app.screen.lines] == [
            f"request 0: admitted in batch {admitted:,}, it fell out of the history, which "
            "keeps the newest 4 requests"]


def test_a_late_joiners_curve_says_it_starts_cold_and_the_curve_is_no_ceiling() -> None:
    """An inspector that joins a warm engine: the what-if screen says its curve starts from
    an empty cache; under a reordering schedule the engine can beat the arrival-order LRU
    curve, and the headline says why instead of reading as a ceiling."""
    import asyncio

    from inspector.app import InspectorApp
    from inspector.live import LiveSource
    from inspector.whatif_screen import WhatIfScreen, headline
    from inspector.widgets.command_line import parse
    from radixcache.serving.driver import TreeDriver
    from radixcache.serving.server import Server, ServerConfig
    from radixcache.wire.endpoints import Endpoints, free_ports

    server = Server(TreeDriver(512), Endpoints.tcp("127.0.0.1", free_ports(3)),
                    ServerConfig(num_blocks=512)).start()
    source = LiveSource(server.publisher.endpoints.events)
    warm = parse("chat 3 --seed 1").command
    assert warm is not None and isinstance(source.send(warm), cmd.Ok)  # before the join
    import time

    deadline = time.monotonic() + 20
    while server.loop.service.busy():  # served (and cached) before the inspector joins
        assert time.monotonic() < deadline, "the warm-up workload did not finish"
        time.sleep(0.01)

    async def run() -> None:
        app = InspectorApp(source, flash_s=0, frame_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.feed.seq >= 0 and not server.loop.service.busy(),
                             timeout=20)
            nodes = app.feed.follow.joined_nodes
            joined = app.feed.follow.since
            assert nodes == len(app.feed.mirror.nodes) - 1 > 0  # it joined a warm cache
            await pilot.press("colon", *"chat 3 --seed 2", "enter")
            await wait_until(pilot, lambda: app.replies == 1)
            await wait_until(pilot, lambda: not server.loop.service.busy()
                             and app.feed.seq >= server.publisher.seq, timeout=20)
            await pilot.press("w")
            await wait_until(pilot, lambda: isinstance(app.screen, WhatIfScreen)
                             and app.screen.view is not None
                             and app.screen.view.curve.requests > 0)
            assert isinstance(app.screen, WhatIfScreen) and app.screen.view is not None
            view = app.screen.view
            text = headline(view)
            assert (f"the curve starts cold at seq {joined:,}: the inspector joined when the "
                    f"engine already cached {nodes:,} nodes, so the first requests count "
                    "misses the engine did not have") in text
            assert "arrival-order LRU curve " in text and "curve predicts" not in text
            beaten = view._replace(schedule="dfs-weight", measured_hits=view.measured_prompt)
            assert ("engine measured 100.00% (batched): dfs-weight reorders the queue, so it "
                    "can beat the arrival order\n") in headline(beaten)

    try:
        asyncio.run(run())
    finally:
        server.close()


@sync
async def test_after_a_resize_every_row_is_drawn_for_the_new_width() -> None:
    """Rows drawn at 80 columns and then at 120: each row's preview is the one a fresh draw
    at 120 makes (rows drawn narrow kept 5-character previews beside rows with 17)."""
    from inspector.widgets.tree_view import TreeView

    src = LocalSource(1024)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        await _served(pilot, app, src, "tot 2 3")
        tree = app.query_one(TreeView)
        narrow = [tree.render_line(y).text for y in range(len(tree.rows))]
        await pilot.resize_terminal(120, 40)
        await wait_until(pilot, lambda: tree.size.width > 50)
        await pilot.pause()
        wide = [tree.render_line(y).text for y in range(len(tree.rows))]
        tree.forget_previews()
        fresh = [tree.render_line(y).text for y in range(len(tree.rows))]
        assert len(fresh) == 14 and wide != narrow
        assert wide == fresh


@sync
async def test_while_the_dataset_words_load_the_status_line_says_so() -> None:
    """The first launch builds the ShareGPT words' cache (up to a minute): the message line
    says what the previews wait for, then that the words are in."""
    import threading

    from inspector.app import WORDS_LOADING
    from inspector.sources import DatasetWords
    from tests.helpers.pilot import tokens

    gate = threading.Event()

    class GatedWords(DatasetWords):
        """The real loader, started only when the test opens ``gate`` (a slow first load)."""

        def _load(self) -> None:
            gate.wait(30)
            super()._load()

    src = ManualSource(64)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        words = GatedWords()
        app.tree_pane.vocab = words
        src.push([ev.BlockAlloc([0]),
                  ev.NodeCreated(1, 0, 0, tokens(66269, 66270), [0], shared_first=False)])
        await wait_until(pilot, lambda: app.messages == [f"… {WORDS_LOADING}"])
        screen = " ".join(" ".join(line.split()) for line in _screen(app))
        assert "… loading ShareGPT words for previews (the first launch builds their cache, " \
               "up to a minute); until then a preview shows token ids" in screen
        gate.set()
        await wait_until(pilot, lambda: len(app.messages) == 2, timeout=30)
        assert app.messages[-1] in (
            "✓ ShareGPT words loaded: previews show text",
            f"✗ no ShareGPT words ({words.error}): previews show token ids")


def test_bench_cli_names_the_figures_past_their_targets() -> None:
    from radixcache.tools.bench_cli import CliFigures, over_target

    met = CliFigures(0.09, 0.447, 65.0, 500, 0.5, 2.6, 7.5, 0.48, True, 3.0, 2.1, True)
    assert over_target(met) == ()
    slow = met._replace(tree_s=0.73, demo_first_frame_s=3.2, quit_s=-1.0)
    assert over_target(slow) == ("tree_s", "demo_first_frame_s", "quit_s")


def test_tree_text_draws_the_guides_of_tree_1_in_plain_text() -> None:
    from cli.cmd_tree import tree_text
    from radixcache.wire.mirror import Mirror
    from tests.helpers.pilot import tokens

    m = Mirror()
    m.load_snapshot(ev.Snapshot(16, 8, [
        ev.NodeState(0, -1, 0, b"", [], 0, 0),
        ev.NodeState(1, 0, 0, tokens(1, 2), [0], 0, 0),
        ev.NodeState(2, 1, 2, tokens(3), [0], 0, 0),
        ev.NodeState(4, 2, 3, tokens(4), [0], 0, 0),
        ev.NodeState(3, 0, 0, tokens(7), [1], 0, 0)], 0, 5, [], 0.9, 0.8), 0)
    lines = list(tree_text(m, 10))
    assert [line.split(" [")[0] for line in lines] == [
        "root (4 nodes)",
        "├── n1",
        "│   └── n2",
        "│       └── n4",
        "└── n3"]
    assert lines[1].endswith(" 1 block b0 r0")
    assert [line.split(" [")[0] for line in tree_text(m, 2)] == [  # the limit: 2 nodes
        "root (4 nodes)", "└── n1", "    └── n2"]
