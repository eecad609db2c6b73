"""The Llama family's layer math (Llama, Qwen2, Qwen3) as a ``PagedDecoder`` over the pool.

One decoder layer, as transformers' ``LlamaDecoderLayer`` computes it::

    h = RMSNorm(x)                                   input_layernorm
    q, k, v = h W_qkv (+ b_qkv)                      Qwen2: bias; Llama: attention_bias
    q, k = RMSNorm_head(q), RMSNorm_head(k)          Qwen3 only: q_norm / k_norm per head
    q, k = RoPE(q), RoPE(k)                          Llama 3: rope_type llama3 frequencies
    x = x + attention(q, K, V) W_o                   K, V read from the pool (serving.paged)
    h = RMSNorm(x)                                   post_attention_layernorm
    x = x + (silu(h W_gate) * h W_up) W_down         SwiGLU

then ``norm`` and ``lm_head`` (the embedding when tied). q/k/v and gate/up are each one matmul
(their weights concatenated once at load). The weights come from ``serving.checkpoint``; this
module never reads a file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixcache.serving.paged import DecoderShape, PagedDecoder, Rope, rms_norm, rope_tables, rotate

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True, slots=True)
class Llama3Rope:
    """Llama 3's frequency scaling (``rope_type: llama3``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True, slots=True)
class LlamaSpec:
    """What a checkpoint's ``config.json`` says about the decoder (``serving.checkpoint``)."""

    architecture: str
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    llama3: Llama3Rope | None
    qk_norm: bool  # Qwen3
    tied: bool  # lm_head is the embedding (tie_word_embeddings)
    dtype: torch.dtype
    max_positions: int = 0  # max_position_embeddings (0: the config does not say)

    def decoder_shape(self) -> DecoderShape:
        """The shapes the paged forward needs (ids are the vocabulary's: no folding)."""
        return DecoderShape(self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim,
                            self.vocab_size, self.vocab_size, self.dtype)


def inv_freq(spec: LlamaSpec) -> torch.Tensor:
    """RoPE's inverse frequencies, float32, as transformers computes them (default, llama3)."""
    d = spec.head_dim
    freq = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = spec.llama3
    if s is None:
        return freq
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > low_wavelen, freq / s.factor, freq)
    smooth = ((s.original_max_position_embeddings / wavelen - s.low_freq_factor)
              / (s.high_freq_factor - s.low_freq_factor))
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


@dataclass(slots=True)
class LlamaLayer:
    """One layer's weights, in transformers' ``(out, in)`` layout; a bias is None when absent."""

    attn_norm: torch.Tensor
    qkv: torch.Tensor  # (Hq*D + 2*Hkv*D, hidden)
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # (hidden, Hq*D)
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # (D,) Qwen3
    k_norm: torch.Tensor | None
    mlp_norm: torch.Tensor
    gate_up: torch.Tensor  # (2 * intermediate, hidden)
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # (hidden, intermediate)
    down_bias: torch.Tensor | None


@dataclass(slots=True)
class LlamaWeights:
    """Every weight of the decoder, on its device, in its dtype."""

    embed: torch.Tensor  # (vocab, hidden)
    layers: list[LlamaLayer]
    norm: torch.Tensor
    lm_head: torch.Tensor  # the embedding itself when tied


class LlamaDecoder(PagedDecoder):
    """A Llama/Qwen2/Qwen3 checkpoint served over the pool (module doc)."""

    def __init__(self, spec: LlamaSpec, weights: LlamaWeights, *, name: str,
                 eos_ids: frozenset[int]) -> None:
        self.spec, self.weights = spec, weights
        self.shape = spec.decoder_shape()
        self._device = weights.embed.device
        self._name, self._eos = name, eos_ids
        self.inv_freq = inv_freq(spec).to(self._device)
        hq, hkv = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
        self._split = [hq, hkv, hkv]

    @property
    def name(self) -> str:
        """The served name (the folder's)."""
        return self._name

    @property
    def eos_ids(self) -> frozenset[int]:
        """From generation_config.json, else config.json."""
        return self._eos

    @property
    def max_positions(self) -> int:
        """config.json's ``max_position_embeddings`` (0 when it does not say)."""
        return self.spec.max_positions

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of ``embed_tokens``."""
        return self.weights.embed[ids]

    def rope(self, positions: torch.Tensor) -> Rope:
        """cos, sin at the checkpoint's frequencies."""
        return rope_tables(self.inv_freq, positions, self.spec.dtype)

    def qkv(self, layer: int, x: torch.Tensor,
            rope: Rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_layernorm, the q/k/v projections, Qwen3's head norms, RoPE."""
        s, w, t = self.spec, self.weights.layers[layer], x.shape[0]
        h = rms_norm(x, w.attn_norm, s.norm_eps)
        q, k, v = torch.split(F.linear(h, w.qkv, w.qkv_bias), self._split, dim=-1)
        q = q.reshape(t, s.n_heads, s.head_dim)
        k = k.reshape(t, s.n_kv_heads, s.head_dim)
        if w.q_norm is not None and w.k_norm is not None:
            q, k = rms_norm(q, w.q_norm, s.norm_eps), rms_norm(k, w.k_norm, s.norm_eps)
        return rotate(q, *rope), rotate(k, *rope), v.reshape(t, s.n_kv_heads, s.head_dim)

    def layer_out(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """o_proj and the residual, post_attention_layernorm, SwiGLU and the residual."""
        w = self.weights.layers[layer]
        x = x + F.linear(attn, w.o, w.o_bias)
        gate, up = F.linear(rms_norm(x, w.mlp_norm, self.spec.norm_eps), w.gate_up,
                            w.gate_up_bias).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w.down, w.down_bias)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """norm, then lm_head."""
        return F.linear(rms_norm(x, self.weights.norm, self.spec.norm_eps), self.weights.lm_head)
