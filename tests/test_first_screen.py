"""What a newcomer sees first and where the cursor is (issue 21): the replay's first screen,
the selected row always on screen, CJK previews that never cut a column."""

from __future__ import annotations

from pathlib import Path

from inspector.app import InspectorApp
from inspector.replay import ReplaySource, load_recording
from inspector.shots import record_demo
from inspector.widgets.stats import StatsPane
from radixcache.core import events as ev
from tests.helpers.pilot import ManualSource, app_for, sync, tokens, wait_until

SIZE = (150, 44)


def _replay(path: Path) -> InspectorApp:
    rec = load_recording(record_demo(path, requests=30))
    return InspectorApp(ReplaySource(rec), flash_s=0, frame_interval=0.02)


@sync
async def test_the_replay_first_screen_labels_what_it_draws(tmp_path: Path) -> None:
    app = _replay(tmp_path / "tot.rcx")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, app.caught_up)
        await pilot.pause(0.2)  # several frames with nothing new: nothing may go stale
        blocks = app.blocks
        k = blocks.per_cell
        legend = str(blocks.border_subtitle)
        assert (f"1 cell = {k:,} blocks" in legend) == (k > 1), (k, legend)
        assert app.panes.of(StatsPane).border_title == "stats · seen here"


def _children(src: ManualSource, n: int, text: list[int] | None = None) -> None:
    """``n`` one-block children of the root (node ids 1..n), first tokens distinct."""
    events: list[ev.AnyEvent] = []
    for i in range(1, n + 1):
        ids = text if text is not None else [100 + i]
        events += [ev.BlockAlloc([i]), ev.NodeCreated(i, 0, 0, tokens(1000 + i, *ids), [i],
                                                       shared_first=False)]
    src.push(events)


def _visible(app: InspectorApp) -> range:
    tree = app.tree_pane
    top = tree.scroll_offset.y
    return range(top, top + tree.scrollable_content_region.height)


@sync
async def test_the_selected_row_is_always_on_screen() -> None:
    src = ManualSource(num_blocks=128)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        _children(src, 51)
        await wait_until(pilot, lambda: len(app.tree_pane.rows) == 52 and app.caught_up())
        tree = app.tree_pane
        await pilot.press("end")
        assert tree.cursor == 51 and tree.cursor in _visible(app)
        await pilot.press("home", "pagedown", "pagedown")
        assert tree.cursor == 40 and tree.cursor in _visible(app)
        await pilot.press("pageup")
        assert tree.cursor == 20 and tree.cursor in _visible(app)


class _Cjk:
    """Preview words two cells wide each (as Chinese or Japanese text is)."""

    def text(self, tokens: object) -> str:
        return "你好世界缓存前缀树" * 4


@sync
async def test_cjk_previews_never_cut_the_right_hand_columns() -> None:
    src = ManualSource(num_blocks=2_400)
    app = app_for(src)
    async with app.run_test(size=(100, 30)) as pilot:
        app.tree_pane.vocab = _Cjk()
        events: list[ev.AnyEvent] = [ev.BlockAlloc([5]), ev.NodeCreated(
            2290, 0, 0, tokens(7, 8, 9), [5], shared_first=False)]
        src.push(events)
        await wait_until(pilot, lambda: len(app.tree_pane.rows) == 2 and app.caught_up())
        tree = app.tree_pane
        rows = {}
        for width in (100, 70, 46, 44):
            await pilot.resize_terminal(width, 30)
            await pilot.pause(0.05)
            line = tree.render_line(1)
            assert line.cell_length == tree.size.width
            rows[tree.size.width] = line.text.rstrip()
        # columns that do not fit go whole (age, blocks, pins, then the id), never cut
        assert rows == {48: '  · [3] "你好世…"  b5           r0    0s n2290',
                        29: '  · [3] "你好…"  r0  n2290',
                        18: '  · [3] "你好…"',
                        17: '  · [3] "你好…"'}


