"""The block map: the whole pool at a glance, drawn from one ``Frame``.

When the pool has more blocks than the pane has cells, each cell covers ``k`` consecutive
blocks: its glyph says how full they are (``·░▒▓█``) and its colour is their dominant state
(the most frequent used state; ties go to the higher drawing priority). ``z`` zooms to one
cell per block (the pane then scrolls). Colours come from ``app.tcss`` (component classes).
Each screen row is cached as a strip and rebuilt only when its cells changed.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import BindingType
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from inspector.frame import EMPTY, Cell, Frame
from inspector.widgets.pane import Paint, PaneWidget
from inspector.widgets.styled import Styled

NAMES = {Cell.SELECTED: "selected node", Cell.PINNED: "pinned", Cell.COW: "COW copy",
         Cell.SHARED: "shared", Cell.CACHED: "cached", Cell.EVICTED: "just evicted",
         Cell.FREE: "free"}
GLYPH = {Cell.COW: "◆", Cell.EVICTED: "░", Cell.FREE: "·"}  # the others: a full block
DENSITY = "·░▒▓█"  # used fraction of a k-block cell: 0, (0, 1/4], .. (3/4, 1]
# columns in priority order (argmax picks the first of equal counts)
_PRIORITY = [Cell.SELECTED, Cell.PINNED, Cell.COW, Cell.SHARED, Cell.CACHED]


def cell_class(state: Cell) -> str:
    """The component class (``blockmap--cached``) whose tcss rule colours ``state``."""
    return f"blockmap--{state.name.lower()}"


class BlockMap(ScrollView, PaneWidget, can_focus=True):
    """The pool as a grid of cells, from ``show(frame)``."""

    DEFAULT_CSS = """
    BlockMap { height: 1fr; min-height: 3; border: round #4c566a; border-subtitle-align: left; }
    BlockMap:focus { border: round #7fd4ff; }
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {cell_class(s) for s in Cell}
    BINDINGS: ClassVar[list[BindingType]] = []  # z is the app's: it works from every pane

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.frame = EMPTY
        self.zoomed = False
        self.codes = np.zeros(0, dtype=np.uint8)  # per cell: state * 8 + density index
        self._rows: dict[int, Strip] = {}
        self._grid = (0, 0)  # (cells per row, blocks per cell) the strips were built for
        self.rows_drawn = 0
        self.styled = Styled(self)

    def notify_style_update(self) -> None:
        """The stylesheet changed: look the colours up again and redraw."""
        super().notify_style_update()
        self.styled.clear()
        self._rows.clear()
        self._show_legend()  # in the new colours

    @property
    def per_cell(self) -> int:
        """Blocks per cell: 1 when zoomed or when the pool fits, else enough to fit it."""
        cells = max(1, self.size.width) * max(1, self.size.height)
        n = self.frame.num_blocks
        return 1 if self.zoomed or n <= cells else -(-n // cells)

    def legend(self) -> list[tuple[str, str]]:
        """(text, component class) pairs for the legend line, with the cell size."""
        k = self.per_cell
        out = [(f"{GLYPH.get(s, '█')} {NAMES[s]}", cell_class(s)) for s in reversed(Cell)]
        if k > 1:
            out.insert(0, (f"1 cell = {k:,} blocks (z: 1 per block)", cell_class(Cell.FREE)))
        return out

    def _show_legend(self) -> None:
        self.border_subtitle = Text.assemble(
            *[(f"{t}  ", self.styled(c)) for t, c in self.legend()])

    def paint(self, p: Paint) -> None:
        """Draw the frame's cells; the title counts the used blocks."""
        self.show(p.frame)
        self.border_title = f"block map {p.frame.used_blocks:,}/{p.frame.num_blocks:,}"

    def show(self, frame: Frame) -> None:
        """Draw ``frame``: recompute the cells and redraw the rows whose cells changed."""
        old, self.frame = self.frame, frame
        grid = (self._width(), self.per_cell)
        if frame.cells is old.cells and self._grid == grid:
            return
        if frame.changed is not None and self._grid == grid and len(old.cells) == len(
                frame.cells):
            self._recode_blocks(frame.changed)
        else:
            self._recode()

    def _width(self) -> int:
        return max(1, self.size.width)

    def _recode(self) -> None:
        w, k = self._width(), self.per_cell
        codes = cell_codes(self.frame.cells, k)
        if self._grid[1] != k or not self.border_subtitle:
            self._show_legend()  # the cell size it names is the one drawn from now on
        same_grid = self._grid == (w, k) and len(codes) == len(self.codes)
        changed = np.nonzero(codes != self.codes)[0] if same_grid else None
        self.codes, self._grid = codes, (w, k)
        rows = (len(codes) + w - 1) // w
        if changed is None:
            self._rows.clear()
            self.virtual_size = Size(w, rows)
            self._scroll_update(self.virtual_size)  # zoomed in after the first layout too
            self.refresh()
            return
        top, h = self.scroll_offset.y, self.size.height
        for r in {int(c) // w for c in changed}:
            self._rows.pop(r, None)
            if top <= r < top + h:
                self.refresh_lines(r)

    def _recode_blocks(self, blocks: frozenset[int]) -> None:
        """Recompute only the cells holding ``blocks`` (a frame usually touches a few)."""
        if not blocks:
            return
        w, k = self._grid
        touched = sorted({b // k for b in blocks if b // k < len(self.codes)})
        cells = np.array(touched, dtype=np.int64)
        states = np.frombuffer(self.frame.cells, dtype=np.uint8)
        lo = cells * k
        idx = np.minimum(lo[:, None] + np.arange(k), len(states) - 1)
        part = states[idx]
        part[lo[:, None] + np.arange(k) >= len(states)] = Cell.FREE  # past the pool's end
        new = cell_codes(part.tobytes(), k)
        moved = cells[new != self.codes[cells]]
        self.codes[cells] = new
        top, h = self.scroll_offset.y, self.size.height
        for r in {int(c) // w for c in moved}:
            self._rows.pop(r, None)
            if top <= r < top + h:
                self.refresh_lines(r)

    def action_zoom(self) -> None:
        """Toggle between the whole pool and one cell per block."""
        self.zoomed = not self.zoomed
        self._recode()

    def on_resize(self) -> None:
        """Cells per row and blocks per cell follow the size."""
        self._recode()

    def render_line(self, y: int) -> Strip:
        """Screen row ``y``: its cached strip, built on first use."""
        r = self.scroll_offset.y + y
        strip = self._rows.get(r)
        if strip is None:
            strip = self._rows[r] = self._build(r)
        return strip

    def _style(self, code: int) -> Style:
        return self.styled(cell_class(Cell(code >> 3)))

    def _build(self, r: int) -> Strip:
        self.rows_drawn += 1
        w, k = self._grid
        row = self.codes[r * w : (r + 1) * w].tolist()
        segs: list[Segment] = []
        start = 0
        for i in range(1, len(row) + 1):
            if i == len(row) or row[i] != row[start]:
                code = row[start]
                glyph = DENSITY[code & 7] if k > 1 else GLYPH.get(Cell(code >> 3), "█")
                segs.append(Segment(glyph * (i - start), self._style(code)))
                start = i
        return Strip(segs).adjust_cell_length(max(1, self.size.width))

    @property
    def evicted(self) -> set[int]:
        """Blocks drawn as just evicted in the current frame."""
        cells = np.frombuffer(self.frame.cells, dtype=np.uint8)
        return {int(b) for b in np.nonzero(cells == Cell.EVICTED)[0]}

    def drawn(self) -> dict[Cell, int]:
        """Blocks per state as the cells on screen account for them (what the fidelity check
        compares with the mirror): at one block per cell the cells' own states; at k per cell
        each cell's blocks by their states, once the cells agree with a full recount."""
        k = max(1, self._grid[1])
        if k == 1:
            shown = (self.codes >> 3).astype(np.uint8)
        else:
            if not np.array_equal(cell_codes(self.frame.cells, k), self.codes):
                return dict.fromkeys(Cell, -1)  # a stale cell: no count can be trusted
            shown = np.frombuffer(self.frame.cells, dtype=np.uint8)
        counts = np.bincount(shown, minlength=len(Cell))
        return {s: int(counts[s]) for s in Cell}


def cell_codes(cells: bytes, k: int) -> np.ndarray:
    """One code per cell of ``k`` blocks: ``state << 3 | density`` (density 0..4)."""
    states = np.frombuffer(cells, dtype=np.uint8)
    if k == 1:
        ones: np.ndarray = (states << 3) | np.where(states >= Cell.CACHED, 4, 0).astype(np.uint8)
        return ones
    pad = (-len(states)) % k
    grid = np.concatenate([states, np.zeros(pad, dtype=np.uint8)]).reshape(-1, k)
    counts = np.stack([(grid == s).sum(axis=1) for s in _PRIORITY], axis=1)
    used = counts.sum(axis=1)
    dominant = np.array(_PRIORITY, dtype=np.uint8)[counts.argmax(axis=1)]
    evicted = (grid == Cell.EVICTED).any(axis=1)
    idle = np.where(evicted, np.uint8(Cell.EVICTED), np.uint8(Cell.FREE))
    state = np.where(used > 0, dominant, idle).astype(np.uint8)
    density = np.ceil(used * 4 / k).astype(np.uint8)
    codes: np.ndarray = (state << 3) | density
    return codes
