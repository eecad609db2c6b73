"""The exact LRU pass bounded to the top ``depth`` blocks of the recency stack: the hits at
every capacity up to ``depth`` blocks, exactly, in memory bounded by ``depth`` (not by the
trace's distinct blocks).

The cache of C blocks is the top C of the one recency stack (Mattson et al., 1970), so the top
``depth`` of it is an LRU cache of ``depth`` blocks, and a block's stack distance below
``depth`` is the same in it as in the whole stack. This pass is ``hashstack``'s (read its
docstring: groups of blocks last touched by one request, counted in a Fenwick tree over
request stamps), with blocks past ``depth`` evicted after each request, deepest first. A
parent is at least as recent as its children, and of one group the deepest go first, so a
child never outlives its parent. Evicting one block at a time would cost a table deletion
each; instead the table holds up to ``depth + max(depth, SLACK)`` blocks and is then cut back
in one pass to whole groups, the newest, as many as hold at least ``depth`` blocks (a top of
the stack: the blocks newer than a stamp, and that stamp's group)::

    stamps (newest first)   r=9 [3]  r=5 [2]  r=3 [4]  r=2 [6] ...     depth 8
    kept: r=9, r=5, r=3 (9 >= 8 blocks); the rest is gone, the tree and the table rebuilt

A cut keeps a top of the stack, so the distances of the blocks kept are their distances in
the whole stack; any block not kept lies deeper than ``depth``. Blocks live in an
open-addressing table (linear probing, Fibonacci hashing: one multiply an id) of 16-byte slots,
the id and its stamp and length in one word, so a look-up reads one cache line (the table of
depth 65,536 and its spare: 8 MB, against 16 MB in three arrays at load 1/4). Below ``depth``
the curve is exact; above it the hits are at least those at ``depth``. It is what a sample
cannot see (SHARDS resolves a curve
only from about 100/R blocks up): ``radixcache.analysis.hybrid`` joins the two.
"""

from __future__ import annotations

import numpy as np

from radixcache.analysis.hashstack import (
    BAD_LENGTH,
    BAD_ORDER,
    HashStackError,
    _account,
    _fen_add,
    _jit,
)
from radixcache.analysis.stackdist import Curve
from radixcache.core.blockrule import check_length
from radixcache.traffic.mooncake_scan import block_tokens
from radixcache.traffic.swar import inline as _inline

# st: requests, blocks held, Fenwick total, followed tokens, error (code, request, id, had,
# now), last stamp, blocks ever evicted
_EVICTED = 10
SLACK = 1 << 12  # blocks held past ``depth`` before a cut, at least (a cut costs a pass)
LOW = np.int64(0xFFFFFFFF)


@_inline
def _find(tab: np.ndarray, x: np.int64, shift: np.uint64) -> int:
    """The slot of id ``x`` (its bits as an int64): >= 0 when present, ``-1 - slot`` of its
    empty slot when not (``len(tab)`` is ``2 ** (64 - shift)``)."""
    mask = np.int64(len(tab) - 1)
    h = np.int64((np.uint64(x) * np.uint64(0x9E3779B97F4A7C15)) >> shift)
    while tab[h, 1] != 0:
        if tab[h, 0] == x:
            return int(h)
        h = (h + np.int64(1)) & mask
    return int(-1 - h)


@_inline
def _meta(stamp: int, length: int) -> np.int64:
    """A slot's second word: its stamp (signed, high half) and its length (low half)."""
    return (np.int64(stamp) << np.int64(32)) | (np.int64(length) & LOW)


@_jit
def _insert_all(tab: np.ndarray, old: np.ndarray, shift: np.uint64, floor: int) -> int:
    """Every block of ``old`` stamped ``floor`` or later into the (empty) table; the blocks
    moved."""
    n = 0
    for i in range(len(old)):
        meta = old[i, 1]
        if meta != 0 and (meta >> np.int64(32)) >= floor:
            s = -1 - _find(tab, old[i, 0], shift)
            tab[s, 0], tab[s, 1] = old[i, 0], meta
            n += 1
    return n


