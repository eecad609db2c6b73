"""The inspector app: wires a ``Source`` and a ``Feed`` to the panes, one frame at a time.

Batches arrive on the source's thread and are applied to the mirror there (``Feed``). A
timer (``FRAME_HZ``) takes the feed's lock once per frame and, in that one hold, takes what
changed and builds a ``Frame`` (``inspector.frame``): one immutable view of the mirror at one
seq. Every pane then draws from that frame, so no two panes can disagree. Big trees are laid
out in a Textual worker thread; the frame re-checks what it copies from that layout. Keys are
handled between frames, so typing stays responsive however fast events arrive.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import ClassVar, Protocol

from textual import events
from textual.actions import SkipAction
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Input, Static

from inspector.commands import CommandReplies
from inspector.engine_facts import ModelWords
from inspector.feed import Delta, Feed
from inspector.frame import Builder, Frame, Want
from inspector.layout import collapse, expand
from inspector.paint import Outside, Painter, Panes
from inspector.panes import PANES, Pane, Place, make, pane_bindings
from inspector.sources import (
    DatasetWords,
    ReplayControls,
    Source,
)
from inspector.tree_layout import LRU_ROWS, TreeLayout
from inspector.widgets.block_map import BlockMap
from inspector.widgets.command_line import REPLAY_HINT, CommandLine
from inspector.widgets.event_log import EventLog
from inspector.widgets.help import HelpScreen, key_map
from inspector.widgets.pane import PaneWidget
from inspector.widgets.tree_view import Folding, TreeView

FRAME_HZ = 30
EVICTED_SHOW_S = 2.0
WINDOW_MARGIN = 2  # screens of tree rows copied above and below the visible ones
SHORT, NARROW = 30, 100  # below these many rows / columns the compact layout is used
WORDS_LOADING = ("loading ShareGPT words for previews (the first launch builds their cache, "
                 "up to a minute); until then a preview shows token ids")


class FrameCheck(Protocol):
    """Something that checks sampled frames against the mirror (``inspector.fidelity``)."""

    def due(self) -> bool:
        """True when the next frame should be checked."""

    def check(self, app: InspectorApp) -> None:
        """Compare what the panes draw with ``app.feed.mirror`` (called with the lock held,
        right after the panes took the frame)."""


class InspectorApp(App[None]):
    """See and steer a radix cache through a ``Source``. Its panes are those of ``PANES``
    (a subclass with more panes adds their ``pane_bindings`` to its ``BINDINGS``)."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # (a subclass elsewhere finds it too)
    PANES: ClassVar[tuple[Pane, ...]] = PANES
    TITLE = "radixcache inspector"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help"),
        # priority: taken when the key arrives, before the keys typed after it are passed on
        Binding("colon,slash", "focus_command", "Command", priority=True),
        Binding("escape", "focus_tree", "Tree", show=False),
        *pane_bindings(PANES),
        Binding("ctrl+left", "resize(-5)", "Narrow", show=False),
        Binding("ctrl+right", "resize(5)", "Widen", show=False),
        Binding("p", "replay('toggle')", "Play", show=False),
        Binding("full_stop", "replay('step')", "Step", show=False),
        Binding("comma", "replay('back')", "Back", show=False),
        Binding("greater_than_sign", "replay('next_key')", "Keyframe", show=False),
        Binding("less_than_sign", "replay('prev_key')", "Keyframe", show=False),
        Binding("right_square_bracket", "replay('faster')", "Faster", show=False),
        Binding("left_square_bracket", "replay('slower')", "Slower", show=False),
        Binding("w", "whatif", "What if", show=False),
        Binding("z", "zoom_blocks", "Zoom", show=False),  # whichever pane has the focus
        Binding("e", "focus_events", "Event log", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, source: Source, *, frame_interval: float = 1 / FRAME_HZ,
                 flash_s: float = 1.5, evicted_s: float = EVICTED_SHOW_S,
                 check: FrameCheck | None = None) -> None:
        super().__init__()
        self.flash_s, self.evicted_s = flash_s, evicted_s
        self.source = source
        self.feed = Feed()
        # set before mount: a source whose start raises (a crafted recording) unmounts the
        # app at once, and on_unmount must not hide the real error behind a missing attribute
        self._frame_timers: list[Timer] = []
        self.builder = Builder()
        self.check = check
        self.frame_interval = frame_interval
        self.frame_ms: deque[float] = deque(maxlen=10_000)
        self.commands = CommandReplies(self, source, self.action_help, self.explain)
        self.tree_width = 50
        self.layout = TreeLayout(self.feed)
        self._selected: int | None = None
        self._words_said = False  # the dataset words' loading was announced
        self._model_note = ""  # the model text's note last said

    @property
    def messages(self) -> list[str]:
        """The last messages shown above the command line, oldest first."""
        return list(self.commands.messages)

    @property
    def replies(self) -> int:
        """Replies the source sent back so far."""
        return self.commands.replies

    # -- layout ----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        """Header, main: [panes, right: [panes, lower: [panes]]], bottom: [panes], replay
        bar, command line; each pane where its ``Place`` says (``inspector.panes``)."""
        yield Static(id="header")
        yield Static(id="fault")
        with Horizontal(id="main"):
            yield from make(self.PANES, Place.MAIN)
            with Vertical(id="right"):
                yield from make(self.PANES, Place.RIGHT)
                with Horizontal(id="lower"):
                    yield from make(self.PANES, Place.LOWER)
        with Horizontal(id="bottom"):
            yield from make(self.PANES, Place.BOTTOM)
        yield Static(id="timeline")
        yield Static(id="message")
        yield CommandLine(id="command")
        yield Footer()

    def on_mount(self) -> None:
        """Start the source and the frame timer."""
        q = self.query_one
        widgets = tuple(q(f"#{pane.id}", PaneWidget) for pane in self.PANES)
        self._panes = Panes(widgets, q("#header", Static), q("#fault", Static),
                            q("#timeline", Static), q("#message", Static), q(CommandLine))
        self._tree, self._blocks = self._panes.of(TreeView), self._panes.of(BlockMap)
        self.painter = Painter(self._panes, self.commands, self.flash_s)
        self.tree_pane.vocab = self.source.vocabulary()
        replay = isinstance(self.source, ReplayControls)
        q("#timeline").display = replay
        if replay:  # a recording cannot be steered: suggest what works on it
            self._panes.command.placeholder = REPLAY_HINT
        self._panes.fault.display = False
        self._fit(self.size.width, self.size.height)
        self.source.start(self.feed)
        self._frame_timers = [self.set_interval(self.frame_interval, self.frame)]
        self.tree_pane.focus()
        self.frame()

    def on_unmount(self) -> None:
        """Stop the timers and the source thread."""
        for timer in self._frame_timers:
            timer.stop()
        self.source.stop()

    def on_resize(self, event: events.Resize) -> None:
        """Compact layouts for short or narrow terminals."""
        self._fit(event.size.width, event.size.height)

    def _fit(self, width: int, height: int) -> None:
        for name, on in (("-short", height < SHORT), ("-narrow", width < NARROW)):
            if on:
                self.screen.add_class(name)
            else:
                self.screen.remove_class(name)

    @property
    def panes(self) -> Panes:
        """The panes (found at mount, kept while the app runs)."""
        return self._panes

    @property
    def tree_pane(self) -> TreeView:
        """The tree pane."""
        return self._tree

    @property
    def blocks(self) -> BlockMap:
        """The block map pane."""
        return self._blocks

    # -- the frame -------------------------------------------------------------------------
    def frame(self) -> None:
        """Take one frame of the mirror (one lock hold) and show it on every pane."""
        if not self.is_running:  # shutting down: a timer may fire while the panes are pruned
            return
        t0 = time.perf_counter()
        wall = time.time()
        # A source's status takes no engine lock (published state only); still ask it before
        # taking the feed's lock, so the lock is held for the frame view alone.
        status = self.source.status()
        position = self.source.position() if isinstance(self.source, ReplayControls) else None
        tree = self.tree_pane
        self.layout.take(tree)
        check = self.check if self.check is not None and self.check.due() else None
        with self.feed.lock:
            d = self.feed.take_locked()
            cands = self.layout.locked(d, tree)
            want = Want(tree.window(WINDOW_MARGIN), self._selected, cands, LRU_ROWS, wall,
                        self.evicted_s)
            frame = self.builder.build(self.feed, d, want)
            if check is not None:
                self._paint(frame, d, Outside(wall, self.size.width, status, position))
                check.check(self)
        if check is None:
            self._paint(frame, d, Outside(wall, self.size.width, status, position))
        self._words_note()
        job = self.layout.job(wall, tree)
        if job is not None:
            self.run_worker(job, thread=True, group="layout", exclusive=True)
        if not d.empty:
            self.frame_ms.append((time.perf_counter() - t0) * 1000)

    def _words_note(self) -> None:
        """Say what the previews wait for while the dataset's words load (on the first launch
        their cache is built: up to a minute of ``#66269 woul…``), and when they are in."""
        words = self.tree_pane.vocab
        if not isinstance(words, DatasetWords):
            return
        if isinstance(words, ModelWords) and words.note != self._model_note:
            self._model_note = words.note  # which tokenizer previews read, or why ids
            if words.note:
                self.say(("✓ " if words.decodes else "✗ ") + words.note,
                         error=not words.decodes)
            return
        if words.loading() and not self._words_said:
            self._words_said = True
            self.say(f"… {WORDS_LOADING}")
        elif self._words_said and words.ready.is_set() and self.messages[-1:] == [
                f"… {WORDS_LOADING}"]:
            self.say("✓ ShareGPT words loaded: previews show text" if not words.error else
                     f"✗ no ShareGPT words ({words.error}): previews show token ids",
                     error=bool(words.error))

    def _paint(self, frame: Frame, d: Delta, out: Outside) -> None:
        self.painter.show(frame, d, out, self.builder.note)
        self._selected = self.builder.selected_id  # it follows merges, or was cleared

    @property
    def view(self) -> Frame:
        """The frame on screen."""
        return self.painter.view

    @property
    def req_per_s(self) -> float:
        """Requests per second, as the header shows."""
        return self.painter.req_per_s

    def caught_up(self) -> bool:
        """True when every batch the feed received is on screen (the screenshots, the bench
        and the tests wait for this)."""
        return self.feed.idle() and self.layout.settled()

    # -- selection and folding -------------------------------------------------------------
    def on_tree_view_selected(self, message: TreeView.Selected) -> None:
        """The cursor's node becomes the selection; the next frame draws it everywhere."""
        self._selected = message.node_id if message.node_id != 0 else None
        self.frame()

    def on_tree_view_moved(self, _: TreeView.Moved) -> None:
        """The window scrolled: copy the new rows' figures now."""
        self.frame()

    def on_tree_view_fold(self, message: TreeView.Fold) -> None:
        """Fold or unfold in place (no full re-layout)."""
        tree = self.tree_pane
        row = tree.rows[message.index]
        with self.feed.lock:
            if message.how is Folding.COLLAPSE:
                tree.collapsed.add(row.node.id)
                collapse(tree.rows, message.index)
            else:
                tree.collapsed.discard(row.node.id)
                expand(tree.rows, message.index, tree.collapsed)
        tree.set_rows(tree.rows)
        self.frame()

    # -- commands --------------------------------------------------------------------------
    def on_input_submitted(self, message: Input.Submitted) -> None:
        """Parse; say what is wrong, or send it from a worker thread. The focus goes back to
        the panes (a ``:`` typed next opens a new command, it is not part of this one); a
        dialog the command opened (``why``) returns it there too."""
        self._focus_pane()
        self.commands.submit(message.value)

    def say(self, text: str, *, error: bool = False) -> None:
        """Show a one-line message above the command line (in red for an error)."""
        self.commands.say(text, error=error)

    # -- actions ---------------------------------------------------------------------------
    def action_help(self) -> None:
        """Show the key map; focus returns to the panes when it closes."""
        self.push_screen(HelpScreen(key_map(self.PANES)), callback=lambda _: self._focus_pane())

    def action_zoom_blocks(self) -> None:
        """The block map: whole pool / one cell per block, from any pane (the tree has the
        focus by default: a binding on the map alone did nothing there)."""
        self.blocks.action_zoom()

    def action_whatif(self) -> None:
        """The hit-rate curve of what the engine did (``inspector.whatif_screen``)."""
        from inspector.whatif_screen import WhatIfScreen

        self.push_screen(WhatIfScreen(self.source, self.feed))

    def explain(self, req: int) -> None:
        """Why request ``req`` missed (``inspector.why_screen``)."""
        from inspector.why_screen import WhyScreen

        self.push_screen(WhyScreen(self.feed, req))

    def on_event_log_explain(self, message: EventLog.Explain) -> None:
        """Enter in the event log: explain its request, or say how to pick one."""
        if message.req is None:
            self.say("✗ the selected entry is not a request event (rstart or rfinish; filter "
                     "rstart rfinish shows them), or type: why REQ", error=True)
        else:
            self.explain(message.req)

    def action_focus_events(self) -> None:
        """Focus the event log with its newest request event selected (up/down select
        another, enter: why that request missed)."""
        events = self._panes.of(EventLog)
        events.display = True
        events.select_newest_request()
        events.focus()

    def action_focus_command(self) -> None:
        """Focus the command line at once. The keys typed right after ``:`` may already wait
        in the queue (a busy machine reads ``:stats`` in one chunk): a plain binding ran only
        after the focused pane had passed ``:`` up, and ``Widget.focus`` moves the focus a
        turn later still, so those keys went to the tree. In an input, or on another screen,
        ``:`` and ``/`` are left to it (typed as text)."""
        command = self._panes.command
        if self.screen is not command.screen or isinstance(self.focused, Input):
            raise SkipAction
        self.screen.set_focus(command)

    def action_focus_tree(self) -> None:
        """Back to the tree (or the first pane shown)."""
        self._focus_pane()

    def _focus_pane(self) -> None:
        for pane in (self.tree_pane, self.blocks):
            if pane.display:
                pane.focus()
                return
        self._panes.command.focus()

    def action_toggle_pane(self, name: str) -> None:
        """Show or hide a pane; a hidden pane hands its focus on. A shown pane leaves the
        focus where it is (the tree's keys keep working after F6), except the tree itself,
        which takes back the focus it handed on when hidden."""
        pane = self.query_one(f"#{name}")
        pane.display = not pane.display
        if pane.display and pane is self.tree_pane:
            pane.focus()
        elif self.focused is None or not self.focused.display:
            self._focus_pane()

    def action_resize(self, delta: int) -> None:
        """Change the tree pane's share of the width (20..80 %)."""
        self.tree_width = max(20, min(80, self.tree_width + delta))
        self.tree_pane.styles.width = f"{self.tree_width}%"

    def action_replay(self, what: str) -> None:
        """Replay controls; a message when the source is not a recording."""
        src = self.source
        if not isinstance(src, ReplayControls):
            self.say("✗ replay keys work in replay mode (radixcache replay FILE)", error=True)
            return
        moves: dict[str, Callable[[], None]] = {
            "toggle": src.toggle, "step": partial(src.step, 1), "back": partial(src.step, -1),
            "next_key": partial(src.seek_keyframe, 1), "prev_key": partial(src.seek_keyframe, -1),
            "faster": partial(src.set_speed, 2.0), "slower": partial(src.set_speed, 0.5)}
        moves[what]()
        self.frame()

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        """The palette: the app's own actions next to Textual's."""
        yield from super().get_system_commands(screen)
        for pane in self.PANES:
            yield SystemCommand(f"Toggle {pane.id} pane", f"Show or hide the {pane.id} pane",
                                partial(self.action_toggle_pane, pane.id))
        yield SystemCommand("Help", "Show the key map", self.action_help)
        yield SystemCommand("Focus command line", "Type a command", self.action_focus_command)
