"""The view attached to a vLLM/SGLang KV-event publisher: the block-hash tree it describes.

Such a publisher only says which full blocks are stored (hash, parent hash, tokens) and which
went away, so this screen is simpler than the main one: a tree of block hashes (one row per
stored block, children under the block they extend), and the client's counters. A thread
owns the ``KVEventsClient`` (its sockets) and lays the rows out whenever ``version`` moved;
the UI picks the newest rows up at most ``FRAME_HZ`` times a second.
"""

from __future__ import annotations

import threading
from typing import ClassVar, NamedTuple

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Footer, Static

from inspector.layout import TokenText
from radixcache.wire.kvevents import Block, BlockTreeStats, KVEventsClient

FRAME_HZ = 10
_HASH = Style(color="#7fd4ff", bold=True)
_TEXT = Style(color="#e6e6e6")
_DIM = Style(color="#7a7a7a")
_CURSOR = Style(bgcolor="#3b4252")


class BlockRow(NamedTuple):
    """One stored block on screen."""

    block: Block
    depth: int
    children: int


def block_label(block: Block) -> str:
    """The first 12 hex digits of a block hash (bytes or an integer)."""
    h = block.hash
    text = h.hex() if isinstance(h, bytes) else f"{h & (2**64 - 1):016x}"
    return text[:12]


class BlockList(ScrollView, can_focus=True):
    """The block-hash tree as a virtual list: only visible rows are drawn."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("pagedown", "move(20)", "Page down", show=False),
        Binding("pageup", "move(-20)", "Page up", show=False),
    ]

    def __init__(self, vocab: TokenText | None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: list[BlockRow] = []
        self.cursor = 0
        self.vocab = vocab

    def set_rows(self, rows: list[BlockRow]) -> None:
        """Show ``rows`` (the cursor stays at its index, clamped)."""
        self.rows = rows
        self.cursor = min(self.cursor, max(0, len(rows) - 1))
        self.virtual_size = Size(self.size.width, len(rows))
        self.refresh()

    def render_line(self, y: int) -> Strip:
        """Row ``scroll + y``: indent, hash, token count, the first words, children."""
        index = self.scroll_offset.y + y
        if index >= len(self.rows):
            return Strip.blank(self.size.width)
        row = self.rows[index]
        b = row.block
        words = self.vocab.text(b.tokens[:6]) if self.vocab is not None else str(b.tokens[:6])
        mark = "▼ " if row.children > 1 else ("│ " if row.children else "· ")
        segs = [Segment("  " * row.depth + mark, _DIM),
                Segment(block_label(b), _HASH),
                Segment(f"  [{len(b.tokens)}] ", _DIM),
                Segment(f'"{words[:28]}"', _TEXT),
                Segment(f"  {b.medium or ''}", _DIM)]
        if row.children > 1:
            segs.append(Segment(f"  {row.children} children", _DIM))
        style = _CURSOR if index == self.cursor else None
        return Strip(segs).adjust_cell_length(self.size.width, style)

    def action_move(self, delta: int) -> None:
        """Move the cursor and keep it on screen."""
        self.cursor = max(0, min(len(self.rows) - 1, self.cursor + delta))
        top, height = self.scroll_offset.y, self.size.height
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + height:
            self.scroll_to(y=self.cursor - height + 1, animate=False)
        self.refresh()


def layout_blocks(client: KVEventsClient) -> list[BlockRow]:
    """Depth-first rows of the client's block tree (roots first). A chain of only children
    stays at one indent (a conversation is a long chain of full blocks): the indent grows
    only where a block has several children, as the branches of a radix tree would."""
    tree = client.tree
    rows: list[BlockRow] = []
    stack = [(0, b) for b in reversed(tree.roots())]
    while stack:
        depth, b = stack.pop()
        kids = tree.children(b.hash)
        rows.append(BlockRow(b, depth, len(kids)))
        inner = depth + 1 if len(kids) > 1 else depth
        stack.extend((inner, c) for c in reversed(kids))
    return rows


class KVEventsApp(App[None]):
    """A block-hash tree following a vLLM-format KV-event publisher at ``endpoint``."""

    CSS_PATH = "app.tcss"
    TITLE = "radixcache inspector (KV events)"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "Quit")]

    def __init__(self, endpoint: str, replay: str | None = None, *,
                 vocab: TokenText | None = None, frame_interval: float = 1 / FRAME_HZ) -> None:
        super().__init__()
        self.endpoint, self.replay = endpoint, replay
        self.vocab = vocab
        self.frame_interval = frame_interval
        self._rows: list[BlockRow] | None = None
        self._stats = BlockTreeStats()
        self._seen = -1
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._follow, name="kv-events", daemon=True)

    def compose(self) -> ComposeResult:
        """Header, block tree | counters, footer."""
        yield Static(id="header")
        with Horizontal(id="main"):
            yield BlockList(self.vocab, id="blocktree")
            yield Static(id="kvstats")
        yield Footer()

    def on_mount(self) -> None:
        """Start following the publisher and the frame timer."""
        self.query_one(BlockList).border_title = "block-hash tree"
        self.query_one("#kvstats").border_title = "KV events"
        self._header(0)
        self._thread.start()
        self.set_interval(self.frame_interval, self.frame)
        self.query_one(BlockList).focus()

    def on_unmount(self) -> None:
        """Stop the client thread."""
        self._stop.set()
        self._thread.join(5)

    def _follow(self) -> None:
        client = KVEventsClient(self.endpoint, self.replay)
        try:
            while not self._stop.is_set():
                client.poll(0.05)
                if client.version != self._seen:
                    self._seen = client.version
                    rows = layout_blocks(client)
                    with self._lock:
                        self._rows, self._stats = rows, BlockTreeStats(**{
                            k: getattr(client.tree.stats, k)
                            for k in BlockTreeStats.__dataclass_fields__})
        finally:
            client.close()

    def frame(self) -> None:
        """Show the newest layout, if a new one was made."""
        with self._lock:
            rows, self._rows = self._rows, None
            stats = self._stats
        if rows is None:
            return
        pane = self.query_one(BlockList)
        pane.set_rows(rows)
        pane.border_title = f"block-hash tree ({len(rows):,} blocks)"
        self._header(len(rows))
        lines = [("stored blocks", len(rows)), ("batches", stats.batches),
                 ("stored", stats.stored), ("removed", stats.removed),
                 ("cleared", stats.cleared), ("replayed", stats.replayed),
                 ("gaps", stats.gaps), ("malformed", stats.malformed)]
        out = Text()
        for name, value in lines:
            out.append(f"{name:<15}", "dim")
            out.append(f"{value:,}\n", "bold")
        out.rstrip()
        self.query_one("#kvstats", Static).update(out)

    def _header(self, blocks: int) -> None:
        out = Text(" radixcache ", "bold")
        out.append(f"─ KV events {self.endpoint} ")
        out.append("● vLLM format", "bold #98c379")
        if self.replay:
            out.append(f"  replay {self.replay}", "dim")
        out.append(f"   {blocks:,} blocks")
        self.query_one("#header", Static).update(out)

    def shown_rows(self) -> list[BlockRow]:
        """The rows on screen now (tests)."""
        return self.query_one(BlockList).rows
