"""A Hugging Face checkpoint served on the radix cache equals transformers: on tiny random
Llama (Llama 3 rope scaling, tied), Qwen2 (qkv bias, untied) and Qwen3 (q/k norms) checkpoints
the tests save themselves (``helpers.checkpoints``), a prompt's logits, greedy generation up to
and including the end of sequence, requests served from the cache (a whole hit, a hit ending
inside a block, a branch that copies a boundary block) and a batch sharing a prefix in one
forward all equal transformers' and computing alone from scratch. The same tests run on CUDA
where there is a device."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from radixcache.core.pool import KVPool
from radixcache.serving.checkpoint import Checkpoint, CheckpointError, load
from radixcache.serving.engine import Engine, EngineConfig, RequestResult
from radixcache.serving.model import SeqInput
from radixcache.serving.policy import SchedulePolicy
from radixcache.serving.sampling import RequestPolicy, Sampling
from radixcache.traffic.folder_tokenizer import FolderTokenizer
from tests.helpers.checkpoints import ARCHS, PROMPT, VOCAB, build

ATOL = 1e-4  # float32 against transformers' eager float32
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))]


class Saved:
    """One saved checkpoint folder and the transformers model it was saved from."""

    def __init__(self, folder: Path, hf: Any) -> None:
        self.folder, self.hf = folder, hf

    @torch.no_grad()
    def logits(self, tokens: list[int]) -> torch.Tensor:
        """transformers' logits of every position of ``tokens``."""
        out: torch.Tensor = self.hf(torch.tensor([tokens])).logits[0]
        return out


@pytest.fixture(scope="module", params=ARCHS)
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Saved:
    folder = tmp_path_factory.mktemp(request.param)
    return Saved(folder, build(request.param, folder))


def _engine(saved: Saved, device: str, **kw: Any) -> Engine:
    cfg = EngineConfig(num_blocks=64, block_size=16, device=device, record_events=False,
                       checkpoint=Checkpoint(str(saved.folder), "float32"), **kw)
    return Engine(cfg)


def _serve(engine: Engine, prompt: list[int], max_new: int = 6) -> RequestResult:
    h = engine.submit(prompt, max_new, keep_logits=True)
    while not h.done():
        engine.step()
    engine.check()
    return h.result(0)


def _equal_to_transformers(saved: Saved, prompt: list[int], r: RequestResult) -> None:
    """The answer's logits are transformers' over prompt + answer, and the tokens its argmax."""
    assert r.logits is not None
    ref = saved.logits(prompt + r.tokens[:-1])[len(prompt) - 1:]
    torch.testing.assert_close(r.logits, ref, atol=ATOL, rtol=0)
    assert r.tokens == ref.argmax(-1).tolist()


