"""Each pane of ``inspector.panes.PANES`` has its widget, its tcss rule, its key, its place in
the painter's ``Panes`` and its words in help: the doc's "A new pane" line is this list."""

from __future__ import annotations

import re
from pathlib import Path

from textual.binding import Binding

from inspector.app import InspectorApp
from inspector.frame import Cell
from inspector.paint import Panes
from inspector.panes import PANES
from inspector.widgets.block_map import cell_class
from inspector.widgets.help import key_table
from radixcache.serving.memory import MemorySource
from tests.helpers.local import LocalSource
from tests.helpers.pilot import T0, NoNvml, sync

ROOT = Path(__file__).resolve().parent.parent
TCSS = (ROOT / "inspector" / "app.tcss").read_text()


def test_each_pane_has_a_rule_a_key_and_a_place_in_the_painter() -> None:
    ids = [p.id for p in PANES]
    assert [f for f in Panes._fields if f in ids] == ids
    toggles = {b.action: b.key for b in InspectorApp.BINDINGS if isinstance(b, Binding)}
    for p in PANES:
        assert re.search(rf"^#{p.id} \{{", TCSS, re.M), p.id
        assert toggles[f"toggle_pane('{p.id}')"] == p.key
    assert "| `F2`…`F7` | show / hide tree, block map, memory, LRU, events, stats |" in key_table()


def test_each_block_state_has_its_colour() -> None:
    for cell in Cell:
        assert f"BlockMap > .{cell_class(cell)} {{" in TCSS, cell


@sync
async def test_each_pane_is_mounted_with_its_title_and_toggles() -> None:
    src = LocalSource(64, clock=lambda: T0, memory=MemorySource(nvml=NoNvml()))  # type: ignore[arg-type]
    app = InspectorApp(src, flash_s=0, frame_interval=0.02)
    async with app.run_test(size=(200, 50)) as pilot:
        for p in PANES:
            widget = app.query_one(f"#{p.id}")
            if p.title:
                assert str(widget.border_title).startswith(p.title)  # + figures per frame
            assert widget.display
            await pilot.press(p.key)
            assert not widget.display
            await pilot.press(p.key)
            assert widget.display
