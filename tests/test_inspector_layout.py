"""Layouts that fit (snapshots at 80x24, 120x40, 200x50), focus that never gets lost, and the
README's key table against the bindings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inspector.app import InspectorApp
from inspector.widgets.block_map import BlockMap
from inspector.widgets.event_log import EventLog
from inspector.widgets.help import KEYS, key_table
from inspector.widgets.lru import LruPane
from inspector.widgets.stats import StatsPane
from inspector.widgets.tree_view import TreeView
from radixcache.serving.memory import MemorySource
from tests.helpers.local import LocalSource
from tests.helpers.pilot import T0, NoNvml, sync, type_line, wait_until

README = Path(__file__).resolve().parents[1] / "README.md"
SIZES = [(80, 24), (120, 40), (200, 50)]


def _app() -> tuple[InspectorApp, LocalSource]:
    src = LocalSource(1024, clock=lambda: T0, memory=MemorySource(nvml=NoNvml()))  # type: ignore[arg-type]
    return InspectorApp(src, flash_s=0, frame_interval=0.02), src


async def _tot(app: InspectorApp, src: LocalSource, pilot) -> None:  # type: ignore[no-untyped-def]
    await type_line(pilot, "tot 2 3")
    await wait_until(pilot, lambda: app.replies == 1 and src.idle() and app.caught_up())
    await pilot.press("escape", "down", "down")
    await pilot.pause(0.1)


def _lines(app: InspectorApp) -> list[str]:
    return [s.text for s in app.screen._compositor.render_strips()]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_snapshot_after_tot(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    app, src = _app()

    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await _tot(app, src, pilot)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@sync
async def test_80x24_keeps_the_header_and_a_block_map_and_120x40_every_tree_column() -> None:
    app, src = _app()
    async with app.run_test(size=(80, 24)) as pilot:
        await _tot(app, src, pilot)
        assert _lines(app)[0].split() == [
            "radixcache", "─", "embedded", "●", "local", "hit", "87.1%", "blocks", "43/1,024",
            "0", "req/s", "seq", "6"]
        assert app.query_one(BlockMap).size.height == 5  # the tot reply wraps to 2 lines
        await pilot.resize_terminal(120, 40)
        await pilot.pause(0.1)
        tree = app.query_one(TreeView)
        rows = [tree.render_line(y).text for y in range(len(tree.rows))]
        ids = [re.search(r" (n\d+) *$", r) for r in rows[1:]]
        assert [m.group(1) if m else r for m, r in zip(ids, rows[1:], strict=True)] == [
            f"n{r.node.id}" for r in tree.rows[1:]]
        assert all(re.search(r" b[\d,-]+ +r0 +0s n\d+ *$", r) for r in rows[1:])
        lru = app.panes.of(LruPane)
        assert str(lru.render()).splitlines()[0].split() == ["1", "n1", "46", "tok", "0s"]
        stats = app.panes.of(StatsPane)
        assert max(len(f"{a:<16}{b}") for a, b in stats.rows()) <= stats.size.width


@sync
async def test_focus_is_never_lost() -> None:
    app, _ = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f2")  # the tree hides: the block map takes the focus
        assert app.focused is app.query_one(BlockMap)
        await pilot.press("f2")  # back: the tree takes it again
        assert app.focused is app.tree_pane
        await pilot.press("question_mark")
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        assert (type(app.screen).__name__, app.focused) == ("Screen", app.tree_pane)
        await pilot.press("colon")
        assert app.focused is app.query_one("#command")
        assert app.query_one("#command").value == ""  # type: ignore[attr-defined]


def test_readme_key_table_is_the_apps() -> None:
    """The README's key table is the help screen's, and every key in it is bound."""
    text = README.read_text()
    assert key_table() in text
    bound: set[str] = set()
    for cls in (InspectorApp, TreeView, BlockMap, EventLog):
        for b in cls.BINDINGS:
            bound.update(k.strip() for k in b.key.split(","))  # type: ignore[union-attr]
    bound.add("ctrl+p")  # Textual's command palette
    assert {k for key in KEYS for k in key.keys} - bound == set()
    assert bound - {k for key in KEYS for k in key.keys} == set()
