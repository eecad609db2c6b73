"""Painting a frame: every pane takes one ``Frame`` (and the delta that led to it).

The app builds the frame under the feed's lock; this puts it on the panes (``PaneWidget.paint``,
in ``PANES`` order) and on the screen's own lines (header, fault, replay bar, messages),
skipping a frame that equals the one on screen. ``Outside`` carries what a frame shows besides
the mirror (the source's status, the replay position), read before the lock is taken.
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

from textual.widgets import Static

from inspector.commands import CommandReplies
from inspector.feed import Delta
from inspector.frame import EMPTY, Frame
from inspector.sources import ReplayPosition, SourceStatus
from inspector.widgets.command_line import CommandLine
from inspector.widgets.pane import Paint, PaneWidget
from inspector.widgets.stats import Rate, header_line, served
from inspector.widgets.timeline import timeline

W = TypeVar("W", bound=PaneWidget)


class Panes(NamedTuple):
    """The widgets the frame updates, found once at mount: the panes in ``PANES`` order,
    and the screen's own lines."""

    widgets: tuple[PaneWidget, ...]
    header: Static
    fault: Static
    timeline: Static
    message: Static
    command: CommandLine

    def of(self, kind: type[W]) -> W:
        """The pane whose widget is a ``kind``."""
        return next(w for w in self.widgets if isinstance(w, kind))


class Outside(NamedTuple):
    """What a frame shows besides the mirror, read before the feed's lock is taken."""

    wall: float
    width: int
    status: SourceStatus
    position: ReplayPosition | None


class Painter:
    """Shows frames on ``p``; keeps what it drew last, to skip unchanged work."""

    def __init__(self, panes: Panes, commands: CommandReplies, flash_s: float) -> None:
        self.p = panes
        self.commands = commands
        self.flash_s = flash_s
        self.view: Frame = EMPTY
        self.rate = Rate()
        self.req_per_s = 0.0
        self._header = ""

    def show(self, frame: Frame, d: Delta, out: Outside, note: str) -> None:
        """Every pane takes ``frame`` and the delta. A frame equal to the one on screen with
        nothing new in the delta costs only the header (the source's state, live or
        disconnected since when, changes without any batch), unless a pane is animating."""
        p = self.p
        if d.empty and frame == self.view and not any(w.animating() for w in p.widgets):
            self.view = frame
            self._header_line(frame, out)
            if note:  # a selection of a node already gone changes no pane, but is said
                self.commands.note(note)
            return
        self.view = frame
        self.req_per_s = self.rate.add(frame.now, served(frame))
        paint = Paint(frame, d, out.wall, out.status, self.req_per_s, self.flash_s)
        for widget in p.widgets:
            widget.paint(paint)
        for err in d.errors:
            self.commands.say(f"[out of sync] {err}", error=True)
        if note:
            self.commands.note(note)
        if out.position is not None:
            p.timeline.update(timeline(out.position, out.width))
        self._header_line(frame, out)
        fault = frame.fault
        p.fault.display = fault is not None
        if fault is not None:
            p.fault.update(f" ✗ the engine's {fault.thread} thread died: {fault.error} "
                           "— it no longer serves; its log has the traceback")

    def _header_line(self, frame: Frame, out: Outside) -> None:
        header = header_line(out.status, frame, self.req_per_s, out.wall, out.width)
        if header.plain != self._header:
            self._header = header.plain
            self.p.header.update(header)
