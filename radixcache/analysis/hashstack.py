"""The one-pass LRU curve of a hash-id trace (Mooncake format) over flat arrays, compiled
with numba: the same groups-and-Fenwick algorithm as ``radixcache.analysis.stackdist`` (read
its docstring first), with a hash id standing for its whole prefix, so no trie is needed.

In a valid trace an id names one block with one parent, so a request's path is its id list
and a block's state is two int32s: the request that last touched it and its length in tokens
(``radixcache.core.blockrule``: one length per id). They live in arrays indexed by the id
itself while ids are dense (Mooncake's traces number blocks from 0), else in an
open-addressing table (8 more bytes a slot for the key). No Python object per block::

    ids  [ 7, 8, 21 ]      dense:  last[7], last[8], last[21]         (4 + 4 bytes a block)
                           table:  slot = mix(id) & mask, probe on:   (16 bytes a slot)
                                   keys[slot] == id, or last[slot] == 0 (empty)

Sampling (SHARDS, Waldspurger et al., FAST'15): with rate R only the blocks whose mixed id
falls under R * 2^24 are followed; their stack distances, scaled by 1/R, estimate the true
ones (``Curve.unit_step``), and their tokens, scaled by 1/R, the hits, with SHARDS-adj's
correction of the sample's share (a few hot blocks, such as shared system prompts, carry much
of a trace's reuse, and the sample holds them or not). Below about 100/R blocks the sample has
too few blocks to resolve the curve.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import numba
import numpy as np

from radixcache.analysis.stackdist import Curve
from radixcache.core.blockrule import check_length
from radixcache.traffic.mooncake_scan import (
    SAMPLE_BITS,
    block_tokens,
    mix,
    sample_keep,
    sampled,
)

F = TypeVar("F", bound=Callable[..., object])
NO_WANTS = np.zeros(0, np.int32)  # ``_run``'s ``wants`` for ids read whole
# error codes of ``_run``: a request index and the id at fault come with them
BAD_LENGTH, BAD_ORDER = 1, 2


def _jit(f: F) -> F:
    return cast(F, numba.njit(cache=True, nogil=True)(f))


@_jit
def _slot(keys: np.ndarray, last: np.ndarray, x: np.uint64, dense: int) -> int:
    """The slot of id ``x``: >= 0 when present, ``-1 - slot`` of its empty slot when not."""
    if dense:
        i = np.int64(x)
        return int(i) if last[i] != 0 else int(-1 - i)
    mask = np.int64(len(keys) - 1)
    h = np.int64(mix(x) & np.uint64(mask))
    while last[h] != 0:
        if keys[h] == x:
            return int(h)
        h = (h + np.int64(1)) & mask
    return int(-1 - h)


@_jit
def _fen_after(tree: np.ndarray, total: int, i: int) -> int:
    s = 0
    while i > 0:
        s += tree[i]
        i -= i & -i
    return total - s


@_jit
def _fen_add(tree: np.ndarray, i: int, delta: int) -> None:
    n = len(tree)
    while i < n:
        tree[i] += delta
        i += i & -i


@_jit
def _want(x: np.uint64, k: int, start: int, end: int, tok: int, wants: np.ndarray, block: int,
          keep: np.uint64) -> int:
    """The tokens of block ``x`` (``ids[k]`` of a request ``ids[start:end]`` of ``tok``
    tokens), or -1 if it is not followed (not in the sample)."""
    if len(wants):  # read as a sample: ``wants`` says
        return int(wants[k])
    if not sampled(x, keep):
        return -1
    return block_tokens(k - start, end - start, tok, block)


@_jit
def _run(ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray, wants: np.ndarray, block: int,
         keep: np.uint64, dense: int, keys: np.ndarray, last: np.ndarray, length: np.ndarray,
         fen: np.ndarray, hist: np.ndarray, st: np.ndarray) -> None:
    """Apply requests in order (see the module docstring). ``st`` in and out: requests,
    distinct blocks, Fenwick total, followed prompt tokens, then an error (code, request, id,
    its length before, its length now), then the last stamp (a request's number in ``last``
    and the Fenwick tree, given only to requests that follow a block). ``wants`` given (not
    empty): ``ids`` are a sample already, and these their blocks' tokens."""
    path = np.empty(ids.shape[0] + 1, np.int64)  # slots of one request's followed blocks
    was = np.empty(ids.shape[0] + 1, np.int64)  # their last toucher before this request
    start = 0
    for i in range(len(ends)):
        st[0] += 1
        end, tok, r = ends[i], tokens[i], st[9] + 1  # a stamp: requests that follow blocks
        n, m = 0, 0
        for k in range(start, end):  # the followed blocks; the matched ones are a prefix
            x = ids[k]
            want = _want(x, k, start, end, tok, wants, block, keep)
            if want < 0:
                continue
            s = _slot(keys, last, x, dense)
            if s >= 0:  # seen: after an unseen block, twice, or touched after its parent: bad
                bad = length[s] != want or n != m or last[s] < 0 or (m and last[s] > was[m - 1])
                if bad:
                    st[4] = BAD_LENGTH if length[s] != want else BAD_ORDER
                    st[5], st[6], st[7], st[8] = i, x, length[s], want
                    return
                was[m] = last[s]
                m += 1
            else:
                s = -1 - s
                length[s] = want
                if not dense:
                    keys[s] = x
                st[1] += 1
            last[s] = -r  # taken by this request (stamped r below)
            path[n] = s
            n += 1
            st[3] += want
        start = end
        if n == 0:  # nothing followed (a sample): no stamp, no group
            continue
        _account(path, was, m, length, fen, hist, st)
        for j in range(n):
            last[path[j]] = r
        _fen_add(fen, r, n)
        st[2] += n
        st[9] = r


