"""The event log: the newest events, filterable by kind, one line each."""

from __future__ import annotations

import time
from typing import ClassVar

from rich.markup import escape
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widget import Widget

from inspector.feed import Feed, LogEntry
from radixcache.core import events as ev

KINDS = ("create", "extend", "split", "merge", "evict", "cow", "alloc", "free", "wm", "rstart",
         "rcached", "rfinish", "snapshot", "reset", "digest", "counters", "fault", "queue")
NOISY = frozenset({"wm", "counters", "queue"})  # heartbeats: `filter all` leaves them out
DEFAULT_KINDS = frozenset(
    {"create", "extend", "split", "merge", "evict", "cow", "snapshot", "reset"}
)
_COLORS = {"split": "#e5c07b", "merge": "#61afef", "evict": "#e06c75", "cow": "#c792ea",
           "create": "#98c379", "extend": "#98c379"}


def describe(e: ev.AnyEvent) -> str:
    """A short human line for one event."""
    match e:
        case ev.NodeCreated():
            return f"n{e.node} under n{e.parent}, {len(e.tokens) // 4} tok from position {e.start}"
        case ev.Extend():
            return f"n{e.node} +{len(e.tokens) // 4} tok, +{len(e.blocks)} blocks"
        case ev.Split():
            return f"n{e.node} after its first {e.offset} tok → prefix n{e.prefix}"
        case ev.Merge():
            return f"n{e.parent}+n{e.child}"
        case ev.Evict():
            return f"n{e.node} {e.tokens} tok, {len(e.freed)} blocks freed"
        case ev.Cow():
            return f"{e.src}→{e.dst} ({e.slots} slots)"
        case ev.BlockAlloc() | ev.BlockFree():
            return f"{len(e.blocks)} blocks"
        case _:
            return _describe_request(e)


def _describe_request(e: ev.AnyEvent) -> str:
    """Requests, heartbeats, snapshots and faults."""
    match e:
        case ev.Watermark():
            return f"{e.used_blocks}/{e.total_blocks} blocks"
        case ev.RequestStart():
            return f"req {e.req} {e.prompt_tokens} tok, {e.hit_tokens} hit"
        case ev.RequestFinish():
            return f"req {e.req} +{e.output_tokens} tok"
        case ev.RequestCached():
            return f"req {e.req} prompt of {e.prompt_tokens} tok cached, decoding"
        case ev.Snapshot():
            return f"{len(e.nodes)} nodes"
        case ev.Fault():
            return f"thread {e.thread} died: {e.error}"
        case ev.Queue():
            return queue_line(e)
        case _:
            return ""


def queue_line(q: ev.Queue) -> str:
    """``lpm: 12 waiting: 8 sharing, 3 order, 1 pool full · r41 waits for r12 at n7``."""
    counts = ", ".join(f"{n} {r.value}" for r, n in q.counts().items() if n)
    line = f"{q.policy}: {q.waiting} waiting" + (f": {counts}" if counts else "")
    share = next((w for w in q.entries if w.reason is ev.WaitReason.SHARING), None)
    if share is not None:
        line += f" · r{share.req} waits for r{share.on_req}'s insert after n{share.node}" \
                f" (+{share.shared} tok)"
    return line


class EventLog(Widget, can_focus=True):
    """The last events of the kinds in ``kinds``, newest at the bottom. Focused, up/down
    select an entry (the view holds still around it; end follows the newest again) and enter
    on a request event (rstart, rfinish) asks for why it missed (``Explain``)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "Older", show=False),
        Binding("down", "move(1)", "Newer", show=False),
        Binding("pageup", "move(-10)", "Older", show=False),
        Binding("pagedown", "move(10)", "Newer", show=False),
        Binding("end", "follow", "Follow", show=False),
        Binding("enter", "explain", "Why missed"),
    ]

    class Explain(Message):
        """Enter on request ``req``'s event: show why it missed."""

        def __init__(self, req: int | None) -> None:
            super().__init__()
            self.req = req  # None: the selected entry is not a request event

    def __init__(self, feed: Feed, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.feed = feed  # only ``feed.log``, which the UI thread itself fills at each frame
        self.kinds: frozenset[str] = DEFAULT_KINDS
        self.selected: LogEntry | None = None  # None: follow the newest

    def set_kinds(self, kinds: frozenset[str]) -> None:
        """Show only these kinds; the border title lists them."""
        self.kinds = kinds
        self.border_title = escape(f"events [{' '.join(k for k in KINDS if k in kinds)}]")
        self.refresh()

    def _entries(self) -> list[LogEntry]:
        return [e for e in self.feed.log if e.kind in self.kinds]

    def _at(self, entries: list[LogEntry]) -> int | None:
        """Where the selected entry is in ``entries`` (None: not there, or none selected)."""
        return next((i for i, e in enumerate(entries) if e is self.selected), None)

    def shown(self) -> list[LogEntry]:
        """The entries on screen: the newest that pass the filter, as many as fit, or the
        ones around the selected entry."""
        want = max(1, self.size.height)
        if self.selected is None:
            out: list[LogEntry] = []
            for entry in reversed(self.feed.log):
                if entry.kind in self.kinds:
                    out.append(entry)
                    if len(out) == want:
                        break
            out.reverse()
            return out
        entries = self._entries()
        at = self._at(entries)
        if at is None:  # scrolled out of the kept log, or filtered away
            self.selected = None
            return self.shown()
        start = max(0, min(at - want // 2, len(entries) - want))
        return entries[start : start + want]

    def action_move(self, delta: int) -> None:
        """Select an older (negative) or newer entry; past the newest: follow again."""
        entries = self._entries()
        if not entries:
            return
        at = self._at(entries)
        to = max(0, (len(entries) if at is None else at) + delta)
        self.selected = entries[to] if to < len(entries) else None
        self.refresh()

    def action_follow(self) -> None:
        """Drop the selection: show the newest entries again."""
        self.selected = None
        self.refresh()

    def action_explain(self) -> None:
        """Ask the app to explain the selected request (``Explain``)."""
        e = self.selected.event if self.selected is not None else None
        req = e.req if isinstance(e, ev.RequestStart | ev.RequestFinish) else None
        self.post_message(self.Explain(req))

    def on_click(self, event: events.Click) -> None:
        """Select the clicked entry."""
        offset = event.get_content_offset(self)
        shown = self.shown()
        if offset is not None and 0 <= offset.y < len(shown):
            self.selected = shown[offset.y]
            self.refresh()

    def render(self) -> Text:
        """``hh:mm:ss.mmm kind description`` per line; the selected one in reverse."""
        out = Text(no_wrap=True, overflow="ellipsis")
        for entry in self.shown():
            ms = int(entry.ts * 1000) % 1000
            stamp = time.strftime("%H:%M:%S", time.gmtime(entry.ts)) + f".{ms:03d}"
            start = len(out)
            out.append(f"{stamp} ", "dim")
            out.append(f"{entry.kind:<8}", _COLORS.get(entry.kind, "bold"))
            out.append(describe(entry.event))
            if entry is self.selected:
                out.stylize("reverse", start, len(out))
            out.append("\n")
        out.rstrip()
        return out
