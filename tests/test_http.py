"""The HTTP front over a real engine on 127.0.0.1: the official openai client, plain HTTP,
SGLang's /generate, the errors, /metrics; and `serve --http` as a process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from radixcache.serving.engine import Engine, EngineConfig
from radixcache.serving.http import EngineBackend, HttpFront
from radixcache.serving.loop import BatchSink, ServiceLoop
from radixcache.serving.model import ModelConfig, tiny_model
from radixcache.traffic.tokenizer import BOS, EOT, HDR, HDR_END
from tests.helpers.http import MODEL, TOK, greedy, http_engine, scrape

PROMPT = "the cache keeps every prefix it has seen"
ROOT = Path(__file__).resolve().parents[1]

# one client with a generous timeout: a loaded 2-core machine answers slowly
_http = httpx.Client(timeout=60)


@pytest.fixture(scope="module")
def front() -> Iterator[HttpFront]:
    with http_engine(64) as f:
        yield f


@pytest.fixture(scope="module")
def client(front: HttpFront) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0)


def test_completion_text_round_trips_through_the_tokenizer(front: HttpFront,
                                                          client: openai.OpenAI) -> None:
    ids = TOK.encode(PROMPT)
    assert TOK.decode(ids) == PROMPT
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5)
    expected = greedy(front, ids, 5)
    assert r.choices[0].text == TOK.decode(expected)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 5)
    again = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5)
    assert again.choices[0].text == r.choices[0].text
    assert again.usage.prompt_tokens_details.cached_tokens == len(ids) - 1  # the cap: one new


def test_streamed_completion_concatenates_to_the_answer(front: HttpFront,
                                                        client: openai.OpenAI) -> None:
    ids = [7, 8, 9, 10, 11, 12]
    whole = client.completions.create(model=MODEL, prompt=ids, max_tokens=6)
    chunks = list(client.completions.create(model=MODEL, prompt=ids, max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-2:] == [None, "length"]
    assert chunks[-1].usage.completion_tokens == 6
    assert whole.choices[0].text == TOK.decode(greedy(front, ids, 6))


def test_continuous_usage_puts_the_usage_so_far_in_every_chunk(front: HttpFront) -> None:
    """What guidellm 0.8.1 sends with every streamed chat (vLLM's continuous_usage_stats)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "max_completion_tokens": 3, "stop": None, "ignore_eos": True}
    lines = _http.post(f"{front.url}/v1/chat/completions", json=body).text.split("\n\n")
    assert lines[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-2]]
    n = len(TOK.chat([("user", "hi")]))
    with_text = [c for c in chunks if c["choices"]]
    assert with_text[0]["usage"] == {"prompt_tokens": n, "completion_tokens": 0,
                                     "total_tokens": n}
    assert with_text[-1]["usage"]["completion_tokens"] == 3
    assert chunks[-1]["usage"]["completion_tokens"] == 3 and chunks[-1]["choices"] == []
    counts = [c["usage"]["completion_tokens"] for c in with_text]
    assert counts == sorted(counts) and counts[1] >= 1  # each text chunk counts its tokens
    assert all(c["usage"]["total_tokens"] == n + c["usage"]["completion_tokens"]
               for c in with_text)
    alone = dict(body, stream_options={"continuous_usage_stats": True})
    plain = _http.post(f"{front.url}/v1/chat/completions", json=alone).text
    assert '"usage"' not in plain  # as vLLM: only together with include_usage


def test_chat_goes_through_the_tokenizers_template(front: HttpFront,
                                                   client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello <eot> there"}], max_tokens=3)
    layout = [BOS, HDR, *TOK.encode("user"), HDR_END, *TOK.encode_plain("hello <eot> there"),
              EOT, HDR, *TOK.encode("assistant"), HDR_END]
    assert EOT not in TOK.encode_plain("hello <eot> there")  # a message cannot forge a turn
    assert TOK.chat([("user", "hello <eot> there")]) == layout
    assert r.usage.prompt_tokens == len(layout)
    assert r.choices[0].message.content == TOK.decode(greedy(front, layout, 3))
    streamed = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello <eot> there"}], max_tokens=3,
        stream=True))
    assert streamed[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in streamed)
    assert text == r.choices[0].message.content


