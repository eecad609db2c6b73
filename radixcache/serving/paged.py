"""The one model interface over the paged pool, and the paged forward every model shares.

Two kinds of model serve: the seeded tiny transformer (``serving.model``) and a Hugging Face
Llama/Qwen checkpoint (``serving.llama``, loaded by ``serving.checkpoint``). Both are a
``PagedDecoder``: they give the per-layer math (embedding, q/k/v with RoPE, the layer's output
and MLP, the logits) and this module runs it over the pool, so the cache's rules hold for
either one unchanged. What the engine and ``Running`` see is the ``Model`` protocol.

Per layer, over the packed new tokens of a batch (``serving.batch`` draws the layout)::

    q, k, v = model.qkv(layer, x, rope)        packed (T, heads, D), RoPE applied
    pool[layer] at write_slots  <- k, v        scatter: block_table[p // B] slot p % B
    pool[layer] at copy_to      <- copy_from   the boundary copy-on-write, after the writes
    K, V = pool[layer] at ctx_slots            gather: every context position, from the pool
    x = model.layer_out(layer, x, attend(q, K, V))   one SDPA call (GQA), or one a sequence

Attention is ``scaled_dot_product_attention`` over strided views of the gathered K/V, with
GQA in the kernel (no expanded heads) and the least mask that is right: none for decodes at
one context length, a lower-right causal bias for one sequence, a bool mask for a padded
batch; a batch whose padding would more than double its keys is laid out ragged instead,
each sequence over its own keys (``serving.batch``).

Attention only ever reads the pool, and all of a layer's writes come before its reads, so a
sequence may read blocks another sequence of the same forward writes (in-forward sharing) and
a boundary copy may copy them. All index tensors of a batch travel to the device in one
transfer (``ForwardBatch``). Everything runs under ``torch.inference_mode``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from radixcache.core.pool import KVShape
from radixcache.serving.batch import ForwardBatch, SeqInput, TokenIds, as_numpy, host_indices

SlotCopy = tuple[Sequence[int], Sequence[int]]  # (from slots, to slots), flat pool slots
Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin: (T, 1, D/2) each
KV = tuple[torch.Tensor, torch.Tensor]  # one layer's gathered keys and values: (keys, H, D)


class Model(Protocol):
    """What the engine serves: a decoder whose K/V live in the pool tensor it is handed.

    ``vocab_size`` is the width of the logits; ``id_space`` the ids a prompt may hold (the
    tiny model folds ids past its vocabulary into it; a checkpoint's are its vocabulary).
    ``eos_ids``: the tokens that end an answer (empty: none, every answer runs to its length).
    """

    @property
    def name(self) -> str:
        """What ``/v1/models`` and the stats call the model."""
        ...

    @property
    def device(self) -> torch.device:
        """Where its weights are; the pool must be there too."""
        ...

    @property
    def vocab_size(self) -> int:
        """Width of the logits."""
        ...

    @property
    def id_space(self) -> int:
        """Token ids a prompt may hold: ``[0, id_space)``."""
        ...

    @property
    def eos_ids(self) -> frozenset[int]:
        """End-of-sequence tokens (empty for the tiny model)."""
        ...

    @property
    def max_positions(self) -> int:
        """The positions one sequence may span (a checkpoint's ``max_position_embeddings``);
        0: no limit but the pool's (the tiny model)."""
        ...

    def kv_shape(self) -> KVShape:
        """The per-token K/V shape a ``KVPool`` must have to serve this model."""
        ...

    def forward(self, batch: Sequence[SeqInput] | ForwardBatch, kv: torch.Tensor,
                copy: SlotCopy | None = None) -> torch.Tensor:
        """The last new token's logits of every sequence, ``(len(batch), vocab)``."""
        ...

    def forward_all(self, batch: Sequence[SeqInput] | ForwardBatch,
                    kv: torch.Tensor) -> list[torch.Tensor]:
        """The logits of every new token: one ``(n_i, vocab)`` per sequence."""
        ...

    def reference_logits(self, tokens: TokenIds) -> torch.Tensor:
        """Logits ``(len(tokens), vocab)`` of one sequence computed densely, no pool."""
        ...


@dataclass(frozen=True, slots=True)
class DecoderShape:
    """The shapes the paged forward needs from a model."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    id_space: int
    dtype: torch.dtype


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as Llama computes it: statistics in float32, the weight applied in x's dtype."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE, rotate-half form (Llama's): x is (T, heads, D), cos/sin are (T, 1, D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_tables(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
    """cos and sin of ``positions x inv_freq``, computed in float32 and cast to ``dtype``."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos()[:, None].to(dtype), freqs.sin()[:, None].to(dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           bias: torch.Tensor | None) -> torch.Tensor:
    """GQA attention. q (S, N, Hq, D); k, v (S, C, Hkv, D); ``bias`` what query ``j`` of
    sequence ``i`` reads: a bool mask (S, 1, N, C), a ``CausalBias`` (the N queries are the
    last N of the C keys), or None (every key).

    Query head ``h`` reads KV head ``h // (Hq // Hkv)`` (transformers' ``repeat_kv``). One
    ``scaled_dot_product_attention`` over strided views: no expanded K/V, no score tensor of
    our own. Returns (S, N, Hq * D).
    """
    s_n, n, hq, d = q.shape
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2), attn_mask=bias,
                                         enable_gqa=hq != k.shape[2])
    return out.transpose(1, 2).reshape(s_n, n, hq * d)  # (S, Hq, N, D) -> (S, N, Hq * D)