@_jit
def _renumber(tab: np.ndarray, fen: np.ndarray, st: np.ndarray) -> int:
    """``hashstack.renumber_stamps`` over the packed table: the stamps held renumbered 1, 2,
    ... in order, the Fenwick tree rebuilt over them; the new last stamp."""
    top = st[9]
    count = np.zeros(top + 1, np.int32)
    for s in range(len(tab)):
        if tab[s, 1] > 0:
            count[tab[s, 1] >> np.int64(32)] += 1
    rank = np.zeros(top + 1, np.int32)
    k = 0
    for q in range(1, top + 1):
        if count[q]:
            k += 1
            rank[q] = k
    for s in range(len(tab)):
        meta = tab[s, 1]
        if meta > 0:
            tab[s, 1] = _meta(rank[meta >> np.int64(32)], meta & LOW)
    fen[:] = 0
    for q in range(1, top + 1):
        if count[q]:
            fen[rank[q]] = count[q]
    n = len(fen)
    for i in range(1, n):  # the Fenwick sums of the counts, in one pass
        j = i + (i & -i)
        if j < n:
            fen[j] += fen[i]
    st[9] = k
    return k


@_jit
def _cut(depth: int, tab: np.ndarray, fen: np.ndarray, spare: np.ndarray, shift: np.uint64,
         st: np.ndarray) -> None:
    """Keep the newest whole groups that hold ``depth`` blocks or more (module docstring):
    the stamp where they start from the stamps' counts, then the table rebuilt through
    ``spare`` (of its size) and the tree renumbered."""
    top = st[9]
    count = np.zeros(top + 1, np.int64)
    for s in range(len(tab)):
        if tab[s, 1] > 0:
            count[tab[s, 1] >> np.int64(32)] += 1
    floor, held = top, 0
    while floor > 1 and held + count[floor] < depth:
        held += count[floor]
        floor -= 1
    spare[:] = tab
    tab[:] = 0
    n = _insert_all(tab, spare, shift, floor)
    st[_EVICTED] += st[1] - n
    st[1], st[2] = n, n
    _renumber(tab, fen, st)


@_jit
def _run(ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray, block: int, depth: int,
         tab: np.ndarray, fen: np.ndarray, hist: np.ndarray, spare: np.ndarray,
         shift: np.uint64, st: np.ndarray) -> None:
    """Apply requests in order (the module docstring); ``st`` as ``hashstack._run``'s, then
    the blocks evicted. A slot is two words, the id's bits and ``_meta`` (0: empty), so a
    look-up touches one cache line."""
    longest = 1
    for i in range(len(ends)):  # one request's blocks at a time: room for the longest
        longest = max(longest, ends[i] - (ends[i - 1] if i else 0) + 1)
    path = np.empty(longest, np.int64)
    lens = np.empty(longest, np.int64)
    was = np.empty(longest, np.int64)
    order = np.arange(longest)
    keys = ids.view(np.int64)
    start, held, cap = 0, st[1], depth + max(depth, SLACK)
    for i in range(len(ends)):
        end, tok, r = ends[i], tokens[i], st[9] + 1
        n, m = 0, 0
        for k in range(start, end):
            x = keys[k]
            want = block_tokens(k - start, end - start, tok, block)
            s = _find(tab, x, shift)
            if s >= 0:
                meta = tab[s, 1]
                had, last = meta & LOW, meta >> np.int64(32)
                bad = had != want or n != m or last < 0 or (m and last > was[m - 1])
                if bad:
                    st[0] += i + 1
                    st[1] = held
                    st[4] = BAD_LENGTH if had != want else BAD_ORDER
                    st[5], st[6], st[7], st[8] = i, ids[k], had, want
                    return
                was[m] = last
                m += 1
            else:
                s = -1 - s
                tab[s, 0] = x
                held += 1
            tab[s, 1] = _meta(-r, want)
            path[n], lens[n] = s, want
            n += 1
        st[3] += tok
        start = end
        if n == 0:
            continue
        _account(order, was, m, lens, fen, hist, st)
        for j in range(n):
            tab[path[j], 1] = _meta(r, lens[j])
        _fen_add(fen, r, n)
        st[2] += n
        st[9] = r
        if held >= cap:
            st[1] = held
            _cut(depth, tab, fen, spare, shift, st)
            held = st[1]
    st[0] += len(ends)
    st[1] = held


