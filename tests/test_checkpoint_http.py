"""A model folder behind the HTTP front, as ``serve --model DIR --http PORT`` runs it: the
folder's name in /v1/models, its tokenizer and chat template (usage counts equal transformers'
tokenizer's), answers that end at its end of sequence unless ``ignore_eos``, and the text of
the answer in the model's own words; the built-in workloads run in the model's ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from radixcache.serving.checkpoint import Checkpoint
from radixcache.serving.engine import Engine, EngineConfig
from radixcache.serving.http import EngineBackend, HttpFront
from radixcache.serving.loop import BatchSink, ServiceLoop
from radixcache.traffic.folder_tokenizer import retokenized
from radixcache.traffic.workloads import build_workload
from tests.helpers.checkpoints import PROMPT, build

_http = httpx.Client(timeout=60)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpFront, Any, Path]]:
    folder = tmp_path_factory.mktemp("SmolTest-1")
    hf = build("llama", folder)
    engine = Engine(EngineConfig(num_blocks=512, device="cpu",
                                 checkpoint=Checkpoint(str(folder), "float32")))
    assert engine.text is not None
    loop = ServiceLoop(engine, BatchSink(lambda _batch: None)).start()
    front = HttpFront(EngineBackend(engine, loop), model=engine.model.name,
                      tokenizer=engine.text, eos_ids=engine.model.eos_ids).start()
    try:
        yield front, hf, folder
    finally:
        front.close()
        loop.close()


def _generate(hf: Any, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out: list[int] = hf.generate(torch.tensor([ids]), max_new_tokens=n,
                                     do_sample=False)[0, len(ids):].tolist()
    return out


def test_models_names_the_folder(served: tuple[HttpFront, Any, Path]) -> None:
    front, _, folder = served
    ids = [m["id"] for m in _http.get(f"{front.url}/v1/models").json()["data"]]
    assert ids == [folder.name]


def test_an_answer_ends_at_the_end_of_sequence_unless_ignore_eos(
        served: tuple[HttpFront, Any, Path]) -> None:
    front, hf, folder = served
    want = _generate(hf, PROMPT, 24)  # ends with the eos the checkpoint was saved with
    eos = hf.generation_config.eos_token_id
    assert want[-1] == eos and len(want) < 24
    body = {"model": folder.name, "prompt": PROMPT, "max_tokens": 24}
    r = _http.post(f"{front.url}/v1/completions", json=body).json()
    tok = front.tokenizer
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["text"] == tok.decode(want[:-1])
    assert r["usage"]["prompt_tokens"] == len(PROMPT)
    assert r["usage"]["completion_tokens"] == len(want)
    hf.generation_config.eos_token_id = None
    try:
        past = _generate(hf, PROMPT, 24)
    finally:
        hf.generation_config.eos_token_id = eos
    r = _http.post(f"{front.url}/v1/completions", json={**body, "ignore_eos": True}).json()
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 24
    assert r["choices"][0]["text"] == tok.decode(past)


def test_a_chat_is_the_folders_template_and_counts_as_transformers_does(
        served: tuple[HttpFront, Any, Path]) -> None:
    from transformers import AutoTokenizer

    front, hf, folder = served
    msgs = [{"role": "system", "content": "you serve the cache"},
            {"role": "user", "content": "hello world what is a radix tree"}]
    ids = list(AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=False))
    r = _http.post(f"{front.url}/v1/chat/completions",
                   json={"model": folder.name, "messages": msgs, "max_tokens": 6,
                         "ignore_eos": True}).json()
    assert r["usage"]["prompt_tokens"] == len(ids)
    hf.generation_config.eos_token_id, eos = None, hf.generation_config.eos_token_id
    try:
        want = _generate(hf, ids, 6)
    finally:
        hf.generation_config.eos_token_id = eos
    assert r["choices"][0]["message"]["content"] == front.tokenizer.decode(want)


def test_a_workload_runs_in_the_models_ids(served: tuple[HttpFront, Any, Path]) -> None:
    """The chat workload's words become the model's ids word by word: each turn still extends
    the one before it, so the follow-ups hit the cache, and previews read as the words."""
    front, _, _ = served
    engine: Engine = front.backend.engine  # type: ignore[attr-defined]
    assert engine.text is not None
    w = build_workload("chat", ["1", "--seed", "3"])
    mw = retokenized(w, engine.text)
    follow = [(i, r.after) for i, r in enumerate(mw.requests) if r.after is not None]
    assert follow
    for i, j in follow:
        before = mw.requests[j].prompt
        assert mw.requests[i].prompt[:len(before)].tolist() == before.tolist()
    for r, m in zip(w.requests, mw.requests, strict=True):
        assert mw.text(m.prompt).split() == w.text(r.prompt).split()
        assert int(m.prompt.max()) < engine.model.vocab_size
    results = engine.run_workload(w).wait(120)
    for (i, _), r in zip(follow, [results[i] for i, _ in follow], strict=True):
        assert not isinstance(r, Exception), i
        assert r.metrics.hit_tokens > 0


def test_a_text_prompt_counts_as_the_clients_tokenizer_counts_it(
        served: tuple[HttpFront, Any, Path]) -> None:
    from transformers import AutoTokenizer

    front, _, folder = served
    text = "how does a block of the cache serve a token"
    want = AutoTokenizer.from_pretrained(str(folder))(text)["input_ids"]
    r = _http.post(f"{front.url}/v1/completions",
                   json={"model": folder.name, "prompt": text, "max_tokens": 2}).json()
    assert r["usage"]["prompt_tokens"] == len(want)
    ids = _http.post(f"{front.url}/tokenize", json={"prompt": text}).json()
    assert ids["tokens"] == want


def test_server_info_says_the_bytes_of_a_block_and_of_a_token(
        served: tuple[HttpFront, Any, Path]) -> None:
    front, _, _ = served
    info = _http.get(f"{front.url}/get_server_info").json()
    per_block = 2 * 2 * 16 * 4 * 2 * 16  # layers x KV heads x head dim x float32 x K,V x slots
    assert (info["kv_bytes_per_block"], info["kv_bytes_per_token"]) == (per_block, per_block // 16)


def test_serve_refuses_a_folder_it_cannot_serve_in_one_line(tmp_path: Path) -> None:
    """Before anything binds: exit 2, one line naming the architecture and the supported ones."""
    import os
    import subprocess
    import sys

    (tmp_path / "config.json").write_text('{"architectures": ["MistralForCausalLM"]}')
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    p = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--model", str(tmp_path),
                        "--http", "0", "--port", "5"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert (p.returncode, p.stderr) == (2, "error: architecture 'MistralForCausalLM' is not "
                                           "supported (supported: LlamaForCausalLM, "
                                           "Qwen2ForCausalLM, Qwen3ForCausalLM)\n")


def test_without_max_tokens_an_answer_runs_to_its_end_or_the_context_s(
        served: tuple[HttpFront, Any, Path]) -> None:
    """As OpenAI and vLLM: no max_tokens is the rest of the context (here config.json's 512
    positions, under the pool's 8,192), so an answer ends at its end of sequence, or with
    ignore_eos at the context's end."""
    front, hf, folder = served
    assert _http.get(f"{front.url}/get_server_info").json()["max_total_num_tokens"] == 512
    want = _generate(hf, PROMPT, 24)
    body = {"model": folder.name, "prompt": PROMPT}
    r = _http.post(f"{front.url}/v1/completions", json=body).json()
    assert (r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]) == (
        "stop", len(want))
    r = _http.post(f"{front.url}/v1/completions", json={**body, "ignore_eos": True}).json()
    assert (r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]) == (
        "length", 512 - len(PROMPT) + 1)
    chat = {"model": folder.name, "messages": [{"role": "user", "content": "hi"}],
            "ignore_eos": True}
    r = _http.post(f"{front.url}/v1/chat/completions", json=chat).json()
    u = r["usage"]
    assert (r["choices"][0]["finish_reason"], u["prompt_tokens"] + u["completion_tokens"]) == (
        "length", 513)
