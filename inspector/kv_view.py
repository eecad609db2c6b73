"""The view attached to a vLLM/SGLang KV-event publisher: the radix tree its blocks describe.

Such a publisher only says which full blocks are stored (hash, parent hash, tokens, tier) and
which went away, so this screen is simpler than the main one: the blocks as a radix tree (a chain
of only children is one row: block count, tokens, a text preview, the tiers and ranks holding
it), and beside it the counters (per tier, stored/removed rates, churn, the top prefixes). The
header names the dialect detected and whether the history is known to be complete. A thread owns
the ``KVEventsClient`` (its sockets) and lays the rows out whenever ``version`` moved or the
health changed; the UI picks the newest rows up at most ``FRAME_HZ`` times a second.
"""

from __future__ import annotations

import threading
import time
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
from radixcache.wire.kvevents import KVEventsClient, RadixRow, Sync, hash_label, radix_rows
from radixcache.wire.kvevents.radix import top_prefixes
from radixcache.wire.kvevents.report import counter_lines, status_lines

FRAME_HZ = 10
_HASH = Style(color="#7fd4ff", bold=True)
_TEXT = Style(color="#e6e6e6")
_DIM = Style(color="#7a7a7a")
_CURSOR = Style(bgcolor="#3b4252")


class Frame(NamedTuple):
    """What the client thread hands the UI: rows, counters and status at one version."""

    rows: list[RadixRow]
    live_blocks: int
    counters: list[tuple[str, str]]
    status: list[str]
    complete: bool


class BlockList(ScrollView, can_focus=True):
    """The radix tree of blocks as a virtual list: only visible rows are drawn."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("pagedown", "move(20)", "Page down", show=False),
        Binding("pageup", "move(-20)", "Page up", show=False),
    ]

    def __init__(self, vocab: TokenText | None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: list[RadixRow] = []
        self.cursor = 0
        self.vocab = vocab

    def set_rows(self, rows: list[RadixRow]) -> None:
        """Show ``rows`` (the cursor stays at its index, clamped)."""
        self.rows = rows
        self.cursor = min(self.cursor, max(0, len(rows) - 1))
        self.virtual_size = Size(0, len(rows))
        self._scroll_update(self.virtual_size)  # see TreeView.set_rows
        self.refresh()

    def render_line(self, y: int) -> Strip:
        """Row ``scroll + y``: indent, first hash, blocks, tokens, the first words, holders."""
        index = self.scroll_offset.y + y
        if index >= len(self.rows):
            return Strip.blank(self.size.width)
        row = self.rows[index]
        preview = row.preview()
        words = self.vocab.text(preview) if self.vocab is not None else str(preview)
        mark = "▼ " if row.children else "· "
        count = f" ×{len(row.blocks)}" if len(row.blocks) > 1 else ""
        segs = [Segment("  " * row.depth + mark, _DIM),
                Segment(hash_label(row.blocks[0].hash), _HASH),
                Segment(f"{count}  [{row.tokens}] ", _DIM),
                Segment(f'"{words[:28]}"', _TEXT),
                Segment(f"  {row.holders()}", _DIM)]
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



def make_frame(client: KVEventsClient) -> Frame:
    """The client's state laid out for the screen (called on the client's thread)."""
    health = client.health()
    return Frame(radix_rows(client.view), len(client.view.blocks), counter_lines(client),
                 status_lines(client), health.sync is Sync.COMPLETE)


class KVEventsApp(App[None]):
    """The radix tree of a vLLM/SGLang KV-event publisher at ``endpoint``."""

    CSS_PATH = "app.tcss"
    TITLE = "radixcache inspector (KV events)"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "Quit")]

    def __init__(self, endpoint: str, replay: str | None = None, *,
                 vocab: TokenText | None = None, frame_interval: float = 1 / FRAME_HZ,
                 topic: bytes = b"") -> None:
        super().__init__()
        self.endpoint, self.replay, self.topic = endpoint, replay, topic
        self.vocab = vocab
        self.frame_interval = frame_interval
        self._frame: Frame | None = None
        self.status: list[str] = []
        self.failure: str | None = None
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
        self.query_one(BlockList).border_title = "radix tree of blocks"
        self.query_one("#kvstats").border_title = "KV events"
        self._header(0, ["format: no batch yet", "history: waiting for the first batch"],
                     complete=False)
        self._thread.start()
        self.set_interval(self.frame_interval, self.frame)
        self.query_one(BlockList).focus()

    def on_unmount(self) -> None:
        """Stop the client thread."""
        self._stop.set()
        self._thread.join(5)

    def _follow(self) -> None:
        """The client's thread: nothing it meets ends it silently (the header says why)."""
        try:
            self._follow_client()
        except Exception as exc:  # a bad endpoint, a closed context: shown, never lost
            with self._lock:
                self.failure = f"stopped: {type(exc).__name__}: {exc}"

    def _follow_client(self) -> None:
        client = KVEventsClient(self.endpoint, self.replay, topic=self.topic)
        seen: tuple[int, str] | None = None
        next_at = 0.0
        try:
            while not self._stop.is_set():
                client.poll(0.05)
                state = (client.version, client.health().line())
                # health moves without events (a replay that stays silent)
                if state != seen and time.monotonic() >= next_at:
                    seen = state
                    began = time.monotonic()
                    frame = make_frame(client)
                    # a layout of 15k page-size-1 blocks takes ~0.15 s: never spend over a
                    # third of this thread's time on it, so batches keep being applied
                    next_at = began + max(self.frame_interval, 3 * (time.monotonic() - began))
                    with self._lock:
                        self._frame = frame
        finally:
            client.close()

    def frame(self) -> None:
        """Show the newest layout, if a new one was made."""
        if not self.is_running:  # shutting down: the timer may fire while the panes are pruned
            return
        with self._lock:
            f, self._frame, failure = self._frame, None, self.failure
        if failure is not None and self.status[-1:] != [failure]:
            self._header(0, [*self.status[:2], failure], complete=False)
        if f is None:
            return
        pane = self.query_one(BlockList)
        pane.set_rows(f.rows)
        pane.border_title = f"radix tree ({len(f.rows):,} nodes, {f.live_blocks:,} blocks)"
        self._header(f.live_blocks, f.status, complete=f.complete)
        out = Text()
        for name, value in f.counters:
            out.append(f"{name:<16}", "dim")
            out.append(f"{value}\n", "bold")
        out.append("top prefixes\n", "dim")
        for row in top_prefixes(f.rows, 5):
            out.append(f"{row.subtree:>7,} ", "bold")
            out.append(f"{hash_label(row.blocks[0].hash)}\n", "#7fd4ff")
        out.rstrip()
        self.query_one("#kvstats", Static).update(out)

    def _header(self, blocks: int, status: list[str], *, complete: bool) -> None:
        self.status = status
        out = Text(" radixcache ", "bold")
        out.append(f"─ KV events {self.endpoint} ")
        out.append(f"● {status[0].removeprefix('format: ')}", "bold #98c379")
        if self.replay:
            out.append(f"  replay {self.replay}", "dim")
        if self.topic:
            out.append(f"  topic {self.topic.decode(errors='replace')}", "dim")
        out.append(f"   {blocks:,} blocks   ")
        history = status[1].removeprefix("history: ")
        out.append(history, "#98c379" if complete else "bold #e5c07b")
        if len(status) > 2:
            out.append(f"   {status[2]}", "#e06c75")
        self.query_one("#header", Static).update(out)

    def shown_rows(self) -> list[RadixRow]:
        """The rows on screen now (tests)."""
        return self.query_one(BlockList).rows
