"""One rule for what a run of block hashes may claim, shared by everything that reads blocks
named by hash ids from outside: the trace readers (Mooncake-format ``hash_ids``), the KV events
(``BlockStored``) and the native stream's snapshot nodes.

A run of ``n`` hash ids of ``block_size``-token blocks holds ``tokens`` tokens when every block
is full but the last, which holds 1 to ``block_size`` of them::

    block_size 512, tokens 1200       [ 512 ][ 512 ][ 176 ]      n must be ceil(1200/512) = 3
                                      id a   id b   id c (partial: c names these 176 tokens)

so ``(n - 1) * block_size < tokens <= n * block_size``. A hash id is an unsigned 64-bit
integer (vLLM's and Mooncake's hashes are), and it names one block of one length for the whole
run of a trace (aiperf refuses a trace that asks for id c at 512 tokens after it was made at
176): ``check_length`` is that test, for whoever keeps the lengths.

Pure functions: each returns the reason a claim breaks the rule, or ``None``.
"""

from __future__ import annotations

HASH_ID_LIMIT = 2**64  # hash ids are in [0, 2^64)
MAX_BLOCK_TOKENS = 1 << 20  # a block size above a million tokens is a mistake, not a cache


def blocks_for(tokens: int, block_size: int) -> int:
    """How many blocks of ``block_size`` tokens hold ``tokens`` tokens (the last may be partial)."""
    return -(-tokens // block_size)


def block_size_problem(block_size: int) -> str | None:
    """Why ``block_size`` cannot be a block size, or ``None``."""
    if not 1 <= block_size <= MAX_BLOCK_TOKENS:
        return f"block size {block_size} is outside [1, {MAX_BLOCK_TOKENS:,}]"
    return None


def hash_run_problem(n_ids: int, tokens: int, block_size: int) -> str | None:
    """Why ``n_ids`` hash ids of ``block_size``-token blocks cannot hold ``tokens`` tokens."""
    if tokens < 1:
        return f"a token count of {tokens} (want >= 1)"
    want = blocks_for(tokens, block_size)
    if n_ids != want:
        return (f"{n_ids} hash ids for {tokens} tokens: blocks of {block_size} tokens need "
                f"exactly {want}")
    return None


def hash_id_problem(lo: int, hi: int) -> str | None:
    """Why hash ids whose smallest is ``lo`` and largest ``hi`` are not all in [0, 2^64)."""
    if lo < 0 or hi >= HASH_ID_LIMIT:
        bad = lo if lo < 0 else hi
        return f"hash id {bad} is outside [0, 2^64)"
    return None


def last_block_tokens(tokens: int, block_size: int) -> int:
    """Tokens in the last block of a run holding ``tokens`` (1 .. ``block_size``)."""
    return tokens - (blocks_for(tokens, block_size) - 1) * block_size


def check_length(hash_id: int, had: int, now: int) -> str | None:
    """Why block ``hash_id``, first made with ``had`` tokens, cannot be asked for with ``now``
    (``had`` 0: not seen before)."""
    if had and had != now:
        return (f"hash id {hash_id} is asked for at {now} tokens but was made at {had} "
                f"tokens (a hash id names one block of one length)")
    return None
