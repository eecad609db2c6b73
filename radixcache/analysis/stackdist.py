"""One-pass stack distances over a prefix trie: the hit rate of every cache size at once.

Model: requests one at a time; each touches the blocks ("units") of its cached sequence
deepest-first, so a parent is always at least as recent as its children. The LRU block is then
always a leaf, leaf-only LRU is plain LRU over that order, and LRU is a stack algorithm
(Mattson et al., 1970): the cache of C units is the top C of one recency stack. A unit is a
hit at capacity C when its stack distance (distinct units touched since) is < C.

Groups instead of per-unit timestamps. After request r, the units it touched and nobody
touched since form one run along r's path, depths ``[g_r, L_r)``: a later request re-touches
a root prefix of r's path, so what stays r's is always a suffix of it. Ordered deepest-first,
the unit at depth d of group r has distance ``S_r + (d - g_r)`` where ``S_r`` is the size of
all later groups. A Fenwick tree over request numbers holds the group sizes, so a request
costs one query and one update per group its path crosses (a few), not one per unit::

    stack (most recent on top)     request 7 touches [0, 5) of r=3's path and adds 2 units
      r=6  ####                      S_3 = |r6| + |r5| + |r4| = 4 + 2 + 3 = 9
      r=5  ##                        units of group 3 at depth g_3 .. g_3+4: distances 9..13
      r=4  ###                       afterwards: g_3 += 5, |r3| -= 5, |r7| = 7
      r=3  ########  (g_3 = 0)

The trie only grows (it is the cache at infinite size): memory is O(distinct units).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from radixcache.core.tokens import common_units
from radixcache.traffic.traces import Access


class _Fenwick:
    """Prefix sums over request numbers 1..n, growing by doubling (rebuilt in O(n))."""

    __slots__ = ("raw", "total", "tree")

    def __init__(self) -> None:
        self.raw = array("q", [0]) * (1 << 12)
        self.tree = array("q", [0]) * (1 << 12)
        self.total = 0

    def _grow(self, i: int) -> None:
        size = len(self.raw)
        while size <= i:
            size *= 2
        self.raw.extend(array("q", [0]) * (size - len(self.raw)))
        tree = array("q", self.raw)  # the O(n) build: each cell pushes its sum to its parent
        for j in range(1, size):
            k = j + (j & -j)
            if k < size:
                tree[k] += tree[j]
        self.tree = tree

    def add(self, i: int, delta: int) -> None:
        if i >= len(self.raw):
            self._grow(i)
        self.raw[i] += delta
        self.total += delta
        tree, n = self.tree, len(self.tree)
        while i < n:
            tree[i] += delta
            i += i & -i

    def after(self, i: int) -> int:
        """Sum over indices > i."""
        s, tree = 0, self.tree
        while i > 0:
            s += tree[i]
            i -= i & -i
        return self.total - s


@dataclass(slots=True, eq=False)
class _Node:
    key: bytes  # this node's units
    last: int  # the request that last touched every unit of it
    children: dict[bytes, _Node] = field(default_factory=dict)


class Curve(NamedTuple):
    """Hit tokens at every capacity (in units): ``hits(c)`` for every c >= 0.

    ``cum[k]`` is the hits at capacity ``k * unit_step`` units: ``unit_step`` is 1 for an
    exact curve, 1/R for one estimated from a sample at rate R (``hashstack``), whose k-th
    entry stands for the blocks at sampled distances below k. A joined curve
    (``analysis.hybrid``) also has ``exact_cum``: the exact hits at capacities 0 ..
    ``exact_units``, which ``hits`` answers from; ``cum`` answers above (the sample, shifted
    to meet the exact part there), each estimated point within ``bound`` tokens (``bound[k]``
    beside ``cum[k]``) at the stated confidence."""

    block_tokens: int
    requests: int
    prompt_tokens: int
    cum: np.ndarray  # cum[k] = hit tokens at capacity k * unit_step units (then flat)
    unit_step: float = 1.0
    exact_cum: np.ndarray | None = None  # exact hits at capacities 0 .. exact_units
    bound: np.ndarray | None = None  # beside ``cum``: the error bound of each estimate, tokens

    @property
    def exact_units(self) -> int:
        """Capacities up to this many units are exact (every one for an exact curve)."""
        if self.exact_cum is not None:
            return len(self.exact_cum) - 1
        return 2**62 if self.unit_step == 1.0 else 0

    @property
    def max_hits(self) -> int:
        """Hit tokens at infinite capacity (every miss left is compulsory)."""
        return int(self.cum[-1])

    @property
    def saturation_units(self) -> int:
        """The smallest capacity (units) that reaches ``max_hits``."""
        return self.units_reaching(self.max_hits)

    def units_reaching(self, hits: float) -> int:
        """The smallest capacity (units) whose hits reach ``hits`` (past the top: the
        saturation)."""
        e = self.exact_cum
        if e is not None and e[-1] >= hits:
            return int(np.searchsorted(e, hits, side="left"))
        k = int(np.searchsorted(self.cum, min(hits, self.cum[-1]), side="left"))
        return max(self.units_at(k), 0 if e is None else len(e))

    def units_at(self, k: int) -> int:
        """The smallest capacity (units) whose hits are ``cum[k]``."""
        if self.unit_step == 1.0 or k == 0:
            return k
        return int(np.floor((k - 1) * self.unit_step)) + 1

    def _index(self, units: np.ndarray) -> np.ndarray:
        u = np.asarray(units, dtype=np.int64)
        if self.unit_step != 1.0:
            u = np.ceil(np.minimum(u, 2**52) / self.unit_step).astype(np.int64)
        out: np.ndarray = np.minimum(u, len(self.cum) - 1)
        return out

    def hits(self, units: np.ndarray) -> np.ndarray:
        """Hit tokens at each capacity in ``units`` (int64 array, any values >= 0)."""
        u = np.asarray(units, dtype=np.int64)
        out: np.ndarray = self.cum[self._index(u)]
        e = self.exact_cum
        if e is not None:
            low = u < len(e)
            out = np.where(low, e[np.minimum(u, len(e) - 1)], out)
        return out

    def exact(self, units: np.ndarray) -> np.ndarray:
        """Whether the hits at each capacity in ``units`` are exact (not estimated)."""
        return np.asarray(units, dtype=np.int64) <= self.exact_units

    def bounds(self, units: np.ndarray) -> np.ndarray:
        """The error bound (tokens) of the hits at each capacity in ``units``: 0 where exact."""
        u = np.asarray(units, dtype=np.int64)
        if self.bound is None:
            return np.where(self.exact(u), 0, -1).astype(np.int64)
        out: np.ndarray = np.where(self.exact(u), 0, self.bound[self._index(u)])
        return out

    def hit_rate_at(self, units: int) -> float:
        """The token hit rate at a capacity of ``units`` (0 before any request)."""
        return float(self.hits(np.asarray([units]))[0]) / max(self.prompt_tokens, 1)


class StackDistances:
    """Feed requests in order with ``add``; ``curve()`` gives the hits at every capacity."""

    def __init__(self, width: int, block_tokens: int) -> None:
        self.w = width
        self.block_tokens = block_tokens
        self.root = _Node(b"", 0)
        self.groups = _Fenwick()
        self.g = array("q", [0])  # g[r]: depth where request r's group starts
        self.requests = 0
        self.prompt_tokens = 0
        self.distinct_units = 0
        # range adds to the per-distance histogram: +val at pos_lo, -val at pos_hi
        self._lo = array("q")
        self._hi = array("q")
        self._val = array("q")

    def _walk(self, seq: bytes, r: int) -> tuple[list[tuple[int, int, int]], _Node, int]:
        """Follow ``seq`` down the trie, splitting where it stops inside a node. Returns the
        groups crossed as ``(request, depth_from, depth_to)``, shallow first, the last node
        and the matched depth; stamps every matched node with ``r``."""
        w, node, pos, n = self.w, self.root, 0, len(seq)
        groups: list[tuple[int, int, int]] = []
        while pos * w < n:
            child = node.children.get(seq[pos * w : pos * w + w])
            if child is None:
                break
            inside = not seq.startswith(child.key, pos * w)
            if inside:  # the sequence ends or diverges within the child: split it there
                k = common_units(seq, pos * w, child.key, w)
                rest = _Node(child.key[k * w :], child.last, child.children)
                child.key, child.children = child.key[: k * w], {rest.key[:w]: rest}
            k = len(child.key) // w
            if groups and groups[-1][0] == child.last:
                groups[-1] = (child.last, groups[-1][1], pos + k)
            else:
                groups.append((child.last, pos, pos + k))
            child.last = r
            node, pos = child, pos + k
            if inside:
                break
        return groups, node, pos

    def add(self, a: Access) -> list[tuple[int, int, int]]:
        """Account one request: its prompt units' distances, then touch its whole path.
        Returns the prompt's matched runs ``(distance of the first unit, depth from, depth
        to)``, shallow first, distances one more per unit deeper: the request's hit at
        capacity C is the longest prefix whose distances are below C."""
        self.requests += 1
        r = self.requests
        self.prompt_tokens += a.prompt_tokens
        groups, node, pos = self._walk(a.units, r)
        fen, g = self.groups, self.g
        tree, raw, size = fen.tree, fen.raw, len(fen.tree)
        runs: list[tuple[int, int, int]] = []
        for q, lo, hi in groups:  # all queries before any update (a shallow group's move
            s, i = 0, q  # changes the distances of the deeper ones): ``fen.after(q)``
            while i > 0:  # inline, as the update below is ``fen.add(q, lo - hi)``: these
                s += tree[i]  # two loops are most of the cost of a request
                i -= i & -i
            run = (fen.total - s, lo, min(hi, a.prompt_units))
            runs.append(run)
            self._record(run[0], run[1], run[2], a.prompt_tokens)
        for q, lo, hi in groups:  # (q < r: inside the tree, which never grows here)
            d, i = lo - hi, q
            raw[q] += d
            fen.total += d
            while i < size:
                tree[i] += d
                i += i & -i
            g[q] = hi
        n = len(a.units) // self.w
        if pos < n:
            tail = a.units[pos * self.w :]
            if node is not self.root and not node.children:
                node.key += tail  # a leaf that r just touched whole: r's group grows in place
            else:
                node.children[tail[: self.w]] = _Node(tail, r)
            self.distinct_units += n - pos
        fen.add(r, n)
        g.append(0)
        return [run for run in runs if run[2] > run[1]]

    def _record(self, dist: int, lo: int, hi: int, prompt_tokens: int) -> None:
        """Histogram the prompt units at depths [lo, hi), the first at distance ``dist``."""
        if hi <= lo:
            return
        b = self.block_tokens
        full = min(hi, prompt_tokens // b)  # units worth a whole block of tokens
        if full > lo:
            self._lo.append(dist)
            self._hi.append(dist + full - lo)
            self._val.append(b)
        if lo <= full < hi:  # the prompt's partial last unit (Mooncake's rounding)
            part = prompt_tokens - full * b
            if part > 0:
                d = dist + full - lo
                self._lo.append(d)
                self._hi.append(d + 1)
                self._val.append(part)

    def curve(self) -> Curve:
        """The hit tokens at every capacity, from the histogram gathered so far."""
        size = self.distinct_units + 2
        val = np.frombuffer(self._val, dtype=np.int64).astype(np.float64)
        diff = np.bincount(np.frombuffer(self._lo, dtype=np.int64), val, minlength=size)
        diff -= np.bincount(np.frombuffer(self._hi, dtype=np.int64), val, minlength=size)
        per_distance = np.cumsum(diff[: size - 1])  # tokens hit at exactly distance d
        cum = np.zeros(size, dtype=np.int64)
        np.cumsum(np.rint(per_distance).astype(np.int64), out=cum[1:])
        return Curve(self.block_tokens, self.requests, self.prompt_tokens, cum)
