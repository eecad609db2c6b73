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

import hashlib
import heapq
import struct
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, NewType, Protocol

import numpy as np

from radixcache.core import events as ev
from radixcache.core import tokens as tk
from radixcache.core.blocks import PoolExhausted
from radixcache.core.tokens import TOKEN_BYTES, U32, InvalidTokens, TokenSeq
from radixcache.core.tokens import unpack_token as _first

if TYPE_CHECKING:
    from radixcache.core.pool import KVPool

NodeId = NewType("NodeId", int)

ROOT_ID = NodeId(0)


class TreeError(Exception):
    """Base class of the errors the tree raises on bad input; the tree is unchanged after one."""



class PromptTooLarge(TreeError):
    """The sequence needs more blocks than the whole pool holds: it can never be served."""


class NotLocked(TreeError):
    """``unlock`` of a node that holds no lock."""


class UnknownNode(TreeError, KeyError):
    """A node id (or node object) that is not in this tree."""


@dataclass(slots=True, eq=False)
class RadixNode:
    """A span of tokens ``[start, end)`` (``end = start + tk.count(tokens)``) and the blocks
    covering it."""

    id: NodeId
    parent: RadixNode | None
    start: int
    end: int  # kept, not computed: the match loop reads it once a level
    tokens: bytes  # uint32 little-endian
    blocks: array[int]  # int32: 4 bytes a block, not a 36-byte int object
    children: dict[int, RadixNode] = field(default_factory=dict)
    pins: int = 0  # locks taken on this very node (a lock holds the whole path: see ``lock``)
    clock: int = 0
    alive: bool = True
    queued: bool = False  # has an entry in the LRU heap (one at most)

    @property
    def num_tokens(self) -> int:
        """Tokens in this node's span."""
        return self.end - self.start

    @property
    def evictable(self) -> bool:
        """An unpinned leaf other than the root: what eviction may take."""
        return not self.children and self.pins == 0 and self.parent is not None

    @property
    def lock(self) -> int:
        """Locks held on this node's path: its own pins and every descendant's (O(subtree))."""
        total, stack = 0, [self]
        while stack:
            n = stack.pop()
            total += n.pins
            stack.extend(n.children.values())
        return total


class MatchResult(NamedTuple):
    """Result of ``match``: ``length`` tokens matched; ``node`` is the deepest node touched
    (the match may end inside it); ``block_table`` covers positions ``[0, length)``."""

    length: int
    node: RadixNode
    block_table: array[int]


@dataclass(slots=True, eq=False)
class Lease:
    """Blocks reserved for one running request, from ``allocate`` until ``insert``/``release``.

    ``table`` covers positions ``[0, total)``. Entries from ``private_from`` on are the
    request's own blocks (refcount 1, owned by this lease). When ``inplace`` is a block
    id, the request writes in place after its matched prefix in that tree-owned block,
    whose claim was ``prev_claim`` before the reservation.
    """

    node: RadixNode
    matched: int
    total: int
    table: array[int]
    private_from: int
    inplace: int | None = None  # the tree-owned block continued in place, if any
    prev_claim: int = 0
    done: bool = False


class InsertResult(NamedTuple):
    """``node`` holds the new tokens: a new leaf, or the request's own leaf extended in place
    (None when the sequence was already cached); ``new_tokens`` were added to the tree;
    ``freed`` private blocks of the lease were returned as duplicates."""

    node: RadixNode | None
    new_tokens: int
    freed: int


class EvictResult(NamedTuple):
    """What one eviction pass removed."""

    nodes: int
    tokens: int
    blocks: int


@dataclass(slots=True)
class TreeStats:
    """Running counters of structural operations."""

    splits: int = 0
    merges: int = 0
    extends: int = 0
    cow_copies: int = 0
    slots_copied: int = 0
    evicted_nodes: int = 0
    evicted_tokens: int = 0
    inserted_tokens: int = 0
    evict_calls: int = 0
    last_evict_ns: int = 0


