"""A compiled scanner for the common shape of Mooncake-format lines, so that reading a trace
costs less than analysing it: ``{"timestamp": 27482, "input_length": 6955, "output_length": 52,
"hash_ids": [46, 47, 48, ...]}``, keys in any order, any whitespace between tokens.

It accepts a strict subset of JSON: one object a line whose values are numbers (no exponent,
at most 18 integer digits, but the ids), strings without escapes, or arrays of integers. A
line must also obey ``radixcache.core.blockrule``'s count rule (exactly ``ceil(input_length /
block)`` ids, input_length >= 1). Anything else -- a blank line, an escape, a nested object, a
negative or oversized id, a fractional length, a missing or repeated key -- makes it give up on
the whole chunk, and the caller reads that chunk with msgspec, which validates every line and
names the bad one. So the scanner never decides that a line is wrong: it only reads the lines
it is sure of (``tests/test_whatif_scale.py`` checks it against msgspec).

Sampling (SHARDS: see ``radixcache.analysis.hashstack``) happens here, as each id is read: a
sampled pass keeps only the ids whose mixed value falls under ``keep``, with the tokens each
kept block holds (``wants``: a block's, or the partial last block's), so a 1% sample builds
arrays of 1% of the ids and its pass does little more than read the file.

Speed: every loop stops at the chunk's last newline (the scanner checks it is there), so none
tests the chunk's end; numbers and keys are read eight bytes at a time (``radixcache.traffic.swar``:
unaligned loads, the buffer holding ``PAD`` bytes past the chunk).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from radixcache.traffic.swar import (
    PAD,
    U,
    digit_count,
    digits,
    eight,
    inline,
    jit,
    load8,
    skip_ws,
    uint,
)

SAMPLE_BITS = 24  # a block is sampled when the top SAMPLE_BITS bits of its mixed id < keep
# the known keys: their first 8 bytes, then the rest with the closing quote (little-endian)
_KEYS = (b"input_length", b"hash_ids", b"timestamp", b"output_length")
KEY_WORDS = np.asarray([int.from_bytes(k[:8], "little") for k in _KEYS], np.uint64)
KEY_TAILS = np.asarray([int.from_bytes(k[8:] + b'"', "little") for k in _KEYS], np.uint64)
FAIL = (-1, 0, U(0), 0, False)  # ``_object``'s answer for a line it does not accept


def sample_keep(rate: float) -> int:
    """The sampling threshold of rate ``rate`` (0: keep every block)."""
    return 0 if rate >= 1 else max(1, round(rate * 2**SAMPLE_BITS))


@inline
def mix(x: np.uint64) -> np.uint64:
    """splitmix64's finaliser: spreads dense ids over a hash table and the sampling range."""
    x = (x ^ (x >> U(30))) * U(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> U(27))) * U(0x94D049BB133111EB)
    return x ^ (x >> U(31))


@inline
def sampled(x: np.uint64, keep: np.uint64) -> bool:
    """Whether block ``x`` is in the sample of threshold ``keep`` (0: every block is)."""
    return bool(keep == U(0) or (mix(x) >> U(64 - SAMPLE_BITS)) < keep)


@inline
def block_tokens(k: int, count: int, tokens: int, block: int) -> int:
    """The tokens the ``k``-th of a request's ``count`` blocks holds (``blockrule``): a
    block's, but the last, which holds what the others leave of its ``tokens``."""
    return block if k < count - 1 else tokens - (count - 1) * block


@inline
def _number(b: np.ndarray, i: int) -> int:
    """Past a JSON number without exponent (``-``? int (``.`` digits)?); -1 if none."""
    if b[i] == 45:
        i += 1
    i, _ = uint(b, i, 18)
    if i > 0 and b[i] == 46:  # a fraction: at least one digit
        j, _ = digits(b, i + 1)
        i = j if j > i + 1 else -1
    return -1 if i > 0 and (b[i] == 101 or b[i] == 69) else i


@inline
def _scalar(b: np.ndarray, i: int, which: int) -> int:
    """Past the value of key ``which`` (``_key``), not the ids; -1 if it is not of the
    accepted shape (timestamp: a number; output_length: an integer; another: a number or a
    string without escapes)."""
    if which == 8:
        i, _ = uint(b, i + 1 if b[i] == 45 else i, 18)
        return i
    if b[i] != 34:
        return _number(b, i)
    if which == 4:
        return -1
    i += 1
    while b[i] != 34:
        if b[i] == 92 or b[i] == 10:
            return -1
        i += 1
    return i + 1


