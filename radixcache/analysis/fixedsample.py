"""A SHARDS sample of fixed size (Waldspurger et al., FAST'15 §3.2 and §4.3: ``s_max``): at
most ``s_max`` blocks followed, whatever the trace's length, the rate lowered as it grows.

A block is in a sample of threshold T when the top ``SAMPLE_BITS`` of its mixed id (its value,
``mooncake_scan.sampled``) fall under T, the rate being T / 2^24. This stack starts at a rate
(1: every block) and follows the blocks under its threshold as ``hashstack`` does (the same
groups and Fenwick tree over request stamps, in an open-addressing table). Before a request
would take it past ``s_max`` blocks, it lowers T to the value of the ``s_max - s_max / 16``-th
smallest of the blocks it holds and the request brings (so a sample always is the blocks of
lowest values, as at a fixed rate; the paper lowers T one block at a time, here 1/16 of them
go at once so the table is rebuilt rarely), evicts every block at or above it, and rescales
what it counted at the old rate to the new one (the paper's §4.3): each histogram bucket's
tokens times T_new / T_old, moved to the bucket of its distance at the new rate (distance
times T_new / T_old), and the followed tokens (SHARDS-adj's share) likewise. The curve is
then that of a sample at the final rate, which the JSON reports (``sample_rate``)::

    held  s_max |   /|   /|  /|   /|      T: 2^24 -> T1 -> T2 -> ...  (each drop: 1/16 out)
                |  / | /  | / | /  |
                | /  |/   |/  |/   |
                +-------------------> requests

``follow`` makes a stack take its thresholds from another one instead (the sub-samples of
``hybrid``'s bound: each the blocks of one ``part`` of eight, told where the whole sample
lowered T, request by request).
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
    _rehash,
    _slot,
    renumber_stamps,
)
from radixcache.analysis.stackdist import Curve
from radixcache.core.blockrule import check_length
from radixcache.traffic.mooncake_scan import SAMPLE_BITS, mix, sample_keep, sample_runs

FULL = 1 << SAMPLE_BITS  # the threshold of rate 1
PARTS = 8  # ``part``: the three bits of a mixed id below its value pick one of eight
PART_SHIFT = 64 - SAMPLE_BITS - 3
DROP_SHARE = 16  # a drop evicts 1/16 of s_max (at least one block)
# st: requests, blocks held, Fenwick total, followed tokens, error (code, request, id, had,
# now), last stamp, most blocks ever held, new blocks of the request it stopped at
_PEAK, _NEED = 10, 11


def mixed(ids: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over an array (``mooncake_scan.mix``)."""
    x = ids.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


@_jit
def _value(x: np.uint64) -> np.int64:
    return np.int64(mix(x) >> np.uint64(64 - SAMPLE_BITS))


@_jit
def _run(ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray, wants: np.ndarray, lo: int,
         hi: int, keep: int, s_max: int, keys: np.ndarray, last: np.ndarray,
         length: np.ndarray, fen: np.ndarray, hist: np.ndarray, st: np.ndarray) -> int:
    """Requests ``lo`` to ``hi`` of the chunk (``ids`` a sample at a threshold at least
    ``keep``, ``wants`` their tokens), the blocks under ``keep`` followed as ``hashstack._run``
    follows them; returns the request it stopped at, before applying it, because it would
    take the stack past ``s_max`` blocks (``st[_NEED]``: the new blocks it brings), or
    ``hi``. ``st`` as ``hashstack._run``'s, then the peak held."""
    longest = 1
    for i in range(lo, hi):  # one request's blocks at a time: room for the longest
        longest = max(longest, ends[i] - (ends[i - 1] if i else 0) + 1)
    path = np.empty(longest, np.int64)
    was = np.empty(longest, np.int64)
    for i in range(lo, hi):
        start, end, r = ends[i - 1] if i else 0, ends[i], st[9] + 1
        new = 0
        for k in range(start, end):  # first: would the request fit?
            if _value(ids[k]) < keep and _slot(keys, last, ids[k], 0) < 0:
                new += 1
        if st[1] + new > s_max:
            st[_NEED] = new
            return i
        st[0] += 1
        n, m = 0, 0
        for k in range(start, end):
            x = ids[k]
            if _value(x) >= keep:
                continue
            want = wants[k]
            s = _slot(keys, last, x, 0)
            if s >= 0:
                bad = length[s] != want or n != m or last[s] < 0 or (m and last[s] > was[m - 1])
                if bad:
                    st[4] = BAD_LENGTH if length[s] != want else BAD_ORDER
                    st[5], st[6], st[7], st[8] = i, x, length[s], want
                    return -1
                was[m] = last[s]
                m += 1
            else:
                s = -1 - s
                length[s], keys[s] = want, x
                st[1] += 1
            last[s] = -r
            path[n] = s
            n += 1
            st[3] += want
        st[_PEAK] = max(st[_PEAK], st[1])
        if n == 0:
            continue
        _account(path, was, m, length, fen, hist, st)
        for j in range(n):
            last[path[j]] = r
        _fen_add(fen, r, n)
        st[2] += n
        st[9] = r
    return hi


