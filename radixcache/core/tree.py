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

The tree is a few objects, each with one job, that its public methods call under its lock:

    RadixTree   match, pin/unpin, insert, allocate/release, evict: the API (this module)
    Structure   the node table and the shape edits: new leaf, split, merge, cut (structure.py)
    Evictor     the access clock, the LRU heap of evictable leaves, watermarks (evict.py)
    Leases      blocks reserved for running requests, boundary copies (lease.py)
    EventLog    the events of all of them, in order (eventlog.py)

``check()`` (invariants.py) and ``snapshot()``/``digest()`` (snapshot.py) read public state.

Concurrency: one ``threading.Lock`` (``lock_``) guards the whole tree and its
``BlockAllocator`` (nodes, children, pins, the LRU heap, refcounts, claims, the event list).
Model compute never runs under it; the K/V tensor itself is not guarded (a block is
written only by the request that holds it privately or in-place reserved).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

from radixcache.core import events as ev
from radixcache.core import recency
from radixcache.core import tokens as tk
from radixcache.core.eventlog import EventLog
from radixcache.core.evict import Evictor
from radixcache.core.invariants import check_tree
from radixcache.core.lease import Leases
from radixcache.core.nodes import ROOT_ID as ROOT_ID
from radixcache.core.nodes import EvictResult as EvictResult
from radixcache.core.nodes import InsertResult as InsertResult
from radixcache.core.nodes import Lease as Lease
from radixcache.core.nodes import MatchResult as MatchResult
from radixcache.core.nodes import NodeId as NodeId
from radixcache.core.nodes import NotPinned as NotPinned
from radixcache.core.nodes import PromptTooLarge as PromptTooLarge
from radixcache.core.nodes import RadixNode as RadixNode
from radixcache.core.nodes import TreeError as TreeError
from radixcache.core.nodes import TreeStats as TreeStats
from radixcache.core.nodes import UnknownNode as UnknownNode
from radixcache.core.snapshot import digest_of, snapshot_of
from radixcache.core.snapshot import structure_digest as structure_digest
from radixcache.core.structure import Structure
from radixcache.core.tokens import TOKEN_BYTES, U32, TokenSeq, common_units
from radixcache.core.tokens import InvalidTokens as InvalidTokens
from radixcache.core.tokens import unpack_token as _first

if TYPE_CHECKING:
    from radixcache.core.pool import KVPool

# results built by tuple.__new__ itself (a NamedTuple's __new__ is a Python frame, twice a request)
_match_result = partial(tuple.__new__, MatchResult)
_insert_result = partial(tuple.__new__, InsertResult)


