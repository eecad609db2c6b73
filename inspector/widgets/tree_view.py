"""The tree pane: a virtual list over ``TreeLayout`` rows, drawn one line at a time.

Only the lines on screen are rendered (``render_line``), so a 100k-node tree costs the same
per frame as a 10-node one. Rows are swapped in whole (``set_rows``); a node that is gone
from the mirror since the last layout renders dimmed until the next one.
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from inspector.feed import Feed, Flash
from inspector.layout import Row, TokenText, block_ranges, human_age, human_count, preview

FLASH_S = 1.5
_FLASH_STYLE = {
    Flash.CREATE: Style(bgcolor="#1f4d2b"),
    Flash.EXTEND: Style(bgcolor="#1f4d2b"),
    Flash.SPLIT: Style(bgcolor="#5c4a12"),
    Flash.MERGE: Style(bgcolor="#1c3f66"),
    Flash.EVICT: Style(bgcolor="#6b1f1f"),
}
_COUNT = Style(color="#7fd4ff", bold=True)
_TEXT = Style(color="#e6e6e6")
_DIM = Style(color="#7a7a7a")
_LOCK = Style(color="#ffb347", bold=True)
_GONE = Style(color="#606060", strike=True)
_CURSOR = Style(bgcolor="#2e3440")
_SELECTED = Style(bgcolor="#3b4252", bold=True)


class TreeView(ScrollView, can_focus=True):
    """The radix tree, one row per visible node; the cursor row is the selected node."""

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
        """The user folded (``collapse=1``) or unfolded (0) the row at ``index``."""

        def __init__(self, index: int, collapse: int) -> None:
            super().__init__()
            self.index = index
            self.collapse = collapse

    def __init__(self, feed: Feed, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.feed = feed
        self.rows: list[Row] = []
        self.cursor = 0
        self.vocab: TokenText | None = None
        self.flashes: dict[int, tuple[Flash, float]] = {}
        self.collapsed: set[int] = set()
        self._preview: dict[int, str] = {}

    # -- data in ---------------------------------------------------------------------------
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
        self.virtual_size = Size(self.size.width, len(rows))
        self.refresh()

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
        strip = Strip(self._segments(self.rows[index], cursor=index == self.cursor))
        return strip.adjust_cell_length(width, _CURSOR if index == self.cursor else None)

    def _segments(self, row: Row, *, cursor: bool) -> list[Segment]:
        node = row.node
        alive = self.feed.mirror.nodes.get(node.id) is node
        arrow = "·" if not node.children else ("▶" if node.id in self.collapsed else "▼")
        base = _SELECTED if cursor else Style()
        flash = self.flashes.get(node.id)
        if flash is not None:
            base = base + _FLASH_STYLE[flash[0]]
        head = "  " * row.depth + arrow + " "
        if node.parent is None:
            count = f"root ({len(self.feed.mirror.nodes) - 1:,} nodes)"
            return [Segment(head, base + _DIM), Segment(count, base + _TEXT)]
        text = self._preview.get(node.id)
        if text is None:
            text = self._preview[node.id] = preview(node, self.vocab)
        if not alive:
            gone = f"[{node.num_tokens}] {text}"
            return [Segment(head, base + _DIM), Segment(gone, base + _GONE)]
        at = self.feed.access_time(node.clock)
        age = human_age(None if at is None else self.feed.now() - at)
        segs = [
            Segment(head, base + _DIM),
            Segment(f"[{human_count(node.num_tokens)}] ", base + _COUNT),
            Segment(f"{text:<24}", base + _TEXT),
            Segment(f" {block_ranges(node.blocks, 16):<16}", base + _DIM),
            Segment(f" r{node.lock:<3}", base + (_LOCK if node.lock else _DIM)),
            Segment(f" {age:>4}", base + _DIM),
            Segment(f"  n{node.id}", base + _DIM),
        ]
        return segs

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
        self.key_handled_at = time.perf_counter()
        if self.cursor == old:
            return
        top, height = self.scroll_offset.y, self.size.height
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + height:
            self.scroll_to(y=self.cursor - height + 1, animate=False)
        self.refresh_lines(old)
        self.refresh_lines(self.cursor)
        nid = self.selected_id()
        if nid is not None:
            self.post_message(self.Selected(nid))

    key_handled_at = 0.0

    def action_fold_toggle(self) -> None:
        """Fold or unfold the node under the cursor."""
        nid = self.selected_id()
        if nid is not None:
            self.post_message(self.Fold(self.cursor, 0 if nid in self.collapsed else 1))

    def action_fold(self) -> None:
        """Collapse the node under the cursor."""
        nid = self.selected_id()
        if nid is not None and nid not in self.collapsed:
            self.post_message(self.Fold(self.cursor, 1))

    def action_unfold(self) -> None:
        """Expand the node under the cursor."""
        nid = self.selected_id()
        if nid is not None and nid in self.collapsed:
            self.post_message(self.Fold(self.cursor, 0))