@_jit
def _evict(keys: np.ndarray, last: np.ndarray, length: np.ndarray, keep: int) -> int:
    """Forget every block of value ``keep`` or more; the blocks left (the table must then be
    rebuilt: a gap breaks linear probing's runs)."""
    n = 0
    for s in range(len(last)):
        if last[s] != 0:
            if _value(keys[s]) >= keep:
                last[s] = 0
            else:
                n += 1
    return n


@_jit
def _rescale(hist: np.ndarray, ratio: float) -> None:
    """Each bucket's tokens times ``ratio`` (< 1), moved to its distance times ``ratio``."""
    for d in range(len(hist)):
        v = hist[d]
        if v != 0.0:
            hist[d] = 0.0
            hist[int(d * ratio)] += v * ratio


class FixedSample:
    """Feed ``HashRuns`` (every id, or a sample at ``start_rate``) in order with ``add``;
    ``curve()`` is the SHARDS estimate at the final rate, from at most ``s_max`` blocks
    (module docstring). ``follow``: no ``s_max`` of its own; ``lower`` sets its threshold."""

    def __init__(self, block_tokens: int, s_max: int, start_rate: float = 1.0,
                 part: int | None = None) -> None:
        if s_max < 1:
            raise ValueError("a fixed-size sample holds at least one block")
        self.block_tokens, self.s_max, self.part = block_tokens, s_max, part
        self.keep = sample_keep(start_rate) or FULL
        self.share = 1.0 if part is None else 1 / PARTS
        size = 1 << max(10, min(s_max, 1 << 20).bit_length() + 1)
        self.keys = np.zeros(size, np.uint64)
        self.last = np.zeros(size, np.int32)
        self.length = np.zeros(size, np.int32)
        self.fen = np.zeros((1 << 16) + 1, np.int32)
        self.hist = np.zeros(min(s_max, 1 << 16) + 1, np.float64)
        self.st = np.zeros(12, np.int64)
        self.followed = 0.0  # followed tokens counted at earlier rates, rescaled to this one
        self.prompt_tokens = 0
        self.drops: list[tuple[int, int]] = []  # (request of the chunk, new threshold)

    @property
    def rate(self) -> float:
        """The sampling rate now (a sub-sample's: of its part)."""
        return self.keep / FULL * self.share

    @property
    def requests(self) -> int:
        return int(self.st[0])

    @property
    def distinct(self) -> int:
        """Blocks followed now (at most ``s_max``)."""
        return int(self.st[1])

    @property
    def peak(self) -> int:
        """The most blocks it ever held."""
        return int(self.st[_PEAK])

    def add(self, ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray,
            wants: np.ndarray | None = None, drops: list[tuple[int, int]] | None = None
            ) -> None:
        """Account consecutive requests: every id (``wants`` None), or a sample at a threshold
        at least this stack's with their ``wants``; ``drops`` (a follower): where to lower the
        threshold, as ``self.drops`` of the stack it follows lists them for this chunk."""
        if wants is None:
            ids, ends, wants = sample_runs(ids, ends, tokens, self.keep, self.block_tokens)
        if self.part is not None:
            mine = (mixed(ids) >> np.uint64(PART_SHIFT)) & np.uint64(PARTS - 1) == self.part
            cut = np.concatenate(([0], np.cumsum(mine)))
            ids, wants, ends = ids[mine], wants[mine], cut[ends]
        self.drops = []
        self._room(len(ids), len(ends))
        i, n = 0, len(ends)
        marks = [] if drops is None else drops
        for at, keep in [*marks, (n, self.keep)]:
            while i < at:
                i = self._run(ids, ends, tokens, wants, i, at)
                if i < at:
                    self._drop(i, ids[(ends[i - 1] if i else 0):ends[i]])
            if keep < self.keep:
                self.lower(keep)
        self.prompt_tokens += int(tokens.sum())

    def _run(self, ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray, wants: np.ndarray,
             lo: int, hi: int) -> int:
        s_max = self.s_max if self.part is None else 2**62
        i = int(_run(ids, ends, tokens, wants, lo, hi, self.keep, s_max, self.keys, self.last,
                     self.length, self.fen, self.hist, self.st))
        if i < 0:
            code, at, x, had, now = (int(v) for v in self.st[4:9])
            why = check_length(x, had, now) if code == BAD_LENGTH else (
                f"hash id {x} appears out of its place (after a block not seen before, twice, "
                f"or under another parent than before)")
            raise HashStackError(at, why or "bad request")
        return i

    def _drop(self, at: int, request: np.ndarray) -> None:
        """Lower the threshold so that the blocks held and ``request``'s fit in ``s_max -
        s_max / DROP_SHARE`` (the lowest values stay), then evict and rescale; noted in
        ``drops`` as before the chunk's request ``at``."""
        held = self.keys[self.last != 0]
        pool = np.unique(np.concatenate((held, request)))
        values = np.sort((mixed(pool) >> np.uint64(64 - SAMPLE_BITS)).astype(np.int64))
        values = values[values < self.keep]
        room = self.s_max - max(1, self.s_max // DROP_SHARE)
        keep = int(values[room]) if room < len(values) else self.keep - 1
        keep = max(keep, 1)
        self.drops.append((at, keep))
        self.lower(keep)

    def lower(self, keep: int) -> None:
        """Take threshold ``keep`` (below the current one): evict the blocks at or above it,
        rebuild the table and the tree, rescale the counts (module docstring)."""
        ratio = keep / self.keep
        n = int(_evict(self.keys, self.last, self.length, keep))
        old = (self.keys, self.last, self.length)
        self.keys, self.last = np.zeros_like(old[0]), np.zeros_like(old[1])
        self.length = np.zeros_like(old[2])
        _rehash(self.keys, self.last, self.length, *old, 0)
        self.st[1] = self.st[2] = n
        renumber_stamps(self.last, self.fen, self.st)
        _rescale(self.hist, ratio)
        self.followed = (self.followed + float(self.st[3])) * ratio
        self.st[3] = 0
        self.keep = keep

    def _room(self, n_ids: int, n_requests: int) -> None:
        """Room for a chunk: the Fenwick tree for its stamps (renumbered past 8x the blocks
        held), the table at most 7/10 full, the histogram for every distance held."""
        if self.st[9] > max(1 << 16, 8 * self.distinct):
            renumber_stamps(self.last, self.fen, self.st)
        need = int(self.st[9]) + n_requests + 1
        while len(self.fen) <= need:
            size = len(self.fen) - 1
            self.fen = np.concatenate((self.fen, np.zeros(size, np.int32)))
            self.fen[2 * size] = self.st[2]
        most = min(self.s_max, self.distinct + n_ids) + 1
        if len(self.hist) < most:
            self.hist = np.concatenate((self.hist, np.zeros(most - len(self.hist))))
        if most * 10 > len(self.keys) * 7:
            old = (self.keys, self.last, self.length)
            size = 1 << (most * 10 // 7).bit_length()
            self.keys, self.last = np.zeros(size, np.uint64), np.zeros(size, np.int32)
            self.length = np.zeros(size, np.int32)
            _rehash(self.keys, self.last, self.length, *old, 0)

    def curve(self) -> Curve:
        """The hits at every capacity, estimated at the final rate (SHARDS-adj, as
        ``HashStack.curve``)."""
        rate = self.rate
        size = self.distinct + 2
        cum = np.zeros(size, np.float64)
        np.cumsum(self.hist[: size - 1], out=cum[1:])
        excess = rate * self.prompt_tokens - (self.followed + float(self.st[3]))
        adj = np.maximum(cum + np.where(np.arange(size) > 0, excess, 0.0), 0.0)
        out = np.rint(np.maximum.accumulate(adj) / rate).astype(np.int64)
        return Curve(self.block_tokens, self.requests, self.prompt_tokens, out, 1.0 / rate)