def _words(seed: int, n: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_a_prompts_logits_equal_transformers(saved: Saved, device: str) -> None:
    """Prefilled in two chunks through the pool (the second reads the first from its blocks),
    and densely: every position's logits within 1e-4 of transformers'."""
    model = load(Checkpoint(str(saved.folder), "float32"), device)
    prompt = _words(0, 37)
    pool = KVPool(8, 16, model.kv_shape(), model.device)
    table = [5, 2, 7]
    first = model.forward_all([SeqInput(prompt[:20], 0, table)], pool.kv)[0]
    rest = model.forward_all([SeqInput(prompt[20:], 20, table)], pool.kv)[0]
    ref = saved.logits(prompt)
    torch.testing.assert_close(torch.cat([first, rest]).cpu(), ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(model.reference_logits(prompt).cpu(), ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_generation_equals_generate_through_the_end_of_sequence(saved: Saved,
                                                                       device: str) -> None:
    engine = _engine(saved, device)
    eos = json.loads((saved.folder / "generation_config.json").read_text())["eos_token_id"]
    assert engine.model.eos_ids == frozenset({eos})
    policy = RequestPolicy(Sampling(stop_ids=engine.model.eos_ids),
                           FolderTokenizer(saved.folder))
    h = engine.submit(PROMPT, 24, policy=policy)
    while not h.done():
        engine.step()
    with torch.no_grad():
        want = saved.hf.generate(torch.tensor([PROMPT]), max_new_tokens=24,
                                 do_sample=False)[0, len(PROMPT):].tolist()
    got = h.result(0).tokens
    assert got == want
    assert got[-1] == eos and eos not in got[:-1] and len(got) < 24
    assert policy.stopped == eos


@pytest.mark.parametrize("device", DEVICES)
def test_requests_served_from_the_cache_equal_computing_from_scratch(saved: Saved,
                                                                     device: str) -> None:
    engine = _engine(saved, device)
    stats = engine.tree.stats
    a = _words(1, 37)
    first = _serve(engine, a)
    assert first.metrics.hit_tokens == 0
    _equal_to_transformers(saved, a, first)

    cow = stats.cow_copies  # a whole hit: all but the last prompt token from the cache
    whole = _serve(engine, a)
    assert (whole.metrics.hit_tokens, whole.tokens) == (36, first.tokens)
    assert stats.cow_copies == cow + 1  # the answer claims block 2 past 36: a copy of 4 slots
    _equal_to_transformers(saved, a, whole)

    inside = a[:21] + _words(2, 12)  # a hit ending 5 tokens into block 1, which a's path
    cow, slots = stats.cow_copies, stats.slots_copied  # claims further: copy its 5 slots
    branch = _serve(engine, inside)
    assert branch.metrics.hit_tokens == 21
    assert (stats.cow_copies, stats.slots_copied) == (cow + 1, slots + 5)
    _equal_to_transformers(saved, inside, branch)

    again = _serve(engine, inside[:30] + _words(3, 9))  # a branch off the branch, in block 1
    assert again.metrics.hit_tokens == 30
    _equal_to_transformers(saved, inside[:30] + _words(3, 9), again)


@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_sharing_a_prefix_in_one_forward_equals_serving_each_alone(saved: Saved,
                                                                           device: str) -> None:
    """Four requests of different lengths behind one new 40-token prefix, arriving together:
    the first computes it and the three others are admitted in the same step, reading its
    blocks in the forward that writes them. Each answer equals serving it alone."""
    shared = _words(4, 40)
    prompts = [shared + _words(10 + i, n) for i, n in enumerate((3, 17, 1, 30))]
    engine = _engine(saved, device, schedule=SchedulePolicy.DFS_WEIGHT, max_step_tokens=512)
    handles = [engine.submit(p, 5, keep_logits=True) for p in prompts]
    report = engine.step()
    assert (report.admitted, report.forwards, engine.scheduler.shared) == (4, 1, 3)
    while not all(h.done() for h in handles):
        engine.step()
        engine.check()
    for p, h in zip(prompts, handles, strict=True):
        together = h.result(0)
        alone = _serve(_engine(saved, device), p, 5)
        assert together.tokens == alone.tokens
        assert together.logits is not None and alone.logits is not None
        torch.testing.assert_close(together.logits, alone.logits, atol=ATOL, rtol=0)
        _equal_to_transformers(saved, p, together)


@pytest.mark.parametrize("device", DEVICES)
def test_a_ragged_batch_with_sharing_and_a_boundary_copy_equals_transformers(
        saved: Saved, device: str) -> None:
    """Contexts of 64, 17, 5 and 21 positions (padded to 64 each they would be 2.4 times the
    keys needed: the ragged layout, each sequence over its own keys). B reads block 1, which
    A writes in this very forward; D reads A's positions 16..19 through a boundary copy of
    A's block 2, made after A writes it. Every last logit equals transformers' on the
    sequence's whole context."""
    model = load(Checkpoint(str(saved.folder), "float32"), device)
    pool = KVPool(16, 16, model.kv_shape(), model.device)
    a, b, c, d = _words(20, 64), _words(21, 1), _words(22, 5), _words(23, 1)
    batch = [SeqInput(a, 0, [1, 2, 3, 4]), SeqInput(b, 16, [1, 9]), SeqInput(c, 0, [12]),
             SeqInput(d, 20, [1, 10])]
    copy = ([2 * 16 + i for i in range(4)], [10 * 16 + i for i in range(4)])
    fb = model.prepare(batch, pool.kv, copy)
    assert (fb.ragged, fb.ctx_lens) == (True, (64, 17, 5, 21))
    last = model.forward(fb, pool.kv).cpu()
    for i, whole in enumerate((a, a[:16] + b, c, a[:20] + d)):
        torch.testing.assert_close(last[i], saved.logits(whole)[-1], atol=ATOL, rtol=0)


def test_an_unsupported_architecture_is_named_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(CheckpointError, match=r"^architecture 'GPT2LMHeadModel' is not supported "
                       r"\(supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM\)$"):
        load(Checkpoint(str(tmp_path)), "cpu")


def test_the_folders_chat_template_gives_transformers_ids(saved: Saved) -> None:
    """Through transformers' own apply_chat_template and through the jinja2 rendering used
    without transformers: the ids transformers gives, and the text reads back."""
    from transformers import AutoTokenizer

    msgs = [("system", "you serve the cache"), ("user", "hello world what is a radix tree")]
    want = AutoTokenizer.from_pretrained(str(saved.folder)).apply_chat_template(
        [{"role": r, "content": c} for r, c in msgs], add_generation_prompt=True,
        tokenize=True, return_dict=False)
    tok = FolderTokenizer(saved.folder)
    assert tok.chat(msgs) == list(want)
    tok._apply = tok._jinja()
    assert tok.chat(msgs) == list(want)
    assert tok.decode(tok.chat(msgs)) == ("<s><|im_start|>system you serve the cache<|im_end|>"
                                          "<|im_start|>user hello world what is a radix tree"
                                          "<|im_end|><|im_start|>assistant ")


def test_the_cli_names_a_folder_and_sizes_the_pool_from_memory(saved: Saved) -> None:
    """``--model DIR --kv-memory 1MiB``: 2 layers x 2 KV heads x head dim x 4 bytes x 2 (K
    and V) x 16 slots a block (Qwen3's head_dim is 32, the others' 16)."""
    from cli.options import engine_config, kv_memory_bytes
    from radixcache.serving.engine import Answers

    cfg = engine_config(str(saved.folder), 64, "cpu", 1, Answers.DECODE, kv_memory="1MiB")
    assert cfg.checkpoint == Checkpoint(str(saved.folder), "auto")
    head_dim = 32 if saved.folder.name.startswith("qwen3") else 16
    assert cfg.num_blocks == 2**20 // (2 * 2 * head_dim * 4 * 2 * 16)
    engine = Engine(cfg)
    assert engine.pool.bytes_per_block() * cfg.num_blocks <= 2**20
    stats = engine.stats()
    assert (stats.kv_bytes_per_block, stats.kv_bytes_per_token) == (
        2 * 2 * head_dim * 4 * 2 * 16, 2 * 2 * head_dim * 4 * 2)
    assert stats.model == saved.folder.name
    assert engine.pool.kv.dtype == torch.float32  # auto on the CPU
    with pytest.raises(ValueError, match=r"^--model 'nowhere': not tiny, default or a model "
                                         r"folder$"):
        engine_config("nowhere", 64, "cpu", 1, Answers.DECODE)
    with pytest.raises(ValueError, match=r"needs a device that reports free memory"):
        kv_memory_bytes("0.5", None)
    assert kv_memory_bytes("2GiB", None) == 2 * 2**30


_LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_hidden_layers": 1, "intermediate_size": 128,
          "vocab_size": 32}


@pytest.mark.parametrize(("change", "message"), [
    ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True},
     r"^Qwen2ForCausalLM: sliding-window attention is not supported$"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     r"^config.json: rope_type 'yarn' is not supported \(supported: default, llama3\)$"),
    ({"hidden_act": "gelu"}, r"^config.json: hidden_act 'gelu' is not supported \(only silu\)$"),
    ({"num_key_value_heads": 3},
     r"^config.json: 4 heads over 3 KV heads of 16 \(heads must be a multiple, head_dim even\)$"),
    ({}, r"no \*.safetensors file \(only safetensors are read\)$"),
])
def test_a_folder_the_decoder_cannot_compute_is_refused_in_one_line(
        tmp_path: Path, change: dict[str, object], message: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**_LLAMA, **change}))
    with pytest.raises(CheckpointError, match=message):
        load(Checkpoint(str(tmp_path)), "cpu")


