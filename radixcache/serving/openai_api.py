"""The request bodies the HTTP front accepts and the bodies it answers, without a web framework.

Three dialects reach the same engine call (``prompt ids, max_new_tokens``):

- OpenAI ``/v1/completions``: ``prompt`` as text or token ids, ``max_tokens`` (default 16);
- OpenAI ``/v1/chat/completions``: ``messages`` through the workloads' chat template;
- SGLang ``/generate``: ``text`` or ``input_ids``, ``sampling_params.max_new_tokens``.

Decoding is greedy whatever ``temperature`` says (the tiny model has random weights; sampling
would only hide the cache's reuse). Only one choice per request (``n`` = 1). Every refusal is an
``ApiError`` that the front turns into OpenAI's error body with its status code.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from radixcache.traffic.chattext import TextCodec, chat_prompt

JsonObject = dict[str, object]
COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_DEFAULT_TOKENS = 64


class ApiError(Exception):
    """A refused request: HTTP ``status`` and OpenAI's error ``type`` / ``param`` / ``code``."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (
            status, message, kind, param, code)

    def body(self) -> JsonObject:
        """OpenAI's error body."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


class Dialect(NamedTuple):
    """Which API a request came through: names its response shapes."""

    name: str  # "completion", "chat" or "generate"


COMPLETION, CHAT, GENERATE = Dialect("completion"), Dialect("chat"), Dialect("generate")


class Ask(NamedTuple):
    """One parsed request: what the engine runs and how to answer."""

    dialect: Dialect
    prompt: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool


def _field(body: Mapping[str, object], name: str, kind: type, default: object) -> object:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ApiError(400, f"'{name}' must be of type {kind.__name__}", param=name)
    return value


def _max_tokens(value: object, name: str) -> int:
    assert isinstance(value, int)
    if value < 1:
        raise ApiError(400, f"'{name}' must be >= 1, got {value}", param=name)
    return value


def _ids(value: object, name: str, vocab: int) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"'{name}' must be a non-empty list of token ids", param=name)
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
               for t in value):
        raise ApiError(400, f"'{name}' holds a token id outside [0, {vocab})", param=name)
    return list(value)


def _text(value: str, name: str, codec: TextCodec) -> list[int]:
    try:
        ids = codec.encode(value)
    except ValueError as exc:
        raise ApiError(400, f"'{name}': {exc}", param=name) from None
    if not ids:
        raise ApiError(400, f"'{name}' holds no tokens", param=name)
    return ids


def _prompt(value: object, codec: TextCodec, vocab: int) -> list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        return _text(value, "prompt", codec)
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        raise ApiError(400, "batched prompts are not supported: send one prompt per request",
                       param="prompt")
    return _ids(value, "prompt", vocab)


def _flag(body: Mapping[str, object], name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be a boolean", param=name)
    return bool(value)


def _stream_options(body: Mapping[str, object]) -> bool:
    opts = _field(body, "stream_options", dict, {})
    assert isinstance(opts, dict)
    return bool(opts.get("include_usage", False))


def _one_choice(body: Mapping[str, object]) -> None:
    n = _field(body, "n", int, 1)
    if n != 1:
        raise ApiError(400, f"only n=1 is supported, got {n}", param="n")


def parse_completion(body: Mapping[str, object], codec: TextCodec, vocab: int) -> Ask:
    """An OpenAI ``/v1/completions`` body. Raises ``ApiError``."""
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required", param="prompt")
    _one_choice(body)
    prompt = _prompt(body["prompt"], codec, vocab)
    n = _max_tokens(_field(body, "max_tokens", int, COMPLETION_DEFAULT_TOKENS), "max_tokens")
    return Ask(COMPLETION, prompt, n, _flag(body, "stream"), _stream_options(body))


def _messages(value: object) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, "each message needs a 'role' string", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise ApiError(400, "each message needs a 'content' string", param="messages")
        out.append((m["role"], content))
    return out


def parse_chat(body: Mapping[str, object], codec: TextCodec) -> Ask:
    """An OpenAI ``/v1/chat/completions`` body. Raises ``ApiError``."""
    _one_choice(body)
    try:
        prompt = chat_prompt(_messages(body.get("messages")), codec)
    except ValueError as exc:
        raise ApiError(400, f"'messages': {exc}", param="messages") from None
    default = _field(body, "max_tokens", int, CHAT_DEFAULT_TOKENS)
    n = _max_tokens(_field(body, "max_completion_tokens", int, default), "max_tokens")
    return Ask(CHAT, prompt, n, _flag(body, "stream"), _stream_options(body))


def parse_generate(body: Mapping[str, object], codec: TextCodec, vocab: int) -> Ask:
    """An SGLang ``/generate`` body (``text`` or ``input_ids``). Raises ``ApiError``."""
    if isinstance(body.get("text"), str):
        prompt = _text(str(body["text"]), "text", codec)
    elif "input_ids" in body:
        prompt = _ids(body["input_ids"], "input_ids", vocab)
    else:
        raise ApiError(400, "one of 'text' or 'input_ids' is required", param="text")
    params = _field(body, "sampling_params", dict, {})
    assert isinstance(params, dict)
    n = _max_tokens(_field(params, "max_new_tokens", int, 128), "max_new_tokens")
    return Ask(GENERATE, prompt, n, _flag(body, "stream"), include_usage=False)


class Outcome(NamedTuple):
    """What the engine did for one request."""

    rid: str
    prompt_tokens: int
    cached_tokens: int
    output: Sequence[int]
    text: str


def usage(o: Outcome) -> JsonObject:
    """OpenAI's usage block (``prompt_tokens_details.cached_tokens``: the prefix-cache hit)."""
    n = len(o.output)
    return {"prompt_tokens": o.prompt_tokens, "completion_tokens": n,
            "total_tokens": o.prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": o.cached_tokens}}


def response(ask: Ask, o: Outcome, model: str) -> JsonObject:
    """The whole (non-streamed) answer in ``ask``'s dialect."""
    if ask.dialect is GENERATE:
        return {"text": o.text, "output_ids": list(o.output), "meta_info": meta_info(o)}
    head = _head(ask, o.rid, model)
    if ask.dialect is CHAT:
        message = {"role": "assistant", "content": o.text}
        choice: JsonObject = {"index": 0, "message": message, "finish_reason": "length"}
    else:
        choice = {"index": 0, "text": o.text, "logprobs": None, "finish_reason": "length"}
    return {**head, "choices": [choice], "usage": usage(o)}


def meta_info(o: Outcome) -> JsonObject:
    """SGLang's ``meta_info``."""
    n = len(o.output)
    return {"id": o.rid, "prompt_tokens": o.prompt_tokens, "completion_tokens": n,
            "cached_tokens": o.cached_tokens,
            "finish_reason": {"type": "length", "length": n}}


def _head(ask: Ask, rid: str, model: str) -> JsonObject:
    kind = "chat.completion" if ask.dialect is CHAT else "text_completion"
    if ask.stream and ask.dialect is CHAT:
        kind = "chat.completion.chunk"
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model}


def chunk(ask: Ask, rid: str, model: str, delta: str, reason: str | None) -> JsonObject:
    """One streamed piece of text (OpenAI dialects); the last one carries ``reason``."""
    if ask.dialect is CHAT:
        choice: JsonObject = {"index": 0, "delta": {"content": delta}, "finish_reason": reason}
    else:
        choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason}
    return {**_head(ask, rid, model), "choices": [choice]}


def usage_chunk(ask: Ask, o: Outcome, model: str) -> JsonObject:
    """The final usage-only chunk sent when ``stream_options.include_usage`` is set."""
    return {**_head(ask, o.rid, model), "choices": [], "usage": usage(o)}
