"""The block map: one cell per physical block, colored by its state, drawn line by line.

Each screen row covers ``width`` consecutive blocks. Rows are cached as strips and only the
rows holding blocks that changed (``invalidate``) are redrawn.
"""

from __future__ import annotations

from enum import Enum

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from inspector.feed import Feed


class BlockState(Enum):
    """What a cell shows, in drawing priority order."""

    SELECTED = ("█", "#ffffff", "selected node")
    LOCKED = ("█", "#ffb347", "locked")
    COW = ("◆", "#c792ea", "COW copy")
    SHARED = ("█", "#4fc3f7", "shared")
    CACHED = ("█", "#3d8b5a", "cached")
    EVICTED = ("░", "#e06c75", "just evicted")
    FREE = ("·", "#4c566a", "free")

    @property
    def style(self) -> Style:
        """The cell's color."""
        return Style(color=self.value[1])


def legend() -> list[tuple[str, Style]]:
    """(``"█ cached"``, style) pairs for the legend line."""
    return [(f"{s.value[0]} {s.value[2]}", s.style) for s in BlockState]


class BlockMap(ScrollView, can_focus=True):
    """The pool as a grid of cells; ``selected`` blocks draw white."""

    def __init__(self, feed: Feed, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.feed = feed
        self.selected: set[int] = set()
        self.locked: set[int] = set()
        self.evicted: dict[int, float] = {}
        self._rows: dict[int, Strip] = {}
        self._width = 0
        self.rows_drawn = 0

    @property
    def per_row(self) -> int:
        """Blocks per screen row."""
        return max(1, self.size.width)

    def state(self, b: int) -> BlockState:
        """The state a block is drawn in."""
        m = self.feed.mirror
        ref = m.ref[b] if b < len(m.ref) else 0
        if b in self.selected:
            return BlockState.SELECTED
        if ref == 0:
            return BlockState.EVICTED if b in self.evicted else BlockState.FREE
        if b in self.locked:
            return BlockState.LOCKED
        if b in m.cow_blocks:
            return BlockState.COW
        return BlockState.SHARED if ref > 1 else BlockState.CACHED

    def invalidate(self, blocks: set[int] | range) -> None:
        """Forget the cached rows holding ``blocks`` and refresh those on screen."""
        w = self.per_row
        rows = {b // w for b in blocks}
        for r in rows:
            self._rows.pop(r, None)
        top, h = self.scroll_offset.y, self.size.height
        for r in rows:
            if top <= r < top + h:
                self.refresh_lines(r)

    def invalidate_all(self) -> None:
        """Redraw every row (resize, new pool, new selection)."""
        self._rows.clear()
        n = self.feed.mirror.num_blocks
        self.virtual_size = Size(self.size.width, (n + self.per_row - 1) // self.per_row)
        self.refresh()

    def on_resize(self) -> None:
        """Cells per row follow the width."""
        self.invalidate_all()

    def render_line(self, y: int) -> Strip:
        """Screen row ``y``: its cached strip, built on first use."""
        r = self.scroll_offset.y + y
        if self._width != self.size.width:
            self._width = self.size.width
            self._rows.clear()
        strip = self._rows.get(r)
        if strip is None:
            strip = self._rows[r] = self._build(r)
        return strip

    def _build(self, r: int) -> Strip:
        self.rows_drawn += 1
        w = self.per_row
        lo, hi = r * w, min((r + 1) * w, self.feed.mirror.num_blocks)
        segs: list[Segment] = []
        run: list[str] = []
        prev: BlockState | None = None
        for b in range(lo, hi):
            s = self.state(b)
            if s is not prev and run:
                segs.append(Segment("".join(run), prev.style if prev else None))
                run = []
            run.append(s.value[0])
            prev = s
        if run and prev is not None:
            segs.append(Segment("".join(run), prev.style))
        return Strip(segs).adjust_cell_length(self.size.width)