def test_an_untied_checkpoint_without_its_lm_head_is_refused(saved: Saved,
                                                             tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(saved.folder / "model.safetensors"))
    weights.pop("lm_head.weight", None)
    save_file(weights, str(tmp_path / "model.safetensors"))
    cfg = json.loads((saved.folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    with pytest.raises(CheckpointError, match=r"untied embeddings \(tie_word_embeddings false\) "
                                              r"but the safetensors hold no lm_head.weight$"):
        load(Checkpoint(str(tmp_path)), "cpu")


def test_bfloat16_serves_within_its_precision_of_transformers_bfloat16(saved: Saved) -> None:
    """``--dtype bfloat16``: weights and pool in bfloat16; the paged prefill's logits within a
    few bfloat16 steps of transformers' own bfloat16 forward (0.078 seen on logits up to ~5)."""
    from transformers import AutoModelForCausalLM

    model = load(Checkpoint(str(saved.folder), "bfloat16"), "cpu")
    assert model.kv_shape().dtype == torch.bfloat16
    hf = AutoModelForCausalLM.from_pretrained(str(saved.folder), dtype=torch.bfloat16)
    prompt = _words(5, 30)
    pool = KVPool(4, 16, model.kv_shape(), model.device)
    got = model.forward_all([SeqInput(prompt, 0, [3, 1])], pool.kv)[0].float()
    with torch.no_grad():
        want = hf(torch.tensor([prompt])).logits[0].float()
    torch.testing.assert_close(got, want, atol=0.25, rtol=0.02)