@inline
def _key(b: np.ndarray, i: int) -> tuple[int, int]:
    """A key at ``i`` (at its quote): (the index after it, 1 for input_length, 2 for hash_ids,
    4 for timestamp, 8 for output_length, 0 for another); index -1 on an escape. A known key
    is told by its first 8 bytes and its rest with the closing quote, read as words."""
    w, tail = load8(b, i + 1), load8(b, i + 9)
    if w == KEY_WORDS[0] and tail & U(0xFFFFFFFFFF) == KEY_TAILS[0]:
        return i + 14, 1
    if w == KEY_WORDS[1] and tail & U(0xFF) == KEY_TAILS[1]:
        return i + 10, 2
    if w == KEY_WORDS[2] and tail & U(0xFFFF) == KEY_TAILS[2]:
        return i + 11, 4
    if w == KEY_WORDS[3] and tail & U(0xFFFFFFFFFFFF) == KEY_TAILS[3]:
        return i + 15, 8
    j = i + 1
    while b[j] != 34:
        if b[j] == 92 or b[j] == 10:
            return -1, 0
        j += 1
    return j + 1, 0


@inline
def _ids(b: np.ndarray, i: int, ids: np.ndarray, wants: np.ndarray, n: int, keep: np.uint64,
         block: int) -> tuple[int, int, int, bool]:
    """The ids after ``[`` at ``i``, the sampled ones appended to ``ids`` from ``n`` (with a
    block's tokens in ``wants`` when sampling): (the index after ``]``, the new ``n``, the ids
    read, whether the last one was kept); index -1 if they are not of the accepted shape."""
    count, kept = 0, False
    i = skip_ws(b, i)
    if b[i] == 93:
        return i + 1, n, 0, False
    while True:
        # the compact form ("12,34]"): an id of 1-8 digits and its separator from one word
        w = load8(b, i)
        x = w ^ U(0x3030303030303030)
        nd = digit_count(x)
        sep = b[i + 8] if nd == 8 else np.uint8((w >> U(8 * nd)) & U(0xFF))
        lead = nd == 1 or w & U(0xFF) != U(48)
        if nd > 0 and (sep == 44 or sep == 93) and lead:
            v, i = eight(x, nd), i + nd
        else:  # any other: whitespace, 9 digits or more, not an id
            i, v = uint(b, skip_ws(b, i), 20)
            i = skip_ws(b, i) if i >= 0 else -1
            sep = b[i] if i >= 0 else np.uint8(0)
            if sep != 44 and sep != 93:
                return -1, n, count, kept
        kept = sampled(v, keep)
        if kept:
            if n == len(ids):  # a sample's arrays are sized for its share: a larger one
                return -1, n, count, kept
            ids[n] = v
            if keep:
                wants[n] = block
            n += 1
        count += 1
        i += 1
        if sep == 93:
            return i, n, count, kept


@inline
def _next(b: np.ndarray, i: int) -> int:
    """After a value: the index of the next key's quote or of ``}``; -1 if neither follows."""
    i = skip_ws(b, i)
    if b[i] == 44:
        i = skip_ws(b, i + 1)
        return i if b[i] == 34 else -1
    return i if b[i] == 125 else -1


@inline
def _object(b: np.ndarray, i: int, ids: np.ndarray, wants: np.ndarray, n: int,
            keep: np.uint64, block: int) -> tuple[int, int, np.uint64, int, bool]:
    """One object after its ``{``: (the index after its ``}``, the ids written so far, its
    input_length, its ids' count, whether its last id was kept); index -1 (``FAIL``) if it is
    not of the accepted shape."""
    seen, tokens, count, last = 0, U(0), 0, False
    i = skip_ws(b, i)
    while b[i] != 125:
        if b[i] != 34:
            return FAIL
        i, which = _key(b, i)
        if i < 0 or which & seen:
            return FAIL
        seen |= which
        i = skip_ws(b, i)
        if b[i] != 58:
            return FAIL
        i = skip_ws(b, i + 1)
        if which == 2 and b[i] == 91:
            i, n, count, last = _ids(b, i + 1, ids, wants, n, keep, block)
        elif which == 2:
            return FAIL
        elif which == 1:
            i, tokens = uint(b, i, 18)
        else:
            i = _scalar(b, i, which)
        i = _next(b, i) if i >= 0 else -1
        if i < 0:
            return FAIL
    return (i + 1, n, tokens, count, last) if seen & 3 == 3 else FAIL


