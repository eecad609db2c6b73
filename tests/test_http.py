"""The HTTP front over a real engine on 127.0.0.1: the official openai client, plain HTTP,
SGLang's /generate, the errors, /metrics; and `serve --http` as a process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from radixcache.serving.engine import Engine, EngineConfig
from radixcache.serving.http import EngineBackend, HttpFront
from radixcache.serving.loop import BatchSink, ServiceLoop
from radixcache.serving.model import tiny_model
from radixcache.traffic.chattext import TextCodec, chat_prompt
from radixcache.traffic.sharegpt import BOS, EOT, HDR, HDR_END, ROLE_GPT, ROLE_HUMAN, word_id

MODEL = "radixcache-tiny"
PROMPT = "the cache keeps every prefix it has seen"
ROOT = Path(__file__).resolve().parents[1]

# one client with a generous timeout: a loaded 2-core machine answers slowly
_http = httpx.Client(timeout=60)


@contextmanager
def http_engine(blocks: int) -> Iterator[HttpFront]:
    """An engine stepped by a ``ServiceLoop`` (its batches dropped) behind an HTTP front."""
    engine = Engine(EngineConfig(num_blocks=blocks, model=tiny_model()))
    loop = ServiceLoop(engine, BatchSink(lambda _batch: None)).start()
    f = HttpFront(EngineBackend(engine, loop)).start()
    try:
        yield f
    finally:
        f.close()
        loop.close()


@pytest.fixture(scope="module")
def front() -> Iterator[HttpFront]:
    with http_engine(64) as f:
        yield f


@pytest.fixture(scope="module")
def client(front: HttpFront) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0)


def greedy(front: HttpFront, ids: list[int], n: int) -> list[int]:
    """What the engine itself answers to ``ids`` (the model is deterministic)."""
    return front.backend.submit(ids, n, None).result(30).tokens


def test_completion_text_round_trips_through_the_tokenizer(front: HttpFront,
                                                          client: openai.OpenAI) -> None:
    ids = TextCodec().encode(PROMPT)
    assert ids == [word_id(w) for w in PROMPT.split()]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5)
    expected = greedy(front, ids, 5)
    assert TextCodec().encode(r.choices[0].text) == expected
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
    assert len(texts) == 7  # one per token, then the empty one with the finish reason
    assert "".join(texts) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-2:] == [None, "length"]
    assert chunks[-1].usage.completion_tokens == 6
    assert TextCodec().encode(whole.choices[0].text) == greedy(front, ids, 6)


def test_chat_goes_through_the_workloads_template(front: HttpFront,
                                                  client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=3)
    layout = [BOS, HDR, ROLE_HUMAN, HDR_END, word_id("hello"), word_id("there"), EOT,
              HDR, ROLE_GPT, HDR_END]
    assert chat_prompt([("user", "hello there")], TextCodec()) == layout
    assert r.usage.prompt_tokens == len(layout)
    assert TextCodec().encode(r.choices[0].message.content or "") == greedy(front, layout, 3)
    streamed = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=3,
        stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed)
    assert text == r.choices[0].message.content


def test_sglang_generate_with_ids_and_text(front: HttpFront) -> None:
    body = {"input_ids": [3, 4, 5, 6], "sampling_params": {"max_new_tokens": 4}}
    r = _http.post(f"{front.url}/generate", json=body).json()
    assert r["output_ids"] == greedy(front, [3, 4, 5, 6], 4)
    assert r["meta_info"]["prompt_tokens"] == 4
    assert r["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    t = _http.post(f"{front.url}/generate", json={"text": "#3 #4 #5 #6", "sampling_params":
                                                  {"max_new_tokens": 4}}).json()
    assert t["output_ids"] == r["output_ids"]


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/v1/completions", {"model": "gpt-9", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 10**6]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
    ("/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/generate", {"sampling_params": {}}, 400, "text"),
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
    assert _http.get(f"{front.url}/model_info").json()["model_path"] == MODEL
    models = _http.get(f"{front.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == 64 * 16
    info = _http.get(f"{front.url}/server_info").json()
    assert info["num_blocks"] == 64


def test_metrics_are_the_engines_counters() -> None:
    with http_engine(64) as f:
        for _ in range(2):
            _http.post(f"{f.url}/v1/completions",
                       json={"model": MODEL, "prompt": [5, 6, 7, 8, 9], "max_tokens": 3})
        text = _http.get(f"{f.url}/metrics").text
    values = {line.split(" ")[0]: line.split(" ")[1] for line in text.splitlines()
              if not line.startswith("#")}
    labels = '{model_name="radixcache-tiny"}'
    assert values[f"vllm:prefix_cache_queries_total{labels}"] == "10"
    assert values[f"vllm:prefix_cache_hits_total{labels}"] == "4"
    assert values[f"vllm:request_success_total{labels}"] == "2"
    assert values[f"vllm:generation_tokens_total{labels}"] == "6"
    assert values[f"sglang:cache_hit_rate{labels}"] == "0.4"
    assert values['vllm:time_to_first_token_seconds_count{model_name="radixcache-tiny"}'] == "2"
    assert values['vllm:time_to_first_token_seconds_bucket{model_name="radixcache-tiny",'
                  'le="+Inf"}'] == "2"


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
