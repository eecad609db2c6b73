"""A tiny seeded decoder-only transformer whose attention reads K/V through block tables.

Llama-shaped: token embedding, ``n_layers`` x (RMSNorm -> GQA attention with RoPE ->
RMSNorm -> SiLU-gated MLP), final RMSNorm, logits through the tied embedding. Weights come
from ``torch.Generator().manual_seed(seed)`` on the CPU, so two models with one config are
bit-identical on one device. Everything runs under ``torch.inference_mode``.

One forward serves a continuous batch: prefill chunks and one-token decodes mixed, laid
out as ``serving.batch`` draws it (new tokens packed, attention padded).

The forward over the pool (scatter the new K/V, the boundary slot copies, gather the
context through the block table, attend) is ``serving.paged``'s, shared with the checkpoint
models (``serving.llama``); this module gives only the tiny model's layer math.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from radixcache.core.pool import KVShape
from radixcache.serving.batch import ForwardBatch as ForwardBatch
from radixcache.serving.batch import SeqInput as SeqInput
from radixcache.serving.batch import TokenIds as TokenIds
from radixcache.serving.batch import as_numpy
from radixcache.serving.paged import DecoderShape, PagedDecoder, Rope, rms_norm, rope_tables, rotate
from radixcache.serving.paged import Model as Model
from radixcache.serving.paged import SlotCopy as SlotCopy

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


class TinyTransformer(PagedDecoder):
    """The model. Holds weights only; the K/V live in the pool tensor passed to ``forward``
    (``PagedDecoder``: the paged forward every model shares)."""

    def __init__(self, config: ModelConfig | None = None, device: str | torch.device | None = None):
        self.config = cfg = config or ModelConfig()
        self._device = dev = resolve_device(device)
        self.shape = DecoderShape(cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                                  cfg.vocab_size, cfg.id_space, cfg.dtype)
        gen = torch.Generator().manual_seed(cfg.seed)

        def init(rows: int, cols: int, std: float) -> torch.Tensor:
            w = torch.randn((rows, cols), generator=gen, dtype=torch.float32) * std
            return w.to(dev, cfg.dtype)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, device=dev, dtype=cfg.dtype)

        d, hd, out_std = cfg.d_model, cfg.head_dim, 1.0 / math.sqrt(2 * cfg.n_layers)
        self.embed_table = init(cfg.vocab_size, d, d**-0.5)
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
        self.inv_freq = (cfg.rope_theta**-exponents).to(dev)

    @property
    def name(self) -> str:
        """``tiny transformer (layers=N)``."""
        return f"tiny transformer (layers={self.config.n_layers})"

    @property
    def eos_ids(self) -> frozenset[int]:
        """None: the seeded model has no end of sequence (answers run to their length)."""
        return frozenset()

    @property
    def max_positions(self) -> int:
        """0: plain RoPE over any position; the pool is the limit."""
        return 0

    # -- the layer math (PagedDecoder) -----------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the tied embedding."""
        return self.embed_table[ids]

    def rope(self, positions: torch.Tensor) -> Rope:
        """Plain RoPE at ``rope_theta``."""
        return rope_tables(self.inv_freq, positions, self.config.dtype)

    def qkv(self, layer: int, x: torch.Tensor,
            rope: Rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pre-norm projections, RoPE on q and k."""
        cfg, t, w = self.config, x.shape[0], self.layers[layer]
        h = rms_norm(x, w.attn_norm, cfg.norm_eps)
        q = (h @ w.wq).view(t, cfg.n_heads, cfg.head_dim)
        k = (h @ w.wk).view(t, cfg.n_kv_heads, cfg.head_dim)
        v = (h @ w.wv).view(t, cfg.n_kv_heads, cfg.head_dim)
        return rotate(q, *rope), rotate(k, *rope), v

    def layer_out(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual attention output, then the residual SiLU-gated MLP."""
        w = self.layers[layer]
        x = x + attn @ w.wo
        h = rms_norm(x, w.mlp_norm, self.config.norm_eps)
        return x + (torch.nn.functional.silu(h @ w.w_gate) * (h @ w.w_up)) @ w.w_down

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm, then the tied embedding."""
        return rms_norm(x, self.final_norm, self.config.norm_eps) @ self.embed_table.T


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device``, else CUDA when there is one, else the CPU; ``cuda`` gets its index (tensors
    report ``cuda:0``, never ``cuda``)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def prefill_and_decode(
    model: Model,
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