def _copy_slots(copy: SlotCopy, slots: int) -> list[npt.NDArray[np.int64]]:
    """``copy``'s slot arrays, checked: equal lengths, inside the pool, no slot written twice
    and none both read and written."""
    src, dst = (np.asarray(c, dtype=np.int64) for c in copy)
    if src.shape != dst.shape or src.ndim != 1 or not src.size:
        raise ValueError(f"slot copy of {src.shape} from and {dst.shape} to slots")
    if min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= slots:
        raise ValueError(f"slot copy outside the pool's {slots} slots")
    if np.unique(dst).size != dst.size or np.intersect1d(src, dst).size:
        raise ValueError("slot copy writes a slot twice or reads a slot it writes")
    return [src, dst]


def _bias(fb: ForwardBatch, device: torch.device) -> torch.Tensor | None:
    """What each query reads (``attend``): nothing to mask when every query may read every
    key (one new token per sequence, every context the longest: a batch of decodes at one
    length); one sequence's new tokens are the last of its context, a causal bias aligned to
    the lower right (the flash kernel's causal path, about half a masked one's time at 1,354
    tokens); else the mask ``c <= query_pos[i, j]`` (S, 1, Nmax, C)."""
    if fb.max_new == 1 and len(set(fb.ctx_lens)) == 1:
        return None
    if fb.num_seqs == 1:
        return causal_lower_right(fb.max_new, fb.max_ctx)
    arange_c = torch.arange(fb.max_ctx, device=device)
    return (arange_c[None, None, :] <= fb.query_pos[:, :, None])[:, None]


