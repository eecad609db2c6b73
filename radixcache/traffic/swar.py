"""Eight bytes at a time: the compiled primitives the trace scanner
(``radixcache.traffic.mooncake_scan``) reads numbers with -- an unaligned 8-byte load, the
digits of a word counted and valued without a branch a digit (SWAR, as simdjson and fast_float
parse them), whitespace skipped. Every index may be read up to 8 bytes past: the buffer holds
``PAD`` bytes past its data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numba.extending
import numpy as np
from llvmlite import ir
from numba import types

F = TypeVar("F", bound=Callable[..., object])
U = np.uint64
PAD = 16  # bytes readable past a chunk's end (the 8-byte loads)
U64_DIGITS = np.frombuffer(b"18446744073709551615", np.uint8)


# No reference counting (numba's ``_nrt`` off): these functions allocate nothing, and counting
# the arrays passed to each helper cost two atomic operations a call (4-8x slower); no
# exception checks (``error_model``): nothing here divides by a value that may be 0.
JIT_OPTIONS: dict[str, Any] = {"cache": True, "nogil": True, "error_model": "numpy",
                               "_nrt": False}


def jit(f: F) -> F:
    return cast(F, numba.njit(**JIT_OPTIONS)(f))


def inline(f: F) -> F:
    """Compiled into each caller: a call passes each array as seven words on the stack, a third
    of the per-id helpers' instructions (cachegrind: 2,310 a line called, 1,620 inlined)."""
    return cast(F, numba.njit(**JIT_OPTIONS, inline="always")(f))


def _load8_codegen(typingctx: object, arr: Any, i: Any) -> tuple[object, object]:
    def codegen(context: Any, builder: Any, sig: object, args: Any) -> object:
        data = context.make_array(arr)(context, builder, args[0]).data
        word = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        return builder.load(word, align=1)

    return types.uint64(arr, i), codegen


def _trailing_zeros_codegen(typingctx: object, x: Any) -> tuple[object, object]:
    def codegen(context: Any, builder: Any, sig: object, args: Any) -> object:
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))

    return types.int64(x), codegen


# compiled-only helpers (llvmlite): an unaligned 8-byte load, as a little-endian uint64 (the
# buffer must hold 8 bytes past any index asked for: ``PAD``), and the trailing zero bits of
# a uint64, 64 for 0 (one instruction, no branch)
load8 = cast(Callable[[np.ndarray, int], np.uint64],
              numba.extending.intrinsic(_load8_codegen))
trailing_zeros = cast(Callable[[np.uint64], int],
                       numba.extending.intrinsic(_trailing_zeros_codegen))


@inline
def skip_ws(b: np.ndarray, i: int) -> int:
    while b[i] <= 32 and (b[i] == 32 or b[i] == 9 or b[i] == 13):  # one test for others
        i += 1
    return i


@jit
def fits(b: np.ndarray, start: int, end: int) -> bool:
    """Whether the digits ``b[start:end]`` (no leading zero) are at most 2^64 - 1."""
    if end - start != 20:
        return end - start < 20
    for t in range(20):
        if b[start + t] != U64_DIGITS[t]:
            return bool(b[start + t] < U64_DIGITS[t])
    return True


@inline
def digit_count(x: np.uint64) -> int:
    """The leading digits of a word xored with ``0x30..30`` (0-8)."""
    m = (x | (x + U(0x0606060606060606))) & U(0xF0F0F0F0F0F0F0F0)
    return int(trailing_zeros(m) >> 3)  # 8 when all eight are digits (m == 0)


@inline
def eight(x: np.uint64, nd: int) -> np.uint64:
    """The value of the first ``nd`` (1-8) digits of a word xored with ``0x30..30``."""
    x <<= U(8 * (8 - nd))
    x = ((x & U(0x0F0F0F0F0F0F0F0F)) * U(2561)) >> U(8)
    x = ((x & U(0x00FF00FF00FF00FF)) * U(6553601)) >> U(16)
    return ((x & U(0x0000FFFF0000FFFF)) * U(42949672960001)) >> U(32)


@inline
def digits(b: np.ndarray, i: int) -> tuple[int, np.uint64]:
    """The decimal digits at ``i``: (the index after them, their value mod 2^64). The first
    eight at once (SWAR, as simdjson and fast_float parse them), so no branch per digit::

        bytes  '4' '7' '1' ',' ...   x = word ^ 0x30..30: digits become 0-9, others not
        count  the first byte of x or x + 6 with a high nibble: 3
        value  x << 8 * (8 - 3) = 0 0 0 0 0 4 7 1 (bytes, first digit first), then pairs
               (47 = 4 * 10 + 7), quads, eights: 471
    """
    x = load8(b, i) ^ U(0x3030303030303030)
    nd = digit_count(x)
    if nd == 0:
        return i, U(0)
    v = eight(x, nd)
    i += nd
    d = U(b[i]) - U(48)  # a ninth digit or more (rare: no branch on nd == 8), one by one;
    while d <= U(9):  # a byte below '0' wraps around: one test
        v = v * U(10) + d
        i += 1
        d = U(b[i]) - U(48)
    return i, v


@inline
def uint(b: np.ndarray, i: int, most: int) -> tuple[int, np.uint64]:
    """An unsigned integer of at most ``most`` digits at ``i``: (the index after it, its
    value); index -1 when there is none, it has a leading zero, or it is too long (20
    digits: over 2^64 - 1)."""
    end, v = digits(b, i)
    if end == i or end - i > most or (b[i] == 48 and end > i + 1):
        return -1, v
    return (end, v) if end - i < 20 or fits(b, i, end) else (-1, v)
