"""A tiny seeded decoder-only transformer whose attention reads K/V through block tables.

Llama-shaped: token embedding, ``n_layers`` x (RMSNorm -> GQA attention with RoPE ->
RMSNorm -> SiLU-gated MLP), final RMSNorm, logits through the tied embedding. Weights come
from ``torch.Generator().manual_seed(seed)`` on the CPU, so two models with one config are
bit-identical on one device. Everything runs under ``torch.inference_mode``.

One forward serves a continuous batch: prefill chunks and one-token decodes mixed, laid
out as ``serving.batch`` draws it (new tokens packed, attention padded).

Per layer: q, k, v of the packed tokens; k, v are *scattered* into the pool at their slots
(``kv[layer]`` viewed as ``(2, num_blocks * B, H, D)``); then the batch's slot copies, if
any, run (a boundary block copied from a block this forward writes); then K/V of every
context position are *gathered* back through the block table, so attention only ever reads
the pool.
All index tensors of a batch travel to the device in one transfer (``ForwardBatch``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from radixcache.core.pool import KVShape
from radixcache.serving.batch import ForwardBatch as ForwardBatch
from radixcache.serving.batch import SeqInput as SeqInput
from radixcache.serving.batch import TokenIds as TokenIds
from radixcache.serving.batch import as_numpy, host_indices

TEXT_VOCAB = 4096  # traffic.tokenizer's vocabulary (a test holds them equal)
TRACE_IDS = 100_014  # traffic.sharegpt's VOCAB_SIZE: word ids and the trace's markers


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape and seed of the tiny transformer.

    ``vocab_size`` is the shipped text tokenizer's (``traffic.tokenizer``, 4,096): the logits
    cover exactly its ids, so every answer decodes to text. The model reads ids of a wider
    space, ``[0, id_space)``, so that the ShareGPT trace's word ids (``traffic.sharegpt``,
    100,014) reach it unchanged: an id at or past ``vocab_size`` is folded into the vocabulary
    (embedding row ``id % vocab_size``, the hashing trick). The cache keys on the ids as sent,
    never on the folded ones, so the trace's hits are its own."""

    vocab_size: int = TEXT_VOCAB
    id_space: int = TRACE_IDS
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    d_ff: int = 256
    seed: int = 0
    dtype: torch.dtype = torch.float32
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if not 0 < self.vocab_size <= self.id_space:
            raise ValueError(f"vocab_size {self.vocab_size} must be in [1, id_space "
                             f"{self.id_space}]")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    def kv_shape(self) -> KVShape:
        """The per-token K/V shape a ``KVPool`` must have to serve this model."""
        return KVShape(self.n_layers, self.n_kv_heads, self.head_dim, self.dtype)


SlotCopy = tuple[Sequence[int], Sequence[int]]  # (from slots, to slots), flat pool slots


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


class Generated(NamedTuple):
    """Result of ``prefill_and_decode``: the greedy tokens and the logits each was taken from."""

    tokens: list[int]
    step_logits: torch.Tensor  # (n_new, vocab)


