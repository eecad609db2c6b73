"""One frame, one truth: the immutable view of the mirror that every pane draws from.

The source thread applies batches to the mirror under ``Feed.lock``; once per frame the UI
thread takes that lock once and copies, at one seq, everything any pane will draw: each
block's state, the used-block count, the node count, the rows around the tree pane's window,
the LRU victims, the selection, the counters. Panes then render from the ``Frame`` alone, so
the header, the tree, the block map, the memory pane, the LRU queue and the footer can never
disagree with each other, however fast the mirror moves on underneath.

Per-block states are kept in one ``bytearray`` and only the blocks a batch touched (and those
whose pins or selection changed) are reclassified, so a frame costs what changed, not the pool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType

from inspector.fates import Fates
from inspector.feed import Delta, Feed
from inspector.layout import Row, block_ranges, human_age
from inspector.retractions import NO_RETRACTIONS, RetractTotals
from radixcache.core import events as ev
from radixcache.wire.mirror import Mirror, MirrorNode, MirrorStats, is_victim, next_victims

PREVIEW_BYTES = 8 * 4  # the tokens a preview shows (uint32 each)


class Cell(IntEnum):
    """A block's state on screen, lowest drawing priority first."""

    FREE = 0
    EVICTED = 1
    CACHED = 2
    SHARED = 3
    COW = 4
    PINNED = 5
    SELECTED = 6


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as one frame shows it (copied under the lock: later batches do not change it)."""

    id: int
    alive: bool
    num_tokens: int
    start: int
    blocks: tuple[int, ...]
    pins: int
    clock: int
    age: str
    leaf: bool
    head: bytes  # the first tokens, for the preview


@dataclass(frozen=True, slots=True)
class Selection:
    """The selected node at this frame and its place in the LRU queue."""

    node: NodeView
    place: str

    def footer(self) -> str:
        """``n12: 96 tok @40 b3-8 r1 · LRU #2``: what the tree pane's footer says."""
        n = self.node
        return (f"n{n.id}: {n.num_tokens:,} tok @{n.start} {block_ranges(n.blocks, 30)} "
                f"r{n.pins} · {self.place}")


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything the panes draw, at ``seq``. ``cells[b]`` is block ``b``'s ``Cell``. Two
    frames that compare equal draw the same screen (the app skips the second)."""

    seq: int
    epoch: int
    now: float = field(compare=False)  # the clock ages are measured against
    num_blocks: int
    cells: bytes
    used_blocks: int
    node_count: int
    stats: MirrorStats
    counters: ev.Counters | None
    fault: ev.Fault | None
    watermark: ev.Watermark | None
    high: float
    low: float
    rows: Mapping[int, NodeView]
    lru: tuple[NodeView, ...]
    selection: Selection | None
    # blocks whose cell changed since the previous frame (None: all of them)
    changed: frozenset[int] | None = field(default=None, compare=False)
    queue: ev.Queue | None = None  # the engine's waiting queue and why each waits
    retractions: RetractTotals = NO_RETRACTIONS  # the stream's retractions so far

    def count(self, state: Cell) -> int:
        """Blocks drawn in ``state``."""
        return self.cells.count(state)


EMPTY = Frame(-1, -1, 0.0, 0, b"", 0, 0, MirrorStats(), None, None, None, 0.92, 0.85,
              MappingProxyType({}), (), None)


@dataclass(frozen=True, slots=True)
class Want:
    """What the UI asks the next frame for: the tree rows around its window, the selected node,
    the LRU candidates a background layout found (None: find them now), the wall clock."""

    window: Sequence[Row]
    selected: int | None
    lru_candidates: Sequence[tuple[MirrorNode, int]] | None  # (node, its clock when ranked)
    lru_rows: int
    wall: float
    evicted_s: float


class Builder:
    """Turns the mirror into ``Frame``s; keeps the per-block states between frames."""

    def __init__(self) -> None:
        self.cells = bytearray()
        self.pinned: set[int] = set()
        self.selected: set[int] = set()
        self.evicted: dict[int, float] = {}  # freed block -> wall time its mark fades
        self.selected_id: int | None = None
        # Blocks drawn shared. An eviction drops a reference to its node's first block (shared
        # with the parent) without naming it in the event, so these are re-checked each frame.
        self.shared: set[int] = set()
        self.note = ""  # why the selection moved or cleared in the last frame, if it did
        self._bytes = b""
        self._changed: frozenset[int] | None = None

    def build(self, feed: Feed, d: Delta, want: Want) -> Frame:
        """The frame at the feed's current seq (call with ``feed.lock`` held)."""
        m = feed.mirror
        sel = self._follow(m, d, feed.fates, want.selected)
        self._cells(feed, d, sel, want)
        views = {row.node.id: self._view(feed, m, row.node.id) for row in want.window}
        lru = self._lru(feed, m, want)
        selection = None
        if sel is not None:
            node = self._view(feed, m, sel)
            rank = next((i + 1 for i, v in enumerate(lru) if v.id == sel), None)
            place = f"LRU #{rank}" if rank else ("pinned" if node.pins else "not a victim yet")
            selection = Selection(node, place)
        free = self._bytes.count(Cell.FREE) + self._bytes.count(Cell.EVICTED)
        return Frame(feed.seq, feed.epoch, feed.now(), m.num_blocks, self._bytes,
                     m.num_blocks - free, len(m.nodes) - 1, dataclasses.replace(m.stats),
                     m.counters, m.fault, m.watermark, m.high, m.low,
                     MappingProxyType(views), tuple(lru), selection, self._changed, m.queue,
                     feed.retractions.totals)

    def _follow(self, m: Mirror, d: Delta, fates: Fates, wanted: int | None) -> int | None:
        """The selected node at this seq: a merged parent's tokens live on in its child; an
        evicted node or a reset clears it, and ``note`` says so."""
        self.note = ""
        if wanted != self.selected_id:
            self.selected_id = wanted
        nid = self.selected_id
        if nid is None or nid == 0:
            return None
        while (heir := d.merged.get(nid, fates.heir(nid))) is not None:
            nid = heir
        if nid in m.nodes:
            if nid != self.selected_id:
                self.note = f"n{self.selected_id} merged into n{nid}: selection follows"
            self.selected_id = nid
            return nid
        self.note = f"n{nid} {fates.of(nid)}: selection cleared"
        self.selected_id = None
        return None

    def _cells(self, feed: Feed, d: Delta, sel: int | None, want: Want) -> None:
        """Reclassify the blocks whose state may have changed since the previous frame."""
        m = feed.mirror
        n = m.num_blocks
        dirty: set[int] | range = d.blocks
        if len(self.cells) != n or d.rebuild:
            self.cells = bytearray(n)
            self.evicted.clear()
            self.shared.clear()
            dirty = range(n)
        wall = want.wall
        for b in d.blocks:
            if b < n and m.ref[b] == 0 and b in m.evicted_blocks:
                self.evicted[b] = wall + want.evicted_s
        faded = {b for b, until in self.evicted.items() if until <= wall}
        for b in faded:
            del self.evicted[b]
        pinned = feed.pinned_blocks()
        node = m.nodes.get(sel) if sel is not None else None
        selected = set(node.blocks) if node is not None else set()
        if not isinstance(dirty, range):
            unshared = {b for b in self.shared if m.ref[b] < 2} if d.evicted else set()
            dirty = dirty | faded | unshared | (pinned ^ self.pinned) | (selected ^ self.selected)
        self.pinned, self.selected = pinned, selected
        self._changed = None if isinstance(dirty, range) else frozenset(dirty)
        if not dirty and len(self._bytes) == n:
            return
        cells, classify, shared = self.cells, self._classify, self.shared
        for b in dirty:
            if b < n:
                cell = cells[b] = classify(m, b)
                if cell == Cell.SHARED:
                    shared.add(b)
                else:
                    shared.discard(b)
        self._bytes = bytes(cells)

    def _classify(self, m: Mirror, b: int) -> Cell:
        if b in self.selected:
            return Cell.SELECTED
        if m.ref[b] == 0:
            return Cell.EVICTED if b in self.evicted else Cell.FREE
        if b in self.pinned:
            return Cell.PINNED
        if b in m.cow_blocks:
            return Cell.COW
        return Cell.SHARED if m.ref[b] > 1 else Cell.CACHED

    @staticmethod
    def _view(feed: Feed, m: Mirror, nid: int) -> NodeView:
        n = m.nodes.get(nid)
        if n is None:
            return NodeView(nid, alive=False, num_tokens=0, start=0, blocks=(), pins=0,
                            clock=0, age="-", leaf=True, head=b"")
        at = feed.access_time(n.clock)
        return NodeView(nid, alive=True, num_tokens=n.num_tokens, start=n.start,
                        blocks=tuple(n.blocks), pins=n.pins, clock=n.clock,
                        age=human_age(None if at is None else feed.now() - at),
                        leaf=not n.children, head=n.tokens[:PREVIEW_BYTES])

    def _lru(self, feed: Feed, m: Mirror, want: Want) -> list[NodeView]:
        """The next victims at this seq. Candidates a background pass found are re-checked
        here (still a live, unpinned leaf at the same access clock) and kept in their order;
        without candidates the whole (small) tree is ranked now."""
        if want.lru_candidates is None:
            return [self._view(feed, m, n.id) for n, _ in next_victims(m, want.lru_rows)]
        out: list[NodeView] = []
        for cand, clock in want.lru_candidates:
            n = m.nodes.get(cand.id)
            if n is cand and is_victim(n) and n.tail_clock == clock:  # in their order
                out.append(self._view(feed, m, n.id))
                if len(out) == want.lru_rows:
                    break
        return out
