"""Snapshot and digest of a ``RadixTree`` from its public state, and the structure digest it
shares with the mirror."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

from radixcache.core import events as ev
from radixcache.core.blocks import BlockAllocator
from radixcache.core.evict import Evictor
from radixcache.core.nodes import RadixNode
from radixcache.core.structure import Structure


class TreeView(Protocol):
    """What a snapshot reads of a ``RadixTree`` (its public state; typed here so this module
    never imports the tree)."""

    @property
    def root(self) -> RadixNode: ...
    @property
    def B(self) -> int: ...
    @property
    def alloc(self) -> BlockAllocator: ...
    @property
    def high(self) -> float: ...
    @property
    def low(self) -> float: ...
    @property
    def evictor(self) -> Evictor: ...
    @property
    def structure(self) -> Structure: ...
    def request_blocks(self) -> set[int]: ...


def preorder(root: RadixNode) -> list[RadixNode]:
    """Every node under ``root`` (itself included), parents before children."""
    order, stack = [], [root]
    while stack:
        n = stack.pop()
        order.append(n)
        stack.extend(n.children.values())
    return order


def path_pins(order: list[RadixNode]) -> dict[int, int]:
    """Each node's path pin count (its pins and its descendants'), in one pass over a
    ``preorder`` (O(nodes))."""
    pins: dict[int, int] = {}
    for n in reversed(order):  # children first
        pins[n.id] = n.pins + sum(pins[c.id] for c in n.children.values())
    return pins


def snapshot_of(tree: TreeView) -> ev.Snapshot:
    """The whole state as one event, parents before children (caller holds the tree lock)."""
    order = preorder(tree.root)
    pins = path_pins(order)
    nodes = [
        ev.NodeState(
            n.id, n.parent.id if n.parent else -1, n.start, n.tokens, n.blocks.tolist(),
            pins[n.id], n.clock, n.older,
        )
        for n in order
    ]
    return ev.Snapshot(tree.B, tree.alloc.num_blocks, nodes, tree.evictor.clock,
                       tree.structure.next_id,
                       sorted(tree.request_blocks()), tree.high, tree.low)


def digest_of(tree: TreeView) -> str:
    """``structure_digest`` of the tree (caller holds the tree lock)."""
    order = preorder(tree.root)
    return structure_digest(order, tree.request_blocks(), path_pins(order))


class _DigestNode(Protocol):
    """What the digest reads of a node (a tree node or a mirror node)."""

    @property
    def id(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def tokens(self) -> bytes: ...
    @property
    def clock(self) -> int: ...
    @property
    def older(self) -> Sequence[tuple[int, int]]: ...
    @property
    def parent(self) -> _DigestNode | None: ...
    @property
    def blocks(self) -> Sequence[int]: ...


def structure_digest(
    nodes: Iterable[_DigestNode], request_blocks: set[int], pins: Mapping[int, int]
) -> str:
    """The digest shared by the tree and the mirror (see ``RadixTree.digest``); ``pins``
    gives each node's path pin count by id."""
    h = hashlib.blake2b(digest_size=16)
    for n in sorted(nodes, key=lambda n: n.id):
        parent = n.parent.id if n.parent is not None else -1
        h.update(struct.pack("<qqqqq", n.id, parent, n.start, pins[n.id], n.clock))
        if n.older:  # schema 4; absent, the digest is the one older engines computed
            h.update(b"older" + np.asarray(n.older, dtype="<i8").tobytes())
        h.update(n.tokens)
        h.update(np.asarray(n.blocks, dtype="<i8").tobytes())
        h.update(b"|")
    h.update(np.asarray(sorted(request_blocks), dtype="<i8").tobytes())
    return h.hexdigest()