@jit
def scan(b: np.ndarray, size: int, ids: np.ndarray, wants: np.ndarray, ends: np.ndarray,
         tokens: np.ndarray, keep: np.uint64, block: int) -> int:
    """Read every line of ``b[:size]`` (whole lines, each ending in a newline; ``PAD`` more
    bytes readable) into the arrays; the number of requests, or -1 where a line is outside
    the accepted shape, breaks the count rule or has more ids to keep than ``ids`` (and
    ``wants``) hold (``size // 2`` always do: an id and its comma take 2 bytes or more).
    ``ends`` must hold ``size // 32`` lines (one takes 33 bytes or more)."""
    if size == 0 or b[size - 1] != 10:
        return -1 if size else 0
    i, n, r = 0, 0, 0
    while i < size:
        i = skip_ws(b, i)
        if b[i] != 123 or r >= len(ends):
            return -1
        i, n, tok, count, last = _object(b, i + 1, ids, wants, n, keep, block)
        if i < 0:
            return -1
        i = skip_ws(b, i)
        t = np.int64(tok)
        if b[i] != 10 or t < 1 or count != (t + block - 1) // block:
            return -1
        if keep and last:  # the request's last block, kept: it holds what the others leave
            wants[n - 1] = block_tokens(count - 1, count, int(t), block)
        ends[r], tokens[r] = n, t
        r, i = r + 1, i + 1
    return r


class Scanned(NamedTuple):
    """A chunk's requests (see ``traffic.mooncake.HashRuns``): ``wants`` when sampled."""

    ids: np.ndarray  # uint64
    ends: np.ndarray  # int64
    tokens: np.ndarray  # int64
    wants: np.ndarray | None


def scan_chunk(buf: np.ndarray, size: int, block: int, keep: int = 0) -> Scanned | None:
    """The requests of ``buf[:size]`` (whole lines; ``buf`` holds ``PAD`` bytes more), the ids
    of sample ``keep`` only, or ``None`` when it must be read by msgspec (see the module
    docstring)."""
    if len(buf) < size + PAD:
        raise ValueError("the buffer needs PAD bytes past the chunk")
    # a sample: room for 4x its share first (numpy backs large arrays with 2 MB pages,
    # resident once touched), then for every id if more are kept
    most = size // 2 + 1
    share = 4096 + most * keep * 4 // 2**SAMPLE_BITS if keep else most
    ends, tokens = np.empty(size // 32 + 1, np.int64), np.empty(size // 32 + 1, np.int64)
    for room in sorted({min(most, share), most}):
        ids, wants = np.empty(room, np.uint64), np.empty(room if keep else 0, np.int32)
        if (r := scan(buf, size, ids, wants, ends, tokens, U(keep), block)) >= 0:
            n = int(ends[r - 1]) if r else 0
            return Scanned(ids[:n], ends[:r], tokens[:r], wants[:n] if keep else None)
    return None


@jit
def _sample(ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray, keep: np.uint64, block: int,
            out: np.ndarray, out_ends: np.ndarray, wants: np.ndarray) -> int:
    start, n = 0, 0
    for r in range(len(ends)):
        end = ends[r]
        for k in range(start, end):
            if sampled(ids[k], keep):
                out[n] = ids[k]
                wants[n] = block_tokens(k - start, end - start, tokens[r], block)
                n += 1
        out_ends[r] = n
        start = end
    return n


def sample_runs(ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray, keep: int, block: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requests read whole (and checked) reduced to sample ``keep``, as the scanner samples:
    (ids, ends, wants)."""
    out, wants = np.empty(len(ids), np.uint64), np.empty(len(ids), np.int32)
    out_ends = np.empty(len(ends), np.int64)
    n = _sample(ids, ends, tokens, U(keep), block, out, out_ends, wants)
    return out[:n], out_ends, wants[:n]


def scan_bytes(chunk: bytes, block: int, keep: int = 0) -> Scanned | None:
    """``scan_chunk`` of a copy of ``chunk`` with its padding."""
    buf = np.zeros(len(chunk) + PAD, np.uint8)
    buf[: len(chunk)] = np.frombuffer(chunk, np.uint8)
    return scan_chunk(buf, len(chunk), block, keep)