class PagedDecoder(ABC):
    """A decoder-only model whose attention reads K/V through block tables (module doc).

    A subclass sets ``shape`` and ``_device`` and gives the layer math; this class owns the
    pool side: validation, the batch's index transfer, scatter, slot copies, gather, attention.
    """

    shape: DecoderShape
    _device: torch.device

    # -- the layer math a model gives ----------------------------------------------------------
    @abstractmethod
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Hidden states ``(T, d_model)`` of token ids inside the vocabulary."""

    @abstractmethod
    def rope(self, positions: torch.Tensor) -> Rope:
        """cos, sin for these absolute positions (``rope_tables``)."""

    @abstractmethod
    def qkv(self, layer: int, x: torch.Tensor,
            rope: Rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``(T, Hq, D)``, k and v ``(T, Hkv, D)`` of the layer's input, RoPE applied."""

    @abstractmethod
    def layer_out(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The layer's output from its input ``x`` and attention ``(T, Hq * D)``."""

    @abstractmethod
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(T, vocab)`` from the last layer's output."""

    # -- the interface ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the weights (and the pool) are."""
        return self._device

    @property
    def vocab_size(self) -> int:
        """Width of the logits."""
        return self.shape.vocab_size

    @property
    def id_space(self) -> int:
        """Token ids a prompt may hold."""
        return self.shape.id_space

    def kv_shape(self) -> KVShape:
        """The per-token K/V shape a ``KVPool`` must have to serve this model."""
        s = self.shape
        return KVShape(s.n_layers, s.n_kv_heads, s.head_dim, s.dtype)

    def _fold(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Ids past the vocabulary fold into it (the tiny model's hashing trick)."""
        return ids % self.shape.vocab_size if self.shape.id_space > self.shape.vocab_size else ids

    def _check_kv(self, kv: torch.Tensor) -> None:
        s = self.shape
        want = (s.n_layers, 2, s.n_kv_heads, s.head_dim)
        got = (kv.shape[0], kv.shape[1], kv.shape[4], kv.shape[5]) if kv.dim() == 6 else ()
        if got != want or kv.dtype != s.dtype or kv.device != self.device:
            raise ValueError(
                f"kv {tuple(kv.shape)} {kv.dtype} on {kv.device} does not fit the model "
                f"(L, 2, blocks, B, H, D) = ({want[0]}, 2, *, *, {want[2]}, {want[3]}) "
                f"{s.dtype} on {self.device}"
            )
        if not kv.is_contiguous():
            raise ValueError("kv must be contiguous (writes go through a flat view)")

    def prepare(self, batch: Sequence[SeqInput], kv: torch.Tensor,
                copy: SlotCopy | None = None) -> ForwardBatch:
        """Validate a batch against the pool tensor and move its indices to the device at once.

        ``copy = (from_slots, to_slots)``: flat pool slots every layer copies right after its
        writes, before any read (so a copy may read what the batch writes).

        Raises ``ValueError`` for an empty batch, a sequence without new tokens, a token id
        outside ``[0, id_space)``, a block table too short for its context or naming a block
        outside the pool, two new tokens that would write one slot, or a ``kv`` whose shape,
        dtype or device does not fit the model.
        """
        self._check_kv(kv)
        arrays, counts, ctx_lens, lay_ragged = host_indices(batch, kv.shape[3], kv.shape[2],
                                                            self.shape.id_space)
        arrays[0] = self._fold(arrays[0])
        if copy is not None:
            arrays += _copy_slots(copy, kv.shape[2] * kv.shape[3])
        flat = torch.from_numpy(np.concatenate([a.reshape(-1) for a in arrays]))
        if self.device.type == "cuda":
            flat = flat.pin_memory()
        flat = flat.to(self.device, non_blocking=True)
        tok, pos, write, pad, qpos, ctx, last, *copied = torch.split(flat,
                                                                     [a.size for a in arrays])
        return ForwardBatch(
            tokens=tok,
            positions=pos,
            write_slots=write,
            pad_index=pad,
            query_pos=qpos.view(arrays[4].shape),
            ctx_slots=ctx,
            last_index=last,
            new_counts=counts,
            copy_from=copied[0] if copied else None,
            copy_to=copied[1] if copied else None,
            ctx_lens=ctx_lens,
            ragged=lay_ragged,
        )

    def _batch(self, batch: Sequence[SeqInput] | ForwardBatch, kv: torch.Tensor,
               copy: SlotCopy | None = None) -> ForwardBatch:
        if isinstance(batch, ForwardBatch):
            self._check_kv(kv)
            return batch
        return self.prepare(batch, kv, copy)

    def _hidden(self, fb: ForwardBatch, kv: torch.Tensor) -> torch.Tensor:
        """Run every layer over the packed new tokens, writing their K/V into ``kv``."""
        s = self.shape
        flat = kv.view(s.n_layers, 2, -1, s.n_kv_heads, s.head_dim)  # (L, 2, NB*B, H, D)
        attention = self._ragged if fb.ragged else self._padded
        bias = None if fb.ragged else _bias(fb, self.device)
        q_pad = None
        if not fb.ragged and fb.num_seqs * fb.max_new != fb.tokens.shape[0]:
            q_pad = torch.zeros((fb.num_seqs * fb.max_new, s.n_heads, s.head_dim),
                                dtype=s.dtype, device=self.device)  # pad rows stay zero
        rope = self.rope(fb.positions)
        x = self.embed(fb.tokens)
        for li in range(s.n_layers):
            q, k, v = self.qkv(li, x, rope)
            flat[li, 0].index_copy_(0, fb.write_slots, k)
            flat[li, 1].index_copy_(0, fb.write_slots, v)
            if fb.copy_to is not None:
                flat[li][:, fb.copy_to] = flat[li][:, fb.copy_from]
            # (keys, H, D) each, after the writes; a dim-0 gather each (a third of one
            # dim-1 gather of both: 237 against 772 us for 2,262 keys)
            ctx = (flat[li, 0].index_select(0, fb.ctx_slots),
                   flat[li, 1].index_select(0, fb.ctx_slots))
            x = self.layer_out(li, x, attention(fb, q, ctx, bias, q_pad))
        return x

    def _padded(self, fb: ForwardBatch, q: torch.Tensor, ctx: KV,
                bias: torch.Tensor | None, q_pad: torch.Tensor | None) -> torch.Tensor:
        """Attention on the padded layout: one call, (S, Nmax) queries over (S, C) keys."""
        s, s_n, n_max = self.shape, fb.num_seqs, fb.max_new
        k, v = (t.view(s_n, fb.max_ctx, s.n_kv_heads, s.head_dim) for t in ctx)
        if q_pad is not None:
            q = q_pad.index_copy_(0, fb.pad_index, q)
        o = attend(q.view(s_n, n_max, s.n_heads, s.head_dim), k, v, bias)
        o = o.view(s_n * n_max, -1)
        return o if q_pad is None else o[fb.pad_index]

    @staticmethod
    def _ragged(fb: ForwardBatch, q: torch.Tensor, ctx: KV,
                bias: torch.Tensor | None, q_pad: torch.Tensor | None) -> torch.Tensor:
        """Attention on the ragged layout: each sequence's queries over its own keys."""
        outs, q_at, c_at = [], 0, 0
        k, v = ctx
        for n, c in zip(fb.new_counts, fb.ctx_lens, strict=True):
            outs.append(attend(q[None, q_at:q_at + n], k[None, c_at:c_at + c],
                               v[None, c_at:c_at + c],
                               causal_lower_right(n, c) if n > 1 else None)[0])
            q_at, c_at = q_at + n, c_at + c
        return torch.cat(outs)

    @torch.inference_mode()
    def forward(self, batch: Sequence[SeqInput] | ForwardBatch, kv: torch.Tensor,
                copy: SlotCopy | None = None) -> torch.Tensor:
        """Compute the new tokens of every sequence; return the last new token's logits.

        Writes K/V of all new tokens into ``kv`` (the pool tensor, ``(L, 2, NB, B, H, D)``) at
        ``block_table[p // B]`` slot ``p % B``; reads every earlier position of a sequence only
        from ``kv`` through its block table. All writes of a layer happen before its reads, so
        a sequence may read blocks another sequence of the same batch writes, and ``copy``
        (see ``prepare``) may copy them. Returns ``(len(batch), vocab)`` logits in batch order.
        """
        fb = self._batch(batch, kv, copy)
        return self.logits(self._hidden(fb, kv)[fb.last_index])

    @torch.inference_mode()
    def forward_all(
        self, batch: Sequence[SeqInput] | ForwardBatch, kv: torch.Tensor
    ) -> list[torch.Tensor]:
        """As ``forward``, but return the logits of every new token: one ``(n_i, vocab)`` each."""
        fb = self._batch(batch, kv)
        return list(torch.split(self.logits(self._hidden(fb, kv)), list(fb.new_counts)))

    @torch.inference_mode()
    def reference_logits(self, tokens: TokenIds) -> torch.Tensor:
        """Logits ``(len(tokens), vocab)`` of one sequence computed densely from scratch.

        No pool and no block table: K/V are the ones just computed, with a causal mask. This
        is the recompute baseline that paged forwards with cache hits must match.
        """
        ids = torch.from_numpy(self._fold(as_numpy(tokens))).to(self.device)
        t, s = ids.shape[0], self.shape
        pos = torch.arange(t, device=self.device)
        rope = self.rope(pos)
        x = self.embed(ids)
        for li in range(s.n_layers):
            q, k, v = self.qkv(li, x, rope)
            o = attend(q[None], k[None], v[None], causal_lower_right(t, t))
            x = self.layer_out(li, x, o.view(t, s.n_heads * s.head_dim))
        return self.logits(x)
