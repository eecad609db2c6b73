"""The inspector app: wires a ``Source`` and a ``Feed`` to the panes, one frame at a time.

Batches arrive on the source's thread and are applied to the mirror there (``Feed``). A
timer (``FRAME_HZ``) takes what changed since the previous frame and updates only that:
tree rows (re-laid-out in a background thread once the tree is big), block-map rows of the
touched blocks, the log, the figures. Keys are handled between frames, so typing stays
responsive however fast events arrive.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import ClassVar, NamedTuple

from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, Static

from inspector.feed import Feed
from inspector.layout import Row, block_ranges, collapse, expand, flatten
from inspector.sources import DatasetWords, ReplayControls, Source
from inspector.widgets.block_map import BlockMap, legend
from inspector.widgets.command_line import CommandLine, parse
from inspector.widgets.event_log import KINDS, EventLog
from inspector.widgets.lru import LruPane, next_victims
from inspector.widgets.memory import HISTORY, MemoryPane
from inspector.widgets.stats import Rate, StatsPane, header_line
from inspector.widgets.tree_view import TreeView
from radixcache.wire import commands as cmd
from radixcache.wire.mirror import MirrorNode

FRAME_HZ = 30
SYNC_LAYOUT_NODES = 5_000  # bigger trees are laid out off the UI thread
BIG_LAYOUT_EVERY_S = 0.5
LRU_ROWS = 12
EVICTED_SHOW_S = 2.0
PANES = ("tree", "blocks", "memory", "lru", "events", "stats")

HELP = """\
[b]radixcache inspector[/b]

[b]Panes[/b]  F2 tree  F3 block map  F4 memory  F5 LRU  F6 events  F7 stats (show/hide)
        ctrl+left / ctrl+right  narrow / widen the tree pane   tab-cycle with shift+tab
[b]Tree[/b]   ↑↓ j k  move · enter/space fold · ← → collapse/expand · home/end
        the selected node's blocks are white in the block map, its LRU place is marked
[b]Commands[/b]  : or /  focus the command line, esc back to the tree
        chat 20 · tot 3 4 · system 50 · fork 8 · flood 500 · evict 4096
        watermark 0.9 0.8 · pause · resume · reset · stats · snapshot
        filter split evict cow (event kinds; `filter all`) · help · quit
        tab completes, ↑ ↓ history; a wrong command is explained and not sent
