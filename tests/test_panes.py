"""A pane is one row of ``inspector.panes.PANES`` and its widget module: the doc's "A new pane"
line says so, and a throwaway pane registered here with nothing else is composed in its place,
styled by its own CSS, bound to its key, in the palette and the help screen, titled and
painted with every frame."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType

from inspector.app import InspectorApp
from inspector.frame import Cell, Frame
from inspector.panes import PANES, Pane, Place, pane_bindings
from inspector.widgets.block_map import cell_class
from inspector.widgets.help import HelpScreen, Key, key_table
from inspector.widgets.pane import Paint, PaneWidget
from radixcache.serving.memory import MemorySource
from tests.helpers.local import LocalSource
from tests.helpers.pilot import T0, NoNvml, sync, type_line, wait_until

ROOT = Path(__file__).resolve().parent.parent
TCSS = (ROOT / "inspector" / "app.tcss").read_text()
DOC = (ROOT / "docs" / "architecture.md").read_text()


class ProbePane(PaneWidget):
    """A pane that keeps every frame it was given and shows the node count."""

    DEFAULT_CSS = "ProbePane { width: 20; border: heavy #ff0000; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.frames: list[Frame] = []

    def paint(self, p: Paint) -> None:
        """Keep the frame; redraw."""
        self.frames.append(p.frame)
        self.refresh()

    def render(self) -> Text:
        """The frame's node count."""
        return Text(f"{self.frames[-1].node_count if self.frames else 0} nodes")


PROBE = Pane(ProbePane, "probe", Place.BOTTOM, "f9", "Probe", "probe pane", "probe")


class ProbedApp(InspectorApp):
    """The inspector with one more pane: its row, and the binding its row makes."""

    PANES = (*PANES, PROBE)
    BINDINGS: ClassVar[list[BindingType]] = [*pane_bindings((PROBE,))]


def test_the_docs_new_pane_line_is_a_row_and_a_widget() -> None:
    line = next(x for x in DOC.splitlines() if x.startswith("- **A new pane**"))
    assert line == ("- **A new pane**: its row in `inspector/panes.py` `PANES` (widget class, "
                    "id, place, key, title) and its `PaneWidget` module in `inspector/widgets/` "
                    "(its `DEFAULT_CSS`, its `paint(Paint)`); `tests/test_panes.py` registers "
                    "one with nothing else.")


def test_each_pane_is_its_own_widget_styled_by_itself() -> None:
    toggles = {b.action: b.key for b in InspectorApp.BINDINGS if isinstance(b, Binding)}
    for p in PANES:
        assert issubclass(p.widget, PaneWidget), p.id
        assert f"{p.widget.__name__} {{" in p.widget.__dict__["DEFAULT_CSS"], p.id
        assert not re.search(rf"^#{p.id} \{{", TCSS, re.M), p.id  # no second place for it
        assert toggles[f"toggle_pane('{p.id}')"] == p.key
    assert "| `F2`…`F7` | show / hide tree, block map, memory, LRU, events, stats |" in key_table()


def test_each_block_state_has_its_colour() -> None:
    for cell in Cell:
        assert f"BlockMap > .{cell_class(cell)} {{" in TCSS, cell


@sync
async def test_a_registered_pane_is_composed_bound_titled_in_help_and_painted() -> None:
    src = LocalSource(64, clock=lambda: T0, memory=MemorySource(nvml=NoNvml()))
    app = ProbedApp(src, flash_s=0, frame_interval=0.02)
    async with app.run_test(size=(200, 50)) as pilot:
        probe = app.query_one("#probe", ProbePane)
        assert probe.parent is not None and probe.parent.id == "bottom"
        assert [w.id for w in app.query_one("#bottom").children] == ["events", "stats", "probe"]
        assert app.panes.widgets[-1] is probe
        assert str(probe.border_title) == "probe pane"
        assert (probe.styles.width is not None and probe.styles.width.value == 20
                and probe.styles.border_top[0] == "heavy")
        await type_line(pilot, "chat 2")
        await wait_until(pilot, lambda: app.replies == 1 and src.idle() and app.caught_up())
        await pilot.pause(0.1)
        assert probe.frames[-1] == app.view and app.view.node_count > 1
        assert str(probe.render()) == f"{app.view.node_count} nodes"
        await pilot.press("escape")
        await pilot.press("f9")
        assert not probe.display
        await pilot.press("f9")
        assert probe.display
        palette = [c.title for c in app.get_system_commands(app.screen)]
        assert "Toggle probe pane" in palette
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert Key("`F2`…`F9`", ("f2", "f3", "f4", "f5", "f6", "f7", "f9"),
                   "show / hide tree, block map, memory, LRU, events, stats, probe"
                   ) in app.screen.key_rows


@sync
async def test_each_pane_is_mounted_with_its_title_and_toggles() -> None:
    src = LocalSource(64, clock=lambda: T0, memory=MemorySource(nvml=NoNvml()))
    app = InspectorApp(src, flash_s=0, frame_interval=0.02)
    async with app.run_test(size=(200, 50)) as pilot:
        for p in PANES:
            widget = app.query_one(f"#{p.id}")
            assert type(widget) is p.widget
            if p.title:
                assert str(widget.border_title).startswith(p.title)  # + figures per frame
            assert widget.display
            await pilot.press(p.key)
            assert not widget.display
            await pilot.press(p.key)
            assert widget.display