def test_tree_piped_keeps_each_node_on_one_line(tmp_path: Path) -> None:
    """``radixcache tree FILE | grep`` works: no line is wrapped at 80 columns."""
    import re

    from typer.testing import CliRunner

    from cli.main import app

    path = record_demo(tmp_path / "tot.rcx", requests=30)
    result = CliRunner().invoke(app, ["tree", str(path)], terminal_width=80)
    out = result.stdout.splitlines()
    node = re.compile(r"^[│ ]*[├└]── n\d+ \[\d+ tok\] .* r\d+$")
    assert out[0] == "root (30 nodes)"
    assert [line for line in out[1:] if not node.match(line)] == []  # the tree alone
    assert result.stderr == "272 events read\n"  # the count is not part of the tree
    assert max(len(line) for line in out) > 80  # long lines were there to be wrapped


def _help_app() -> InspectorApp:
    return app_for(ManualSource(num_blocks=64))


def test_snapshot_help_at_80x24(snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.press("question_mark")

    assert snap_compare(_help_app(), terminal_size=(80, 24), run_before=run_before)


@sync
async def test_help_at_80x24_shows_no_backtick_and_scrolls_to_its_end() -> None:
    app = _help_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause(0.05)

        def screen() -> str:
            return "\n".join(s.text for s in app.screen._compositor.render_strips())

        assert "`" not in screen()
        assert "radixcache inspector" in screen() and "Press esc to close" not in screen()
        await pilot.press("end")
        await pilot.pause(0.05)
        assert "Press esc to close (↑ ↓ scroll when the screen is short)." in screen()
        await pilot.press("escape")
        assert type(app.screen).__name__ == "Screen"


@sync
async def test_z_zooms_the_block_map_while_the_tree_has_the_focus() -> None:
    app = _help_app()
    async with app.run_test(size=SIZE) as pilot:
        assert app.focused is app.tree_pane and not app.blocks.zoomed
        await pilot.press("z")
        assert app.blocks.zoomed and app.blocks.per_cell == 1
        await pilot.press("z")
        assert not app.blocks.zoomed


@sync
async def test_the_reset_reply_stays_on_screen_beside_the_selection_note() -> None:
    from radixcache.wire import commands as cmd
    from tests.helpers.pilot import type_line

    src = ManualSource(num_blocks=64)
    app = app_for(src)
    async with app.run_test(size=SIZE) as pilot:
        _children(src, 2)
        await wait_until(pilot, lambda: len(app.tree_pane.rows) == 3 and app.caught_up())
        await pilot.press("down")  # n1
        await wait_until(pilot, lambda: app.view.selection is not None)
        src.reply = cmd.Ok("reset: the cache is empty (0 requests cancelled)")
        await type_line(pilot, "reset")
        await wait_until(pilot, lambda: app.replies == 1)
        src.push([ev.Reset()])
        note = "n1 left when the cache was reset at seq 2: selection cleared"
        await wait_until(pilot, lambda: app.messages[-1] == note)
        assert str(app.query_one("#message").render()) == (
            f"✓ reset: the cache is empty (0 requests cancelled) · {note}")


def test_the_what_if_headline_of_a_late_joiner_counts_the_engines_finished_requests() -> None:
    from inspector.whatif_screen import View, headline
    from radixcache.analysis.follow import RunningCurve
    from radixcache.wire.mirror import Mirror

    m = Mirror()
    m.counters = ev.Counters(0, 64, 64, 0, 8_000, 6_000, 0, 0, 0, 0, 0, False)
    view = View.of(RunningCurve(m), "since the inspector joined (seq 120)")
    assert headline(view) == (
        "what if: since the inspector joined (seq 120): none of the requests followed from "
        "their start has finished yet (the engine has finished 64, begun before this inspector "
        "joined); the curve grows as they finish")
    m.counters = None
    assert headline(View.of(RunningCurve(m), "x")) == (
        "what if: x: no request has finished yet; the curve grows as they finish")
