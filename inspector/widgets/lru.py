"""The LRU pane: the next eviction victims in order, with size and age, from the frame."""

from __future__ import annotations

from rich.text import Text

from inspector.frame import EMPTY, Frame
from inspector.layout import human_count
from inspector.widgets.pane import Paint, PaneWidget


class LruPane(PaneWidget):
    """Rank, node, tokens, age (victims are unpinned by definition); the selected node's row
    is marked. One line per victim, never wrapped."""

    DEFAULT_CSS = """
    LruPane { width: 1fr; border: round #4c566a; padding: 0 1;
              text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.frame = EMPTY

    @property
    def victims(self) -> list[int]:
        """Node ids in eviction order, as drawn."""
        return [v.id for v in self.frame.lru]

    def on_mount(self) -> None:
        """Twice a second a redraw, so the ages move without new batches."""
        self.set_interval(0.5, self.refresh)

    def paint(self, p: Paint) -> None:
        """Draw the frame's queue."""
        self.show(p.frame)

    def show(self, frame: Frame) -> None:
        """Draw this frame's queue (only when it changed)."""
        old, self.frame = self.frame, frame
        if (old.lru, old.selection) != (frame.lru, frame.selection):
            self.refresh()

    def render(self) -> Text:
        """One line per victim."""
        lru = self.frame.lru
        if not lru:
            return Text("nothing evictable", style="dim")
        sel = self.frame.selection
        out = Text(no_wrap=True, overflow="ellipsis")
        for i, v in enumerate(lru[: max(1, self.size.height)]):
            line = f"{i + 1:>2} n{v.id:<6} {human_count(v.num_tokens):>6} tok {v.age:>4}"
            out.append(line + "\n", "reverse bold" if sel and sel.node.id == v.id else "")
        out.rstrip()
        return out
