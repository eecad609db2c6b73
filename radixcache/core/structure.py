"""Structure: the nodes of one tree and the edits that change its shape (a new leaf, a split,
a merge, a leaf cut by eviction), each keeping the refcounts and claims of the blocks the
nodes hold and recording its event.

With block size B = 4, a node split at token 6 and the merge that undoes it::

    N [0, 10)  blocks [a, b, c]   --split 6-->   P [0, 6)  [a, b]    b shared: P owns slots
                                                 N [6, 10) [b, c]    4-5, N 6-7 (refcount 2)
    --merge P into N-->  N [0, 10)  [a, b, c]    (the duplicate reference to b is dropped)

It never decides *when*: the tree inserts, the evictor picks victims. Edits return the node
that may have become an evictable leaf, for the caller to offer to the evictor. The tree's
lock guards it.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from radixcache.core import events as ev
from radixcache.core import recency
from radixcache.core import tokens as tk
from radixcache.core.blocks import BlockAllocator
from radixcache.core.eventlog import EventLog
from radixcache.core.evict import Cut
from radixcache.core.nodes import ROOT_ID, NodeId, RadixNode, TreeStats, UnknownNode
from radixcache.core.tokens import TOKEN_BYTES, common_units
from radixcache.core.tokens import unpack_token as _first


class Structure:
    """The node table (ids to nodes, the root, the next id) and the shape edits."""

    def __init__(self, alloc: BlockAllocator, stats: TreeStats, log: EventLog) -> None:
        self.alloc = alloc
        self.B = alloc.block_size
        self.stats = stats
        self.log = log
        self.clear()

    def clear(self) -> None:
        """Only the root is left (its blocks are the allocator's business)."""
        self.root = RadixNode(ROOT_ID, None, 0, 0, b"", array("i"))
        self.nodes: dict[int, RadixNode] = {ROOT_ID: self.root}
        self.next_id = 1

    def __len__(self) -> int:
        """The number of nodes, the root included."""
        return len(self.nodes)

    def live_nodes(self) -> Iterable[RadixNode]:
        """Every node, the root included (a view: do not edit the tree while iterating)."""
        return self.nodes.values()

    def alive(self, node: RadixNode) -> RadixNode:
        """``node`` itself when it is in this tree; raises ``UnknownNode``."""
        if not node.alive or self.nodes.get(node.id) is not node:
            raise UnknownNode(f"node {node.id} is not in the tree")
        return node

    def descend(self, seq: bytes, node: RadixNode, pos: int) -> tuple[RadixNode, int]:
        """Follow ``seq`` down from ``node`` (whose path covers ``seq[:pos]``): the deepest node
        touched (the match may end inside it) and the matched length. No state change."""
        n = len(seq) // TOKEN_BYTES  # tk.count, without a call (every request, twice)
        while pos < n:
            child = node.children.get(_first(seq, pos * TOKEN_BYTES)[0])
            if child is None:
                break
            node = child
            if seq.startswith(child.tokens, pos * TOKEN_BYTES):
                pos = child.end
            else:
                pos += common_units(seq, pos * TOKEN_BYTES, child.tokens)
                break
        return node, pos

    # -- grow ------------------------------------------------------------------------------
    def add_leaf(
        self, parent: RadixNode, seq: bytes, pos: int, blocks: array[int], *, shared: bool
    ) -> RadixNode:
        """A new leaf ``seq[pos:]`` under ``parent`` (which ends at ``pos``) holding ``blocks``;
        ``shared``: its first block is ``parent``'s last (its refcount goes up)."""
        B, n = self.B, len(seq) // TOKEN_BYTES
        leaf = RadixNode(NodeId(self.next_id), parent, pos, n, seq[pos * TOKEN_BYTES :], blocks)
        self.next_id += 1
        self.nodes[leaf.id] = leaf
        parent.children[_first(seq, pos * TOKEN_BYTES)[0]] = leaf
        if shared:
            self.alloc.incref(blocks[0])
        self.alloc.set_claim(blocks[-1], n - (n - 1) // B * B)  # the request may have reserved more
        if self.log.on:
            self.log.emit(ev.NodeCreated(leaf.id, parent.id, pos, leaf.tokens, blocks, shared))
        return leaf

    def extend(self, leaf: RadixNode, seq: bytes, pos: int, table: array[int]) -> RadixNode:
        """Append ``seq[pos:]`` to ``leaf`` (which ends at ``pos``) with the blocks of the
        request's ``table`` that cover it: a request that alone pins the leaf continued it
        (its last block, continued in place, is already the leaf's)."""
        B, n = self.B, len(seq) // TOKEN_BYTES
        j_last = (n - 1) // B
        new = table[(pos + B - 1) // B : j_last + 1]
        tokens = seq[pos * TOKEN_BYTES :]  # to its end: tk.span without a call
        leaf.tokens += tokens
        leaf.end = n
        leaf.blocks = leaf.blocks + new  # a new array: events may hold the old one
        self.alloc.set_claim(leaf.blocks[-1], n - j_last * B)
        self.stats.extends += 1
        if self.log.on:
            self.log.emit(ev.Extend(leaf.id, tokens, new))
        return leaf

    def split(self, node: RadixNode, k: int) -> RadixNode:
        """Split ``node`` ``k`` tokens in; returns the new prefix (the old id keeps the suffix,
        and with it the pins: a pinned node stays the deepest node of its holders' path)."""
        B, s = self.B, node.start
        p = s + k
        first = s // B
        prefix_blocks = node.blocks[: (p - 1) // B - first + 1]
        suffix_blocks = node.blocks[p // B - first :]
        if p % B:
            self.alloc.incref(suffix_blocks[0])
        parent = node.parent
        assert parent is not None
        head = node.clock
        prefix_older, node.clock, node.older = recency.split(head, node.older, p)
        prefix = RadixNode(
            NodeId(self.next_id), parent, s, p, tk.span(node.tokens, 0, k), prefix_blocks,
            clock=head, older=prefix_older,
        )
        self.next_id += 1
        self.nodes[prefix.id] = prefix
        parent.children[_first(node.tokens, 0)[0]] = prefix
        prefix.children[_first(node.tokens, k * TOKEN_BYTES)[0]] = node
        node.parent, node.start = prefix, p
        node.tokens, node.blocks = tk.span(node.tokens, k), suffix_blocks
        self.stats.splits += 1
        if self.log.on:
            self.log.emit(ev.Split(node.id, k, prefix.id, prefix_blocks, suffix_blocks))
        return prefix

    # -- shrink ----------------------------------------------------------------------------
    def merge(self, parent: RadixNode) -> int:
        """Join ``parent`` into its only child when both hold the same path pins (path
        compression); returns the blocks that freed (the parent's boundary block when only it
        held it). The joined node keeps each token's access time (``recency.join``), so its
        deepest time, the LRU's key, is the child's as before."""
        if parent is self.root or len(parent.children) != 1 or parent.pins:
            return 0
        (child,) = parent.children.values()
        dropped: int | None = None
        freed = False
        if child.start % self.B:
            dropped = parent.blocks[-1]
            freed = self.alloc.decref(dropped)
            if not freed and dropped != child.blocks[0]:
                # the grandparent chain still holds it: its claim falls back to our start
                self.alloc.set_claim(dropped, parent.start % self.B)
            child.blocks = parent.blocks[:-1] + child.blocks
        else:
            child.blocks = parent.blocks + child.blocks
        grand = parent.parent
        assert grand is not None
        grand.children[_first(parent.tokens, 0)[0]] = child
        child.older = recency.join(parent.clock, parent.older, child.start, child.clock,
                                   child.older, self.B, child.end)
        child.clock = parent.clock
        child.parent, child.start = grand, parent.start
        child.tokens = parent.tokens + child.tokens
        parent.alive = False
        parent.tokens, parent.blocks = b"", array("i")
        del self.nodes[parent.id]
        self.stats.merges += 1
        if self.log.on:
            self.log.emit(ev.Merge(parent.id, child.id, dropped, keeps_times=True))
        return int(freed)

    def cut(self, leaf: RadixNode, want: int) -> Cut:
        """Give up blocks of the evictable ``leaf``'s least recent tokens, its deepest
        stretch (``leaf.older``'s last, or the whole leaf): as few as free ``want`` blocks,
        or the whole stretch. The rest of the leaf stays with its access times. Returns what
        that freed and, when the leaf went whole, its parent if it became a leaf (to be offered
        to the evictor)::

            leaf [s ........ q ............ e)    q: where its deepest stretch starts
                  newer      | least recent |     blocks from q // B on: freed from the
                             [ b5 ][ b6 ][ b7 ]   tail, b7 first; all of them and q == s:
                                                  the leaf goes (a boundary block it shares
                                                  with its parent stays the parent's)"""
        B, older, start = self.B, leaf.older, leaf.start
        last = (leaf.end - 1) // B
        if older:  # steps start past the leaf's start: a deeper stretch goes, never all of it
            end = max(older[-1][0], (last - want + 1) * B)
        else:
            spare = last - start // B - want  # blocks left if ``want`` of them go
            if spare < 0 or (spare == 0 and self._shares_first(leaf)):
                return self._remove(leaf)
            end = (last - want + 1) * B
        # trim back to ``end``, a block boundary inside the leaf: the blocks past it are all
        # private (only a node's first block can be shared with its parent). Inline, not a
        # helper: this runs on nearly every allocation once the pool is full.
        blocks = leaf.blocks
        keep = (end - 1) // B - start // B + 1
        freed = blocks[keep:]
        self.alloc.free_tail(freed)
        tokens = leaf.end - end
        leaf.tokens = leaf.tokens[: (end - start) * TOKEN_BYTES]
        leaf.end, leaf.blocks = end, blocks[:keep]  # a new array: events hold the old one
        if older:
            leaf.older = recency.trim(older, end)
        self.stats.evicted_tokens += tokens
        if self.log.on:
            self.log.emit(ev.Evict(leaf.id, tokens, freed))
        return len(freed), tokens, None

    def _shares_first(self, node: RadixNode) -> bool:
        """``node``'s first block is its parent's last (it continues in that block)."""
        parent = node.parent
        assert parent is not None
        return (node.start % self.B != 0 and parent is not self.root
                and node.blocks[0] == parent.blocks[-1])

    def _remove(self, leaf: RadixNode) -> Cut:
        """Remove ``leaf`` whole (see ``cut``)."""
        parent = leaf.parent
        assert parent is not None
        start = leaf.start
        shared = self._shares_first(leaf)
        freed = self.alloc.release_run(leaf.blocks)
        if shared:
            self.alloc.set_claim(leaf.blocks[0], start % self.B)
        del parent.children[_first(leaf.tokens, 0)[0]]
        del self.nodes[leaf.id]
        leaf.alive = False
        tokens = leaf.end - start
        self.stats.evicted_nodes += 1
        self.stats.evicted_tokens += tokens
        if self.log.on:
            self.log.emit(ev.Evict(leaf.id, tokens, freed))
        leaf.tokens, leaf.blocks = b"", array("i")  # stale heap entries may still point here
        if parent is self.root:
            return len(freed), tokens, None
        if parent.children:  # a joined child keeps its LRU entry: its deepest time is unchanged
            merged = self.merge(parent) if len(parent.children) == 1 else 0
            return len(freed) + merged, tokens, None
        return len(freed), tokens, parent