[b]Replay[/b]  p play/pause · . step · , step back · > < keyframes · ] [ speed
ctrl+p  command palette · q quit (outside the command line)

Press esc to close.
"""


class Panes(NamedTuple):
    """The widgets the frame updates, found once at mount."""

    tree: TreeView
    blocks: BlockMap
    memory: MemoryPane
    lru: LruPane
    events: EventLog
    stats: StatsPane
    header: Static
    timeline: Static
    message: Static
    command: CommandLine


class HelpScreen(ModalScreen[None]):
    """The key map."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        """One framed text."""
        yield Static(HELP, id="help")


class InspectorApp(App[None]):
    """See and steer a radix cache through a ``Source``."""

    CSS_PATH = "app.tcss"
    TITLE = "radixcache inspector"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help"),
        Binding("colon,slash", "focus_command", "Command"),
        Binding("escape", "focus_tree", "Tree", show=False),
        Binding("f2", "toggle_pane('tree')", "Tree"),
        Binding("f3", "toggle_pane('blocks')", "Blocks"),
        Binding("f4", "toggle_pane('memory')", "Memory"),
        Binding("f5", "toggle_pane('lru')", "LRU"),
        Binding("f6", "toggle_pane('events')", "Events"),
        Binding("f7", "toggle_pane('stats')", "Stats", show=False),
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
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        source: Source,
        *,
        frame_interval: float = 1 / FRAME_HZ,
        flash_s: float = 1.5,
        evicted_s: float = EVICTED_SHOW_S,
    ) -> None:
        super().__init__()
        self.flash_s, self.evicted_s = flash_s, evicted_s
        self.source = source
        self.feed = Feed()
        self.frame_interval = frame_interval
        self._shown: tuple[object, ...] = ()
        self._timeline_shown = ""
        self.frame_ms: deque[float] = deque(maxlen=10_000)
        self.rate = Rate()
        self.req_per_s = 0.0
        self.messages: list[str] = []
        self.replies: list[cmd.AnyReply] = []
        self.tree_width = 50
        self._layout_due = True
        self._lru_due = True
        self._pending_rows: list[Row] | None = None
        self._pending_lru: list[MirrorNode] | None = None
        self._bg: threading.Thread | None = None
        self._next_big = 0.0
        self._big_cost = 0.0
        self._selected: set[int] = set()

    # -- layout ----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        """Header, tree | (block map, memory + LRU), events + stats, replay bar, command."""
        yield Static(id="header")
        with Horizontal(id="main"):
            yield TreeView(self.feed, id="tree")
            with Vertical(id="right"):
                yield BlockMap(self.feed, id="blocks")
                with Horizontal(id="lower"):
                    yield MemoryPane(id="memory")
                    yield LruPane(self.feed, id="lru")
        with Horizontal(id="bottom"):
            yield EventLog(self.feed, id="events")
            yield StatsPane(id="stats")
        yield Static(id="timeline")
        yield Static(id="message")
        yield CommandLine(id="command")
        yield Footer()

    def on_mount(self) -> None:
        """Start the source and the frame timer."""
        q = self.query_one
        self._panes = Panes(q(TreeView), q(BlockMap), q(MemoryPane), q(LruPane), q(EventLog),
                            q(StatsPane), q("#header", Static), q("#timeline", Static),
                            q("#message", Static), q(CommandLine))
        self.tree_pane.vocab = self.source.vocabulary()
        self._words_in = False
        self.tree_pane.border_title = "tree"
        self.blocks.border_title = "block map"
        self.blocks.border_subtitle = Text.assemble(*[(f"{t}  ", s) for t, s in legend()])
        self.query_one("#memory").border_title = "memory"
        self.query_one("#lru").border_title = "LRU queue (next out)"
        self._panes.events.set_kinds(self._panes.events.kinds)
        self.query_one("#stats").border_title = "stats"
        self.query_one("#timeline").display = isinstance(self.source, ReplayControls)
        self.source.start(self.feed)
        self._frame_timers = [self.set_interval(self.frame_interval, self.frame),
                        self.set_interval(0.5, self.slow_tick)]
        self.tree_pane.focus()
        self.frame()

    def on_unmount(self) -> None:
        """Stop the timers and the source thread."""
        for timer in self._frame_timers:
            timer.stop()
        self.source.stop()

    @property
    def tree_pane(self) -> TreeView:
        """The tree pane."""
        return self._panes.tree

    @property
    def blocks(self) -> BlockMap:
        """The block map pane."""
        return self._panes.blocks

    # -- the frame -------------------------------------------------------------------------
    def frame(self) -> None:
        """Apply what changed since the previous frame to the panes."""
        t0 = time.perf_counter()
        d = self.feed.take()
        wall = time.time()
        tree = self.tree_pane
        if d.flashes:
            tree.flash(d.flashes, wall, self.flash_s)
        self._layout_due |= d.structure or d.rebuild
        self._lru_due |= d.events > 0
        self._words_arrived(tree)
        self._relayout(wall)
        self._refresh_blocks(d.blocks, rebuild=d.rebuild, wall=wall)
        if d.events or tree.expire_flashes(wall):
            tree.refresh()
        if d.log:
            self._panes.events.refresh()
        for err in d.errors:
            self.say(f"[out of sync] {err}", error=1)
        if d.watermarks:  # each sample, so the sparkline does not depend on the frame rate
            note = self.source.status().memory_note
            for sample in d.watermarks[-HISTORY:]:
                self._panes.memory.push(sample, note)
        self._figures(wall)
        if not d.empty or self._pending_rows is not None:
            self.frame_ms.append((time.perf_counter() - t0) * 1000)

    def _words_arrived(self, tree: TreeView) -> None:
        """Once the dataset's words are in, previews drawn with ids are drawn again."""
        vocab = tree.vocab
        if not self._words_in and isinstance(vocab, DatasetWords) and vocab.ready.is_set():
            self._words_in = True
            tree.forget_previews()
            tree.refresh()

    def _relayout(self, wall: float) -> None:
        """New tree rows and LRU order: right now for small trees, else in the background."""
        if self._pending_rows is not None:
            self.tree_pane.set_rows(self._pending_rows)
            self._pending_rows = None
            self._tree_title()
            # A big tree is 100k+ long-lived objects: a full cyclic collection over them
            # stalls the UI for 150-750 ms. Move what lives now out of the collector's
            # sight; nodes and rows are freed by reference counting when dropped.
            gc.freeze()
        if self._pending_lru is not None:
            self._show_lru(self._pending_lru)
            self._pending_lru = None
        if not (self._layout_due or self._lru_due):
            return
        mirror = self.feed.mirror
        if len(mirror.nodes) <= SYNC_LAYOUT_NODES:
            with self.feed.lock:
                if self._layout_due:
                    self.tree_pane.set_rows(flatten(mirror, self.tree_pane.collapsed))
                    self._tree_title()
                if self._lru_due:
                    self._show_lru(next_victims(mirror, LRU_ROWS))
            self._layout_due = self._lru_due = False
        elif (self._bg is None or not self._bg.is_alive()) and wall > self._next_big:
            # the layout thread competes with this one for the GIL: keep it under ~1/4
            self._next_big = wall + max(BIG_LAYOUT_EVERY_S, 4 * self._big_cost)
            layout, self._layout_due, self._lru_due = self._layout_due, False, False
            self._bg = threading.Thread(target=self._background, kwargs={"layout": layout},
                                        daemon=True)
            self._bg.start()

    def _background(self, *, layout: bool) -> None:
        """Lay out a big tree and find the LRU order without the feed lock (atomic copies)."""
        t0 = time.perf_counter()
        mirror = self.feed.mirror
        if layout:
            self._pending_rows = flatten(mirror, set(self.tree_pane.collapsed),
                                         yield_every=1_000)
        self._pending_lru = next_victims(mirror, LRU_ROWS)
        self._big_cost = time.perf_counter() - t0

    def _tree_title(self) -> None:
        n = len(self.feed.mirror.nodes) - 1
        self.tree_pane.border_title = f"tree ({n:,} nodes, {len(self.tree_pane.rows):,} rows)"

    def _show_lru(self, victims: list[MirrorNode]) -> None:
        lru = self._panes.lru
        lru.set_victims(victims)

    def _refresh_blocks(self, touched: set[int], *, rebuild: bool, wall: float) -> None:
        bm = self.blocks
        m = self.feed.mirror
        with self.feed.lock:
            locked = self.feed.locked_blocks()
            for b in touched:
                if b < len(m.ref) and m.ref[b] == 0 and b in m.evicted_blocks:
                    bm.evicted[b] = wall + self.evicted_s
        changed = touched | (locked ^ bm.locked)
        bm.locked = locked
        faded = {b for b, until in bm.evicted.items() if until <= wall}
        for b in faded:
            del bm.evicted[b]
        if rebuild:
            bm.invalidate_all()
        elif changed or faded:
            bm.invalidate(changed | faded)
        used = m.watermark.used_blocks if m.watermark is not None else m.used_blocks
        title = f"block map {used:,}/{m.num_blocks:,}"
        if bm.border_title != title:
            bm.border_title = title

    def _figures(self, wall: float) -> None:
        m = self.feed.mirror
        self.req_per_s = self.rate.add(self.feed.now(), m.stats.requests)
        if isinstance(self.source, ReplayControls):
            line = self._timeline()
            if line.plain != self._timeline_shown:
                self._timeline_shown = line.plain
                self._panes.timeline.update(line)
        status = self.source.status()
        header = header_line(status, self.feed.epoch, self.feed.seq, m.stats, self.req_per_s, wall)
        shown = (header.plain, len(m.nodes), m.stats.requests, m.stats.evictions, m.version)
        if shown == self._shown:  # an idle frame costs (almost) nothing
            return
        self._shown = shown
        self._panes.header.update(header)
        self._panes.stats.show(m.stats, self.req_per_s, len(m.nodes) - 1)

    def caught_up(self) -> bool:
        """True when every batch the feed received is on screen (tests wait for this)."""
        return self.feed.idle() and self._pending_rows is None and not (
            self._layout_due or self._lru_due)

    def slow_tick(self) -> None:
        """Twice a second: redraw the memory pane (sparkline, ages) even without new samples."""
        self._panes.memory.refresh()
        self._panes.lru.refresh()

    def _timeline(self) -> Text:
        assert isinstance(self.source, ReplayControls)
        pos = self.source.position()
        width = max(10, self.size.width - 40 - (len(pos.note) + 4 if pos.note else 0))
        cells = ["─"] * width
        for k in pos.keyframes:
            cells[min(width - 1, k * width // max(1, pos.total))] = "┼"
        at = min(width - 1, pos.index * width // max(1, pos.total))
        out = Text(" ▶ " if pos.playing else " ❚❚ ", "bold #c792ea")
        out.append("".join(cells[:at]), "#c792ea")
        out.append("●", "bold #ffffff")
        out.append("".join(cells[at + 1 :]), "dim")
        out.append(f" {pos.index:,}/{pos.total:,} ×{pos.speed:g}  p . , < > [ ]", "dim")
        if pos.note:
            out.append(f"  ✗ {pos.note}", "bold #e06c75")
        return out

    # -- selection and folding -------------------------------------------------------------
    def on_tree_view_selected(self, message: TreeView.Selected) -> None:
        """Highlight the node's blocks and its place in the LRU queue."""
        node = self.feed.mirror.nodes.get(message.node_id)
        blocks = set(node.blocks) if node is not None and node.parent is not None else set()
        bm = self.blocks
        old, bm.selected = bm.selected, blocks
        bm.invalidate(old | blocks)
        lru = self._panes.lru
        lru.selected = message.node_id
        lru.refresh()
        if node is not None and node.parent is not None:
            rank = lru.rank_of(node.id)
            place = f"LRU #{rank}" if rank else ("locked" if node.lock else "not a victim yet")
            self.tree_pane.border_subtitle = (
                f"n{node.id}: {node.num_tokens:,} tok @{node.start} "
                f"{block_ranges(node.blocks, 30)} r{node.lock} · {place}")
        else:
            self.tree_pane.border_subtitle = ""

    def on_tree_view_fold(self, message: TreeView.Fold) -> None:
        """Fold or unfold in place (no full re-layout)."""
        tree = self.tree_pane
        row = tree.rows[message.index]
        with self.feed.lock:
            if message.collapse:
                tree.collapsed.add(row.node.id)
                collapse(tree.rows, message.index)
            else:
                tree.collapsed.discard(row.node.id)
                expand(tree.rows, message.index, tree.collapsed)
        tree.set_rows(tree.rows)
        self._tree_title()

    # -- commands --------------------------------------------------------------------------
    def on_input_submitted(self, message: Input.Submitted) -> None:
        """Parse; say what is wrong, or send it from a worker thread."""
        line = message.value.strip()
        box = self._panes.command
        box.value = ""
        if not line:
            return
        box.remember(line)
        parsed = parse(line)
        if parsed.error is not None:
            self.say(f"✗ {parsed.error} — nothing sent", error=1)
        elif parsed.local is not None:
            self._local(parsed.local)
        elif parsed.command is not None:
            self.say(f"→ {line}")
            self.run_worker(partial(self._send, parsed.command), thread=True, group="send")

    def _send(self, command: cmd.AnyCommand) -> None:
        reply = self.source.send(command)
        self.call_from_thread(self._replied, reply)

    def _replied(self, reply: cmd.AnyReply) -> None:
        self.replies.append(reply)
        if isinstance(reply, cmd.Ok):
            extra = "  ".join(f"{k}={v}" for k, v in reply.values.items())
            self.say(f"✓ {reply.message} {extra}".rstrip())
        else:
            assert isinstance(reply, cmd.Error)
            self.say(f"✗ {reply.message}", error=1)

    def _local(self, words: tuple[str, ...]) -> None:
        head, rest = words[0], words[1:]
        if head == "help":
            self.action_help()
        elif head == "quit":
            self.exit()
        else:
            kinds = frozenset(KINDS) if rest == ("all",) else frozenset(rest)
            unknown = kinds - set(KINDS)
            if unknown or not kinds:
                self.say(f"✗ filter takes event kinds: {' '.join(KINDS)} (or all)", error=1)
                return
            self._panes.events.set_kinds(kinds)
            self.say(f"✓ showing {' '.join(sorted(kinds))}")

    def say(self, text: str, *, error: int = 0) -> None:
        """Show a one-line message above the command line (``error=1``: in red)."""
        self.messages.append(text)
        self._panes.message.update(Text(text, "bold #e06c75" if error else "#98c379"))

    # -- actions ---------------------------------------------------------------------------
    def action_help(self) -> None:
        """Show the key map."""
        self.push_screen(HelpScreen())

    def action_whatif(self) -> None:
        """The hit-rate curve of the replay so far (``inspector.whatif_screen``)."""
        from inspector.whatif_screen import WhatIfScreen

        self.push_screen(WhatIfScreen(self.source))

    def action_focus_command(self) -> None:
        """Focus the command line."""
        self._panes.command.focus()

    def action_focus_tree(self) -> None:
        """Back to the tree."""
        self.tree_pane.focus()

    def action_toggle_pane(self, name: str) -> None:
        """Show or hide a pane."""
        pane = self.query_one(f"#{name}")
        pane.display = not pane.display

    def action_resize(self, delta: int) -> None:
        """Change the tree pane's share of the width (20..80 %)."""
        self.tree_width = max(20, min(80, self.tree_width + delta))
        self.tree_pane.styles.width = f"{self.tree_width}%"

    def action_replay(self, what: str) -> None:
        """Replay controls; a message when the source is not a recording."""
        src = self.source
        if not isinstance(src, ReplayControls):
            self.say("✗ replay keys work in replay mode (radixcache replay FILE)", error=1)
            return
        moves: dict[str, Callable[[], None]] = {
            "toggle": src.toggle, "step": partial(src.step, 1), "back": partial(src.step, -1),
            "next_key": partial(src.seek_keyframe, 1), "prev_key": partial(src.seek_keyframe, -1),
            "faster": partial(src.set_speed, 2.0), "slower": partial(src.set_speed, 0.5)}
        moves[what]()

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        """The palette: the app's own actions next to Textual's."""
        yield from super().get_system_commands(screen)
        for pane in PANES:
            yield SystemCommand(f"Toggle {pane} pane", f"Show or hide the {pane} pane",
                                partial(self.action_toggle_pane, pane))
        yield SystemCommand("Help", "Show the key map", self.action_help)
        yield SystemCommand("Focus command line", "Type a command", self.action_focus_command)