def test_sglang_generate_with_ids_and_text(front: HttpFront) -> None:
    ids = TOK.encode("I love C#")
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}}
    r = _http.post(f"{front.url}/generate", json=body).json()
    assert r["output_ids"] == greedy(front, ids, 4)
    assert r["text"] == TOK.decode(r["output_ids"])
    assert r["meta_info"]["prompt_tokens"] == len(ids)
    assert r["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    t = _http.post(f"{front.url}/generate", json={"text": "I love C#", "sampling_params":
                                                  {"max_new_tokens": 4}}).json()
    assert t["output_ids"] == r["output_ids"]


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/v1/completions", {"model": "gpt-9", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 10**6]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 4096]}, 400, "prompt"),
    ("/generate", {"input_ids": [1, 4096]}, 400, "input_ids"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
    ("/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/generate", {"sampling_params": {}}, 400, "text"),
    ("/generate", {"text": ["a", "b"]}, 400, "text"),
    ("/generate", {"input_ids": [[1], [2]]}, 400, "text"),
])
def test_bad_requests_get_openai_errors(front: HttpFront, path: str, body: dict[str, object],
                                        status: int, param: str) -> None:
    r = _http.post(f"{front.url}{path}", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert (err["param"], isinstance(err["message"], str)) == (param, True)


def test_size_json_context_and_path_errors(front: HttpFront) -> None:
    big = _http.post(f"{front.url}/v1/completions", content=b"{" + b" " * (1 << 20) + b"}")
    assert big.status_code == 413
    assert big.json()["error"]["message"] == "request body over 1048576 bytes"
    bad = _http.post(f"{front.url}/v1/completions", content=b"{not json")
    assert bad.status_code == 400
    long = _http.post(f"{front.url}/v1/completions",
                      json={"model": MODEL, "prompt": [1] * 1000, "max_tokens": 100})
    assert (long.status_code, long.json()["error"]["code"]) == (400, "context_length_exceeded")
    missing = _http.get(f"{front.url}/v2/nothing")
    assert (missing.status_code, missing.json()["error"]["type"]) == (404, "not_found_error")


def test_info_routes(front: HttpFront) -> None:
    assert _http.get(f"{front.url}/health").status_code == 200
    info = _http.get(f"{front.url}/model_info").json()
    assert (info["model_path"], info["tokenizer_path"], info["served_model_name"]) == (
        str(TOK.path), str(TOK.path), MODEL)
    assert _http.get(f"{front.url}/get_model_info").json() == info
    models = _http.get(f"{front.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == 64 * 16
    assert info["vocab_size"] == models["data"][0]["vocab_size"] == TOK.vocab_size == 4096
    info = _http.get(f"{front.url}/server_info").json()
    assert info["num_blocks"] == 64


def test_metrics_are_the_engines_counters() -> None:
    with http_engine(64) as f:
        for _ in range(2):
            _http.post(f"{f.url}/v1/completions",
                       json={"model": MODEL, "prompt": [5, 6, 7, 8, 9], "max_tokens": 3})
        values = scrape(f)
        used = f.backend.engine.pool.allocator.used_count  # type: ignore[attr-defined]
    m = (("model_name", MODEL),)
    assert values[("vllm:prefix_cache_queries_total", m)] == 10
    assert values[("vllm:prefix_cache_hits_total", m)] == 4
    assert values[("vllm:request_success_total", (("finished_reason", "length"), *m))] == 2
    assert values[("vllm:request_success_total", (("finished_reason", "abort"), *m))] == 0
    assert values[("vllm:generation_tokens_total", m)] == 6
    assert values[("sglang:cache_hit_rate", m)] == 0.4
    assert values[("vllm:time_to_first_token_seconds_count", m)] == 2
    assert values[("vllm:time_to_first_token_seconds_bucket", (("le", "+Inf"), *m))] == 2
    assert values[("vllm:inter_token_latency_seconds_count", m)] == 4  # 2 gaps a request
    assert values[("vllm:request_generation_tokens_sum", m)] == 6
    assert values[("vllm:request_prompt_tokens_sum", m)] == 10
    # idle: nothing is held by a request, so vLLM's usage is 0 and the cache is all evictable
    assert values[("vllm:kv_cache_usage_perc", m)] == 0
    assert values[("radixcache:kv_cache_cached_perc", m)] == used / 64 > 0


def test_serve_http_refuses_a_taken_port_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        p = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--port", "0",
                            "--http", str(port), "--blocks", "64"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"error: cannot bind HTTP 127.0.0.1:{port}: Address already in use"]


def test_serve_http_refuses_a_port_out_of_range_before_any_work() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--http", "70000"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "Invalid value for '--http'" in p.stderr and "Traceback" not in p.stderr


def test_the_front_serves_ipv6_loopback() -> None:
    engine = Engine(EngineConfig(num_blocks=64, model=tiny_model()))
    loop = ServiceLoop(engine, BatchSink(lambda _batch: None)).start()
    f = HttpFront(EngineBackend(engine, loop), host="::1").start()
    try:
        assert f.url == f"http://[::1]:{f.port}"
        client = openai.OpenAI(base_url=f"{f.url}/v1", api_key="unused", max_retries=0)
        r = client.completions.create(model=MODEL, prompt="I love C#", max_tokens=2)
        assert r.usage is not None and r.usage.completion_tokens == 2
    finally:
        f.close()
        loop.close()
    with pytest.raises(ValueError, match="port 70000 is outside 0-65535"):
        HttpFront(EngineBackend(engine, loop), port=70000)


def test_ids_past_the_vocabulary_are_refused_by_name(front: HttpFront) -> None:
    r = _http.post(f"{front.url}/v1/completions", json={"model": MODEL, "prompt": [4095, 4096]})
    assert r.json()["error"]["message"] == "'prompt' holds a token id outside [0, 4096)"
    ok = _http.post(f"{front.url}/v1/completions",
                    json={"model": MODEL, "prompt": [4095], "max_tokens": 1})
    assert ok.status_code == 200


def test_the_front_refuses_a_model_whose_vocabulary_is_smaller_than_the_tokenizers() -> None:
    """(A larger one is fine: checkpoints pad their vocabulary past the tokenizer's.)"""
    engine = Engine(EngineConfig(num_blocks=8, model=ModelConfig(vocab_size=1000)))
    loop = ServiceLoop(engine, BatchSink(lambda _batch: None)).start()
    try:
        with pytest.raises(ValueError, match=r"the model's vocabulary \(1000\) is smaller than "
                                             r"the tokenizer's \(4096\)"):
            HttpFront(EngineBackend(engine, loop))
    finally:
        loop.close()


def test_the_sglang_stream_sends_only_new_text(front: HttpFront) -> None:
    ids = TOK.encode("I love C#")
    whole = _http.post(f"{front.url}/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 6}}).json()
    r = _http.post(f"{front.url}/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 6}, "stream": True})
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [i for c in chunks for i in c["output_ids"]] == whole["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}


def test_tokenize_detokenize_and_version(front: HttpFront) -> None:
    t = _http.post(f"{front.url}/tokenize", json={"prompt": "I love C#"}).json()
    assert t == {"tokens": TOK.encode("I love C#"), "count": 4, "max_model_len": 64 * 16}
    chat = _http.post(f"{front.url}/tokenize", json={
        "messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == TOK.chat([("user", "hi")])
    d = _http.post(f"{front.url}/detokenize", json={"tokens": t["tokens"]}).json()
    assert d == {"prompt": "I love C#"}
    bad = _http.post(f"{front.url}/detokenize", json={"tokens": [TOK.vocab_size]})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "tokens")
    assert isinstance(_http.get(f"{front.url}/version").json()["version"], str)
