"""The LRU pane: the next eviction victims in order, with size and age, from the frame."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from inspector.frame import EMPTY, Frame
from inspector.layout import human_count


class LruPane(Widget):
    """Rank, node, tokens, age (victims are unpinned by definition); the selected node's row
    is marked. One line per victim, never wrapped."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.frame = EMPTY

    @property
    def victims(self) -> list[int]:
        """Node ids in eviction order, as drawn."""
        return [v.id for v in self.frame.lru]

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
