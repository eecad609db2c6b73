"""The LRU pane: the next eviction victims in order, with size and age, from the frame."""

from __future__ import annotations

import heapq

from rich.text import Text
from textual.widget import Widget

from inspector.frame import EMPTY, Frame
from inspector.layout import human_count
from radixcache.wire.mirror import Mirror, MirrorNode


def next_victims(mirror: Mirror, limit: int) -> list[tuple[MirrorNode, int]]:
    """The same order as ``Mirror.lru`` (unpinned leaves by (clock, id)) in O(n log k), with
    each node's clock as read, from one atomic copy of the node table, so the ingest thread may
    keep applying (the frame re-checks each candidate under the lock)."""
    root = mirror.root
    leaves = [(n, n.clock) for n in list(mirror.nodes.values())
              if not n.children and n.lock == 0 and n is not root]
    return heapq.nsmallest(limit, leaves, key=lambda p: (p[1], p[0].id))


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
