"""A compiled scanner for the common shape of Mooncake-format lines, so that reading a trace
costs less than analysing it: ``{"timestamp": 27482, "input_length": 6955, "output_length": 52,
"hash_ids": [46, 47, 48, ...]}``, keys in any order, any whitespace between tokens.

It accepts a strict subset of JSON: one object a line whose values are numbers, strings
without escapes, or arrays of integers. Anything else -- a blank line, an escape, a nested
object, a negative or oversized id, a fractional length, a missing or repeated key -- makes it
give up on the whole chunk, and the caller reads that chunk with msgspec, which validates every
line and names the bad one. So the scanner never decides that a line is wrong: it only reads
the lines it is sure of (``tests/test_whatif_scale.py`` checks it against msgspec).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import numba
import numpy as np

F = TypeVar("F", bound=Callable[..., object])
INPUT_LENGTH = np.frombuffer(b"input_length", np.uint8)
HASH_IDS = np.frombuffer(b"hash_ids", np.uint8)
TIMESTAMP = np.frombuffer(b"timestamp", np.uint8)
OUTPUT_LENGTH = np.frombuffer(b"output_length", np.uint8)
U64_DIGITS = np.frombuffer(b"18446744073709551615", np.uint8)


def _jit(f: F) -> F:
    return cast(F, numba.njit(cache=True, nogil=True)(f))


@_jit
def _ws(b: np.ndarray, i: int) -> int:
    while i < len(b) and (b[i] == 32 or b[i] == 9 or b[i] == 13):
        i += 1
    return i


@_jit
def _uint(b: np.ndarray, i: int, out: np.ndarray) -> int:
    """An unsigned integer at ``i`` into ``out[0]``; the index after it, or -1 (none, a
    leading zero, or over 2^64 - 1: a 20-digit number is compared with it digit by digit)."""
    start, v = i, np.uint64(0)
    while i < len(b) and 48 <= b[i] <= 57:
        v = v * np.uint64(10) + np.uint64(b[i] - 48)
        i += 1
    nd = i - start
    if nd == 0 or nd > 20 or (b[start] == 48 and nd > 1):
        return -1
    if nd == 20:
        for t in range(20):
            if b[start + t] != U64_DIGITS[t]:
                if b[start + t] > U64_DIGITS[t]:
                    return -1
                break
    out[0] = v
    return i


@_jit
def _skip_value(b: np.ndarray, i: int, tmp: np.ndarray) -> int:
    """Skip a number or an escape-free string; -1 on anything else."""
    if b[i] == 34:
        i += 1
        while i < len(b) and b[i] != 34:
            if b[i] == 92 or b[i] == 10:
                return -1
            i += 1
        return i + 1 if i < len(b) else -1
    if b[i] == 45:
        i += 1
    i = _uint(b, i, tmp)
    while i > 0 and i < len(b) and (b[i] == 46 or b[i] == 101 or b[i] == 69 or b[i] == 43
                                    or b[i] == 45 or 48 <= b[i] <= 57):
        i += 1
    return i


@_jit
def _ids(b: np.ndarray, i: int, ids: np.ndarray, n: int, tmp: np.ndarray) -> tuple[int, int]:
    """An array of unsigned integers at ``i`` (after ``[``) appended to ``ids`` from ``n``.
    The digit loop is written out here: most of a trace's bytes are these digits."""
    size = len(b)
    i = _ws(b, i)
    if i < size and b[i] == 93:
        return i + 1, n
    while True:
        i = _ws(b, i)
        start, v = i, np.uint64(0)
        while i < size and 48 <= b[i] <= 57:
            v = v * np.uint64(10) + np.uint64(b[i] - 48)
            i += 1
        nd = i - start
        if nd == 0 or n >= len(ids) or (b[start] == 48 and nd > 1):
            return -1, n
        if nd >= 20 and _uint(b, start, tmp) < 0:  # 20 digits: over 2^64 - 1?
            return -1, n
        ids[n] = v
        n += 1
        i = _ws(b, i)
        if i >= size:
            return -1, n
        if b[i] == 93:
            return i + 1, n
        if b[i] != 44:
            return -1, n
        i += 1


@_jit
def _key(b: np.ndarray, i: int) -> tuple[int, int]:
    """A key at ``i`` (at its quote): 1 for input_length, 2 for hash_ids, 4 for timestamp (a
    number), 8 for output_length (an integer), 0 for another (any number or string)."""
    j = i + 1
    while j < len(b) and b[j] != 34:
        if b[j] == 92 or b[j] == 10:
            return -1, 0
        j += 1
    if j >= len(b):
        return -1, 0
    k = b[i + 1 : j]
    if _is(k, INPUT_LENGTH):
        return j + 1, 1
    if _is(k, HASH_IDS):
        return j + 1, 2
    if _is(k, TIMESTAMP):
        return j + 1, 4
    return j + 1, 8 if _is(k, OUTPUT_LENGTH) else 0


@_jit
def _is(k: np.ndarray, word: np.ndarray) -> bool:
    if len(k) != len(word):  # (an array comparison would allocate: this runs per key)
        return False
    t = 0
    while t < len(word) and k[t] == word[t]:
        t += 1
    return t == len(word)


@_jit
def _value(b: np.ndarray, i: int, which: int, ids: np.ndarray, n: int,
           tmp: np.ndarray) -> tuple[int, int]:
    """The value of a key (``which`` as ``_key`` says) at ``i``: ids appended, a length into
    ``tmp[0]``, anything else skipped; then the index at the next key's quote or at ``}``."""
    if which == 2:
        if b[i] != 91:
            return -1, n
        i, n = _ids(b, i + 1, ids, n, tmp)
    elif which == 1:
        i = _uint(b, i, tmp)
    elif which == 8:
        i = _uint(b, i + 1 if b[i] == 45 else i, tmp)
    else:
        i = -1 if which == 4 and b[i] == 34 else _skip_value(b, i, tmp)
    if i < 0:
        return -1, n
    i = _ws(b, i)
    if i < len(b) and b[i] == 44:
        i = _ws(b, i + 1)
        return (i, n) if i < len(b) and b[i] == 34 else (-1, n)
    return (i, n) if i < len(b) and b[i] == 125 else (-1, n)


@_jit
def _object(b: np.ndarray, i: int, ids: np.ndarray, n: int,
            tmp: np.ndarray) -> tuple[int, int, np.uint64]:
    """One object after its ``{``: the index after its ``}`` (-1 if it is not of the accepted
    shape), the ids written so far, its input_length."""
    seen, length = 0, np.uint64(0)
    i = _ws(b, i)
    while i < len(b) and b[i] != 125:
        if b[i] != 34:
            return -1, n, length
        i, which = _key(b, i)
        if i < 0 or (which and seen & which):
            return -1, n, length
        i = _ws(b, i)
        if i >= len(b) or b[i] != 58:
            return -1, n, length
        i = _ws(b, i + 1)
        if i >= len(b):
            return -1, n, length
        seen |= which
        i, n = _value(b, i, which, ids, n, tmp)
        if i < 0:
            return -1, n, length
        if which == 1:
            length = tmp[0]
    if seen & 3 != 3 or i >= len(b):
        return -1, n, length
    return i + 1, n, length


@_jit
def scan(b: np.ndarray, ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray) -> int:
    """Read every line of ``b`` (whole lines, each ending in a newline) into the arrays;
    the number of requests, or -1 where a line is outside the accepted shape."""
    i, n, r, tmp = 0, 0, 0, np.zeros(1, np.uint64)
    while i < len(b):
        i = _ws(b, i)
        if i >= len(b) or b[i] != 123 or r >= len(ends):
            return -1
        i, n, length = _object(b, i + 1, ids, n, tmp)
        if i < 0:
            return -1
        i = _ws(b, i)
        if i >= len(b) or b[i] != 10 or length > np.uint64(2**62):
            return -1
        ends[r], tokens[r] = n, np.int64(length)
        r, i = r + 1, i + 1
    return r


def scan_chunk(chunk: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(ids, ends, tokens) of every line of ``chunk``, or ``None`` when it must be read by
    msgspec (see the module docstring)."""
    b = np.frombuffer(chunk, np.uint8)
    lines = chunk.count(b"\n")
    ids = np.empty(len(chunk) // 2 + 1, np.uint64)
    ends, tokens = np.empty(lines, np.int64), np.empty(lines, np.int64)
    n = scan(b, ids, ends, tokens)
    if n != lines:
        return None
    return ids[: int(ends[-1]) if n else 0].copy(), ends, tokens
