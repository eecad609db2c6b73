"""The event log: the newest events, filterable by kind, one line each."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import ClassVar

from rich.markup import escape
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.message import Message

from inspector.feed import UNLOGGED, LogEntry
from inspector.widgets.pane import Paint, PaneWidget
from radixcache.core import events as ev
from radixcache.core.kinds import KINDS as ALL_KINDS
from radixcache.core.kinds import TAGS, exhaustive

KINDS = tuple(TAGS[k] for k in ALL_KINDS if k not in UNLOGGED)  # the kinds the log can show
LOG_KEEP = 2_000  # events the log pane can scroll back through
NOISY = frozenset({"wm", "counters", "queue"})  # heartbeats: `filter all` leaves them out
# rfinish: one line per request, and the one Enter explains (the why screen needs a request)
DEFAULT_KINDS = frozenset(
    {"create", "extend", "split", "merge", "evict", "cow", "rfinish", "snapshot", "reset"}
)
_COLORS = {"split": "#e5c07b", "merge": "#61afef", "evict": "#e06c75", "cow": "#c792ea",
           "create": "#98c379", "extend": "#98c379"}


# One line per kind, filled from the event's fields: a token run as its token count, a list
# (blocks, snapshot nodes) as its length. Empty: the kind alone says it.
_LINES: Mapping[type[ev.Event], str] = exhaustive("inspector.event_log", {
    ev.NodeCreated: "n{node} under n{parent}, {tokens} tok from position {start}",
    ev.Extend: "n{node} +{tokens} tok, +{blocks} blocks",
    ev.Split: "n{node} after its first {offset} tok → prefix n{prefix}",
    ev.Merge: "n{parent}+n{child}",
    ev.Evict: "n{node} {tokens} tok, {freed} blocks freed",
    ev.Cow: "{src}→{dst} ({slots} slots)",
    ev.BlockAlloc: "{blocks} blocks",
    ev.BlockFree: "{blocks} blocks",
    ev.Watermark: "{used_blocks}/{total_blocks} blocks",
    ev.RequestStart: "req {req} {prompt_tokens} tok, {hit_tokens} hit",
    ev.RequestFinish: "req {req} +{output_tokens} tok",
    ev.RequestCached: "req {req}: {prompt_tokens} tok of its prompt cached, readable now",
    ev.Retract: "retracted r{req}: {kept_tokens:,} tokens kept in the tree, {blocks} blocks freed",
    ev.Queue: "{policy}: {waiting} waiting (the stats pane says why)",
    ev.Snapshot: "{nodes} nodes",
    ev.Fault: "thread {thread} died: {error}",
    ev.Pin: "", ev.Access: "", ev.Reset: "", ev.Counters: "", ev.Digest: "",
})


def describe(e: ev.AnyEvent) -> str:
    """A short human line for one event (empty where the kind alone says it)."""
    if isinstance(e, ev.Fault) and e.req is not None:
        return f"req {e.req} failed: {_short(e.error)}"
    line = _LINES[type(e)]
    return line.format_map({f: _short(getattr(e, f)) for f in e.__struct_fields__}) if line else ""


def _short(value: object) -> object:
    if isinstance(value, bytes):
        return len(value) // 4  # uint32 token ids
    return len(value) if isinstance(value, Sequence) and not isinstance(value, str) else value


class EventLog(PaneWidget, can_focus=True):
    """The last ``LOG_KEEP`` events, those of the kinds in ``kinds`` shown, newest at the
    bottom. Focused, up/down select an entry (the view holds still around it; end follows the
    newest again) and enter on a request event (rstart, rfinish, retract, rcached) asks for
    why it missed and waited (``Explain``)."""

    DEFAULT_CSS = """
    EventLog { width: 1fr; border: round #4c566a; padding: 0 1;
               text-wrap: nowrap; text-overflow: ellipsis; }
    """

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

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.kept: deque[LogEntry] = deque(maxlen=LOG_KEEP)  # filled by ``paint`` (UI thread)
        self.kinds: frozenset[str] = DEFAULT_KINDS
        self.selected: LogEntry | None = None  # None: follow the newest

    def on_mount(self) -> None:
        """The title names the kinds shown."""
        self.set_kinds(self.kinds)

    def paint(self, p: Paint) -> None:
        """Keep the delta's events; redraw when some came."""
        if p.delta.log:
            self.kept.extend(p.delta.log)
            self.refresh()

    def set_kinds(self, kinds: frozenset[str]) -> None:
        """Show only these kinds; the border title lists them."""
        self.kinds = kinds
        self.border_title = escape(f"events [{' '.join(k for k in KINDS if k in kinds)}]")
        self.refresh()

    def _entries(self) -> list[LogEntry]:
        return [e for e in self.kept if e.kind in self.kinds]

    def _at(self, entries: list[LogEntry]) -> int | None:
        """Where the selected entry is in ``entries`` (None: not there, or none selected)."""
        return next((i for i, e in enumerate(entries) if e is self.selected), None)

    def shown(self) -> list[LogEntry]:
        """The entries on screen: the newest that pass the filter, as many as fit, or the
        ones around the selected entry."""
        want = max(1, self.size.height)
        if self.selected is None:
            out: list[LogEntry] = []
            for entry in reversed(self.kept):
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

    def select_newest_request(self) -> None:
        """Select the newest request event shown (``rfinish``, else ``rstart``, else
        ``retract``), so enter explains a request at once; nothing selected (follow) when
        none is kept."""
        entries = self._entries()
        for kinds in ((ev.RequestFinish,), (ev.RequestStart,), (ev.Retract,)):
            found = next((e for e in reversed(entries) if isinstance(e.event, kinds)), None)
            if found is not None:
                self.selected = found
                self.refresh()
                return

    def action_follow(self) -> None:
        """Drop the selection: show the newest entries again."""
        self.selected = None
        self.refresh()

    def action_explain(self) -> None:
        """Ask the app to explain the selected request (``Explain``)."""
        e = self.selected.event if self.selected is not None else None
        req = e.req if isinstance(e, ev.RequestStart | ev.RequestFinish | ev.Retract
                                  | ev.RequestCached) else None
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