class RadixTree:
    """The radix tree over a ``KVPool``. All public methods are thread-safe (one lock)."""

    def __init__(self, pool: KVPool, *, high: float = 0.92, low: float = 0.85,
                 vocab_limit: int = U32, record_events: bool = True) -> None:
        self.pool = pool
        self.alloc = pool.allocator
        self.B = pool.block_size
        self.vocab_limit = vocab_limit
        self._any_id = vocab_limit >= U32  # uint32 bytes need no range scan (match, insert)
        self.lock_ = threading.Lock()
        self.stats = TreeStats()
        self.log = EventLog(on=record_events)
        self.structure = Structure(self.alloc, self.stats, self.log)
        self.evictor = Evictor(self.structure, self.alloc, self.stats, high, low)
        self.leases = Leases(pool, self.evictor, self.stats, self.log)

    # -- public state ----------------------------------------------------------------------
    @property
    def root(self) -> RadixNode:
        """The root node (no tokens, no blocks)."""
        return self.structure.root

    @property
    def high(self) -> float:
        """High watermark: fraction of blocks used past which eviction runs."""
        return self.evictor.high

    @property
    def low(self) -> float:
        """Low watermark: fraction of blocks used that eviction brings use down to."""
        return self.evictor.low

    def set_watermarks(self, high: float, low: float) -> None:
        """Set the eviction band: past ``high`` (fraction of blocks used) evict down to ``low``."""
        with self.lock_:
            self.evictor.set_watermarks(high, low)

    def live_nodes(self) -> Iterable[RadixNode]:
        """Every node, the root included (call with ``lock_`` held)."""
        return self.structure.live_nodes()

    def node(self, node_id: int) -> RadixNode:
        """The live node with this id; raises ``UnknownNode``."""
        try:
            return self.structure.nodes[node_id]
        except KeyError:
            raise UnknownNode(f"no node {node_id} in the tree") from None

    def __len__(self) -> int:
        """Number of nodes, the root excluded."""
        return len(self.structure) - 1

    @property
    def cached_tokens(self) -> int:
        """Tokens held by all nodes."""
        return sum(n.num_tokens for n in self.structure.live_nodes())

    def request_blocks(self) -> set[int]:
        """Blocks held privately by outstanding leases (allocated, not yet inserted)."""
        return self.leases.request_blocks()

    # -- events ----------------------------------------------------------------------------
    def take_events(self) -> list[ev.AnyEvent]:
        """Drain the events recorded since the last call, in order (one list swap)."""
        with self.lock_:
            return self.log.take()

    def emit(self, event: ev.AnyEvent) -> None:
        """Record a caller's event (a request's start or finish) in order with the tree's own
        (dropped when events are off)."""
        with self.lock_:
            if self.log.on:
                self.log.emit(event)

    # -- match -----------------------------------------------------------------------------
    def _walk(self, seq: bytes) -> tuple[RadixNode, int, array[int]]:
        """Deepest match of ``seq`` from the root: (node, matched length, block table), the
        path stamped with a new access clock on the way down (what ``Evictor.touch`` does
        after an insert), and its ``Access`` event."""
        evictor = self.evictor
        c = evictor.clock = evictor.clock + 1
        node, pos, n, B = self.structure.root, 0, len(seq) // TOKEN_BYTES, self.B
        node.clock = c
        table = array("i")  # from the root, the deepest node covering a logical block wins
        while pos < n:
            child = node.children.get(_first(seq, pos * TOKEN_BYTES)[0])
            if child is None:
                break
            node = child
            if child.start % B:
                table[-1:] = child.blocks
            else:
                table.extend(child.blocks)
            if seq.startswith(child.tokens, pos * TOKEN_BYTES):
                pos = child.end
                child.clock = c
                if child.older:
                    child.older = ()
            else:  # the rest of the node keeps its older time
                pos += common_units(seq, pos * TOKEN_BYTES, child.tokens)
                child.older = recency.stamp(child.clock, child.older, child.end, pos, c, B)
                child.clock = c
                break
        del table[(pos + B - 1) // B :]
        if self.log.on:
            self.log.emit(ev.Access(node.id, c, pos if pos < node.end else None))
        return node, pos, table

    def match(self, tokens: TokenSeq) -> MatchResult:
        """Longest cached prefix of ``tokens`` at token granularity; marks the path used (LRU).

        The result's node is not pinned: use ``match_and_pin`` when the blocks will be used.
        """
        seq = (tokens if type(tokens) is bytes and self._any_id and not len(tokens) % 4 and tokens
               else tk.validated(tokens, self.vocab_limit))  # tk.validated's bytes case inline
        with self.lock_:
            node, length, table = self._walk(seq)
            return _match_result((length, node, table))

    def peek(self, tokens: TokenSeq) -> tuple[RadixNode, int]:
        """The deepest node ``tokens`` reach (the match may end inside it) and the matched
        length, changing nothing: no access time, no event (a scheduler ordering its queue)."""
        seq = tk.validated(tokens, self.vocab_limit)
        with self.lock_:
            return self.structure.descend(seq, self.structure.root, 0)

    def match_and_pin(self, tokens: TokenSeq) -> MatchResult:
        """``match`` and ``pin``, atomically. A match that ends inside a node splits it there
        first (as SGLang's match does), so the pin holds exactly the matched tokens: the
        node's unmatched rest stays evictable with its older access time."""
        seq = (tokens if type(tokens) is bytes and self._any_id and not len(tokens) % 4 and tokens
               else tk.validated(tokens, self.vocab_limit))  # tk.validated's bytes case inline
        with self.lock_:
            node, length, table = self._walk(seq)
            if node.start < length < node.end:
                node = self.structure.split(node, length - node.start)
            node.pins += 1
            if self.log.on:
                self.log.emit(ev.Pin(node.id, 1))
            return _match_result((length, node, table))

    # -- pin -------------------------------------------------------------------------------
    def pin(self, node: RadixNode) -> None:
        """Hold every node of ``node``'s path: none is evicted until ``unpin``.

        The count is kept on ``node`` alone (``pins``), O(1): only leaves are evicted, so
        a path is safe while its deepest node is pinned; ``RadixNode.path_pins`` (and the
        digest, snapshots and events) give the per-node path count."""
        with self.lock_:
            if self.structure.nodes.get(node.id) is not node:  # ``Structure.alive`` inline
                self.structure.alive(node)  # raises
            node.pins += 1
            if self.log.on:
                self.log.emit(ev.Pin(node.id, 1))

    def unpin(self, node: RadixNode) -> None:
        """Drop a pin ``pin`` took on this node. ``NotPinned``/``UnknownNode``: tree
        unchanged."""
        with self.lock_:
            if self.structure.nodes.get(node.id) is not node:
                self.structure.alive(node)  # raises
            if node.pins <= 0:
                raise NotPinned(f"node {node.id} is not pinned")
            node.pins -= 1
            if self.log.on:
                self.log.emit(ev.Pin(node.id, -1))
            if not node.queued:  # most leaves that lose a pin are queued already
                self.evictor.offer(node)
            if len(node.children) == 1:  # what ``merge`` needs first: skip its call if not
                self.structure.merge(node)

    # -- leases ----------------------------------------------------------------------------
    def allocate(self, match: MatchResult, total: int) -> Lease:
        """Reserve blocks so a request can hold ``total`` positions after its matched prefix.

        The caller must hold a pin on ``match.node`` (``match_and_pin``). Evicts LRU leaves
        as needed (and down to the low watermark once use passes the high one). The boundary
        block is reserved in place when its claim ends at the match, else copied (COW).
        Raises ``PromptTooLarge`` (never fits; the tree is unchanged) or ``PoolExhausted``
        (retry later): then no block was reserved, but unpinned leaves may already have been
        evicted on the way -- they were the next victims, and the retry needs their room.
        """
        with self.lock_:
            node = match.node
            if self.structure.nodes.get(node.id) is not node:
                self.structure.alive(node)  # raises
            return self.leases.allocate(match, total)

    def grow(self, lease: Lease, total: int) -> int:
        """Extend an outstanding ``lease`` to ``total`` positions, taking a block per block
        boundary crossed (``Leases.grow``); returns the blocks taken. Raises ``PoolExhausted``
        (nothing reserved; LRU leaves may have been evicted on the way) or ``TreeError`` for a
        consumed lease."""
        with self.lock_:
            if lease.done:
                raise TreeError("lease already consumed")
            return self.leases.grow(lease, total)

    def release(self, lease: Lease) -> None:
        """Abort: return every private block of the lease and undo its in-place reservation."""
        with self.lock_:
            if not lease.done:
                self.leases.finish(lease)

    # -- insert ----------------------------------------------------------------------------
    def insert(self, tokens: TokenSeq, lease: Lease) -> InsertResult:
        """Cache ``tokens`` (the request's whole sequence, at most ``lease.total``) using the
        lease's blocks, splitting an edge where it diverges. Consumes the lease: blocks that
        duplicate what is already cached go back to the free list. Does not unpin."""
        seq = (tokens if type(tokens) is bytes and self._any_id and not len(tokens) % 4 and tokens
               else tk.validated(tokens, self.vocab_limit))  # tk.validated's bytes case inline
        with self.lock_:
            if lease.done:
                raise TreeError("lease already consumed")
            n = len(seq) // TOKEN_BYTES
            if n > lease.total:
                raise InvalidTokens(f"{n} tokens exceed the lease's {lease.total}")
            node, pos = self._descend_from_lease(seq, lease)
            leaf = None
            if pos == n:
                freed = self.leases.finish(lease)
            elif self._extendable(node, pos, lease):
                leaf = self.structure.extend(node, seq, pos, lease.table)
                freed = self.leases.finish(lease, (pos, n), inplace_used=pos % self.B != 0)
            else:
                leaf = self._attach(seq, node, pos, lease)
                used = leaf is not None and leaf.blocks[0] == lease.inplace
                freed = self.leases.finish(lease, (pos, n) if leaf else None, inplace_used=used)
                if leaf is not None:
                    self.evictor.offer(leaf)
                    # attached under a node the request did not pin (cached meanwhile): compress
                    up = node if leaf.parent is None else leaf.parent
                    if len(up.children) == 1:  # what ``merge`` needs first: skip its call if not
                        self.structure.merge(up)
            last = leaf or node
            c = self.evictor.touch(last, n)
            if self.log.on:
                self.log.emit(ev.Access(last.id, c, n if n < last.end else None))
            self.stats.inserted_tokens += n - pos if leaf else 0
            return _insert_result((leaf, n - pos if leaf else 0, freed))

    def _extendable(self, node: RadixNode, pos: int, lease: Lease) -> bool:
        """True when the request continues, at the end of its match, the leaf it alone has
        pinned, and either at a block boundary or in place in that leaf's last block. Then
        the leaf grows instead of getting a child that the unpin would merge into it (the
        same final state, with one event instead of two and the leaf's id kept)."""
        return (
            node is lease.node
            and node.pins == 1
            and not node.children
            and pos == lease.matched == node.end
            and node is not self.structure.root
            and (pos % self.B == 0 or node.blocks[-1] == lease.inplace)
        )

    def _descend_from_lease(self, seq: bytes, lease: Lease) -> tuple[RadixNode, int]:
        """Where ``seq`` leaves the tree, walking down from the deepest node of the lease's
        pinned path that starts within the match (the path is never evicted, and splits and
        merges keep its tokens, so the first ``matched`` tokens are known to be there)."""
        top = lease.node
        while top.start > lease.matched and top.parent is not None:
            top = top.parent  # split after the match: the old id now names a later suffix
        k = lease.matched - top.start
        if k > 0 and not seq.startswith(top.tokens[: k * TOKEN_BYTES], top.start * TOKEN_BYTES):
            raise InvalidTokens("insert tokens do not start with the prefix the lease matched")
        if top.parent is None:
            return self.structure.descend(seq, top, 0)
        return self.structure.descend(seq, top.parent, top.start)

    def _attach(self, seq: bytes, node: RadixNode, pos: int, lease: Lease) -> RadixNode | None:
        """Create the leaf ``[pos, n)``; returns None when its boundary block cannot be had."""
        B, n = self.B, len(seq) // TOKEN_BYTES
        j_first, j_last = pos // B, (n - 1) // B
        blocks = lease.table[j_first : j_last + 1]
        shared = False
        if pos % B and j_first < lease.private_from:
            # The only tree-owned block a leaf can start in is the lease's in-place block.
            if node.blocks[(pos - 1) // B - node.start // B] == lease.inplace:
                shared = True
            else:
                assert lease.inplace is not None  # a leaf starts inside a tree block only so
                copy = self.leases.copy_out(lease.inplace, min(B, n - j_first * B), node)
                if copy is None:
                    return None
                blocks[0] = copy
        if pos < node.end:
            node = self.structure.split(node, pos - node.start)
        return self.structure.add_leaf(node, seq, pos, blocks, shared=shared)

    # -- evict -----------------------------------------------------------------------------
    def evict(self, n_tokens: int) -> EvictResult:
        """Free at least ``n_tokens`` token slots (rounded up to blocks) of LRU unpinned leaves,
        or as many as can be freed. Pinned paths are never evicted."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        with self.lock_:
            return self.evictor.evict((n_tokens + self.B - 1) // self.B)

    def lru_order(self, limit: int) -> list[RadixNode]:
        """The next ``limit`` eviction victims in order (does not change the tree)."""
        with self.lock_:
            return self.evictor.order(limit)

    # -- whole tree ------------------------------------------------------------------------
    def reset(self) -> None:
        """Drop every node and free every block. Raises ``TreeError`` while anything is pinned
        or a lease is outstanding."""
        with self.lock_:
            if self.leases or any(n.pins for n in self.structure.live_nodes()):
                raise TreeError("cannot reset while requests hold pins or blocks")
            self.alloc.reset()
            self.structure.clear()
            self.evictor.clear()
            self.leases.clear()
            if self.log.on:
                self.log.emit(ev.Reset())

    def snapshot(self) -> ev.Snapshot:
        """The whole state as one event (parents before children)."""
        with self.lock_:
            return snapshot_of(self)

    def digest(self) -> str:
        """A stable hash of the structure: every node's id, parent, span, tokens, blocks, path
        pins, access times (clock and older steps), and the request-held blocks. Equal for a
        mirror built from events."""
        with self.lock_:
            return digest_of(self)

    def check(self) -> None:
        """Verify every invariant (``radixcache.core.invariants``); raises ``InvariantError``."""
        with self.lock_:
            check_tree(self)