def _common_prefix(seq: bytes, pos: int, tokens: bytes) -> int:
    """Tokens shared by ``seq[pos:]`` and ``tokens``: galloping then bisection over slice
    comparisons, each one a C ``memcmp`` (O(log k) compares for a k-token common run)."""
    W = TOKEN_BYTES
    n = min(len(seq) // W - pos, len(tokens) // W)
    off = pos * W
    lo, step = 0, 1  # invariant: the first ``lo`` tokens match
    while lo + step <= n and seq.startswith(tokens[lo * W : (lo + step) * W], off + lo * W):
        lo += step
        step *= 2
    hi = min(n, lo + step)  # the first mismatch lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if seq.startswith(tokens[lo * W : mid * W], off + lo * W):
            lo = mid
        else:
            hi = mid
    if lo < n and hi == lo + 1 and seq.startswith(tokens[lo * W : hi * W], off + lo * W):
        lo = hi
    return lo


class RadixTree:
    """The radix tree over a ``KVPool``. All public methods are thread-safe (one lock)."""

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
                pos += _common_prefix(seq, pos, child.tokens)
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
                pos += _common_prefix(seq, pos, child.tokens)
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

    def _offer(self, node: RadixNode) -> None:
        """Queue ``node`` in the LRU heap if it became an evictable leaf (unlocked, childless,
        not the root) and has no entry yet.

        The heap holds at most one entry per node, keyed by the access clock it had when
        queued: a touch does not push (entries only ever understate a clock), and
        ``_pop_victim`` re-queues an entry whose node was used since, so the first entry it
        finds current is the least recently used leaf (exact LRU, O(log n) a step)."""
        if not node.queued and node.evictable:
            node.queued = True
            heapq.heappush(self._heap, (node.clock, node.id, node))

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

    # -- allocate --------------------------------------------------------------------------
    def allocate(self, match: MatchResult, total: int) -> Lease:
        """Reserve blocks so a request can hold ``total`` positions after its matched prefix.

        The caller must hold a lock on ``match.node`` (``match_and_lock``). Evicts LRU leaves
        as needed (and down to the low watermark once use passes the high one). The boundary
        block is reserved in place when its claim ends at the match, else copied (COW).
        Raises ``PromptTooLarge`` (never fits; the tree is unchanged) or ``PoolExhausted``
        (retry later): then no block was reserved, but unlocked leaves may already have been
        evicted on the way -- they were the next victims, and the retry needs their room.
        """
        with self.lock_:
            return self._allocate(match, total)

    def _allocate(self, match: MatchResult, total: int) -> Lease:
        B, m = self.B, match.length
        if total <= 0 or total < m:
            raise InvalidTokens(f"total {total} must be positive and >= matched {m}")
        if (total + B - 1) // B > self.alloc.num_blocks:
            raise PromptTooLarge(
                f"{total} tokens need {(total + B - 1) // B} blocks;"
                f" the pool has {self.alloc.num_blocks}"
            )
        if self._alive(match.node).pins <= 0:
            raise NotLocked(f"allocate needs a lock on node {match.node.id} (match_and_lock)")
        table = array("i", match.block_table)
        if total == m:  # nothing to write: the lease holds no block of its own
            lease = Lease(match.node, m, total, table, len(table))
            self._leases.add(lease)
            return lease
        j0, partial = divmod(m, B)
        new = (total + B - 1) // B - len(table)
        if partial and self.alloc.claim(table[j0]) != partial:
            new += 1
        self._make_room(new)
        if partial and self.alloc.claim(table[j0]) == partial:
            x = table[j0]
            lease = Lease(match.node, m, total, table, j0 + 1, x, partial)
            self.alloc.set_claim(x, min(B, total - j0 * B))
            self._inplace.add(x)
            new = (total + B - 1) // B - len(table)
        else:
            lease = Lease(match.node, m, total, table, j0)
        blocks = self.alloc.alloc(new)
        if partial and lease.inplace is None:
            src = table[j0]
            table[j0] = blocks[0]
            self.pool.copy_slots(src, blocks[0], partial)
            self.stats.cow_copies += 1
            self.stats.slots_copied += partial
            if self._emit is not None:
                self._emit(ev.Cow(src, blocks[0], partial))
            table.extend(blocks[1:])
        else:
            table.extend(blocks)
        if len(table) > lease.private_from:  # the last block is claimed up to ``total``
            self.alloc.set_claim(table[-1], total - (len(table) - 1) * B)
        self._leases.add(lease)
        if self._emit is not None and blocks:
            self._emit(ev.BlockAlloc(blocks))
        return lease

    def _make_room(self, need: int) -> None:
        """Evict so that ``need`` blocks are free, and down to ``low`` once past ``high``."""
        a = self.alloc
        if a.used_count + need > self.high * a.num_blocks:
            target = need + round(a.num_blocks * (1 - self.low))
            if a.free_count < target:
                t0 = time.perf_counter_ns()
                self._evict_blocks(target - a.free_count)
                self.stats.evict_calls += 1
                self.stats.last_evict_ns = time.perf_counter_ns() - t0
        if a.free_count < need:
            raise PoolExhausted(
                f"need {need} blocks, {a.free_count} free and nothing more evictable"
            )

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

    def _copy_out(self, src: int, slots: int, keep: RadixNode) -> int | None:
        """A private copy of ``src``'s first ``slots`` slots, or None when no block can be had.

        With the pool full it evicts one LRU leaf, holding ``keep``'s path (where the copy's
        leaf will hang) for the duration; the hold nets to zero, so it emits no Lock event."""
        if self.alloc.free_count == 0:
            keep.pins += 1
            try:
                self._evict_blocks(1)
            finally:
                keep.pins -= 1
            self._offer(keep)  # its entry was dropped if it came up during the hold
            if self.alloc.free_count == 0:
                return None
        dst = self.alloc.alloc(1)[0]
        self.pool.copy_slots(src, dst, slots)
        self.alloc.set_claim(dst, slots)  # the leaf being attached takes it at once
        self.stats.cow_copies += 1
        self.stats.slots_copied += slots
        if self._emit is not None:
            self._emit(ev.BlockAlloc([dst]))
            self._emit(ev.Cow(src, dst, slots))
        return dst

    def _finish_lease(
        self, lease: Lease, taken: tuple[int, int] | None = None, *, inplace_used: bool = False
    ) -> int:
        """Free the lease's blocks the tree did not take; settle the in-place claim.

        ``taken = (pos, n)``: the tree took ``table[pos // B : (n - 1) // B + 1]`` for the
        positions ``[pos, n)`` (the first may have been replaced by a copy); ``inplace_used``:
        it continued in place in the lease's in-place block."""
        table, first = lease.table, lease.private_from
        if taken is None:
            dup = table[first:]
        else:
            pos, n = taken
            dup = table[first : max(first, pos // self.B)] + table[(n - 1) // self.B + 1 :]
        if lease.inplace is not None:
            self._inplace.discard(lease.inplace)
            if not inplace_used:
                self.alloc.set_claim(lease.inplace, lease.prev_claim)
        freed = len(self.alloc.release_run(dup))  # private blocks: none is shared
        self._leases.discard(lease)
        if self._emit is not None and dup:
            self._emit(ev.BlockFree(dup))
        lease.done = True
        return freed

    def release(self, lease: Lease) -> None:
        """Abort: return every private block of the lease and undo its in-place reservation."""
        with self.lock_:
            if not lease.done:
                self._finish_lease(lease)

    # -- split / merge ---------------------------------------------------------------------
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

    def _maybe_merge(self, parent: RadixNode) -> int:
        """Join ``parent`` into its only child when both hold the same lock count; returns the
        blocks that freed (the parent's boundary block when only it held it)."""
        if parent is self.root or len(parent.children) != 1:
            return 0
        (child,) = parent.children.values()
        if parent.pins:  # a request locked the parent itself
            return 0
        B = self.B
        dropped: int | None = None
        freed = False
        if child.start % B:
            dropped = parent.blocks[-1]
            freed = self.alloc.decref(dropped)
            if not freed and dropped != child.blocks[0]:
                # the grandparent chain still holds it: its claim falls back to our start
                self.alloc.set_claim(dropped, parent.start % B)
            child.blocks = parent.blocks[:-1] + child.blocks
        else:
            child.blocks = parent.blocks + child.blocks
        grand = parent.parent
        assert grand is not None
        grand.children[_first(parent.tokens, 0)[0]] = child
        child.parent, child.start = grand, parent.start
        child.tokens = parent.tokens + child.tokens
        if parent.clock > child.clock:
            child.clock = parent.clock
            self._offer(child)
        parent.alive = False
        parent.tokens, parent.blocks = b"", array("i")
        del self._nodes[parent.id]
        self.stats.merges += 1
        if self._emit is not None:
            self._emit(ev.Merge(parent.id, child.id, dropped))
        return int(freed)

    # -- eviction --------------------------------------------------------------------------
    def _pop_victim(self) -> RadixNode | None:
        heap = self._heap
        while heap:
            clock, _, node = heap[0]
            if node.alive and node.evictable:
                if node.clock != clock:  # used since it was queued: re-queue at that time
                    heapq.heapreplace(heap, (node.clock, node.id, node))
                    continue
                heapq.heappop(heap)
                node.queued = False
                return node
            heapq.heappop(heap)  # not an evictable leaf now: offered again once it is one
            node.queued = False
        return None

    def _evict_blocks(self, want: int) -> EvictResult:
        """Evict LRU unlocked leaves until ``want`` blocks are freed (or none is left)."""
        freed = nodes = tokens = 0
        while freed < want:
            victim = self._pop_victim()
            if victim is None:
                break
            tokens += victim.num_tokens
            freed += self._evict_leaf(victim)
            nodes += 1
        if len(self._heap) > 2 * len(self._nodes) + 32:  # entries of merged-away nodes linger
            self._rebuild_heap()
        return EvictResult(nodes, tokens, freed)

    def _evict_leaf(self, leaf: RadixNode) -> int:
        parent = leaf.parent
        assert parent is not None
        freed = self.alloc.release_run(leaf.blocks)
        if leaf.start % self.B and parent is not self.root and leaf.blocks[0] == parent.blocks[-1]:
            self.alloc.set_claim(leaf.blocks[0], leaf.start % self.B)
        del parent.children[_first(leaf.tokens, 0)[0]]
        del self._nodes[leaf.id]
        leaf.alive = False
        self.stats.evicted_nodes += 1
        self.stats.evicted_tokens += leaf.num_tokens
        if self._emit is not None:
            self._emit(ev.Evict(leaf.id, leaf.num_tokens, freed))
        leaf.tokens, leaf.blocks = b"", array("i")  # stale heap entries may still point here
        if parent is not self.root:
            if parent.children:
                return len(freed) + self._maybe_merge(parent)
            self._offer(parent)
        return len(freed)

    def _rebuild_heap(self) -> None:
        heap: list[tuple[int, int, RadixNode]] = []
        for n in self._nodes.values():
            n.queued = n.evictable
            if n.queued:
                heap.append((n.clock, n.id, n))
        heapq.heapify(heap)
        self._heap = heap

    def evict(self, n_tokens: int) -> EvictResult:
        """Free at least ``n_tokens`` token slots (rounded up to blocks) of LRU unlocked leaves,
        or as many as can be freed. Locked paths are never evicted."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        with self.lock_:
            return self._evict_blocks((n_tokens + self.B - 1) // self.B)

    def lru_order(self, limit: int) -> list[RadixNode]:
        """The next ``limit`` eviction victims in order (does not change the tree)."""
        with self.lock_:
            live = [(n.clock, n.id, n) for _, _, n in self._heap if n.alive and n.evictable]
            return [n for _, _, n in heapq.nsmallest(limit, live)]

    # -- watermarks / reset ----------------------------------------------------------------
    @staticmethod
    def _check_watermarks(high: float, low: float) -> None:
        if not 0.0 < low <= high <= 1.0:
            raise ValueError(f"watermarks need 0 < low <= high <= 1, got high={high} low={low}")

    def set_watermarks(self, high: float, low: float) -> None:
        """Set the eviction band: past ``high`` (fraction of blocks used) evict down to ``low``."""
        self._check_watermarks(high, low)
        with self.lock_:
            self.high, self.low = high, low

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
        from radixcache.core.invariants import check_tree

        with self.lock_:
            check_tree(self)

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
