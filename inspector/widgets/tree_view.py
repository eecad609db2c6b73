"""The tree pane: a virtual list over ``TreeLayout`` rows, drawn one line at a time.

Only the lines on screen are rendered (``render_line``), so a 100k-node tree costs the same
per frame as a 10-node one. Rows are swapped in whole (``set_rows``); a node that is gone
from the mirror since the last layout renders dimmed until the next one.
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from inspector.feed import Flash
from inspector.frame import EMPTY, Frame, NodeView
from inspector.layout import Row, TokenText, block_ranges, human_count, preview_text
from inspector.sources import DatasetWords
from inspector.widgets.pane import Paint, PaneWidget
from inspector.widgets.styled import Styled

FLASH_S = 1.5


class Folding(Enum):
    """What a fold request does."""

    COLLAPSE = "collapse"
    EXPAND = "expand"

_FLASH_CLASS = {
    Flash.CREATE: "tree--create",
    Flash.EXTEND: "tree--create",
    Flash.SPLIT: "tree--split",
    Flash.MERGE: "tree--merge",
    Flash.EVICT: "tree--evict",
}
PREVIEW_MIN = 8  # the preview column shrinks to this before any other column is cut
BLOCKS_W = 12
RIGHT = 1 + BLOCKS_W + 4 + 5 + 8  # blocks, ref, age, id columns


class TreeView(ScrollView, PaneWidget, can_focus=True):
    """The radix tree, one row per visible node; the cursor row is the selected node. Rows
    come from the layout (order, depth); what a row says comes from the frame (``show``)."""

    DEFAULT_CSS = """
    TreeView { width: 50%; border: round #4c566a; border-title-color: #7fd4ff; }
    TreeView:focus { border: round #7fd4ff; }
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "tree--count", "tree--text", "tree--dim", "tree--pinned", "tree--gone", "tree--cursor",
        "tree--selected", "tree--create", "tree--split", "tree--merge", "tree--evict"}

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("pageup", "move(-20)", "Page up", show=False),
        Binding("pagedown", "move(20)", "Page down", show=False),
        Binding("home", "jump(0)", "Top", show=False),
        Binding("end", "jump(-1)", "Bottom", show=False),
        Binding("enter,space", "fold_toggle", "Fold", show=True),
        Binding("left,h", "fold", "Collapse", show=False),
        Binding("right,l", "unfold", "Expand", show=False),
    ]

    class Selected(Message):
        """The cursor moved onto ``node_id``."""

        def __init__(self, node_id: int) -> None:
            super().__init__()
            self.node_id = node_id

    class Fold(Message):
        """The user folded or unfolded (``Folding``) the row at ``index``."""

        def __init__(self, index: int, how: Folding) -> None:
            super().__init__()
            self.index = index
            self.how = how

    class Moved(Message):
        """The window moved: the app takes a frame now so the new rows have their figures."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.frame = EMPTY
        self.rows: list[Row] = []
        self.cursor = 0
        self.vocab: TokenText | None = None
        self.flashes: dict[int, tuple[Flash, float]] = {}
        self.collapsed: set[int] = set()
        self._preview: dict[int, tuple[int, str]] = {}  # node -> (room, its preview)
        self._revision = 0  # the vocabulary's ``revision`` the cached previews were drawn in
        self.styled = Styled(self)

    def notify_style_update(self) -> None:
        """The stylesheet changed: look the colours up again."""
        super().notify_style_update()
        self.styled.clear()

    # -- data in ---------------------------------------------------------------------------
    def paint(self, p: Paint) -> None:
        """Highlight what changed, draw the frame's figures, title the pane with its size."""
        d = p.delta
        if d.flashes:
            self.flash(d.flashes, p.wall, p.flash_s)
        self.expire_flashes(p.wall)
        self._words_arrived()
        self.show(p.frame)
        if d.structure or d.rebuild or d.flashes:
            self.refresh()
        self.border_title = f"tree ({p.frame.node_count:,} nodes, {len(self.rows):,} rows)"
        self.border_subtitle = p.frame.selection.footer() if p.frame.selection else ""

    def animating(self) -> bool:
        """True while a highlight is on (it runs out with time)."""
        return bool(self.flashes)

    def _words_arrived(self) -> None:
        """Once the dataset's words are in, or the engine's model text is known, previews
        drawn before are drawn again."""
        vocab = self.vocab
        if isinstance(vocab, DatasetWords) and vocab.revision != self._revision:
            self._revision = vocab.revision
            self.forget_previews()

    def set_rows(self, rows: list[Row]) -> None:
        """Show ``rows``; keeps the cursor on the same node when it is still there."""
        selected = self.selected_id()
        self.rows = rows
        if selected is not None:
            for i, row in enumerate(rows[: max(self.cursor + 200, 200)]):
                if row.node.id == selected:
                    self.cursor = i
                    break
        self.cursor = min(self.cursor, max(0, len(rows) - 1))
        # no width of its own: rows are fitted to the pane, so it never scrolls sideways
        self.virtual_size = Size(0, len(rows))
        # a ScrollView's scrollbars follow its size, not its virtual size: without this, rows
        # that grow after the first layout (an unfold) get no scrollbar, scrolling is refused
        # and End leaves the cursor off screen (Textual's OptionList does the same)
        self._scroll_update(self.virtual_size)
        self.refresh()

    def show(self, frame: Frame) -> None:
        """Draw the rows with this frame's figures (only when they changed)."""
        old, self.frame = self.frame, frame
        if (old.rows, old.node_count, old.selection) != (frame.rows, frame.node_count,
                                                         frame.selection):
            self.refresh()

    def window(self, margin: int) -> list[Row]:
        """The rows on screen plus ``margin`` screens above and below (the frame copies their
        figures, so a page key lands on rows that are already there)."""
        h = max(1, self.size.height)
        top = max(0, self.scroll_offset.y - margin * h)
        return self.rows[top : self.scroll_offset.y + (margin + 1) * h]

    def forget_previews(self) -> None:
        """Drop every cached preview (the vocabulary learned new words)."""
        self._preview.clear()

    def flash(self, flashes: dict[int, Flash], now: float, seconds: float = FLASH_S) -> None:
        """Highlight these nodes for ``seconds``; drop cached previews of them."""
        until = now + seconds
        for nid, kind in flashes.items():
            self._preview.pop(nid, None)
            if seconds > 0:
                self.flashes[nid] = (kind, until)

    def expire_flashes(self, now: float) -> bool:
        """Forget flashes that ran out; True when some did (a redraw is due)."""
        gone = [nid for nid, (_, until) in self.flashes.items() if until <= now]
        for nid in gone:
            del self.flashes[nid]
        return bool(gone)

    def selected_id(self) -> int | None:
        """Id of the node under the cursor, if any."""
        return self.rows[self.cursor].node.id if 0 <= self.cursor < len(self.rows) else None

    # -- drawing ---------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        """The row at scroll offset + ``y``, padded to the pane's width."""
        index = self.scroll_offset.y + y
        width = self.size.width
        if index >= len(self.rows):
            return Strip.blank(width)
        cursor = index == self.cursor
        strip = Strip(self._segments(self.rows[index], cursor=cursor))
        return strip.adjust_cell_length(width, self._style("cursor") if cursor else None)

    def _style(self, name: str) -> Style:
        return self.styled(f"tree--{name}")

    def _segments(self, row: Row, *, cursor: bool) -> list[Segment]:
        nid = row.node.id
        view = self.frame.rows.get(nid)
        leaf = view.leaf if view is not None else not row.node.children
        arrow = "·" if leaf else ("▶" if nid in self.collapsed else "▼")
        base = self._style("selected") if cursor else Style()
        flash = self.flashes.get(nid)
        if flash is not None:
            base = base + self.styled(_FLASH_CLASS[flash[0]])
        head = "  " * row.depth + arrow + " "
        dim = base + self._style("dim")
        if row.node.parent is None and nid == 0:
            count = f"root ({self.frame.node_count:,} nodes)"
            return [Segment(head, dim), Segment(count, base + self._style("text"))]
        if view is None:  # scrolled past the frame's copy: the next frame fills it in
            return [Segment(head, dim), Segment("…", dim)]
        count = f"[{human_count(view.num_tokens)}] "
        room = max(PREVIEW_MIN, self.size.width - len(head) - len(count) - RIGHT)
        cached = self._preview.get(nid)  # made for this room (a resize changes the room)
        if cached is not None and cached[0] == room:
            text = cached[1]
        else:
            text = preview_text(view.head, self.vocab, room)
            self._preview[nid] = (room, text)
        if not view.alive:
            gone = f"[{row.node.num_tokens}] {text}"
            return [Segment(head, dim), Segment(gone, base + self._style("gone"))]
        return self._columns(head + count, view, text, base, room)

    def _columns(self, head: str, v: NodeView, text: str, base: Style, room: int) -> list[Segment]:
        """``▼ [44] "pass the…"  b6-8  r0  12s  n5``: every column keeps its place; only
        the preview gives up width, measured in cells (a CJK character takes two). When even
        the narrowest preview leaves no room, whole columns go, age first, then blocks, pins,
        the id: a column is never cut, so no id reads as another real one (n2290 as n2)."""
        dim = base + self._style("dim")
        count = head.split("[")[-1]
        text = text + " " * max(0, room - cell_len(text))
        left = [Segment(head[: -len(count) - 1], dim),
                Segment("[" + count, base + self._style("count")),
                Segment(text, base + self._style("text"))]
        right = {
            "blocks": Segment(f" {block_ranges(v.blocks, BLOCKS_W):<{BLOCKS_W}}", dim),
            "ref": Segment(f" r{v.pins:<2}", base + self._style("pinned") if v.pins else dim),
            "age": Segment(f" {v.age:>4}", dim),
            "id": Segment(f" n{v.id:<6}", dim),
        }
        spare = self.size.width - sum(seg.cell_length for seg in (*left, *right.values()))
        for name in ("age", "blocks", "ref", "id"):
            if spare >= 0:
                break
            spare += right.pop(name).cell_length
        return [*left, *right.values()]

    # -- keys ------------------------------------------------------------------------------
    def action_move(self, delta: int) -> None:
        """Move the cursor and keep it on screen."""
        self._set_cursor(self.cursor + delta)

    def action_jump(self, index: int) -> None:
        """Cursor to the first (0) or last (-1) row."""
        self._set_cursor(index if index >= 0 else len(self.rows) - 1)

    def _set_cursor(self, index: int) -> None:
        old = self.cursor
        self.cursor = max(0, min(index, len(self.rows) - 1))
        if self.cursor == old:
            return
        # the rows shown (a scrollbar takes none of them: rows never scroll sideways); the
        # scroll happens now, so the frame this move asks for copies the rows on screen
        top, height = self.scroll_offset.y, self.scrollable_content_region.height
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False, immediate=True)
            self.post_message(self.Moved())
        elif self.cursor >= top + height:
            self.scroll_to(y=self.cursor - height + 1, animate=False, immediate=True)
            self.post_message(self.Moved())
        self.refresh()
        nid = self.selected_id()
        if nid is not None:
            self.post_message(self.Selected(nid))

    def action_fold_toggle(self) -> None:
        """Fold or unfold the node under the cursor."""
        nid = self.selected_id()
        if nid is not None:
            how = Folding.EXPAND if nid in self.collapsed else Folding.COLLAPSE
            self.post_message(self.Fold(self.cursor, how))

    def action_fold(self) -> None:
        """Collapse the node under the cursor."""
        nid = self.selected_id()
        if nid is not None and nid not in self.collapsed:
            self.post_message(self.Fold(self.cursor, Folding.COLLAPSE))

    def action_unfold(self) -> None:
        """Expand the node under the cursor."""
        nid = self.selected_id()
        if nid is not None and nid in self.collapsed:
            self.post_message(self.Fold(self.cursor, Folding.EXPAND))
