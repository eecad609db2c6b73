"""The panes of the main screen, one row each; a pane is its row here and its widget module.

A row names the widget class (a ``PaneWidget``: made with its id alone, styled by its own
``DEFAULT_CSS``, drawn by ``paint``), its id (its ``#id`` and the ``toggle_pane`` argument),
where it sits (``Place``), the key that shows or hides it, its footer label, its border title
and the word the help screen uses for it. The app composes the panes from this table, binds
their keys, lists them in the palette, titles them at mount and paints each from the frame
in this order; the help screen's key row is made from it (``tests/test_panes.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import NamedTuple

from textual.binding import Binding

from inspector.widgets.block_map import BlockMap
from inspector.widgets.event_log import EventLog
from inspector.widgets.lru import LruPane
from inspector.widgets.memory import MemoryPane
from inspector.widgets.pane import PaneWidget
from inspector.widgets.stats import StatsPane
from inspector.widgets.tree_view import TreeView


class Place(Enum):
    """The container a pane sits in (its id in ``InspectorApp.compose``)::

        main:  [ tree | right: [ block map ] ]
                      |        [ lower: memory | LRU ]
        bottom: [ events | stats ]
    """

    MAIN = "main"
    RIGHT = "right"
    LOWER = "lower"
    BOTTOM = "bottom"


class Pane(NamedTuple):
    """One pane: its ``widget`` class, ``id``, ``place``, the toggle ``key``, footer
    ``label`` (``shown`` there or not), border ``title`` (empty: the widget sets its own) and
    the ``word`` help uses."""

    widget: type[PaneWidget]
    id: str
    place: Place
    key: str
    label: str
    title: str
    word: str
    shown: bool = True


PANES: tuple[Pane, ...] = (
    Pane(TreeView, "tree", Place.MAIN, "f2", "Tree", "tree", "tree"),
    Pane(BlockMap, "blocks", Place.RIGHT, "f3", "Blocks", "block map", "block map"),
    Pane(MemoryPane, "memory", Place.LOWER, "f4", "Memory", "memory", "memory"),
    Pane(LruPane, "lru", Place.LOWER, "f5", "LRU", "LRU queue (next out)", "LRU"),
    Pane(EventLog, "events", Place.BOTTOM, "f6", "Events", "", "events"),
    Pane(StatsPane, "stats", Place.BOTTOM, "f7", "Stats", "stats", "stats", shown=False),
)


def make(panes: Sequence[Pane], place: Place) -> list[PaneWidget]:
    """The widgets of the ``panes`` at ``place``, in the table's order, titled."""
    out = []
    for pane in panes:
        if pane.place is place:
            widget = pane.widget(id=pane.id)
            if pane.title:
                widget.border_title = pane.title
            out.append(widget)
    return out


def pane_bindings(panes: Sequence[Pane] = PANES) -> list[Binding]:
    """One ``toggle_pane`` binding per pane."""
    return [Binding(p.key, f"toggle_pane('{p.id}')", p.label, show=p.shown) for p in panes]


def help_row(panes: Sequence[Pane] = PANES) -> tuple[str, tuple[str, ...], str]:
    """The help screen's row for the pane keys: as shown, the keys, what they do."""
    shown = f"`{panes[0].key.upper()}`…`{panes[-1].key.upper()}`"
    return shown, tuple(p.key for p in panes), "show / hide " + ", ".join(p.word for p in panes)
