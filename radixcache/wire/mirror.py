"""Mirror: the tree rebuilt from its events alone (the inspector, replay and tests use it).

It applies each event exactly as the tree applied the change, so that after every batch
``mirror.digest() == tree.digest()``. It never touches a tensor; it keeps per-block
refcounts and the few extra marks the inspector draws (COW copies, just evicted).
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixcache.core import events as ev
from radixcache.core import recency
from radixcache.core.kinds import exhaustive
from radixcache.core.recency import Steps
from radixcache.core.snapshot import structure_digest
from radixcache.wire.validate import Malformed, MirrorError, check_event, check_snapshot

__all__ = ["Malformed", "Mirror", "MirrorError", "MirrorNode", "MirrorStats", "is_victim",
           "next_victims"]

_first = struct.Struct("<I").unpack_from


@dataclass(slots=True, eq=False)
class MirrorNode:
    """A node as the mirror knows it."""

    id: int
    parent: MirrorNode | None
    start: int
    tokens: bytes
    blocks: list[int]
    pins: int = 0  # pins on the paths through it (a Pin event adds to the whole path)
    clock: int = 0
    children: dict[int, MirrorNode] = field(default_factory=dict)
    born: int = 0
    older: Steps = ()  # where deeper tokens were last used earlier (``core.recency``)

    @property
    def end(self) -> int:
        """Absolute position just past the node's last token."""
        return self.start + len(self.tokens) // 4

    @property
    def num_tokens(self) -> int:
        """Tokens in the node's span."""
        return len(self.tokens) // 4

    @property
    def tail_clock(self) -> int:
        """Last access of its deepest tokens: what the LRU orders leaves by."""
        return recency.tail_clock(self.clock, self.older)


