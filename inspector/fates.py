"""Fates: what became of the nodes that left the tree lately, so a message about one says
what happened to it (evicted at seq N, merged into nM, dropped by a reset or a snapshot)
instead of guessing. A selection made from tree rows drawn a moment ago can name a node that
left several frames before; the frame's own delta no longer knows it then."""

from __future__ import annotations

from collections import OrderedDict

FATES_KEPT = 4096  # nodes whose departure is remembered (the newest)


class Fates:
    """The newest ``FATES_KEPT`` departures, and the last wipe of the whole tree. Written by
    the feed under its lock (a source's thread), read by the frame builder in the same
    lock hold."""

    def __init__(self) -> None:
        self._of: OrderedDict[int, str] = OrderedDict()
        self._merged: dict[int, int] = {}  # parent -> the child it was merged into
        self._wipe = ""  # why every node below ``_wiped_below`` left at once
        self._wiped_below = 0

    def evicted(self, node: int, seq: int) -> None:
        """``node`` gave up its blocks at batch ``seq`` (whether it left: the tree says)."""
        self._note(node, f"was evicted at seq {seq:,}")

    def merged(self, parent: int, child: int, seq: int) -> None:
        """``parent`` was joined into its only child ``child`` at batch ``seq``."""
        self._note(parent, f"was merged into n{child} at seq {seq:,}")
        self._merged[parent] = child

    def wiped(self, why: str, seq: int, next_id: int) -> None:
        """Every node id below ``next_id`` left at batch ``seq`` (``why``: a reset, a
        snapshot loaded); the single fates before it are superseded."""
        self._of.clear()
        self._merged.clear()
        self._wipe, self._wiped_below = f"{why} at seq {seq:,}", next_id

    def heir(self, node: int) -> int | None:
        """The node ``node`` was merged into (None: it was not)."""
        return self._merged.get(node)

    def of(self, node: int) -> str:
        """What became of ``node``, in words that follow its name (``n5 was evicted ...``)."""
        fate = self._of.get(node)
        if fate is not None:
            return fate
        if node < self._wiped_below:
            return f"left when {self._wipe}"
        return "is not in the tree (it left before the inspector could see how)"

    def _note(self, node: int, fate: str) -> None:
        self._of[node] = fate
        self._of.move_to_end(node)
        while len(self._of) > FATES_KEPT:
            old, _ = self._of.popitem(last=False)
            self._merged.pop(old, None)
