"""Every request field is honoured or refused with a 400 naming it: stop strings and ids,
sampling (temperature, top-k, top-p, seed), logprobs, echo, and the refusals."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from radixcache.serving.http import HttpFront
from radixcache.traffic.tokenizer import shipped
from tests.helpers.http import MODEL, greedy, http_engine

TOK = shipped()
PROMPT = "I love C#"
_http = httpx.Client(timeout=60)


@pytest.fixture(scope="module")
def front() -> Iterator[HttpFront]:
    with http_engine(64) as f:
        yield f


@pytest.fixture(scope="module")
def client(front: HttpFront) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0)


def test_a_stop_string_cuts_the_answer_before_it(front: HttpFront,
                                                 client: openai.OpenAI) -> None:
    ids = greedy(front, TOK.encode(PROMPT), 8)
    whole = TOK.decode(ids)
    stop = TOK.decode(ids[3:5])  # text the answer reaches at its 5th token
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stop=[stop])
    assert r.choices[0].text == whole[: whole.find(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8,
                                              stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_a_stop_token_id_ends_the_answer_at_it(front: HttpFront) -> None:
    prompt = TOK.encode(PROMPT)
    ids = greedy(front, prompt, 8)
    stop = ids[4]
    cut = ids[: ids.index(stop) + 1]
    r = _http.post(f"{front.url}/generate", json={
        "input_ids": prompt, "sampling_params": {"max_new_tokens": 8,
                                                 "stop_token_ids": [stop]}}).json()
    assert r["output_ids"] == cut
    assert r["text"] == TOK.decode(cut[:-1])  # the stop token's text is not in the answer
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_sampling_is_seeded_and_greedy_by_default(front: HttpFront,
                                                  client: openai.OpenAI) -> None:
    def ask(**kw: object) -> str:
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, **kw)
        return r.choices[0].text or ""

    greedy_text = TOK.decode(greedy(front, TOK.encode(PROMPT), 6))
    assert ask() == ask(temperature=0) == greedy_text
    top1 = ask(temperature=1.0, seed=3, extra_body={"top_k": 1})
    assert top1 == greedy_text  # top-1: the argmax
    assert ask(temperature=1.0, top_p=1e-9, seed=3) == greedy_text  # only the likeliest
    hot = ask(temperature=2.0, seed=7)
    assert hot == ask(temperature=2.0, seed=7)
    assert hot != greedy_text != ask(temperature=2.0, seed=8)


def test_completion_logprobs_and_echo(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    assert lp.top_logprobs is not None and [len(t) for t in lp.top_logprobs] == [2] * 4
    for token, p, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == p == max(top.values()) < 0  # greedy: the likeliest token
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, echo=True)
    assert echoed.choices[0].text == PROMPT + r.choices[0].text


def test_chat_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, max_tokens=3, logprobs=True, top_logprobs=3,
                                       messages=[{"role": "user", "content": PROMPT}])
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 3
    assert "".join(c.token for c in content) == r.choices[0].message.content
    assert [len(c.top_logprobs) for c in content] == [3, 3, 3]
    assert all(c.logprob == c.top_logprobs[0].logprob for c in content)


def test_fields_at_their_no_op_values_are_accepted(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, n=1, best_of=1,
                                  presence_penalty=0, frequency_penalty=0, user="u-1")
    assert r.choices[0].finish_reason == "length"
    c = client.chat.completions.create(model=MODEL, max_tokens=2, tool_choice="none",
                                       response_format={"type": "text"},
                                       messages=[{"role": "user", "content": PROMPT}])
    assert c.usage is not None and c.usage.completion_tokens == 2


@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/completions", {"best_of": 2}, "best_of"),
    ("/v1/completions", {"suffix": "end"}, "suffix"),
    ("/v1/completions", {"n": 2}, "n"),
    ("/v1/completions", {"presence_penalty": 0.5}, "presence_penalty"),
    ("/v1/completions", {"frequency_penalty": 1}, "frequency_penalty"),
    ("/v1/completions", {"logit_bias": {"5": 10}}, "logit_bias"),
    ("/v1/completions", {"temperature": -1}, "temperature"),
    ("/v1/completions", {"temperature": 2.5}, "temperature"),
    ("/v1/completions", {"temperature": "hot"}, "temperature"),
    ("/v1/completions", {"top_p": 0}, "top_p"),
    ("/v1/completions", {"top_p": 1.5}, "top_p"),
    ("/v1/completions", {"top_k": -2}, "top_k"),
    ("/v1/completions", {"seed": -1}, "seed"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"echo": True, "logprobs": 1}, "echo"),
    ("/v1/completions", {"stop": ""}, "stop"),
    ("/v1/completions", {"stop": ["x"] * 17}, "stop"),
    ("/v1/completions", {"stop_token_ids": [10**6]}, "stop_token_ids"),
    ("/v1/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/completions", {"stream_options": {"continuous_usage_stats": True}}, "stream_options"),
    ("/v1/completions", {"frobnicate": 1}, "frobnicate"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, "messages"),
    ("/generate", {"sampling_params": {"max_new_tokens": 2, "min_p": 0.1}}, "min_p"),
    ("/generate", {"sampling_params": {"max_new_tokens": 2, "n": 2}}, "n"),
    ("/generate", {"return_hidden_states": True}, "return_hidden_states"),
])
def test_what_is_not_implemented_is_a_400_naming_it(front: HttpFront, path: str,
                                                    extra: dict[str, object],
                                                    param: str) -> None:
    base: dict[str, object] = {"model": MODEL, "max_tokens": 2}
    if path == "/v1/completions":
        base["prompt"] = PROMPT
    elif path == "/v1/chat/completions":
        base["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        base = {"text": PROMPT}
    r = _http.post(f"{front.url}{path}", json={**base, **extra})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param


def test_the_openai_client_sees_a_refusal_as_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, best_of=3)
    assert "'best_of' is not supported" in str(err.value)
