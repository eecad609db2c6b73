"""The batch layout of one forward: what ``TinyTransformer.prepare`` builds on the host.

One forward serves a continuous batch: prefill chunks and one-token decodes mixed. The
new tokens of all sequences are *packed* for the matmuls; attention runs on a *padded*
layout. For a batch of S=3 with B=4 (positions already cached ``.``, new ``n``, padding ``_``)::

    seq  start  new  block_table     context positions 0..C-1 (C = max start+new = 9)
    0    0      5    [5, 2]          n n n n | n _ _ _ | _      slots 20 21 22 23 | 8 ...
    1    8      1    [3, 9, 1]       . . . . | . . . . | n      slots 12 .. 15 | 36 .. 39 | 4
    2    2      3    [4, 0]          . . n n | n _ _ _ | _

    packed new tokens (T = 9):  s0 s0 s0 s0 s0 | s1 | s2 s2 s2
    queries, padded (S, Nmax=5): row i holds seq i's new tokens; pad rows are computed, then dropped
    keys/values, gathered (S, C): slot of position c = block_table[c // B] * B + c % B
    mask[i, j, c] = c <= start_i + j    (causal; padding keys lie beyond every real query)

When padding would more than double the keys a forward gathers (``RAGGED_WASTE``: decodes of
150 and 1,363 positions padded to 1,363 each), the layout is *ragged* instead: the context
slots of the sequences packed one after the other (sum of contexts, no padding), and each
sequence attends over its own slice, its queries the last of its keys. A forward then costs
what its sequences need, at one attention call per sequence and layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

TokenIds = Sequence[int] | torch.Tensor | npt.NDArray[np.integer]
IntArray = npt.NDArray[np.int64]


class SeqInput(NamedTuple):
    """One sequence of a batch: compute ``tokens`` at positions ``start, start+1, ...``.

    ``start`` is the number of positions already in the cache; ``block_table`` must cover
    positions ``[0, start + len(tokens))`` (longer tables are fine, the tail is ignored).
    """

    tokens: TokenIds
    start: int
    block_table: Sequence[int]


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """The device-side index tensors of one batch (see the module diagram).

    Built once per batch by ``TinyTransformer.prepare``; every tensor is a view of one
    int64 buffer moved to the device in a single copy.
    """

    tokens: torch.Tensor  # (T,) packed new tokens
    positions: torch.Tensor  # (T,) absolute position of each new token
    write_slots: torch.Tensor  # (T,) flat pool slot each new token's K/V goes to
    pad_index: torch.Tensor  # (T,) row of each new token in the padded (S * Nmax) layout
    query_pos: torch.Tensor  # (S, Nmax) absolute position of each padded query
    ctx_slots: torch.Tensor  # (S * C,) flat pool slot of every context position
    last_index: torch.Tensor  # (S,) index in the packed tokens of each sequence's last one
    new_counts: tuple[int, ...]  # new tokens per sequence
    # slots each layer copies after its writes, before its reads: a request's boundary block
    # copied from a block this very forward writes (``serving.scheduler``); None: no copy
    copy_from: torch.Tensor | None = None
    copy_to: torch.Tensor | None = None
    # context length of each sequence; ``ragged``: ctx_slots packs them (sum of ctx_lens,
    # no padding) and query_pos is unused (``RAGGED_WASTE``)
    ctx_lens: tuple[int, ...] = ()
    ragged: bool = False

    @property
    def num_seqs(self) -> int:
        """S: sequences in the batch."""
        return len(self.new_counts)

    @property
    def max_new(self) -> int:
        """Nmax: the most new tokens of any sequence (padded query length)."""
        return int(self.query_pos.shape[1])

    @property
    def max_ctx(self) -> int:
        """C: the longest context, ``max(start + len(tokens))`` (padded key length)."""
        if self.ctx_lens:
            return max(self.ctx_lens)
        return int(self.ctx_slots.shape[0]) // self.num_seqs



def as_numpy(tokens: TokenIds) -> IntArray:
    """``tokens`` as a flat int64 array on the host (a tensor is copied off its device)."""
    if isinstance(tokens, torch.Tensor):
        return tokens.detach().to("cpu", torch.int64).numpy().reshape(-1)
    return np.asarray(tokens, dtype=np.int64).reshape(-1)


def _check_batch(toks: list[IntArray], starts: IntArray, vocab_size: int) -> None:
    if not toks:
        raise ValueError("empty batch")
    for i, t in enumerate(toks):
        if t.size == 0:
            raise ValueError(f"sequence {i} has no new tokens")
        if t.min() < 0 or t.max() >= vocab_size:
            raise ValueError(f"sequence {i} has a token id outside [0, {vocab_size})")
    if starts.min() < 0:
        raise ValueError("start must be >= 0")


def _tables(batch: Sequence[SeqInput], ctx: IntArray, block_size: int, num_blocks: int) -> IntArray:
    """Block tables cut to the blocks each context needs, zero-padded to one (S, nb) array."""
    need = -(-ctx // block_size)
    out = np.zeros((len(batch), int(need.max())), dtype=np.int64)
    for i, seq in enumerate(batch):
        n = int(need[i])
        tbl = np.asarray(seq.block_table[:n], dtype=np.int64)
        if tbl.size < n:
            raise ValueError(f"sequence {i}: block table covers {tbl.size} blocks, needs {n}")
        out[i, :n] = tbl
    if out.min() < 0 or out.max() >= num_blocks:
        raise ValueError(f"block id outside [0, {num_blocks})")
    return out


# Padded keys beyond this many times the keys the sequences need: the ragged layout (module
# doc). Measured on SmolLM2-135M's shapes, one CPU thread: 4 decodes of 30 to 1,363 positions
# (2.4x padded) 150 ms padded, the same ragged ~70 ms; a padded forward's gather and
# attention grow with S x C, a ragged one's with the sum of contexts, plus ~30 us a sequence
# and layer of calls.
RAGGED_WASTE = 2.0


def ragged(ctx: IntArray) -> bool:
    """Whether a batch of these contexts is laid out ragged (``RAGGED_WASTE``)."""
    return ctx.size > 1 and ctx.size * int(ctx.max()) > RAGGED_WASTE * int(ctx.sum())


class HostBatch(NamedTuple):
    """What ``host_indices`` returns."""

    arrays: list[IntArray]  # in the order ``ForwardBatch`` lists its tensors
    counts: tuple[int, ...]  # new tokens per sequence
    ctx_lens: tuple[int, ...]
    ragged: bool


def host_indices(
    batch: Sequence[SeqInput], block_size: int, num_blocks: int, vocab_size: int
) -> HostBatch:
    """Every index array of a batch, on the host, in the order ``ForwardBatch`` lists them."""
    toks = [as_numpy(s.tokens) for s in batch]
    starts = np.array([s.start for s in batch], dtype=np.int64)
    _check_batch(toks, starts, vocab_size)
    counts = np.array([t.size for t in toks], dtype=np.int64)
    ctx = starts + counts
    s_n, n_max, c_max = len(batch), int(counts.max()), int(ctx.max())
    tables = _tables(batch, ctx, block_size, num_blocks)
    c = np.arange(c_max)
    ctx_slots = tables[:, c // block_size] * block_size + c % block_size  # (S, C)
    ctx_slots[c[None, :] >= ctx[:, None]] = 0  # padding keys: any valid slot, masked anyway
    seq_of = np.repeat(np.arange(s_n), counts)
    local = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    positions = starts[seq_of] + local
    write_slots = ctx_slots[seq_of, positions]
    if np.unique(write_slots).size != write_slots.size:
        raise ValueError("two new tokens of the batch would write the same pool slot")
    query_pos = starts[:, None] + np.arange(n_max)[None, :]
    lay_ragged = ragged(ctx)
    arrays = [
        np.concatenate(toks),
        positions,
        write_slots,
        seq_of * n_max + local,
        query_pos,
        ctx_slots[c[None, :] < ctx[:, None]] if lay_ragged else ctx_slots.reshape(-1),
        np.cumsum(counts) - 1,
    ]
    return HostBatch(arrays, tuple(int(n) for n in counts), tuple(int(n) for n in ctx),
                     lay_ragged)
