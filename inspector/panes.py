"""The panes of the main screen, one row each: the widget id (also its tcss rule and the
``toggle_pane`` argument), the key that shows or hides it, its footer label, its border title
and the word the help screen uses for it.

The app's key bindings and palette commands, the border titles at mount and the help screen's
key row are made from this table; ``tests/test_panes.py`` checks that each pane has its
widget, its tcss rule and its place in ``paint.Panes``.
"""

from __future__ import annotations

from typing import NamedTuple

from textual.binding import Binding


class Pane(NamedTuple):
    """One pane: ``id``, the toggle ``key``, footer ``label`` (``shown`` there or not),
    border ``title`` (empty: the widget sets its own) and the ``word`` help uses."""

    id: str
    key: str
    label: str
    title: str
    word: str
    shown: bool = True


PANES: tuple[Pane, ...] = (
    Pane("tree", "f2", "Tree", "tree", "tree"),
    Pane("blocks", "f3", "Blocks", "block map", "block map"),
    Pane("memory", "f4", "Memory", "memory", "memory"),
    Pane("lru", "f5", "LRU", "LRU queue (next out)", "LRU"),
    Pane("events", "f6", "Events", "", "events"),
    Pane("stats", "f7", "Stats", "stats", "stats", shown=False),
)


def pane_bindings() -> list[Binding]:
    """One ``toggle_pane`` binding per pane."""
    return [Binding(p.key, f"toggle_pane('{p.id}')", p.label, show=p.shown) for p in PANES]


def help_row() -> tuple[str, tuple[str, ...], str]:
    """The help screen's row for the pane keys: as shown, the keys, what they do."""
    shown = f"`{PANES[0].key.upper()}`…`{PANES[-1].key.upper()}`"
    return shown, tuple(p.key for p in PANES), "show / hide " + ", ".join(p.word for p in PANES)
