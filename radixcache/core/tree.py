"""RadixTree: token-granular prefix reuse on paged KV blocks.

Every node owns a span of tokens ``[start, end)`` (absolute positions along its
path) and the blocks that cover it. With block size B = 4 and a node split at
token 6::

    before:  N [0, 10)   blocks [a, b, c]        slots  a:0-3  b:4-7  c:8-9
    after:   P [0, 6)    blocks [a, b]           b is shared: P owns slots 4-5,
             N [6, 10)   blocks [b, c]           N owns 6-7 (refcount of b is 2)

A child whose parent ends inside a block either continues in that block's free
slots (the claim of the block ends exactly where the parent ends) or gets a
copy of the parent's leading slots (copy-on-write, at most B - 1 slots).

A request's block table takes, for each logical block, the block of the deepest
node on its path that covers it.

Concurrency: one ``threading.Lock`` guards the whole tree and its ``BlockAllocator``
(nodes, children, locks, the LRU heap, refcounts, claims, the event list). Model
compute never runs under it; the K/V tensor itself is not guarded (a block is
written only by the request that holds it privately or in-place reserved).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

from radixcache.core import events as ev
from radixcache.core import tokens as tk
from radixcache.core.invariants import check_tree
from radixcache.core.lease import LeaseMixin
from radixcache.core.nodes import ROOT_ID as ROOT_ID
from radixcache.core.nodes import EvictResult as EvictResult
from radixcache.core.nodes import InsertResult as InsertResult
from radixcache.core.nodes import Lease as Lease
from radixcache.core.nodes import MatchResult as MatchResult
from radixcache.core.nodes import NodeId as NodeId
from radixcache.core.nodes import NotLocked as NotLocked
from radixcache.core.nodes import PromptTooLarge as PromptTooLarge
from radixcache.core.nodes import RadixNode as RadixNode
from radixcache.core.nodes import TreeError as TreeError
from radixcache.core.nodes import TreeStats as TreeStats
from radixcache.core.nodes import UnknownNode as UnknownNode
from radixcache.core.snapshot import SnapshotMixin
from radixcache.core.snapshot import structure_digest as structure_digest
from radixcache.core.tokens import TOKEN_BYTES, U32, TokenSeq, common_units
from radixcache.core.tokens import InvalidTokens as InvalidTokens
from radixcache.core.tokens import unpack_token as _first

if TYPE_CHECKING:
    from radixcache.core.pool import KVPool


class RadixTree(LeaseMixin, SnapshotMixin):
    """The radix tree over a ``KVPool``. All public methods are thread-safe (one lock).

    Match, pin, insert and split live here; eviction, the LRU heap, merge and the watermarks
    in ``core.evict``; leases (allocate, copy-on-write, release) in ``core.lease``; snapshot
    and digest in ``core.snapshot``; the node and result types in ``core.nodes``."""

    def __init__(
        self,
        pool: KVPool,
        *,
        high: float = 0.92,
        low: float = 0.85,
        vocab_limit: int = U32,
        record_events: bool = True,
    ) -> None:
        self.pool = pool
        self.alloc = pool.allocator
        self.B = pool.block_size
        self.vocab_limit = vocab_limit
        self.lock_ = threading.Lock()
        self.stats = TreeStats()
        self._check_watermarks(high, low)
        self.high, self.low = high, low
        self._events: list[ev.AnyEvent] = []
        self._emit: Callable[[ev.AnyEvent], None] | None = (
            self._events.append if record_events else None
        )
        self._reset_state()

    def _reset_state(self) -> None:
        self.root = RadixNode(ROOT_ID, None, 0, 0, b"", array("i"))
        self._nodes: dict[int, RadixNode] = {ROOT_ID: self.root}
        self._next_id = 1
        self._clock = 0
        self._heap: list[tuple[int, int, RadixNode]] = []
        self._leases: set[Lease] = set()  # outstanding: allocated, not yet inserted/released
        self._inplace: set[int] = set()

    # -- events ----------------------------------------------------------------------------
    def take_events(self) -> list[ev.AnyEvent]:
        """Drain the events recorded since the last call, in order (one list swap)."""
        with self.lock_:
            out = self._events
            self._events = []
            if self._emit is not None:
                self._emit = self._events.append
            return out

    def emit(self, event: ev.AnyEvent) -> None:
        """Record a caller's event (a request's start or finish) in order with the tree's own
        (dropped when events are off)."""
        with self.lock_:
            if self._emit is not None:
                self._emit(event)

    # -- lookup ----------------------------------------------------------------------------
    def node(self, node_id: int) -> RadixNode:
        """The live node with this id; raises ``UnknownNode``."""
        try:
            return self._nodes[node_id]
        except KeyError:
            raise UnknownNode(f"no node {node_id} in the tree") from None

    def __len__(self) -> int:
        """Number of nodes, the root excluded."""
        return len(self._nodes) - 1

    @property
    def cached_tokens(self) -> int:
        """Tokens held by all nodes."""
        return sum(n.num_tokens for n in self._nodes.values())

    def request_blocks(self) -> set[int]:
        """Blocks held privately by outstanding leases (allocated, not yet inserted)."""
        return {b for lease in self._leases for b in lease.table[lease.private_from :]}

    # -- match -----------------------------------------------------------------------------
    def _descend(self, seq: bytes, node: RadixNode, pos: int) -> tuple[RadixNode, int]:
        """Follow ``seq`` down from ``node`` (whose path covers ``seq[:pos]``): the deepest node
        touched (the match may end inside it) and the matched length. No state change."""
        n = tk.count(seq)
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

    def _walk(self, seq: bytes) -> tuple[RadixNode, int, array[int]]:
        """Deepest match of ``seq`` from the root: (node, matched length, block table), the
        path stamped with a new access clock on the way down (what ``_touch`` does after)."""
        self._clock += 1
        c = self._clock
        node, pos, n, B = self.root, 0, tk.count(seq), self.B
        node.clock = c
        table = array("i")  # from the root, the deepest node covering a logical block wins
        while pos < n:
            child = node.children.get(_first(seq, pos * TOKEN_BYTES)[0])
            if child is None:
                break
            node = child
            child.clock = c
            if child.start % B:
                table[-1:] = child.blocks
            else:
                table.extend(child.blocks)
            if seq.startswith(child.tokens, pos * TOKEN_BYTES):
                pos = child.end
            else:
                pos += common_units(seq, pos * TOKEN_BYTES, child.tokens)
                break
        del table[(pos + B - 1) // B :]
        return node, pos, table

    def _touch(self, node: RadixNode) -> None:
        self._clock += 1
        c = self._clock
        n: RadixNode | None = node
        while n is not None:
            n.clock = c
            n = n.parent
        if self._emit is not None:
            self._emit(ev.Access(node.id, c))

    def match(self, tokens: TokenSeq) -> MatchResult:
        """Longest cached prefix of ``tokens`` at token granularity; marks the path used (LRU).

        The result's node is not locked: use ``match_and_lock`` when the blocks will be used.
        """
        seq = tk.validated(tokens, self.vocab_limit)
        with self.lock_:
            node, length, table = self._walk(seq)
            if self._emit is not None:
                self._emit(ev.Access(node.id, self._clock))
            return MatchResult(length, node, table)

    def peek(self, tokens: TokenSeq) -> tuple[RadixNode, int]:
        """The deepest node ``tokens`` reach (the match may end inside it) and the matched
        length, changing nothing: no access time, no event (a scheduler ordering its queue)."""
        seq = tk.validated(tokens, self.vocab_limit)
        with self.lock_:
            return self._descend(seq, self.root, 0)

    def match_and_lock(self, tokens: TokenSeq) -> MatchResult:
        """``match`` and ``lock`` of the result's node, atomically."""
        seq = tk.validated(tokens, self.vocab_limit)
        with self.lock_:
            node, length, table = self._walk(seq)
            self._lock(node)
            if self._emit is not None:
                self._emit(ev.Access(node.id, self._clock))
            return MatchResult(length, node, table)

    # -- lock ------------------------------------------------------------------------------
    def _lock(self, node: RadixNode) -> None:
        node.pins += 1
        if self._emit is not None:
            self._emit(ev.Lock(node.id, 1))

    def _alive(self, node: RadixNode) -> RadixNode:
        if not node.alive or self._nodes.get(node.id) is not node:
            raise UnknownNode(f"node {node.id} is not in the tree")
        return node

    def lock(self, node: RadixNode) -> None:
        """Hold a reference on every node of ``node``'s path: none is evicted until unlock.

        The count is kept on ``node`` alone (``pins``), O(1): only leaves are evicted, so
        a path is safe while its deepest node is pinned; ``RadixNode.lock`` (and the digest,
        snapshots and events) give the per-node path count."""
        with self.lock_:
            self._lock(self._alive(node))

    def unlock(self, node: RadixNode) -> None:
        """Drop a lock ``lock`` took on this node. ``NotLocked``/``UnknownNode``: tree
        unchanged."""
        with self.lock_:
            self._alive(node)
            if node.pins <= 0:
                raise NotLocked(f"node {node.id} is not locked")
            node.pins -= 1
            if self._emit is not None:
                self._emit(ev.Lock(node.id, -1))
            self._offer(node)
            self._maybe_merge(node)

    # -- insert ----------------------------------------------------------------------------
    def insert(self, tokens: TokenSeq, lease: Lease) -> InsertResult:
        """Cache ``tokens`` (the request's whole sequence, at most ``lease.total``) using the
        lease's blocks, splitting an edge where it diverges. Consumes the lease: blocks that
        duplicate what is already cached go back to the free list. Does not unlock."""
        seq = tk.validated(tokens, self.vocab_limit)
        with self.lock_:
            if lease.done:
                raise TreeError("lease already consumed")
            n = tk.count(seq)
            if n > lease.total:
                raise InvalidTokens(f"{n} tokens exceed the lease's {lease.total}")
            node, pos = self._descend_from_lease(seq, lease)
            leaf = None
            if pos == n:
                freed = self._finish_lease(lease)
            elif self._extendable(node, pos, lease):
                leaf = self._extend(seq, node, pos, lease)
                freed = self._finish_lease(lease, (pos, n), inplace_used=pos % self.B != 0)
            else:
                leaf = self._attach(seq, node, pos, lease)
                used = leaf is not None and leaf.blocks[0] == lease.inplace
                freed = self._finish_lease(lease, (pos, n) if leaf else None, inplace_used=used)
                if leaf is not None:
                    self._offer(leaf)
                    # attached under a node the request did not lock (cached meanwhile): compress
                    self._maybe_merge(node if leaf.parent is None else leaf.parent)
            self._touch(leaf or node)
            self.stats.inserted_tokens += n - pos if leaf else 0
            return InsertResult(leaf, n - pos if leaf else 0, freed)

    def _extendable(self, node: RadixNode, pos: int, lease: Lease) -> bool:
        """True when the request continues, at the end of its match, the leaf it alone has
        locked, and either at a block boundary or in place in that leaf's last block. Then
        the leaf grows instead of getting a child that the unlock would merge into it (the
        same final state, with one event instead of two and the leaf's id kept)."""
        return (
            node is lease.node
            and node.pins == 1
            and not node.children
            and pos == lease.matched == node.end
            and node is not self.root
            and (pos % self.B == 0 or node.blocks[-1] == lease.inplace)
        )

    def _extend(self, seq: bytes, node: RadixNode, pos: int, lease: Lease) -> RadixNode:
        """Append ``seq[pos:]`` and the lease's blocks for it to ``node`` (see ``_extendable``)."""
        B, n = self.B, tk.count(seq)
        j_last = (n - 1) // B
        new = lease.table[(pos + B - 1) // B : j_last + 1]  # the in-place block is already there
        tokens = tk.span(seq, pos, n)
        node.tokens += tokens
        node.end = n
        node.blocks = node.blocks + new  # a new array: events may hold the old one
        self.alloc.set_claim(node.blocks[-1], n - j_last * B)
        self.stats.extends += 1
        if self._emit is not None:
            self._emit(ev.Extend(node.id, tokens, new))
        return node

    def _descend_from_lease(self, seq: bytes, lease: Lease) -> tuple[RadixNode, int]:
        """Where ``seq`` leaves the tree, walking down from the deepest node of the lease's
        locked path that starts within the match (the path is never evicted, and splits and
        merges keep its tokens, so the first ``matched`` tokens are known to be there)."""
        top = lease.node
        while top.start > lease.matched and top.parent is not None:
            top = top.parent  # split after the match: the old id now names a later suffix
        k = lease.matched - top.start
        if k > 0 and not seq.startswith(tk.span(top.tokens, 0, k), top.start * TOKEN_BYTES):
            raise InvalidTokens("insert tokens do not start with the prefix the lease matched")
        if top.parent is None:
            return self._descend(seq, top, 0)
        return self._descend(seq, top.parent, top.start)

    def _attach(self, seq: bytes, node: RadixNode, pos: int, lease: Lease) -> RadixNode | None:
        """Create the leaf ``[pos, n)``; returns None when its boundary block cannot be had."""
        B, n = self.B, tk.count(seq)
        j_first, j_last = pos // B, (n - 1) // B
        blocks = lease.table[j_first : j_last + 1]
        shared = False
        if pos % B and j_first < lease.private_from:
            # The only tree-owned block a leaf can start in is the lease's in-place block.
            if node.blocks[(pos - 1) // B - node.start // B] == lease.inplace:
                shared = True
            else:
                assert lease.inplace is not None  # a leaf starts inside a tree block only so
                copy = self._copy_out(lease.inplace, min(B, n - j_first * B), node)
                if copy is None:
                    return None
                blocks[0] = copy
        if pos < node.end:
            node = self._split(node, pos - node.start)
        leaf = RadixNode(NodeId(self._next_id), node, pos, n, tk.span(seq, pos, n), blocks)
        self._next_id += 1
        self._nodes[leaf.id] = leaf
        node.children[_first(seq, pos * TOKEN_BYTES)[0]] = leaf
        if shared:
            self.alloc.incref(blocks[0])
        self.alloc.set_claim(blocks[-1], n - j_last * B)  # the request may have reserved more
        if self._emit is not None:
            self._emit(ev.NodeCreated(leaf.id, node.id, pos, leaf.tokens, blocks, shared))
        return leaf

    # -- split -----------------------------------------------------------------------------
    def _split(self, node: RadixNode, k: int) -> RadixNode:
        """Split ``node`` ``k`` tokens in; returns the new prefix (the old id keeps the suffix)."""
        B, s = self.B, node.start
        p = s + k
        first = s // B
        prefix_blocks = node.blocks[: (p - 1) // B - first + 1]
        suffix_blocks = node.blocks[p // B - first :]
        if p % B:
            self.alloc.incref(suffix_blocks[0])
        parent = node.parent
        assert parent is not None
        prefix = RadixNode(
            NodeId(self._next_id),
            parent,
            s,
            p,
            tk.span(node.tokens, 0, k),
            prefix_blocks,
            clock=node.clock,
        )
        self._next_id += 1
        self._nodes[prefix.id] = prefix
        parent.children[_first(node.tokens, 0)[0]] = prefix
        prefix.children[_first(node.tokens, k * TOKEN_BYTES)[0]] = node
        node.parent, node.start = prefix, p
        node.tokens, node.blocks = tk.span(node.tokens, k), suffix_blocks
        self.stats.splits += 1
        if self._emit is not None:
            self._emit(ev.Split(node.id, k, prefix.id, prefix_blocks, suffix_blocks))
        return prefix

    # -- reset -----------------------------------------------------------------------------
    def reset(self) -> None:
        """Drop every node and free every block. Raises ``TreeError`` while anything is locked
        or a lease is outstanding."""
        with self.lock_:
            if self._leases or any(n.pins for n in self._nodes.values()):
                raise TreeError("cannot reset while requests hold locks or blocks")
            self.alloc.reset()
            self._reset_state()
            if self._emit is not None:
                self._emit(ev.Reset())

    # -- state export ----------------------------------------------------------------------
    def check(self) -> None:
        """Verify every invariant (``radixcache.core.invariants``); raises ``InvariantError``."""
        with self.lock_:
            check_tree(self)
