"""The "why" screen: why one request missed, from the feed's miss history
(``radixcache.analysis.misses``): its matched path, hit tokens and each missed span's cause;
then why it waited, when it was retracted (``inspector.retractions``): the tokens each
retraction kept in the tree and how long it waited to run again.

Opened with enter on a request event in the event log, or ``why REQ`` on the command line.
It redraws twice a second, so a request still running gets its spans when it finishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Static

from inspector.feed import Feed
from radixcache.analysis.misses import Cause, Line, describe

REDRAW_S = 0.5
STYLES: Mapping[Cause, str] = MappingProxyType({  # a colour for each cause (a test checks)
    Cause.EVICTED: "#e06c75", Cause.NEVER_SEEN: "#e5c07b", Cause.DIVERGED: "#c792ea",
    Cause.CAPACITY: "#e06c75", Cause.IN_FLIGHT: "#61afef", Cause.LAST_TOKEN: "dim",
    Cause.NOT_FOLLOWED: "dim"})


class WhyScreen(ModalScreen[None]):
    """Why request ``req`` missed; closes with escape, q or enter."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,enter", "app.pop_screen", "Close")]

    def __init__(self, feed: Feed, req: int) -> None:
        super().__init__()
        self.feed, self.req = feed, req
        self.lines: list[Line] = []

    def compose(self) -> ComposeResult:
        """One block of text."""
        yield Static(id="why-body")

    def on_mount(self) -> None:
        """Draw now and every ``REDRAW_S``."""
        self.redraw()
        self.set_interval(REDRAW_S, self.redraw)

    def redraw(self) -> None:
        """Read the request's explanation under the feed's lock and show it."""
        with self.feed.lock:
            f = self.feed.follow
            self.lines = describe(f.misses, self.req, f.error)
            retracted = self.feed.retractions.of(self.req)
            if retracted is not None:
                self.lines += [Line(text) for text in retracted.lines()]
        out = Text()
        for i, line in enumerate(self.lines):
            style = "bold" if i == 0 else STYLES[line.cause] if line.cause is not None else ""
            out.append(line.text + "\n", style)
        out.append("\nescape: close", "dim")
        self.query_one("#why-body", Static).update(out)
