"""The tree pane's rows and the LRU candidates, laid out where each costs least.

A small tree (up to ``SYNC_LAYOUT_NODES``) is laid out in the frame, under the feed's lock, at
the frame's seq. A big one is laid out in a Textual worker thread without the lock (from
atomic copies of the node table), at most every ``BIG_LAYOUT_EVERY_S`` and at most a quarter
of the time; the next frame takes the rows and the LRU candidates it ranked, and re-checks
each candidate under the lock (``frame.Builder``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from functools import partial

from inspector.feed import Delta, Feed
from inspector.layout import Row, flatten
from inspector.widgets.tree_view import TreeView
from radixcache.wire.mirror import MirrorNode, next_victims

SYNC_LAYOUT_NODES = 5_000  # bigger trees are laid out off the UI thread
BIG_LAYOUT_EVERY_S = 0.5
LRU_ROWS = 12

Candidates = list[tuple[MirrorNode, int]]  # (node, its clock when ranked)


class TreeLayout:
    """Keeps ``tree``'s rows in step with ``feed``'s mirror (see the module doc)."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.due = True
        self._pending: tuple[list[Row] | None, Candidates] | None = None
        self._candidates: Candidates | None = None
        self._running = False
        self._next_big = 0.0
        self._big_cost = 0.0

    @property
    def big(self) -> bool:
        """True when the tree is laid out by the worker."""
        return len(self.feed.mirror.nodes) > SYNC_LAYOUT_NODES

    def locked(self, d: Delta, tree: TreeView) -> Sequence[tuple[MirrorNode, int]] | None:
        """In the frame, lock held: a small tree's new rows now; returns the LRU candidates
        for the frame (None: rank now; a big tree shows none until the worker's first pass)."""
        self.due |= d.structure or d.rebuild
        if d.rebuild:
            self._candidates = None
        if not self.big:
            self._candidates = None
            if self.due:
                tree.set_rows(flatten(self.feed.mirror, tree.collapsed))
                self.due = False
        return [] if self.big and self._candidates is None else self._candidates

    def job(self, wall: float, tree: TreeView) -> Callable[[], None] | None:
        """The worker's next pass over a big tree, when one is due (the caller runs it in a
        thread); None otherwise."""
        if not self.big or self._running or wall < self._next_big:
            return None
        # the layout thread competes with the UI thread for the GIL: keep it under ~1/4
        self._next_big = wall + max(BIG_LAYOUT_EVERY_S, 4 * self._big_cost)
        layout, self.due = self.due, False
        self._running = True
        return partial(self._run, set(tree.collapsed), layout)

    def _run(self, collapsed: set[int], layout: bool) -> None:  # noqa: FBT001
        """Lay out a big tree and rank LRU candidates without the feed lock (atomic copies)."""
        t0 = time.perf_counter()
        mirror = self.feed.mirror
        rows = flatten(mirror, collapsed, yield_every=1_000) if layout else None
        self._pending = (rows, next_victims(mirror, 4 * LRU_ROWS))
        self._big_cost = time.perf_counter() - t0
        self._running = False

    def take(self, tree: TreeView) -> None:
        """Before the frame: put the worker's last pass, if any, on ``tree``."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        rows, self._candidates = pending
        if rows is not None:
            tree.set_rows(rows)
            # A big tree is 100k+ long-lived objects: a full cyclic collection over them
            # stalls the UI for 150-750 ms. Move what lives now out of the collector's sight;
            # nodes are freed by reference counting when dropped (Feed breaks the cycles of
            # a dropped tree, so a resync, seek or reset does not pin the old one).
            gc.freeze()

    def settled(self) -> bool:
        """True when no layout is pending, running or due for a small tree."""
        return self._pending is None and not self._running and not (self.due and not self.big)
