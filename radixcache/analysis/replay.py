"""Direct replay of one cache size: leaf-only eviction under LRU, FIFO or LFU.

Independent of the one-pass curve (it keeps its own trie of cached units and a heap of
leaves), so the LRU replay checks the curve, and FIFO/LFU -- not stack algorithms -- get their
points on the same plot from one replay each. Same sequential model: a request's prompt is
matched against the cache, then its whole sequence is touched (deepest-first) and inserted,
then LRU-side units are dropped until at most ``capacity`` remain. Eviction is per unit:
a leaf gives up its deepest units first, the way the recency stack orders them.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from radixcache.core.tokens import common_units
from radixcache.traffic.traces import Access


class Policy(enum.Enum):
    """Which leaf gives up units first."""

    LRU = "lru"  # least recently touched
    FIFO = "fifo"  # inserted earliest
    LFU = "lfu"  # touched least often (ties: least recently)


@dataclass(slots=True, eq=False)
class CachedRun:
    """A run of cached units that share their history (inserted, touched together)."""

    key: bytes
    parent: CachedRun | None
    born: int  # request that inserted these units
    last: int = 0  # request that last touched them
    count: int = 0  # touches
    children: dict[bytes, CachedRun] = field(default_factory=dict)
    alive: bool = True


def _priority(policy: Policy) -> Callable[[CachedRun], tuple[int, int]]:
    if policy is Policy.LRU:
        return lambda n: (n.last, 0)
    if policy is Policy.FIFO:
        return lambda n: (n.born, 0)
    return lambda n: (n.count, n.last)


class ReplayCache:
    """A cache of at most ``capacity`` units of ``width`` bytes under ``policy``."""

    def __init__(self, capacity: int, width: int, block_tokens: int, policy: Policy) -> None:
        self.capacity, self.w, self.block_tokens = capacity, width, block_tokens
        self.prio = _priority(policy)
        self.root = CachedRun(b"", None, 0)
        self.used = 0
        self.requests = 0
        self.heap: list[tuple[tuple[int, int], int, CachedRun]] = []
        self._ids = 0

    def _offer(self, node: CachedRun) -> None:
        if node is not self.root and not node.children:
            self._ids += 1
            heapq.heappush(self.heap, (self.prio(node), self._ids, node))

    def _split(self, node: CachedRun, k: int) -> None:
        """Keep the first ``k`` units in ``node``; the rest become its only child."""
        w = self.w
        rest = CachedRun(node.key[k * w :], node, node.born, node.last, node.count, node.children)
        for c in rest.children.values():
            c.parent = rest
        node.key, node.children = node.key[: k * w], {rest.key[:w]: rest}
        self._offer(rest)  # the old entry names ``node``, which is no longer a leaf

    def _touch(self, seq: bytes, r: int) -> tuple[CachedRun, int]:
        """Walk ``seq``, splitting where it stops inside a node; stamp the matched nodes."""
        w, node, pos = self.w, self.root, 0
        while pos * w < len(seq):
            child = node.children.get(seq[pos * w : pos * w + w])
            if child is None:
                break
            inside = not seq.startswith(child.key, pos * w)
            if inside:
                self._split(child, common_units(seq, pos * w, child.key, w))
            child.last, child.count = r, child.count + 1
            node, pos = child, pos + len(child.key) // w
            if inside:
                break
        self._offer(node)
        return node, pos

    def _evict(self) -> None:
        w = self.w
        while self.used > self.capacity:
            prio, _, leaf = heapq.heappop(self.heap)
            if not leaf.alive or leaf.children or prio != self.prio(leaf):
                continue  # stale: re-offered when it became a leaf or was touched again
            drop = min(self.used - self.capacity, len(leaf.key) // w)
            leaf.key = leaf.key[: len(leaf.key) - drop * w]
            self.used -= drop
            if leaf.key:
                self._offer(leaf)
                continue
            leaf.alive = False
            parent = leaf.parent
            assert parent is not None
            for k, c in parent.children.items():
                if c is leaf:
                    del parent.children[k]
                    break
            self._offer(parent)

    def matched(self, seq: bytes) -> int:
        """Units of ``seq`` cached now, from its start (no state change)."""
        w, node, pos = self.w, self.root, 0
        while pos * w < len(seq):
            child = node.children.get(seq[pos * w : pos * w + w])
            if child is None:
                break
            if not seq.startswith(child.key, pos * w):
                return pos + common_units(seq, pos * w, child.key, w)
            node, pos = child, pos + len(child.key) // w
        return pos

    def add(self, a: Access) -> int:
        """Serve one request; returns its prompt's hit tokens at this capacity."""
        self.requests += 1
        r = self.requests
        node, pos = self._touch(a.units, r)
        b = self.block_tokens
        hit = min(pos * b, a.prompt_tokens, a.prompt_units * b)
        n = len(a.units) // self.w
        if pos < n:
            tail = a.units[pos * self.w :]
            leaf = CachedRun(tail, node, r, r, 1)
            node.children[tail[: self.w]] = leaf
            self.used += n - pos
            self._offer(leaf)
        self._evict()
        return max(hit, 0)


def replay(accesses: Iterable[Access], cache: ReplayCache) -> int:
    """Total prompt hit tokens of ``accesses`` served in order by ``cache``."""
    return sum(cache.add(a) for a in accesses)
