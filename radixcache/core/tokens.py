"""The one place that knows how a run of tokens is held: little-endian uint32, 4 bytes a token.

The tree keeps every node's tokens as such ``bytes`` (compared with C ``memcmp``), events carry
them, the mirror and the KV-event codec read them back. Everything that turns token ids into
that form, or back, or counts or slices it, goes through here, and so does the one validator of
token ids that come from outside (a prompt, a trace, a frame).

::

    ids      [  17,     5,  70000 ]
    bytes    11 00 00 00 05 00 00 00 70 11 01 00      count = len(bytes) // TOKEN_BYTES
             ^ token 0   ^ token 1   ^ token 2        token i at bytes [4i, 4i + 4)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

TOKEN_BYTES = 4
DTYPE = "<u4"
U32 = 2**32
TokenArray = npt.NDArray[np.uint32]


class TokenText(Protocol):
    """Anything that renders token ids as preview text (the workloads' ``Vocabulary``, the
    inspector's dataset or model words, a checkpoint folder's tokenizer): the one protocol
    every pane, printer and report takes."""

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """Words of ``tokens`` joined by spaces."""
        ...
TokenSeq = Sequence[int] | npt.NDArray[np.integer] | bytes

# (run, byte offset) -> (id,): for the tree's hot loops, where a call of ``token_at`` costs
_FIRST = struct.Struct("<I").unpack_from
unpack_token = _FIRST


class InvalidTokens(ValueError):
    """Token ids that are not a non-empty run of integers inside the vocabulary."""


class InvalidSpan(ValueError):
    """Token counts, block counts and sizes that disagree: a span claiming more (or fewer)
    tokens than its blocks hold, a hash id outside 64 bits."""


# Block hash ids as the engines send them: SGLang an int64, vLLM a uint64 (or bytes).
HASH_MIN, HASH_MAX = -(2**63), 2**64 - 1


def blocks_spanned(start: int, tokens: int, block_size: int) -> int:
    """How many blocks positions ``[start, start + tokens)`` touch: block ``i`` holds
    ``[i * block_size, (i + 1) * block_size)``; a span that starts mid-block shares it."""
    return (start + tokens - 1) // block_size - start // block_size + 1 if tokens > 0 else 0


def check_span(start: int, tokens: int, blocks: int, block_size: int) -> None:
    """Raise ``InvalidSpan`` unless ``blocks`` blocks of ``block_size`` hold exactly the
    ``tokens`` tokens from position ``start`` (at least one): the rule of a radix node's span
    (the tree's ``check()`` asserts it) and of a trace request's hash ids (``input_length``
    tokens in blocks of ``block_size``, the last one partial). Checked before anything is
    allocated for the span, so a node of 16M tokens on 1 block costs nothing."""
    if block_size < 1:
        raise InvalidSpan(f"block size {block_size}")
    if start < 0:
        raise InvalidSpan(f"position {start}")
    if tokens < 1:
        raise InvalidSpan(f"a span of {tokens} tokens")
    want = blocks_spanned(start, tokens, block_size)
    if blocks != want:
        raise InvalidSpan(f"{tokens:,} tokens from position {start:,} need {want:,} blocks of "
                          f"{block_size:,}, not {blocks:,}")


def check_full_blocks(tokens: int, blocks: int, block_size: int) -> None:
    """Raise ``InvalidSpan`` unless ``tokens`` fill ``blocks`` whole blocks of ``block_size``:
    the rule of a KV event (vLLM and SGLang publish full blocks only), so no block of 0
    tokens."""
    if block_size < 1 or tokens != blocks * block_size:
        raise InvalidSpan(f"{tokens:,} tokens for {blocks:,} blocks of {block_size:,}: want "
                          f"{blocks * block_size:,}")


def check_hash_id(value: int) -> None:
    """Raise ``InvalidSpan`` unless ``value`` is a 64-bit block hash id, signed (SGLang) or
    unsigned (vLLM): ``[-2**63, 2**64)``."""
    if not HASH_MIN <= value <= HASH_MAX:
        raise InvalidSpan(f"hash id {value} outside 64 bits")


def count(run: bytes) -> int:
    """How many tokens ``run`` holds."""
    return len(run) // TOKEN_BYTES


def token_at(run: bytes, i: int) -> int:
    """The ``i``-th token id of ``run`` (no copy)."""
    return int(_FIRST(run, i * TOKEN_BYTES)[0])


def span(run: bytes, lo: int, hi: int | None = None) -> bytes:
    """Tokens ``[lo, hi)`` of ``run`` (to its end when ``hi`` is None)."""
    return run[lo * TOKEN_BYTES:] if hi is None else run[lo * TOKEN_BYTES: hi * TOKEN_BYTES]


def to_array(run: bytes, limit: int | None = None) -> TokenArray:
    """The ids of ``run`` (its first ``limit`` when given) as a uint32 array over its bytes."""
    n = count(run) if limit is None else min(limit, count(run))
    return np.frombuffer(run, dtype=DTYPE, count=n)


def to_list(run: bytes, limit: int | None = None) -> list[int]:
    """The ids of ``run`` (its first ``limit``) as Python ints."""
    return [int(t) for t in to_array(run, limit)]


def from_ids(ids: Sequence[int] | npt.NDArray[np.integer]) -> bytes:
    """Trusted ids (already validated) as a run."""
    return np.asarray(ids, dtype=DTYPE).tobytes()


def validated(tokens: TokenSeq, vocab_limit: int = U32, what: str = "tokens") -> bytes:
    """``tokens`` as a run; ``InvalidTokens`` unless they are a non-empty run of integer ids in
    ``[0, vocab_limit)``. uint32 input (bytes or array) is taken without a range scan when
    ``vocab_limit`` is 2**32."""
    if isinstance(tokens, bytes):
        if not tokens or len(tokens) % TOKEN_BYTES:
            raise InvalidTokens(f"token bytes must be a non-empty multiple of {TOKEN_BYTES}, "
                                f"got {len(tokens)}")
        if vocab_limit >= U32:
            return tokens
        _check_range(np.frombuffer(tokens, dtype=DTYPE), vocab_limit, what)
        return tokens
    arr = validated_array(tokens, vocab_limit, what)
    return arr.tobytes()


def validated_array(tokens: Sequence[int] | npt.NDArray[np.integer], vocab_limit: int = U32,
                    what: str = "tokens") -> TokenArray:
    """``tokens`` as a uint32 array; ``InvalidTokens`` unless a non-empty 1-D run of integer ids
    in ``[0, vocab_limit)``."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise InvalidTokens(f"{what} must be a 1-D sequence of token ids")
    if arr.size == 0:  # before the dtype test: ``[]`` reads as float64
        raise InvalidTokens(f"{what} must hold at least one token")
    if arr.dtype.kind not in "iu":
        raise InvalidTokens(f"{what}: token ids must be integers, got {arr.dtype}")
    if not (arr.dtype == np.uint32 and vocab_limit >= U32):
        _check_range(arr, vocab_limit, what)
    return arr.astype(DTYPE, copy=False)


def _check_range(arr: npt.NDArray[np.integer], vocab_limit: int, what: str) -> None:
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= min(vocab_limit, U32):
        raise InvalidTokens(f"{what} has a token id outside [0, {vocab_limit}): min {lo}, "
                            f"max {hi}")


def common_units(seq: bytes, off: int, key: bytes, w: int = TOKEN_BYTES) -> int:
    """Whole ``w``-byte units shared by ``seq[off:]`` and ``key`` (tokens when ``w`` is
    ``TOKEN_BYTES``; the what-if analysis compares block hashes): galloping then bisection
    over slice comparisons, each one a C ``memcmp`` (O(log k) compares for a k-unit run)."""
    n = min(len(seq) - off, len(key)) // w
    lo, step = 0, 1  # invariant: the first ``lo`` units match
    while lo + step <= n and seq.startswith(key[lo * w : (lo + step) * w], off + lo * w):
        lo += step
        step *= 2
    hi = min(n, lo + step)  # the first mismatch lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if seq.startswith(key[lo * w : mid * w], off + lo * w):
            lo = mid
        else:
            hi = mid
    if hi == lo + 1 and seq.startswith(key[lo * w : hi * w], off + lo * w):
        lo = hi
    return lo
