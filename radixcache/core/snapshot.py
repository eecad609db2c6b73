"""Snapshot and digest of ``RadixTree``, and the structure digest it shares with the mirror.

A mixin: ``RadixTree`` owns the state declared below and the lock.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from radixcache.core import events as ev
from radixcache.core.blocks import BlockAllocator
from radixcache.core.nodes import RadixNode


class SnapshotMixin:
    """The whole tree as one ``Snapshot`` event, and its digest."""

    root: RadixNode
    B: int
    alloc: BlockAllocator
    high: float
    low: float
    lock_: threading.Lock
    _nodes: dict[int, RadixNode]
    _clock: int
    _next_id: int

    if TYPE_CHECKING:

        def request_blocks(self) -> set[int]: ...

    def _preorder(self) -> list[RadixNode]:
        """Every node, parents before children."""
        order, stack = [], [self.root]
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        return order

    @staticmethod
    def _path_locks(order: list[RadixNode]) -> dict[int, int]:
        """Each node's lock count (its pins and its descendants'), in one pass (O(nodes))."""
        locks: dict[int, int] = {}
        for n in reversed(order):  # children first
            locks[n.id] = n.pins + sum(locks[c.id] for c in n.children.values())
        return locks

    def snapshot(self) -> ev.Snapshot:
        """The whole state as one event (parents before children)."""
        with self.lock_:
            order = self._preorder()
            locks = self._path_locks(order)
            nodes = [
                ev.NodeState(
                    n.id,
                    n.parent.id if n.parent else -1,
                    n.start,
                    n.tokens,
                    n.blocks.tolist(),
                    locks[n.id],
                    n.clock,
                )
                for n in order
            ]
            return ev.Snapshot(
                self.B,
                self.alloc.num_blocks,
                nodes,
                self._clock,
                self._next_id,
                sorted(self.request_blocks()),
                self.high,
                self.low,
            )

    def digest(self) -> str:
        """A stable hash of the structure: every node's id, parent, span, tokens, blocks, lock
        and access clock, and the request-held blocks. Equal for a mirror built from events."""
        with self.lock_:
            locks = self._path_locks(self._preorder())
            return structure_digest(self._nodes.values(), self.request_blocks(), locks)



class _DigestNode(Protocol):
    """What the digest reads of a node (a tree node or a mirror node)."""

    @property
    def id(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def tokens(self) -> bytes: ...
    @property
    def lock(self) -> int: ...
    @property
    def clock(self) -> int: ...
    @property
    def parent(self) -> _DigestNode | None: ...
    @property
    def blocks(self) -> Sequence[int]: ...


def structure_digest(
    nodes: Iterable[_DigestNode], request_blocks: set[int], locks: dict[int, int] | None = None
) -> str:
    """The digest shared by the tree and the mirror (see ``RadixTree.digest``); ``locks``
    gives the nodes' lock counts when they do not carry them."""
    h = hashlib.blake2b(digest_size=16)
    for n in sorted(nodes, key=lambda n: n.id):
        parent = n.parent.id if n.parent is not None else -1
        lock = locks[n.id] if locks is not None else n.lock
        h.update(struct.pack("<qqqqq", n.id, parent, n.start, lock, n.clock))
        h.update(n.tokens)
        h.update(np.asarray(n.blocks, dtype="<i8").tobytes())
        h.update(b"|")
    h.update(np.asarray(sorted(request_blocks), dtype="<i8").tobytes())
    return h.hexdigest()
