"""Every invariant of the tree and its pool, checked from scratch (tests call it after each step).

- each block's refcount equals its references (nodes holding it + the request holding it);
- only the first and last block of a node can be shared, a request's own blocks never are;
- the free list holds each block at most once, and no free block is shared or claimed;
- no slot of a block is owned by two nodes, and each block's claim ends where its deepest
  holder ends (or further, while a running request has reserved it in place);
- children are keyed by their distinct first tokens, each child starts where its parent ends;
- each node's blocks cover its span, one per logical block;
- pin counts are not negative, and no non-root node with one child is unpinned (that pair
  would be merged: their path pin counts are equal);
- each node's access times (``clock`` and ``older`` steps, ``core.recency``) decrease with
  depth: steps on block boundaries inside its span, and no child used after its parent's tail;
- every evictable leaf (unpinned, childless, not root) has exactly one LRU heap entry, keyed
  no later than the access of its deepest tokens; ``queued`` marks the nodes that have one.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

from radixcache.core import recency
from radixcache.core import tokens as tk
from radixcache.core.blocks import BlockAllocator
from radixcache.core.evict import Evictor
from radixcache.core.lease import Leases
from radixcache.core.nodes import RadixNode


class TreeState(Protocol):
    """What the check reads of a ``RadixTree``: public state only (typed here so this module
    never imports the tree: ``RadixTree.check`` imports this one)."""

    @property
    def root(self) -> RadixNode: ...
    @property
    def B(self) -> int: ...
    @property
    def alloc(self) -> BlockAllocator: ...
    @property
    def evictor(self) -> Evictor: ...
    @property
    def leases(self) -> Leases: ...
    def live_nodes(self) -> Iterable[RadixNode]: ...
    def request_blocks(self) -> set[int]: ...


class InvariantError(AssertionError):
    """One or more invariants do not hold; the message lists them."""


def _check_node(tree: TreeState, n: RadixNode, out: list[str]) -> None:
    B = tree.B
    p = n.parent
    if p is None or not p.alive or p.children.get(tk.token_at(n.tokens, 0)) is not n:
        out.append(f"node {n.id}: not its parent's child under its first token")
        return
    if n.start != p.end:
        out.append(f"node {n.id}: starts at {n.start}, parent ends at {p.end}")
    if not n.tokens or len(n.tokens) % 4:
        out.append(f"node {n.id}: empty or ragged token bytes")
    if n.end != n.start + tk.count(n.tokens):
        out.append(f"node {n.id}: end {n.end} but {tk.count(n.tokens)} tokens from {n.start}")
    want = (n.end - 1) // B - n.start // B + 1
    if len(n.blocks) != want:
        out.append(f"node {n.id}: {len(n.blocks)} blocks for span [{n.start},{n.end}), want {want}")
    if n.pins < 0:
        out.append(f"node {n.id}: {n.pins} pins")
    if not recency.well_formed(n.start, n.end, n.clock, n.older, B):
        out.append(f"node {n.id}: older steps {n.older} out of order for [{n.start},{n.end})")
    if n.clock > p.tail_clock and p.parent is not None:
        out.append(f"node {n.id}: used at {n.clock}, after its parent's tail ({p.tail_clock})")
    if len(n.children) == 1 and n.pins == 0:
        (c,) = n.children.values()
        out.append(f"node {n.id}: mergeable with its only child {c.id}")


def _slot_owners(tree: TreeState) -> dict[int, list[tuple[int, int, int]]]:
    """block -> [(first slot, end slot, node id)] of the slots each node's span owns."""
    B = tree.B
    owners: dict[int, list[tuple[int, int, int]]] = {}
    for n in tree.live_nodes():
        for i, b in enumerate(n.blocks):
            base = (n.start // B + i) * B
            lo, hi = max(n.start, base) - base, min(n.end, base + B) - base
            owners.setdefault(b, []).append((lo, hi, n.id))
    return owners


def _check_blocks(tree: TreeState, out: list[str]) -> None:
    a = tree.alloc
    refs: Counter[int] = Counter()
    for n in tree.live_nodes():
        refs.update(n.blocks)
    private = tree.request_blocks()
    refs.update(private)
    out.extend(a.check())
    # release_run relies on it: only a node's first and last block can be shared
    for n in tree.live_nodes():
        inner = [b for b in n.blocks[1:-1] if refs[b] != 1]
        if inner:
            out.append(f"node {n.id}: interior blocks {inner[:5]} shared")
    shared = sorted(b for b in private if refs[b] != 1)
    if shared:
        out.append(f"request blocks {shared[:5]} also held elsewhere")
    for b, have in enumerate(a.refcounts()):
        if have != refs[b]:
            out.append(f"block {b}: refcount {have} but {refs[b]} references")
    inplace = tree.leases.inplace_blocks()
    for b, spans in _slot_owners(tree).items():
        spans.sort()
        for (_, hi, x), (lo, _, y) in itertools.pairwise(spans):
            if lo < hi:
                out.append(f"block {b}: slots owned by both node {x} and node {y}")
        top = max(hi for _, hi, _ in spans)
        claim = a.claim(b)
        if claim < top or (claim != top and b not in inplace):
            out.append(f"block {b}: claim {claim}, deepest holder ends at slot {top}")


def _check_lru(tree: TreeState, out: list[str]) -> None:
    heap = tree.evictor.entries()
    queued = Counter(n.id for _, _, n in heap if n.alive)
    twice = sorted(i for i, c in queued.items() if c > 1)
    if twice:
        out.append(f"LRU holds nodes {twice[:5]} twice")
    ahead = sorted(n.id for c, _, n in heap if n.alive and c > n.tail_clock)
    if ahead:
        out.append(f"LRU entries of nodes {ahead[:5]} are newer than their access")
    flags = sorted(n.id for n in tree.live_nodes() if n.queued != (n.id in queued))
    if flags:
        out.append(f"nodes {flags[:5]}: queued flag differs from the LRU heap")
    want = {n.id for n in tree.live_nodes() if n.evictable}
    if not want <= queued.keys():
        out.append(f"LRU misses evictable leaves {sorted(want - queued.keys())[:5]}")


def check_tree(tree: TreeState) -> None:
    """Raise ``InvariantError`` listing every violated invariant (caller holds the tree lock)."""
    out: list[str] = []
    root = tree.root
    if root.tokens or root.blocks or root.parent is not None:
        out.append("root holds tokens, blocks or a parent")
    for n in tree.live_nodes():
        if n is not root:
            _check_node(tree, n, out)
    _check_blocks(tree, out)
    _check_lru(tree, out)
    if out:
        raise InvariantError("; ".join(out[:20]))