@dataclass(slots=True)
class MirrorStats:
    """Counters the inspector shows, accumulated from events."""

    requests: int = 0
    finished: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    splits: int = 0
    merges: int = 0
    extends: int = 0
    evictions: int = 0
    evicted_tokens: int = 0
    cow_copies: int = 0
    slots_copied: int = 0
    events: int = 0
    digest_checks: int = 0
    digest_mismatches: int = 0

    @property
    def hit_rate(self) -> float:
        """Cached prompt tokens over all prompt tokens of admitted requests."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def is_victim(n: MirrorNode) -> bool:
    """What the engine may evict: an unpinned leaf other than the root."""
    return not n.children and n.pins == 0 and n.parent is not None


def next_victims(mirror: Mirror, limit: int) -> list[tuple[MirrorNode, int]]:
    """The next ``limit`` eviction victims in the engine's order (unpinned leaves by the last
    access of their deepest tokens, then id: ``RadixTree.lru_order``), each with that
    ``tail_clock`` as read, in O(n log k). It reads one atomic copy of the node table, so the
    ingest thread may keep applying; a caller that did not hold the feed's lock re-checks
    each (``is_victim``, same tail clock)."""
    leaves = [(n, n.tail_clock) for n in list(mirror.nodes.values()) if is_victim(n)]
    return heapq.nsmallest(limit, leaves, key=lambda p: (p[1], p[0].id))


class Mirror:
    """A tree rebuilt from events. Not thread-safe: one thread applies, then readers read."""

    def __init__(self, block_size: int = 16, num_blocks: int = 0) -> None:
        self.stats = MirrorStats()
        self.high, self.low = 0.92, 0.85
        self.watermark: ev.Watermark | None = None
        self.counters: ev.Counters | None = None  # the engine's own, from its heartbeat
        self.fault: ev.Fault | None = None  # a worker thread of the engine died
        self.queue: ev.Queue | None = None  # the engine's waiting queue, as last sent
        self.version = 0  # bumped on every applied event, never rewound (the UI redraws on change)
        self.seq = 0  # the batch being applied (``apply_batch``; a feed applying event by event
        # sets it) or the snapshot's seq (set by the loader)
        self._watchers: list[Callable[[ev.AnyEvent], None]] = []  # see ``watch``
        self._reset(block_size, num_blocks)

    def _reset(self, block_size: int, num_blocks: int) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.root = MirrorNode(0, None, 0, b"", [])
        self.nodes: dict[int, MirrorNode] = {0: self.root}
        self.ref = [0] * num_blocks
        self.request_blocks: set[int] = set()
        self.cow_blocks: set[int] = set()
        self.evicted_blocks: set[int] = set()
        self.clock = 0
        self.last_evicted: MirrorNode | None = None

    # -- reading ---------------------------------------------------------------------------
    def node(self, node_id: int) -> MirrorNode:
        """The node with this id; raises ``MirrorError``."""
        try:
            return self.nodes[node_id]
        except KeyError:
            raise MirrorError(f"unknown node {node_id}") from None

    @property
    def used_blocks(self) -> int:
        """Blocks with a reference."""
        return sum(1 for r in self.ref if r)

    def digest(self) -> str:
        """The same hash as ``RadixTree.digest`` over the mirrored state."""
        nodes = self.nodes.values()
        return structure_digest(nodes, self.request_blocks, {n.id: n.pins for n in nodes})

    # -- watchers --------------------------------------------------------------------------
    def watch(self, watcher: Callable[[ev.AnyEvent], None]) -> None:
        """Call ``watcher`` after every applied event, and after a snapshot load with the
        snapshot, in the applying thread: it sees each event at the state right after it
        (an ``Evict`` leaves the evicted span in ``last_evicted``: the node, or for a tail
        eviction its tail as a detached node whose parent is the node that stays). Watchers
        run in the order they were added; the stream analysis (``radixcache.analysis.follow``)
        is one."""
        self._watchers.append(watcher)

    def unwatch(self, watcher: Callable[[ev.AnyEvent], None]) -> None:
        """Stop calling ``watcher`` (nothing happens when it is not watching)."""
        if watcher in self._watchers:
            self._watchers.remove(watcher)

    def watching(self, watcher: Callable[[ev.AnyEvent], None]) -> bool:
        """True while ``watcher`` is called."""
        return watcher in self._watchers

    # -- applying --------------------------------------------------------------------------
    def apply_batch(self, batch: ev.Batch) -> None:
        """Apply every event of a batch in order. Raises ``Malformed`` (nothing applied) when
        an event is out of range for this pool, ``MirrorError`` when one does not fit the
        state (the events before it stay applied: the caller resyncs from a snapshot)."""
        for e in batch.events:
            check_event(e, self.num_blocks)
        self.seq = batch.seq
        for e in batch.events:
            self._apply(e)

    def apply(self, e: ev.AnyEvent) -> None:
        """Apply one event; raises ``Malformed`` (nothing changed) when it is out of range for
        this pool, ``MirrorError`` when it does not fit the current state."""
        check_event(e, self.num_blocks)
        self._apply(e)

    def _apply(self, e: ev.AnyEvent) -> None:
        self.stats.events += 1
        self.version += 1
        handler = _HANDLERS[type(e)]  # every kind has one (``exhaustive``): a KeyError is a bug
        try:
            handler(self, e)
        except (IndexError, KeyError) as exc:
            raise MirrorError(f"{type(e).__name__} does not fit the mirror: {exc!r}") from exc
        for watcher in self._watchers:
            watcher(e)

    def _access(self, e: ev.Access) -> None:
        n: MirrorNode | None = self.node(e.node)
        assert n is not None
        if e.end is not None and e.end < n.end:  # the rest keeps its older time
            n.older = recency.stamp(n.clock, n.older, n.end, e.end, e.clock, self.block_size)
            n.clock, n = e.clock, n.parent
        while n is not None:
            n.clock, n.older = e.clock, ()
            n = n.parent
        self.clock = e.clock

    def _pin_event(self, e: ev.Pin) -> None:
        self._lock(self.node(e.node), e.delta)

    def _alloc(self, e: ev.BlockAlloc) -> None:
        for b in e.blocks:
            self.ref[b] += 1
            self.evicted_blocks.discard(b)
        self.request_blocks.update(e.blocks)

    def _free(self, e: ev.BlockFree) -> None:
        for b in e.blocks:
            self.ref[b] -= 1
        self.request_blocks.difference_update(e.blocks)

    def _cow(self, e: ev.Cow) -> None:
        self.cow_blocks.add(e.dst)
        self.stats.cow_copies += 1
        self.stats.slots_copied += e.slots

    def _counters(self, e: ev.Counters) -> None:
        self.counters = e

    def _fault(self, e: ev.Fault) -> None:
        if e.req is None:  # a thread died (a failed request is only logged)
            self.fault = e

    def _request(self, e: ev.Queue | ev.RequestCached | ev.Retract) -> None:  # (rcached: the events
        self.queue = e if isinstance(e, ev.Queue) else self.queue  # before it did its insert)

    def _watermark(self, e: ev.Watermark) -> None:
        self.watermark = e
        self.high, self.low = e.high, e.low

    def _request_start(self, e: ev.RequestStart) -> None:
        self.stats.requests += 1
        self.stats.prompt_tokens += e.prompt_tokens
        self.stats.hit_tokens += e.hit_tokens

    def _request_finish(self, e: ev.RequestFinish) -> None:
        self.stats.finished += 1

    def _reset_event(self, e: ev.Reset) -> None:
        self._reset(self.block_size, self.num_blocks)

    def _digest(self, e: ev.Digest) -> None:
        self.stats.digest_checks += 1
        if e.value != self.digest():
            self.stats.digest_mismatches += 1
            raise MirrorError("digest mismatch")

    def load_snapshot(self, s: ev.Snapshot, seq: int | None = None) -> None:
        """Replace the whole state with a snapshot's (taken after batch ``seq``, when known);
        raises ``Malformed`` (state unchanged, nothing allocated) unless the snapshot passes
        ``check_snapshot``."""
        self._load(s)
        if seq is not None:
            self.seq = seq
        for watcher in self._watchers:
            watcher(s)

    def _load(self, s: ev.Snapshot) -> None:
        check_snapshot(s)
        self._reset(s.block_size, s.num_blocks)
        self.high, self.low, self.clock = s.high, s.low, s.clock
        for st in s.nodes:
            if st.parent < 0:
                self.root.pins, self.root.clock = st.pins, st.clock
                continue
            parent = self.node(st.parent)
            n = MirrorNode(st.node, parent, st.start, st.tokens, list(st.blocks), st.pins, st.clock,
                           older=tuple(st.older))
            parent.children[_first(st.tokens, 0)[0]] = n
            self.nodes[n.id] = n
            for b in n.blocks:
                self.ref[b] += 1
        for b in s.request_blocks:
            self.ref[b] += 1
        self.request_blocks = set(s.request_blocks)

    @staticmethod
    def _lock(n: MirrorNode | None, delta: int) -> None:
        while n is not None:
            n.pins += delta
            n = n.parent

    def _create(self, e: ev.NodeCreated) -> None:
        parent = self.node(e.parent)
        n = MirrorNode(e.node, parent, e.start, e.tokens, list(e.blocks), born=self.version)
        parent.children[_first(e.tokens, 0)[0]] = n
        self.nodes[n.id] = n
        if e.shared_first:
            self.ref[e.blocks[0]] += 1
        self.request_blocks.difference_update(e.blocks)

    def _extend(self, e: ev.Extend) -> None:
        n = self.node(e.node)
        if n.children or n.parent is None or not e.tokens:
            raise MirrorError(f"bad extend of node {e.node}")
        n.tokens += e.tokens
        n.blocks += e.blocks
        self.request_blocks.difference_update(e.blocks)
        self.stats.extends += 1

    def _split(self, e: ev.Split) -> None:
        n = self.node(e.node)
        parent = n.parent
        if parent is None or not 0 < e.offset < n.num_tokens:
            raise MirrorError(f"bad split of node {e.node} at {e.offset}")
        k = e.offset * 4
        prefix_older, suffix_clock, suffix_older = recency.split(n.clock, n.older,
                                                                 n.start + e.offset)
        p = MirrorNode(e.prefix, parent, n.start, n.tokens[:k], list(e.prefix_blocks), n.pins,
                       n.clock, born=self.version, older=prefix_older)
        n.clock, n.older = suffix_clock, suffix_older
        if (n.start + e.offset) % self.block_size:
            self.ref[e.suffix_blocks[0]] += 1
        parent.children[_first(n.tokens, 0)[0]] = p
        p.children[_first(n.tokens, k)[0]] = n
        n.parent, n.start, n.tokens, n.blocks = p, n.start + e.offset, n.tokens[k:], list(
            e.suffix_blocks)
        self.nodes[p.id] = p
        self.stats.splits += 1

    def _merge(self, e: ev.Merge) -> None:
        p, c = self.node(e.parent), self.node(e.child)
        grand = p.parent
        if grand is None or c.parent is not p:
            raise MirrorError(f"bad merge of {e.parent} into {e.child}")
        if e.dropped is not None:
            self.ref[e.dropped] -= 1
            c.blocks = p.blocks[:-1] + c.blocks
        else:
            c.blocks = p.blocks + c.blocks
        if e.keeps_times:
            c.older = recency.join(p.clock, p.older, c.start, c.clock, c.older,
                                   self.block_size, c.end)
        c.clock = max(c.clock, p.clock)  # the parent's (older streams: for all its tokens)
        grand.children[_first(p.tokens, 0)[0]] = c
        c.parent, c.start, c.tokens = grand, p.start, p.tokens + c.tokens
        del self.nodes[p.id]
        self.stats.merges += 1

    def _evict(self, e: ev.Evict) -> None:
        n = self.node(e.node)
        if n.children or n.parent is None or not 0 < e.tokens <= n.num_tokens:
            raise MirrorError(f"evict of non-leaf {e.node} or of {e.tokens} tokens")
        self.evicted_blocks.update(e.freed)
        self.cow_blocks.difference_update(e.freed)
        self.stats.evicted_tokens += e.tokens
        if e.tokens < n.num_tokens:  # schema 4: the leaf gives up its tail and stays
            self._trim(n, n.end - e.tokens)
            return
        for b in n.blocks:
            self.ref[b] -= 1
        del n.parent.children[_first(n.tokens, 0)[0]]
        del self.nodes[n.id]
        self.last_evicted = n  # its parent link kept: observers read the evicted span's path
        self.stats.evictions += 1

    def _trim(self, n: MirrorNode, end: int) -> None:
        keep = (end - 1) // self.block_size - n.start // self.block_size + 1
        if end % self.block_size or keep < 1:
            raise MirrorError(f"tail eviction of node {n.id} to {end}, not a block boundary")
        for b in n.blocks[keep:]:
            self.ref[b] -= 1
        cut = (end - n.start) * 4
        # observers read the evicted span's path: the tail, hanging from the node that stays
        self.last_evicted = MirrorNode(n.id, n, end, n.tokens[cut:], n.blocks[keep:])
        n.tokens, n.blocks = n.tokens[:cut], n.blocks[:keep]
        n.older = recency.trim(n.older, end)


# One handler per event kind: a dict lookup instead of a chain of isinstance tests.
_HANDLERS: Mapping[type, Callable[[Mirror, Any], None]] = exhaustive(
    "wire.mirror",
    {
        ev.Access: Mirror._access,
        ev.Pin: Mirror._pin_event,
        ev.NodeCreated: Mirror._create,
        ev.Extend: Mirror._extend,
        ev.Split: Mirror._split,
        ev.Merge: Mirror._merge,
        ev.Evict: Mirror._evict,
        ev.BlockAlloc: Mirror._alloc,
        ev.BlockFree: Mirror._free,
        ev.Cow: Mirror._cow,
        ev.Watermark: Mirror._watermark,
        ev.RequestStart: Mirror._request_start,
        ev.RequestFinish: Mirror._request_finish,
        ev.RequestCached: Mirror._request,
        ev.Snapshot: Mirror._load,
        ev.Reset: Mirror._reset_event,
        ev.Digest: Mirror._digest,
        ev.Counters: Mirror._counters,
        ev.Fault: Mirror._fault,
        ev.Queue: Mirror._request,
        ev.Retract: Mirror._request,
    }
)