@dataclass(slots=True)
class _Layer:
    attn_norm: torch.Tensor
    wq: torch.Tensor  # (d_model, n_heads * head_dim)
    wk: torch.Tensor  # (d_model, n_kv_heads * head_dim)
    wv: torch.Tensor
    wo: torch.Tensor  # (n_heads * head_dim, d_model)
    mlp_norm: torch.Tensor
    w_gate: torch.Tensor  # (d_model, d_ff)
    w_up: torch.Tensor
    w_down: torch.Tensor  # (d_ff, d_model)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE, rotate-half form: x is (T, heads, D), cos/sin are (T, 1, D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked GQA attention. q (S, N, Hq, D); k, v (S, C, Hkv, D); mask (S, N, C) bool.

    Query head ``h`` reads KV head ``h // (Hq // Hkv)``. Returns (S, N, Hq * D).
    """
    s_n, n, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.view(s_n, n, hkv, hq // hkv, d).permute(0, 2, 3, 1, 4)  # (S, Hkv, G, N, D)
    kt = k.permute(0, 2, 3, 1).unsqueeze(2)  # (S, Hkv, 1, D, C)
    vt = v.permute(0, 2, 1, 3).unsqueeze(2)  # (S, Hkv, 1, C, D)
    scores = (qg @ kt) * (1.0 / math.sqrt(d))
    scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vt  # (S, Hkv, G, N, D)
    return out.permute(0, 3, 1, 2, 4).reshape(s_n, n, hq * d)


class TinyTransformer:
    """The model. Holds weights only; the K/V live in the pool tensor passed to ``forward``."""

    def __init__(self, config: ModelConfig | None = None, device: str | torch.device | None = None):
        self.config = cfg = config or ModelConfig()
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dev.type == "cuda" and dev.index is None:  # tensors report "cuda:0", never "cuda"
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        gen = torch.Generator().manual_seed(cfg.seed)

        def init(rows: int, cols: int, std: float) -> torch.Tensor:
            w = torch.randn((rows, cols), generator=gen, dtype=torch.float32) * std
            return w.to(self.device, cfg.dtype)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, device=self.device, dtype=cfg.dtype)

        d, hd, out_std = cfg.d_model, cfg.head_dim, 1.0 / math.sqrt(2 * cfg.n_layers)
        self.embed = init(cfg.vocab_size, d, d**-0.5)
        self.layers = [
            _Layer(
                attn_norm=ones(d),
                wq=init(d, cfg.n_heads * hd, d**-0.5),
                wk=init(d, cfg.n_kv_heads * hd, d**-0.5),
                wv=init(d, cfg.n_kv_heads * hd, d**-0.5),
                wo=init(cfg.n_heads * hd, d, out_std * (cfg.n_heads * hd) ** -0.5),
                mlp_norm=ones(d),
                w_gate=init(d, cfg.d_ff, d**-0.5),
                w_up=init(d, cfg.d_ff, d**-0.5),
                w_down=init(cfg.d_ff, d, out_std * cfg.d_ff**-0.5),
            )
            for _ in range(cfg.n_layers)
        ]
        self.final_norm = ones(d)
        exponents = torch.arange(0, hd, 2, dtype=torch.float32) / hd
        self.inv_freq = (cfg.rope_theta**-exponents).to(self.device)

    # -- building blocks -----------------------------------------------------------------------
    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        dt = self.config.dtype
        return freqs.cos()[:, None].to(dt), freqs.sin()[:, None].to(dt)

    def _qkv(
        self, layer: _Layer, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg, t = self.config, x.shape[0]
        h = _rms_norm(x, layer.attn_norm, cfg.norm_eps)
        q = (h @ layer.wq).view(t, cfg.n_heads, cfg.head_dim)
        k = (h @ layer.wk).view(t, cfg.n_kv_heads, cfg.head_dim)
        v = (h @ layer.wv).view(t, cfg.n_kv_heads, cfg.head_dim)
        return _rotate(q, *rope), _rotate(k, *rope), v

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        h = _rms_norm(x, layer.mlp_norm, self.config.norm_eps)
        return (torch.nn.functional.silu(h @ layer.w_gate) * (h @ layer.w_up)) @ layer.w_down

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.final_norm, self.config.norm_eps) @ self.embed.T

    def _check_kv(self, kv: torch.Tensor) -> None:
        cfg = self.config
        want = (cfg.n_layers, 2, cfg.n_kv_heads, cfg.head_dim)
        got = (kv.shape[0], kv.shape[1], kv.shape[4], kv.shape[5]) if kv.dim() == 6 else ()
        if got != want or kv.dtype != cfg.dtype or kv.device != self.device:
            raise ValueError(
                f"kv {tuple(kv.shape)} {kv.dtype} on {kv.device} does not fit the model "
                f"(L, 2, blocks, B, H, D) = ({want[0]}, 2, *, *, {want[2]}, {want[3]}) "
                f"{cfg.dtype} on {self.device}"
            )
        if not kv.is_contiguous():
            raise ValueError("kv must be contiguous (writes go through a flat view)")

    # -- public --------------------------------------------------------------------------------
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
        arrays, counts = host_indices(batch, kv.shape[3], kv.shape[2], self.config.id_space)
        arrays[0] = arrays[0] % self.config.vocab_size  # trace ids fold into the vocabulary
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
        )

    def _batch(self, batch: Sequence[SeqInput] | ForwardBatch, kv: torch.Tensor,
               copy: SlotCopy | None = None) -> ForwardBatch:
        if isinstance(batch, ForwardBatch):
            self._check_kv(kv)
            return batch
        return self.prepare(batch, kv, copy)

    def _hidden(self, fb: ForwardBatch, kv: torch.Tensor) -> torch.Tensor:
        """Run every layer over the packed new tokens, writing their K/V into ``kv``."""
        cfg = self.config
        s_n, n_max, c_max = fb.num_seqs, fb.max_new, fb.max_ctx
        flat = kv.view(cfg.n_layers, 2, -1, cfg.n_kv_heads, cfg.head_dim)  # (L, 2, NB*B, H, D)
        arange_c = torch.arange(c_max, device=self.device)
        mask = arange_c[None, None, :] <= fb.query_pos[:, :, None]  # (S, Nmax, C)
        rope = self._rope(fb.positions)
        x = self.embed[fb.tokens]
        q_pad = x.new_zeros((s_n * n_max, cfg.n_heads, cfg.head_dim))
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, rope)
            flat[li, 0].index_copy_(0, fb.write_slots, k)
            flat[li, 1].index_copy_(0, fb.write_slots, v)
            if fb.copy_to is not None:
                flat[li][:, fb.copy_to] = flat[li][:, fb.copy_from]
            ctx = flat[li][:, fb.ctx_slots].view(2, s_n, c_max, cfg.n_kv_heads, cfg.head_dim)
            q_pad.index_copy_(0, fb.pad_index, q)
            o = _attend(q_pad.view(s_n, n_max, cfg.n_heads, cfg.head_dim), ctx[0], ctx[1], mask)
            x = x + o.view(s_n * n_max, -1)[fb.pad_index] @ layer.wo
            x = x + self._mlp(layer, x)
        return x

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
        return self._logits(self._hidden(fb, kv)[fb.last_index])

    @torch.inference_mode()
    def forward_all(
        self, batch: Sequence[SeqInput] | ForwardBatch, kv: torch.Tensor
    ) -> list[torch.Tensor]:
        """As ``forward``, but return the logits of every new token: one ``(n_i, vocab)`` each."""
        fb = self._batch(batch, kv)
        return list(torch.split(self._logits(self._hidden(fb, kv)), list(fb.new_counts)))

    @torch.inference_mode()
    def reference_logits(self, tokens: TokenIds) -> torch.Tensor:
        """Logits ``(len(tokens), vocab)`` of one sequence computed densely from scratch.

        No pool and no block table: K/V are the ones just computed, with a causal mask. This
        is the recompute baseline that paged forwards with cache hits must match.
        """
        ids = torch.from_numpy(as_numpy(tokens) % self.config.vocab_size).to(self.device)
        t, cfg = ids.shape[0], self.config
        pos = torch.arange(t, device=self.device)
        rope, mask = self._rope(pos), (pos[None, :] <= pos[:, None])[None]
        x = self.embed[ids]
        for layer in self.layers:
            q, k, v = self._qkv(layer, x, rope)
            o = _attend(q[None], k[None], v[None], mask)
            x = x + o.view(t, cfg.n_heads * cfg.head_dim) @ layer.wo
            x = x + self._mlp(layer, x)
        return self._logits(x)


def prefill_and_decode(
    model: TinyTransformer,
    pool_kv: torch.Tensor,
    tokens: TokenIds,
    block_table: Sequence[int],
    start: int,
    n_new: int,
) -> Generated:
    """Prefill ``tokens[start:]`` (positions ``< start`` are already in the pool), then decode.

    Greedy: takes ``n_new`` tokens one forward each. The block table must cover
    ``len(tokens) + n_new - 1`` positions (the last generated token is not written).
    ``step_logits[i]`` is the distribution ``tokens_out[i]`` was taken from, so it equals
    ``reference_logits(prompt + out[:-1])[len(prompt) - 1 + i]``.
    """
    prompt = as_numpy(tokens)
    logits = model.forward([SeqInput(prompt[start:], start, block_table)], pool_kv)[0]
    out: list[int] = []
    steps: list[torch.Tensor] = []
    for i in range(n_new):
        if i:
            step = SeqInput([out[-1]], prompt.size + i - 1, block_table)
            logits = model.forward([step], pool_kv)[0]
        steps.append(logits)
        out.append(int(logits.argmax()))
    return Generated(out, torch.stack(steps) if steps else logits[None][:0])


def tiny_model() -> ModelConfig:
    """The smallest model the engine serves well on a CPU: 1 layer, d_model 32, 2 query heads
    over 1 K/V head of 16 (the text tokenizer's vocabulary; trace ids fold into it)."""
    return ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