@_jit
def _account(path: np.ndarray, was: np.ndarray, m: int, length: np.ndarray, fen: np.ndarray,
             hist: np.ndarray, st: np.ndarray) -> None:
    """Histogram the ``m`` matched blocks' tokens by stack distance, then move their groups
    (all queries before any update: moving a shallow group changes the deeper ones' distances).
    Only the distances below ``len(hist)`` are counted (``HashStack`` grows ``hist`` past every
    distance; ``boundstack`` keeps it at its depth)."""
    j, top = 0, len(hist)
    while j < m:
        q, lo = was[j], j
        d = _fen_after(fen, st[2], q)
        while j < m and was[j] == q:
            if d + j - lo < top:
                hist[d + j - lo] += length[path[j]]
            j += 1
    j = 0
    while j < m:
        q, lo = was[j], j
        while j < m and was[j] == q:
            j += 1
        _fen_add(fen, q, lo - j)
        st[2] += lo - j


@_jit
def _rehash(keys: np.ndarray, last: np.ndarray, length: np.ndarray, old_keys: np.ndarray,
            old_last: np.ndarray, old_length: np.ndarray, dense: int) -> None:
    """Move every block of the old arrays into the (empty, larger) table."""
    for i in range(len(old_last)):
        if old_last[i] != 0:
            x = np.uint64(i) if dense else old_keys[i]
            s = -1 - _slot(keys, last, x, 0)
            keys[s], last[s], length[s] = x, old_last[i], old_length[i]


@_jit
def renumber_stamps(last: np.ndarray, fen: np.ndarray, st: np.ndarray) -> int:
    """Renumber the stamps still held by a block 1, 2, ... in order, and rebuild the Fenwick
    tree over them (its sums, the blocks touched after a stamp, are kept): a sample's
    requests stamp many more times than it holds blocks, and a tree over the live stamps
    only stays in cache. The new last stamp."""
    top = st[9]
    count = np.zeros(top + 1, np.int32)
    for s in range(len(last)):
        if last[s] > 0:
            count[last[s]] += 1
    rank = np.zeros(top + 1, np.int32)
    k = 0
    for q in range(1, top + 1):
        if count[q]:
            k += 1
            rank[q] = k
    for s in range(len(last)):
        if last[s] > 0:
            last[s] = rank[last[s]]
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


