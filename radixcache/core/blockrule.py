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

Pure functions: each returns the reason a claim breaks the rule, or ``None``. The count rule
is ``radixcache.core.tokens.check_span``'s, shared with the native stream's snapshot nodes and
(for full blocks) the KV events: one rule, worded here for trace lines.
"""

from __future__ import annotations

from radixcache.core.tokens import InvalidSpan, blocks_spanned, check_span

HASH_ID_LIMIT = 2**64  # trace hash ids are unsigned: [0, 2^64) (KV events also allow SGLang's
# signed ids: ``tokens.check_hash_id``)
MAX_BLOCK_TOKENS = 1 << 20  # a block size above a million tokens is a mistake, not a cache


def hash_run_problem(n_ids: int, tokens: int, block_size: int) -> str | None:
    """Why ``n_ids`` hash ids of ``block_size``-token blocks cannot hold ``tokens`` tokens: the
    span rule of ``tokens.check_span`` (the one a radix node's blocks obey) from position 0,
    worded for a trace line."""
    try:
        check_span(0, tokens, n_ids, block_size)
    except InvalidSpan as exc:
        if tokens < 1:
            return f"a token count of {tokens} (want >= 1)"
        if block_size < 1:
            return str(exc)
        return (f"{n_ids} hash ids for {tokens} tokens: blocks of {block_size} tokens need "
                f"exactly {blocks_spanned(0, tokens, block_size)}")
    return None


def hash_id_problem(lo: int, hi: int) -> str | None:
    """Why hash ids whose smallest is ``lo`` and largest ``hi`` are not all in [0, 2^64)."""
    if lo < 0 or hi >= HASH_ID_LIMIT:
        bad = lo if lo < 0 else hi
        return f"hash id {bad} is outside [0, 2^64)"
    return None


def check_length(hash_id: int, had: int, now: int) -> str | None:
    """Why block ``hash_id``, first made with ``had`` tokens, cannot be asked for with ``now``
    (``had`` 0: not seen before)."""
    if had and had != now:
        return (f"hash id {hash_id} is asked for at {now} tokens but was made at {had} "
                f"tokens (a hash id names one block of one length)")
    return None
