"""Painting a frame: every pane takes one ``Frame`` (and the delta that led to it).

The app builds the frame under the feed's lock; this puts it on the panes, skipping a frame
that equals the one on screen. ``Outside`` carries what a frame shows besides the mirror (the
source's status, the replay position), read before the lock is taken.
"""

from __future__ import annotations

from typing import NamedTuple

from textual.widgets import Static

from inspector.commands import CommandReplies
from inspector.feed import Delta
from inspector.frame import EMPTY, Frame
from inspector.sources import DatasetWords, ReplayPosition, SourceStatus
from inspector.widgets.block_map import BlockMap
from inspector.widgets.command_line import CommandLine
from inspector.widgets.event_log import EventLog
from inspector.widgets.lru import LruPane
from inspector.widgets.memory import HISTORY, MemoryPane
from inspector.widgets.stats import Rate, StatsPane, figures, header_line
from inspector.widgets.timeline import timeline
from inspector.widgets.tree_view import TreeView


class Panes(NamedTuple):
    """The widgets the frame updates, found once at mount."""

    tree: TreeView
    blocks: BlockMap
    memory: MemoryPane
    lru: LruPane
    events: EventLog
    stats: StatsPane
    header: Static
    fault: Static
    timeline: Static
    message: Static
    command: CommandLine


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
        self._words_in = False

    def show(self, frame: Frame, d: Delta, out: Outside, note: str) -> None:
        """Every pane takes ``frame``; the log and the memory history take the delta. A frame
        equal to the one on screen with nothing new in the delta costs only the header: the
        source's state (live, disconnected since when) changes without any batch."""
        p = self.p
        if d.empty and frame == self.view and not p.tree.flashes:
            self.view = frame
            self._header_line(frame, out)
            return
        self.view = frame
        wall = out.wall
        if d.flashes:
            p.tree.flash(d.flashes, wall, self.flash_s)
        p.tree.expire_flashes(wall)
        self._words_arrived()
        p.tree.show(frame)
        if d.structure or d.rebuild or d.flashes:
            p.tree.refresh()
        p.tree.border_title = f"tree ({frame.node_count:,} nodes, {len(p.tree.rows):,} rows)"
        p.tree.border_subtitle = frame.selection.footer() if frame.selection else ""
        p.blocks.show(frame)
        p.blocks.border_title = f"block map {frame.used_blocks:,}/{frame.num_blocks:,}"
        if d.log:
            p.events.refresh()
        for err in d.errors:
            self.commands.say(f"[out of sync] {err}", error=True)
        if note:
            self.commands.note(note)
        if d.watermarks:  # each sample, so the sparkline does not depend on the frame rate
            note = out.status.memory_note
            for sample in d.watermarks[-HISTORY:]:
                p.memory.push(sample, note)
        p.memory.show(frame)
        p.lru.show(frame)
        self._figures(frame, out)

    def _words_arrived(self) -> None:
        """Once the dataset's words are in, previews drawn with ids are drawn again."""
        vocab = self.p.tree.vocab
        if not self._words_in and isinstance(vocab, DatasetWords) and vocab.ready.is_set():
            self._words_in = True
            self.p.tree.forget_previews()

    def _header_line(self, frame: Frame, out: Outside) -> None:
        header = header_line(out.status, frame, self.req_per_s, out.wall, out.width)
        if header.plain != self._header:
            self._header = header.plain
            self.p.header.update(header)

    def _figures(self, frame: Frame, out: Outside) -> None:
        p = self.p
        self.req_per_s = self.rate.add(frame.now, figures(frame).requests)
        if out.position is not None:
            p.timeline.update(timeline(out.position, out.width))
        self._header_line(frame, out)
        p.stats.show(frame, self.req_per_s)
        fault = frame.fault
        p.fault.display = fault is not None
        if fault is not None:
            p.fault.update(f" ✗ the engine's {fault.thread} thread died: {fault.error} "
                           "— it no longer serves; its log has the traceback")