class HashStackError(ValueError):
    """A request that breaks ``radixcache.core.blockrule``: ``index`` is its place in the
    batch given to ``HashStack.add``."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


class HashStack:
    """Feed ``HashRuns`` in order with ``add``; ``curve()`` gives the hits at every capacity
    (exact at ``rate`` 1, else the SHARDS estimate at that sampling rate)."""

    renumber_floor = 1 << 16  # a sample renumbers its stamps past this many
    # ... and past this many a block it follows: less often costs a larger Fenwick tree, more
    # often a pass over all stamps each time. 8 against 2, alternated: the 1% sample's pass
    # over 5M requests generated in process 0.38 against 0.41 s, over the 10M-request file's
    # chunks alone 0.49 against 0.61 s, the whole `whatif FILE --sample` the same (its scan
    # bounds it); its tree at most 8 MB
    renumber_ratio = 8

    def __init__(self, block_tokens: int, rate: float = 1.0) -> None:
        self.block_tokens = block_tokens
        self.keep = sample_keep(rate)
        self.rate = self.keep / 2**SAMPLE_BITS if self.keep else 1.0
        self.dense = not self.keep  # a sample is small: a table from the start
        self.keys = np.zeros(1 if self.dense else 1 << 16, np.uint64)
        self.last = np.zeros(len(self.keys), np.int32)
        self.length = np.zeros(len(self.keys), np.int32)
        self.fen = np.zeros((1 << 16) + 1, np.int32)  # sums <= distinct blocks < 2^31
        self.hist = np.zeros(1 << 16, np.int64)
        self.st = np.zeros(10, np.int64)
        self.prompt_tokens = 0
        self.ids_seen = 0

    @property
    def requests(self) -> int:
        """Requests added so far."""
        return int(self.st[0])

    @property
    def distinct(self) -> int:
        """Distinct blocks followed so far (all of them at rate 1)."""
        return int(self.st[1])

    def add(self, ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray,
            wants: np.ndarray | None = None) -> None:
        """Account consecutive requests (``HashRuns``' arrays: ``wants`` with a sample read
        at this stack's ``keep``); ``HashStackError`` names the first that breaks the rule (the
        stack is of no further use then)."""
        if wants is not None and not self.keep:
            raise ValueError("a sample's ids given to an exact stack")
        self._room(ids, len(ends))
        _run(ids, ends, tokens, NO_WANTS if wants is None else wants, self.block_tokens,
             np.uint64(self.keep), int(self.dense), self.keys, self.last, self.length, self.fen,
             self.hist, self.st)
        if self.st[4]:
            code, i, x, had, now = (int(v) for v in self.st[4:9])
            why = check_length(x, had, now) if code == BAD_LENGTH else (
                f"hash id {x} appears out of its place (after a block not seen before, twice, "
                f"or under another parent than before)")
            raise HashStackError(i, why or "bad request")
        self.prompt_tokens += int(tokens.sum())

    def _room(self, ids: np.ndarray, n: int) -> None:
        """Grow the arrays so that ``n`` more requests of ``ids`` fit."""
        if self.keep and self.st[9] > max(self.renumber_floor, self.renumber_ratio * self.distinct):
            renumber_stamps(self.last, self.fen, self.st)
        need = int(self.st[9]) + n + 1
        if need >= 2**31 - 1 or self.distinct + len(ids) >= 2**31 - 1:
            raise HashStackError(0, "over 2^31 requests or blocks: split the trace")
        while len(self.fen) <= need:  # a power-of-two Fenwick doubles with one new cell
            size = len(self.fen) - 1
            self.fen = np.concatenate((self.fen, np.zeros(size, np.int32)))
            self.fen[2 * size] = self.st[2]
        if len(self.hist) <= self.distinct + len(ids):
            grow = max(len(self.hist) // 2, self.distinct + len(ids) + 1 - len(self.hist))
            self.hist = np.concatenate((self.hist, np.zeros(grow, np.int64)))
        self.ids_seen += len(ids)
        top = int(ids.max()) if len(ids) and self.dense else 0  # a table takes any id
        if self.dense and top >= max(1 << 22, 4 * self.ids_seen):
            self._table(max(1 << 16, 2 * self.distinct + len(ids)))  # sparse ids: a table
        if self.dense and top >= len(self.last):
            grow = max(top + 1 - len(self.last), len(self.last) // 4)
            self.last = np.concatenate((self.last, np.zeros(grow, np.int32)))
            self.length = np.concatenate((self.length, np.zeros(grow, np.int32)))
        elif not self.dense and (self.distinct + len(ids)) * 10 > len(self.keys) * 7:
            self._table(2 * len(self.keys))

    def _table(self, want: int) -> None:
        """Move the blocks into an open-addressing table of at least ``want`` slots."""
        size = 1 << max(want - 1, 1).bit_length()
        old = (self.keys, self.last, self.length)
        self.keys, self.last = np.zeros(size, np.uint64), np.zeros(size, np.int32)
        self.length = np.zeros(size, np.int32)
        _rehash(self.keys, self.last, self.length, *old, int(self.dense))
        self.dense = False

    def curve(self) -> Curve:
        """The hit tokens at every capacity (units of ``block_tokens``)."""
        size = self.distinct + 2
        cum = np.zeros(size, np.int64)
        np.cumsum(self.hist[: size - 1], out=cum[1:])
        if self.keep:  # SHARDS-adj: the sample's tokens stand for 1/rate times as many; what
            # the sample holds above or below its expected share (hot blocks in or out of
            # it) is put at distance 0, where such blocks are; then scaled by 1/rate
            excess = self.rate * self.prompt_tokens - float(self.st[3])
            adj = np.maximum(cum + np.where(np.arange(size) > 0, excess, 0.0), 0.0)
            cum = np.rint(np.maximum.accumulate(adj) / self.rate).astype(np.int64)
        return Curve(self.block_tokens, self.requests, self.prompt_tokens, cum,
                     1.0 / self.rate)
