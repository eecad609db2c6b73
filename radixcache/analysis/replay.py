"""Direct replay of one cache size: leaf-only LRU eviction over a trie of cached units.

Independent of the one-pass curve (it keeps its own trie of cached units and a heap of
leaves), so it checks the curve (``bench whatif``), and the routing simulation keeps one per
replica (``analysis.routing``). Other policies come from libCacheSim (``analysis.policies``).
Same sequential model: a request's prompt is matched against the cache, then its whole
sequence is touched (deepest-first) and inserted, then least recently used units are dropped
until at most ``capacity`` remain. Eviction is per unit: a leaf gives up its deepest units
first, the way the recency stack orders them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from radixcache.core.tokens import common_units
from radixcache.traffic.traces import Access


@dataclass(slots=True, eq=False)
class CachedRun:
    """A run of cached units that share their history (inserted, touched together)."""

    key: bytes
    parent: CachedRun | None
    last: int = 0  # request that last touched them
    children: dict[bytes, CachedRun] = field(default_factory=dict)
    alive: bool = True


class ReplayCache:
    """An LRU cache of at most ``capacity`` units of ``width`` bytes."""

    def __init__(self, capacity: int, width: int, block_tokens: int) -> None:
        self.capacity, self.w, self.block_tokens = capacity, width, block_tokens
        self.root = CachedRun(b"", None)
        self.used = 0
        self.requests = 0
        self.heap: list[tuple[int, int, CachedRun]] = []
        self._ids = 0

    def _offer(self, node: CachedRun) -> None:
        if node is not self.root and not node.children:
            self._ids += 1
            heapq.heappush(self.heap, (node.last, self._ids, node))

    def _split(self, node: CachedRun, k: int) -> None:
        """Keep the first ``k`` units in ``node``; the rest become its only child."""
        w = self.w
        rest = CachedRun(node.key[k * w :], node, node.last, node.children)
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
            child.last = r
            node, pos = child, pos + len(child.key) // w
            if inside:
                break
        self._offer(node)
        return node, pos

    def _evict(self) -> None:
        w = self.w
        while self.used > self.capacity:
            prio, _, leaf = heapq.heappop(self.heap)
            if not leaf.alive or leaf.children or prio != leaf.last:
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
            leaf = CachedRun(tail, node, r)
            node.children[tail[: self.w]] = leaf
            self.used += n - pos
            self._offer(leaf)
        self._evict()
        return max(hit, 0)


def replay(accesses: Iterable[Access], cache: ReplayCache) -> int:
    """Total prompt hit tokens of ``accesses`` served in order by ``cache``."""
    return sum(cache.add(a) for a in accesses)
