"""The fidelity check: what the panes draw against the mirror, at the same seq.

``Fidelity`` is handed to ``InspectorApp(check=...)``; every ``every``-th frame the app shows
the frame and calls ``check`` while still holding the feed's lock, so the mirror is exactly
the state the frame was taken from. The truth is recomputed here from the mirror alone (a
walk over every node), not from the frame builder's incremental indexes, and compared with
what the panes render:

- block-map cells per state equal the mirror's counts (pinned, COW, shared, cached, free);
- the block map's title, the header and the memory pane show the mirror's used blocks;
- the tree's title and its root row show the mirror's node count;
- every LRU entry is a live, unpinned leaf, in (last access, id) order;
- no row of a live node is drawn as gone (struck through);
- the selection is a live node whose figures the footer shows, or it is cleared.

``bench tui`` reports the number of violations as ``fidelity_violations``; a test runs the
same check with a real stream at 50k events/s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from inspector.frame import Cell
from inspector.layout import block_ranges
from inspector.widgets.lru import LruPane
from inspector.widgets.memory import MemoryPane
from radixcache.wire.mirror import Mirror, is_victim

if TYPE_CHECKING:
    from inspector.app import InspectorApp


class Fidelity:
    """Checks every ``every``-th frame; ``violations`` lists what disagreed (with the seq)."""

    def __init__(self, every: int = 1) -> None:
        self.every = every
        self.frames = 0
        self.checked = 0
        self.violations: list[str] = []
        self._tick = 0

    def due(self) -> bool:
        """True for every ``every``-th frame."""
        self._tick += 1
        return self._tick % self.every == 0

    def check(self, app: InspectorApp) -> None:
        """Compare the panes with ``app.feed.mirror`` (the caller holds the feed's lock)."""
        m, frame = app.feed.mirror, app.view
        self.checked += 1
        found = [*self._blocks(app, m), *self._tree(app, m), *self._lru(app, m)]
        self.violations += [f"seq {frame.seq}: {v}" for v in found]

    @staticmethod
    def _truth(m: Mirror, selected: set[int], evicted: set[int]) -> dict[Cell, int]:
        """Each block's state from the mirror alone (pins walked from every node), counted;
        the same priority as the map: selected, free/evicted, pinned, COW, shared, cached."""
        pinned = set(m.request_blocks)
        for n in m.nodes.values():
            if n.pins > 0 and n.parent is not None:
                pinned.update(n.blocks)
        ref = np.array(m.ref, dtype=np.int64)
        state = np.where(ref > 1, Cell.SHARED, Cell.CACHED).astype(np.uint8)
        for blocks, cell in ((m.cow_blocks, Cell.COW), (pinned, Cell.PINNED)):
            state[np.fromiter(blocks, dtype=np.int64, count=len(blocks))] = cell
        state[ref == 0] = Cell.FREE
        gone = np.fromiter(evicted, dtype=np.int64, count=len(evicted))
        state[gone[ref[gone] == 0]] = Cell.EVICTED
        state[np.fromiter(selected, dtype=np.int64, count=len(selected))] = Cell.SELECTED
        counts = np.bincount(state, minlength=len(Cell))
        return {c: int(counts[c]) for c in Cell}

    def _blocks(self, app: InspectorApp, m: Mirror) -> list[str]:
        out: list[str] = []
        sel = app.view.selection
        node = m.nodes.get(sel.node.id) if sel is not None else None
        selected = set(node.blocks) if node is not None else set()
        truth = self._truth(m, selected, set(app.builder.evicted))
        drawn = app.blocks.drawn()
        for state in Cell:
            if drawn[state] != truth[state]:
                out.append(f"block map {state.name.lower()} {drawn[state]} != {truth[state]}")
        used = f"{m.used_blocks:,}/{m.num_blocks:,}"
        if not str(app.blocks.border_title).endswith(used):
            out.append(f"block map title {app.blocks.border_title!r} != {used}")
        if f"blocks {used}" not in str(app.panes.header.render()):
            out.append(f"header does not show blocks {used}")
        memory = app.panes.of(MemoryPane).pool_line()
        if f"pool {used} blocks" not in memory:
            out.append(f"memory pane does not show pool {used}")
        return out

    def _tree(self, app: InspectorApp, m: Mirror) -> list[str]:
        out: list[str] = []
        nodes = len(m.nodes) - 1
        tree = app.tree_pane
        if not str(tree.border_title).startswith(f"tree ({nodes:,} nodes"):
            out.append(f"tree title {tree.border_title!r} != {nodes:,} nodes")
        top = tree.scroll_offset.y
        for y in range(min(tree.size.height, len(tree.rows) - top)):
            row = tree.rows[top + y]
            strip = tree.render_line(y)
            gone = any(s.style is not None and s.style.strike for s in strip)
            if gone and row.node.id in m.nodes:
                out.append(f"live node n{row.node.id} drawn as gone")
            if row.node.id == 0 and f"root ({nodes:,} nodes)" not in strip.text:
                out.append(f"root row {strip.text.strip()!r} != {nodes:,} nodes")
        sel = app.view.selection
        if sel is not None:
            n = m.nodes.get(sel.node.id)
            if n is None:
                out.append(f"selection n{sel.node.id} is gone")
            elif not str(tree.border_subtitle).startswith(
                    f"n{n.id}: {n.num_tokens:,} tok @{n.start} {block_ranges(n.blocks, 30)} "
                    f"r{n.pins} "):
                out.append(f"footer {tree.border_subtitle!r} does not match n{n.id}")
        return out

    @staticmethod
    def _lru(app: InspectorApp, m: Mirror) -> list[str]:
        out: list[str] = []
        prev: tuple[int, int] | None = None
        for nid in app.panes.of(LruPane).victims:
            n = m.nodes.get(nid)
            if n is None or not is_victim(n):
                out.append(f"LRU entry n{nid} is not a live unpinned leaf")
                continue
            if prev is not None and (n.tail_clock, n.id) < prev:
                out.append(f"LRU entry n{nid} out of order")
            prev = (n.tail_clock, n.id)
        return out
