"""Tiny random Hugging Face checkpoints the checkpoint tests build and save themselves.

One per architecture (Llama with Llama 3's rope scaling and tied embeddings, Qwen2 with qkv
bias and untied embeddings, Qwen3 with q/k norms and an explicit head_dim), saved by
transformers' ``save_pretrained`` (safetensors) with a small ``tokenizer.json`` (byte-level
BPE) and a ``tokenizer_config.json`` holding a chat template. Every weight is random (norms
and biases included, so a bias or norm the loader dropped would show). The end of
sequence is a token greedy decoding of ``PROMPT`` reaches after a few steps, so generation
tests see it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

VOCAB = 320
PROMPT = [7, 42, 99, 13, 250, 61, 7, 301, 18, 77, 5, 150]
WORDS = ("system", "user", "assistant", "the", "a", "cache", "tree", "block", "radix", "model",
         "token", "hello", "world", "serve", "what", "is", "how", "why", "you", "I", "we", "it",
         "this", "that", "of", "to", "and", "in", "on", "for", "with")
SENTENCES = ["you serve the cache", "hello world what is a radix tree",
             "how does a block of the cache serve a token", "we serve it with this model"]
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # Qwen2's pre-tokenizer split
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }} "
                 "{{ m['content'] }}<|im_end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")
COMMON: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=512,
                              bos_token_id=1)
ARCHS = ("llama", "qwen2", "qwen3")


def _hf_model(arch: str) -> Any:
    import transformers as tf

    if arch == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
        return tf.LlamaForCausalLM(tf.LlamaConfig(**COMMON, rope_parameters=rope,
                                                  tie_word_embeddings=True))
    if arch == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, tie_word_embeddings=False))
    return tf.Qwen3ForCausalLM(tf.Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=True))


def _tokenizer(folder: Path) -> None:
    """A byte-level BPE shaped as Qwen2's (NFC, its split regex, byte-level), trained on a few
    sentences: transformers rebuilds a Qwen2 folder's tokenizer in that shape from the
    vocabulary and merges, so tokenizer.json and transformers agree, as on a real checkpoint."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(WORDS)] * 4 + SENTENCES, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE}))


def build(arch: str, folder: Path) -> Any:
    """Save the ``arch`` checkpoint in ``folder``; return the transformers model (float32)."""
    torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3}[arch])
    model = _hf_model(arch).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    ids = torch.tensor([PROMPT])
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=24, do_sample=False)[0, len(PROMPT):].tolist()
    eos = next(t for i, t in enumerate(out) if i >= 3 and t not in out[:i])
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    model.save_pretrained(folder)
    _tokenizer(folder)
    return model


def folder_fixture(arch: str, name: str) -> Any:
    """A module-scoped fixture ``folder``: the ``arch`` checkpoint built once per test module
    in a fresh temporary folder named after ``name`` (assign it to ``folder`` in the module)."""

    @pytest.fixture(scope="module", name="folder")
    def _folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
        path = tmp_path_factory.mktemp(name)
        build(arch, path)
        return path

    return _folder