class BoundedStack:
    """Feed ``HashRuns`` in order with ``add``; ``curve()`` gives the exact hits at every
    capacity up to ``depth`` blocks (then flat: a lower bound). Memory: a table of 16-byte
    slots, at most 7/10 full, for ``depth + max(depth, SLACK)`` blocks plus the longest
    request, the spare a cut rebuilds through, and a Fenwick tree of at most ``8 * depth``
    stamps."""

    renumber_floor = 1 << 16

    def __init__(self, block_tokens: int, depth: int) -> None:
        if depth < 1:
            raise ValueError("the exact depth must be at least one block")
        self.block_tokens, self.depth = block_tokens, depth
        self._table(1 << 10)
        self.fen = np.zeros((1 << 16) + 1, np.int32)
        self.hist = np.zeros(min(depth, 1 << 16) + 1, np.int64)
        self.st = np.zeros(11, np.int64)
        self.prompt_tokens = 0

    def _table(self, size: int) -> None:
        """An empty table of ``size`` slots (a power of two) and its spare."""
        self.tab = np.zeros((size, 2), np.int64)
        self.spare = np.zeros((size, 2), np.int64)
        self.shift = np.uint64(64 - (size.bit_length() - 1))

    @property
    def requests(self) -> int:
        """Requests added so far."""
        return int(self.st[0])

    @property
    def evicted(self) -> int:
        """Blocks evicted past ``depth`` so far: 0 means the curve is exact at every size."""
        return int(self.st[_EVICTED])

    @property
    def held(self) -> int:
        """Blocks held now (between ``depth`` and ``depth + max(depth, SLACK)`` once full)."""
        return int(self.st[1])

    def add(self, ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray) -> None:
        """Account consecutive requests (``HashRuns``' arrays, every id: not a sample);
        ``HashStackError`` names the first that breaks the rule among the blocks held."""
        if not len(ends):
            return
        self._room(ids, ends)
        ids = np.ascontiguousarray(ids, np.uint64)
        _run(ids, ends, tokens, self.block_tokens, self.depth, self.tab, self.fen, self.hist,
             self.spare, self.shift, self.st)
        if self.st[4]:
            code, i, x, had, now = (int(v) for v in self.st[4:9])
            why = check_length(x, had, now) if code == BAD_LENGTH else (
                f"hash id {x} appears out of its place (after a block not seen before, twice, "
                f"or under another parent than before)")
            raise HashStackError(i, why or "bad request")
        self.prompt_tokens += int(tokens.sum())

    def _room(self, ids: np.ndarray, ends: np.ndarray) -> None:
        """Room for the requests of one ``add``: the table for the most blocks held and the
        longest request, the Fenwick tree for their stamps, the histogram up to ``depth``."""
        longest = int(np.diff(ends, prepend=0).max())
        if self.st[9] > max(self.renumber_floor, 8 * self.depth):
            _renumber(self.tab, self.fen, self.st)
        need = int(self.st[9]) + len(ends) + 1
        while len(self.fen) <= need:
            size = len(self.fen) - 1
            self.fen = np.concatenate((self.fen, np.zeros(size, np.int32)))
            self.fen[2 * size] = self.st[2]
        # every distance below the most blocks ever held: with none evicted, all of them
        want = min(self.depth + max(self.depth, SLACK) + longest, self.held + len(ids)) + 1
        if len(self.hist) < want:
            self.hist = np.concatenate((self.hist, np.zeros(want - len(self.hist), np.int64)))
        most = min(self.depth + max(self.depth, SLACK), self.held + len(ids)) + longest
        if most * 10 > len(self.tab) * 7:  # load at most 7/10
            old = self.tab
            self._table(1 << (most * 10 // 7).bit_length())
            _insert_all(self.tab, old, self.shift, 1)

    def curve(self) -> Curve:
        """The hits at every capacity 0..``depth`` (units), exact; flat past it (the hits
        there are at least these)."""
        cum = np.zeros(len(self.hist) + 1, np.int64)
        np.cumsum(self.hist, out=cum[1:])
        return Curve(self.block_tokens, self.requests, self.prompt_tokens, cum)
