"""The LRU pane: the next eviction victims in order, with size, age and lock count."""

from __future__ import annotations

import heapq

from rich.text import Text
from textual.widget import Widget

from inspector.feed import Feed
from inspector.layout import human_age, human_count
from radixcache.wire.mirror import Mirror, MirrorNode


def next_victims(mirror: Mirror, limit: int) -> list[MirrorNode]:
    """The same order as ``Mirror.lru`` (unlocked leaves by (clock, id)) in O(n log k), reading
    the node table as one atomic copy so the ingest thread may keep applying."""
    root = mirror.root
    leaves = [n for n in list(mirror.nodes.values())
              if not n.children and n.lock == 0 and n is not root]
    return heapq.nsmallest(limit, leaves, key=lambda n: (n.clock, n.id))


class LruPane(Widget):
    """Rank, node, tokens, age; the selected node's row is marked."""

    def __init__(self, feed: Feed, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.feed = feed
        self.victims: list[MirrorNode] = []
        self.selected: int | None = None

    def set_victims(self, victims: list[MirrorNode]) -> None:
        """Show this order."""
        self.victims = victims
        self.refresh()

    def rank_of(self, node_id: int) -> int | None:
        """1-based place of ``node_id`` in the shown queue."""
        for i, n in enumerate(self.victims):
            if n.id == node_id:
                return i + 1
        return None

    def render(self) -> Text:
        """One line per victim."""
        if not self.victims:
            return Text("nothing evictable", style="dim")
        out = Text()
        now = self.feed.now()
        for i, n in enumerate(self.victims[: max(1, self.size.height)]):
            at = self.feed.access_time(n.clock)
            age = human_age(None if at is None else now - at)
            line = f"{i + 1:>2} n{n.id:<6} {human_count(n.num_tokens):>6} tok {age:>4} r{n.lock}"
            style = "reverse bold" if n.id == self.selected else ""
            out.append(line + "\n", style)
        out.rstrip()
        return out
