"""A local Hugging Face checkpoint folder read into a served model; nothing is ever downloaded.

The folder holds what ``save_pretrained`` writes::

    DIR/config.json              architecture, shapes, RoPE, norm eps, dtype, eos_token_id
    DIR/*.safetensors            the weights (one file or shards), memory-mapped, read once
    DIR/generation_config.json   eos_token_id (preferred over config.json's), when present
    DIR/tokenizer.json, tokenizer_config.json   the text side (``traffic.folder_tokenizer``)

Architectures: ``LlamaForCausalLM`` (Llama 3's ``rope_type: llama3`` included),
``Qwen2ForCausalLM`` (qkv bias), ``Qwen3ForCausalLM`` (q/k head norms), tied or untied
embeddings. Anything else, or a feature the decoder does not compute (sliding windows, another
RoPE scaling, another activation), is refused with one line saying what was found.

``--dtype auto`` takes the config's dtype on a GPU (float16 where bfloat16 is not supported)
and float32 on the CPU (a CPU computes half precision slowly and less exactly).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from radixcache.serving.llama import (
    ARCHITECTURES,
    Llama3Rope,
    LlamaDecoder,
    LlamaLayer,
    LlamaSpec,
    LlamaWeights,
)
from radixcache.serving.model import ModelConfig, TinyTransformer, resolve_device
from radixcache.serving.paged import Model

if TYPE_CHECKING:  # tokenizers is the http extra's: imported only for a checkpoint
    from radixcache.traffic.folder_tokenizer import FolderTokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)


class CheckpointError(ValueError):
    """The folder cannot be served (one line: what is missing or unsupported)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Which folder to serve and in what dtype (``auto`` or a ``DTYPES`` name)."""

    path: str
    dtype: str = "auto"


def _json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return data


def _int(cfg: dict[str, object], key: str, default: int | None = None) -> int:
    v = cfg.get(key)
    v = default if v is None else v  # transformers writes null for an unset field
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise CheckpointError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def _float(cfg: dict[str, object], key: str, default: float) -> float:
    v = cfg.get(key)
    v = default if v is None else v
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise CheckpointError(f"config.json: {key} must be a number, got {v!r}")
    return float(v)


def choose_dtype(requested: str, config_dtype: object, device: torch.device) -> torch.dtype:
    """The dtype to serve in (module doc). Raises ``CheckpointError`` for an unknown name."""
    if requested != "auto":
        if requested not in DTYPES:
            raise CheckpointError(f"dtype {requested!r}: choose one of {', '.join(DTYPE_CHOICES)}")
        return DTYPES[requested]
    if device.type == "cpu":
        return torch.float32
    dt = DTYPES.get(str(config_dtype).removeprefix("torch."), torch.float32)
    if dt is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return torch.float16
    return dt


def _rope(cfg: dict[str, object]) -> tuple[float, Llama3Rope | None]:
    """(theta, llama3 scaling or None) from ``rope_parameters`` (transformers 5) or
    ``rope_theta``/``rope_scaling`` (the format the hub's checkpoints carry)."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"config.json: rope parameters {params!r} are not an object")
    theta = _float(params, "rope_theta", _float(cfg, "rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if _float(params, "partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("config.json: partial_rotary_factor is not supported (only 1.0)")
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise CheckpointError(f"config.json: rope_type {kind!r} is not supported "
                              "(supported: default, llama3)")
    return theta, Llama3Rope(
        _float(params, "factor", 8.0), _float(params, "low_freq_factor", 1.0),
        _float(params, "high_freq_factor", 4.0),
        _int(params, "original_max_position_embeddings", 8192))


def _refuse_unsupported(cfg: dict[str, object]) -> str:
    """The architecture, when the decoder computes everything the config asks."""
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"architecture {arch!r} is not supported "
                              f"(supported: {', '.join(ARCHITECTURES)})")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"config.json: hidden_act {act!r} is not supported (only silu)")
    layer_types = cfg.get("layer_types") or []
    if cfg.get("use_sliding_window") or (isinstance(layer_types, list)
                                        and "sliding_attention" in layer_types):
        raise CheckpointError(f"{arch}: sliding-window attention is not supported")
    return str(arch)


def read_spec(folder: Path, dtype: str, device: torch.device) -> LlamaSpec:
    """The decoder ``folder/config.json`` describes. Raises ``CheckpointError``."""
    cfg = _json(folder / "config.json")
    arch = _refuse_unsupported(cfg)
    hidden, heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", heads)
    head_dim = _int(cfg, "head_dim", hidden // heads)
    if heads % kv_heads or head_dim % 2:
        raise CheckpointError(f"config.json: {heads} heads over {kv_heads} KV heads of "
                              f"{head_dim} (heads must be a multiple, head_dim even)")
    theta, llama3 = _rope(cfg)
    return LlamaSpec(
        architecture=arch, hidden_size=hidden, n_layers=_int(cfg, "num_hidden_layers"),
        n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=_int(cfg, "intermediate_size"), vocab_size=_int(cfg, "vocab_size"),
        norm_eps=_float(cfg, "rms_norm_eps", 1e-6), rope_theta=theta, llama3=llama3,
        qk_norm=arch == "Qwen3ForCausalLM", tied=cfg.get("tie_word_embeddings") is True,
        dtype=choose_dtype(dtype, cfg.get("torch_dtype", cfg.get("dtype")), device),
        max_positions=(0 if cfg.get("max_position_embeddings") is None
                       else _int(cfg, "max_position_embeddings")))


def eos_ids(folder: Path) -> frozenset[int]:
    """End-of-sequence ids: ``generation_config.json``'s ``eos_token_id``, else
    ``config.json``'s (an id or a list of them); none when neither says."""
    for name in ("generation_config.json", "config.json"):
        if not (folder / name).is_file():
            continue
        v = _json(folder / name).get("eos_token_id")
        ids = v if isinstance(v, list) else [v]
        found = frozenset(i for i in ids if isinstance(i, int) and not isinstance(i, bool))
        if found:
            return found
    return frozenset()


Take = Callable[[str], torch.Tensor | None]


def _layer(take: Take, i: int, spec: LlamaSpec) -> LlamaLayer:
    p = f"model.layers.{i}."

    def need(key: str) -> torch.Tensor:
        t = take(p + key)
        if t is None:
            raise CheckpointError(f"the safetensors hold no {p + key}")
        return t

    def cat(keys: list[str]) -> tuple[torch.Tensor, torch.Tensor | None]:
        ws = [need(k + ".weight") for k in keys]
        bs = [take(p + k + ".bias") for k in keys]
        present = [b for b in bs if b is not None]
        if present and len(present) != len(bs):
            raise CheckpointError(f"{p}{keys}: some projections have a bias, some not")
        return torch.cat(ws), torch.cat(present) if present else None

    qkv, qkv_bias = cat(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"])
    gate_up, gate_up_bias = cat(["mlp.gate_proj", "mlp.up_proj"])
    return LlamaLayer(
        attn_norm=need("input_layernorm.weight"), qkv=qkv, qkv_bias=qkv_bias,
        o=need("self_attn.o_proj.weight"), o_bias=take(p + "self_attn.o_proj.bias"),
        q_norm=need("self_attn.q_norm.weight") if spec.qk_norm else None,
        k_norm=need("self_attn.k_norm.weight") if spec.qk_norm else None,
        mlp_norm=need("post_attention_layernorm.weight"), gate_up=gate_up,
        gate_up_bias=gate_up_bias, down=need("mlp.down_proj.weight"),
        down_bias=take(p + "mlp.down_proj.bias"))


def load_weights(folder: Path, spec: LlamaSpec, device: torch.device) -> LlamaWeights:
    """Every weight of ``folder``'s safetensors files (each memory-mapped and every tensor read
    once), on ``device`` in ``spec.dtype``. Raises ``CheckpointError`` for a missing tensor."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors file (only safetensors are read)")
    handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
    where = {k: h for h in handles for k in h.keys()}  # type: ignore[no-untyped-call]  # noqa: SIM118

    def take(key: str) -> torch.Tensor | None:
        h = where.get(key)
        if h is None:
            return None
        t: torch.Tensor = h.get_tensor(key)  # type: ignore[no-untyped-call]
        return t.to(device, spec.dtype)

    embed = take("model.embed_tokens.weight")
    norm = take("model.norm.weight")
    if embed is None or norm is None:
        raise CheckpointError(f"{folder}: the safetensors hold no model.embed_tokens/model.norm")
    if embed.shape != (spec.vocab_size, spec.hidden_size):
        raise CheckpointError(f"embed_tokens is {tuple(embed.shape)}, config.json says "
                              f"({spec.vocab_size}, {spec.hidden_size})")
    head = None if spec.tied else take("lm_head.weight")
    if head is None and not spec.tied:
        raise CheckpointError(f"{folder}: untied embeddings (tie_word_embeddings false) "
                              "but the safetensors hold no lm_head.weight")
    layers = [_layer(take, i, spec) for i in range(spec.n_layers)]
    return LlamaWeights(embed, layers, norm, embed if head is None else head)


def load(checkpoint: Checkpoint, device: str | torch.device | None = None) -> LlamaDecoder:
    """The model in ``checkpoint.path``, on ``device`` (default: CUDA when there is one)."""
    folder = Path(checkpoint.path)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a directory (a local Hugging Face model folder)")
    dev = resolve_device(device)
    spec = read_spec(folder, checkpoint.dtype, dev)
    with torch.inference_mode():
        weights = load_weights(folder, spec, dev)
    return LlamaDecoder(spec, weights, name=folder.resolve().name, eos_ids=eos_ids(folder))


def build_model(config: ModelConfig, checkpoint: Checkpoint | None,
                device: str | torch.device | None = None) -> Model:
    """The engine's model: the checkpoint when one is named, else the seeded tiny one."""
    if checkpoint is None:
        return TinyTransformer(config, device)
    return load(checkpoint, device)


def folder_tokenizer(checkpoint: Checkpoint | None) -> FolderTokenizer | None:
    """The checkpoint folder's tokenizer (None for the seeded model, or a folder without
    tokenizer.json: it serves ids only). Raises ``CheckpointError`` when ``tokenizers`` is not
    installed."""
    if checkpoint is None or not (Path(checkpoint.path) / "tokenizer.json").is_file():
        return None
    try:
        from radixcache.traffic.folder_tokenizer import FolderTokenizer
    except ImportError as e:
        raise CheckpointError(f"a model folder needs {e.name} (pip install "
                              "'radixcache[models]')") from None
    try:
        return FolderTokenizer(Path(checkpoint.path))
    except ValueError as e:
        raise CheckpointError(str(e)) from None
