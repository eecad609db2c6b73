"""The event log: the newest events, filterable by kind, one line each."""

from __future__ import annotations

import time

from rich.markup import escape
from rich.text import Text
from textual.widget import Widget

from inspector.feed import Feed, LogEntry
from radixcache.core import events as ev

KINDS = ("create", "extend", "split", "merge", "evict", "cow", "alloc", "free", "wm", "rstart",
         "rfinish", "snapshot", "reset", "digest", "counters", "fault")
NOISY = frozenset({"wm", "counters"})  # heartbeats: `filter all` leaves them out
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
        case ev.Snapshot():
            return f"{len(e.nodes)} nodes"
        case ev.Fault():
            return f"thread {e.thread} died: {e.error}"
        case _:
            return ""


class EventLog(Widget):
    """The last events of the kinds in ``kinds``, newest at the bottom."""

    def __init__(self, feed: Feed, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.feed = feed  # only ``feed.log``, which the UI thread itself fills at each frame
        self.kinds: frozenset[str] = DEFAULT_KINDS

    def set_kinds(self, kinds: frozenset[str]) -> None:
        """Show only these kinds; the border title lists them."""
        self.kinds = kinds
        self.border_title = escape(f"events [{' '.join(k for k in KINDS if k in kinds)}]")
        self.refresh()

    def shown(self) -> list[LogEntry]:
        """The newest entries that pass the filter, as many as fit."""
        want = max(1, self.size.height)
        out: list[LogEntry] = []
        for entry in reversed(self.feed.log):
            if entry.kind in self.kinds:
                out.append(entry)
                if len(out) == want:
                    break
        out.reverse()
        return out

    def render(self) -> Text:
        """``hh:mm:ss.mmm kind description`` per line."""
        out = Text(no_wrap=True, overflow="ellipsis")
        for entry in self.shown():
            ms = int(entry.ts * 1000) % 1000
            stamp = time.strftime("%H:%M:%S", time.gmtime(entry.ts)) + f".{ms:03d}"
            out.append(f"{stamp} ", "dim")
            out.append(f"{entry.kind:<8}", _COLORS.get(entry.kind, "bold"))
            out.append(describe(entry.event) + "\n")
        out.rstrip()
        return out
