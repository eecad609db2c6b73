"""The request bodies the HTTP front accepts, without a web framework: every field is either
honoured or refused with a 400 that names it (never silently ignored).

Three dialects reach the same engine call (``prompt ids, max_new_tokens, policy``):

- OpenAI ``/v1/completions``: ``prompt`` as text or token ids, ``max_tokens`` (default 16);
- OpenAI ``/v1/chat/completions``: ``messages`` through the shipped tokenizer's chat template;
- SGLang ``/generate``: ``text`` or ``input_ids``, ``sampling_params``.

Honoured: ``temperature`` / ``top_p`` / ``top_k`` / ``seed`` (greedy when the temperature is 0
or absent, so the default stays deterministic), ``stop`` (strings) and ``stop_token_ids``,
``logprobs`` / ``top_logprobs`` (SGLang: ``return_logprob`` / ``top_logprobs_num``), ``echo``,
``stream`` with ``stream_options.include_usage`` and ``continuous_usage_stats`` (vLLM's: every
chunk carries the usage so far), ``ignore_eos`` (a checkpoint's answers end at its end of
sequence unless it is set; the seeded model has none), ``user`` and ``metadata`` (carried,
not used). Refused unless at their no-op value: the fields in ``_NOOP`` (``n``, ``best_of``,
``suffix``, ``response_format``, ``tools``, penalties, ...). Any other field: 400. Every refusal
is an ``ApiError`` that the front turns into OpenAI's error body with its status code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from radixcache.serving.sampling import Sampling
from radixcache.traffic.tokenizer import TextTokenizer

JsonObject = dict[str, object]
COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_DEFAULT_TOKENS = 64
MAX_LOGPROBS = 20
MAX_STOPS = 16
SEED_LIMIT = 1 << 63
# Text over context x this many characters is refused before it is encoded (the shipped
# tokenizer averages about 4 characters a token on ShareGPT; only text of mostly very long
# tokens, such as runs of spaces, could fit and still be refused).
CHARS_PER_TOKEN = 8


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


class Context(NamedTuple):
    """What parsing needs: the tokenizer, the ids a prompt may hold, the engine's context."""

    tok: TextTokenizer
    vocab: int
    max_context: int

    @property
    def max_chars(self) -> int:
        """The longest text encoded: longer is refused before encoding (``CHARS_PER_TOKEN``)."""
        return self.max_context * CHARS_PER_TOKEN


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
    sampling: Sampling = Sampling()
    echo: bool = False
    rid: str | None = None  # the client's request id (SGLang ``rid``), for /abort_request
    continuous_usage: bool = False  # every chunk carries the usage so far (vLLM's option)


# A field absent, null or at one of these values changes nothing; any other value is refused.
_NOOP: dict[str, tuple[object, ...]] = {
    "n": (1,), "best_of": (1,), "suffix": ("",), "response_format": ({"type": "text"},),
    "tools": ([],), "tool_choice": ("none", "auto"), "functions": ([],),
    "function_call": ("none", "auto"), "parallel_tool_calls": (True, False),
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0), "logit_bias": ({},), "min_tokens": (0,), "min_p": (0, 0.0),
    "store": (False,), "service_tier": ("auto", "default"), "modalities": (["text"],),
    "audio": (), "prediction": (), "reasoning_effort": (), "web_search_options": (),
    "include_stop_str_in_output": (False,), "skip_special_tokens": (True, False),
    "spaces_between_special_tokens": (True, False), "min_new_tokens": (0,),
    "json_schema": (), "regex": (), "ebnf": (), "logprob_start_len": (-1, 0),
    "return_text_in_logprobs": (True, False), "no_stop_trim": (False,),
    # what sglang-router 0.3.2 adds to every request it forwards, at its defaults
    "return_hidden_states": (False,), "continue_final_message": (False,),
    "separate_reasoning": (True, False), "stream_reasoning": (True, False),
    "log_metrics": (True, False), "background": (False,), "no_logs": (True, False),
    "return_bytes": (False,), "return_entropy": (False,),
}
_COMMON = frozenset({"model", "user", "metadata", "stream", "stream_options", "temperature",
                     "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos"})
_COMPLETION_FIELDS = _COMMON | {"prompt", "max_tokens", "logprobs", "echo"}
_CHAT_FIELDS = _COMMON | {"messages", "max_tokens", "max_completion_tokens", "logprobs",
                          "top_logprobs"}
_GENERATE_FIELDS = frozenset({"text", "input_ids", "sampling_params", "stream", "rid",
                              "return_logprob", "top_logprobs_num", "model"})
_SAMPLING_FIELDS = frozenset({"max_new_tokens", "temperature", "top_p", "top_k", "stop",
                              "stop_token_ids", "ignore_eos", "sampling_seed", "seed", "n"})


def _refuse_unknown(body: Mapping[str, object], known: frozenset[str], where: str) -> None:
    for name, value in body.items():
        if name in known or value is None:
            continue
        if name not in _NOOP:
            raise ApiError(400, f"unrecognized request argument '{name}'{where}", param=name)
        if value not in _NOOP[name]:
            raise ApiError(400, f"'{name}' is not supported{where} (only "
                           f"{' or '.join(map(repr, _NOOP[name])) or 'null'})", param=name)


def _get(body: Mapping[str, object], name: str, kind: type | tuple[type, ...],
         default: object = None) -> object:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ApiError(400, f"'{name}' must be of type {names}", param=name)
    return value


def _number(body: Mapping[str, object], name: str, default: float, low: float,
            high: float) -> float:
    value = float(_get(body, name, (int, float), default))  # type: ignore[arg-type]
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be in [{low}, {high}], got {value}", param=name)
    return value


def _int(body: Mapping[str, object], name: str, default: int, low: int, high: int) -> int:
    value = _get(body, name, int, default)
    assert isinstance(value, int)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be in [{low}, {high}], got {value}", param=name)
    return value


def _flag(body: Mapping[str, object], name: str) -> bool:
    return bool(_get(body, name, bool))


def _ids(value: object, name: str, vocab: int) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"'{name}' must be a non-empty list of token ids", param=name)
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
               for t in value):
        raise ApiError(400, f"'{name}' holds a token id outside [0, {vocab})", param=name)
    return list(value)


def _stops(body: Mapping[str, object], vocab: int) -> tuple[tuple[str, ...], frozenset[int]]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if (not isinstance(stops, list) or len(stops) > MAX_STOPS
            or not all(isinstance(s, str) and s for s in stops)):
        raise ApiError(400, f"'stop' must be a non-empty string or a list of at most "
                       f"{MAX_STOPS} of them", param="stop")
    ids = body.get("stop_token_ids")
    stop_ids = _ids(ids, "stop_token_ids", vocab) if ids not in (None, []) else []
    return tuple(str(s) for s in stops), frozenset(stop_ids)


def sampling(body: Mapping[str, object], vocab: int, logprobs: int | None,
             seed_field: str = "seed") -> Sampling:
    """The sampling fields shared by every dialect (``body`` is the top level for OpenAI,
    ``sampling_params`` for SGLang); ``vocab`` bounds stop token ids."""
    top_k = _int(body, "top_k", 0, -1, 1 << 30)
    seed = _get(body, seed_field, int, None)
    if seed is not None and not 0 <= seed < SEED_LIMIT:  # type: ignore[operator]
        raise ApiError(400, f"'{seed_field}' must be in [0, 2**63)", param=seed_field)
    stop, stop_ids = _stops(body, vocab)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise ApiError(400, "'top_p' must be in (0, 1]", param="top_p")
    return Sampling(_number(body, "temperature", 0.0, 0.0, 2.0), top_p, max(top_k, 0),
                    seed, logprobs, stop, stop_ids,  # type: ignore[arg-type]
                    _get(body, "ignore_eos", bool, default=False))  # type: ignore[arg-type]


def _encode(ctx: Context, text: str, name: str, encode: Callable[[str], list[int]]) -> list[int]:
    if len(text) > ctx.max_chars:
        raise ApiError(400, f"'{name}' holds {len(text)} characters: more than the "
                       f"{ctx.max_chars} the context can hold", param=name,
                       code="context_length_exceeded")
    try:
        return encode(text)
    except ValueError as exc:
        raise ApiError(400, f"'{name}': {exc}", param=name) from None


def _text(ctx: Context, value: str, name: str) -> list[int]:
    ids = _encode(ctx, value, name, ctx.tok.encode)
    if not ids:
        raise ApiError(400, f"'{name}' holds no tokens", param=name)
    return ids


def _prompt(value: object, ctx: Context) -> list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        return _text(ctx, value, "prompt")
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        raise ApiError(400, "batched prompts are not supported: send one prompt per request",
                       param="prompt")
    return _ids(value, "prompt", ctx.vocab)


class _Streaming(NamedTuple):
    stream: bool
    usage: bool  # the usage chunk at the end
    continuous: bool  # and the usage so far in every chunk (vLLM: only with ``usage``)


def _stream(body: Mapping[str, object]) -> _Streaming:
    stream = _flag(body, "stream")
    opts = _get(body, "stream_options", dict, {})
    assert isinstance(opts, dict)
    _refuse_unknown(opts, frozenset({"include_usage", "continuous_usage_stats"}),
                    " in 'stream_options'")
    usage, continuous = _flag(opts, "include_usage"), _flag(opts, "continuous_usage_stats")
    if (usage or continuous) and not stream:
        raise ApiError(400, "'stream_options' is only allowed with 'stream': true",
                       param="stream_options")
    return _Streaming(stream, usage, usage and continuous)


def parse_completion(body: Mapping[str, object], ctx: Context) -> Ask:
    """An OpenAI ``/v1/completions`` body. Raises ``ApiError``."""
    _refuse_unknown(body, _COMPLETION_FIELDS, "")
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required", param="prompt")
    prompt = _prompt(body["prompt"], ctx)
    n = _int(body, "max_tokens", COMPLETION_DEFAULT_TOKENS, 1, 1 << 31)
    logprobs = _get(body, "logprobs", int, None)
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:  # type: ignore[operator]
        raise ApiError(400, f"'logprobs' must be in [0, {MAX_LOGPROBS}]", param="logprobs")
    echo = _flag(body, "echo")
    if echo and logprobs is not None:
        raise ApiError(400, "'echo' with 'logprobs' is not supported (prompt logprobs)",
                       param="echo")
    st = _stream(body)
    return Ask(COMPLETION, prompt, n, st.stream, st.usage,
               sampling(body, ctx.tok.vocab_size, logprobs), echo,  # type: ignore[arg-type]
               continuous_usage=st.continuous)


def _content(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for p in value:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(
                    p.get("text"), str):
                raise ApiError(400, "only text content parts are supported", param="messages")
            parts.append(p["text"])
        return "".join(parts)
    raise ApiError(400, "each message needs a 'content' string", param="messages")


def _messages(value: object) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for m in value:
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user",
                                                            "assistant"):
            raise ApiError(400, "each message needs a 'role': system, developer, user or "
                           "assistant", param="messages")
        if set(m) - {"role", "content", "name"}:
            raise ApiError(400, f"message fields {sorted(set(m) - {'role', 'content', 'name'})}"
                           " are not supported", param="messages")
        out.append((str(m["role"]), _content(m.get("content"))))
    return out


def _chat(ctx: Context, messages: list[tuple[str, str]]) -> list[int]:
    try:
        return ctx.tok.chat(messages)
    except ValueError as exc:
        raise ApiError(400, f"'messages': {exc}", param="messages") from None


def parse_chat(body: Mapping[str, object], ctx: Context) -> Ask:
    """An OpenAI ``/v1/chat/completions`` body. Raises ``ApiError``."""
    _refuse_unknown(body, _CHAT_FIELDS, "")
    messages = _messages(body.get("messages"))
    chars = sum(len(c) for _, c in messages)
    if chars > ctx.max_chars:
        raise ApiError(400, f"'messages' hold {chars} characters: more than the "
                       f"{ctx.max_chars} the context can hold", param="messages",
                       code="context_length_exceeded")
    prompt = _chat(ctx, messages)
    default = _int(body, "max_tokens", CHAT_DEFAULT_TOKENS, 1, 1 << 31)
    n = _int(body, "max_completion_tokens", default, 1, 1 << 31)
    top = _int(body, "top_logprobs", 0, 0, MAX_LOGPROBS)
    logprobs = top if _flag(body, "logprobs") else None
    if top and logprobs is None:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    st = _stream(body)
    return Ask(CHAT, prompt, n, st.stream, st.usage, sampling(body, ctx.tok.vocab_size, logprobs),
               continuous_usage=st.continuous)


def parse_generate(body: Mapping[str, object], ctx: Context) -> Ask:
    """An SGLang ``/generate`` body (``text`` or ``input_ids``). Raises ``ApiError``."""
    _refuse_unknown(body, _GENERATE_FIELDS, "")
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
        raise ApiError(400, "batched /generate (a list of texts or of id lists) is not "
                       "supported: send one request per prompt", param="text")
    if (text is None) == (ids is None):
        raise ApiError(400, "exactly one of 'text' or 'input_ids' is required", param="text")
    if text is not None and not isinstance(text, str):
        raise ApiError(400, "'text' must be a string", param="text")
    prompt = _text(ctx, text, "text") if isinstance(text, str) else _ids(
        ids, "input_ids", ctx.vocab)
    params = _get(body, "sampling_params", dict, {})
    assert isinstance(params, dict)
    _refuse_unknown(params, _SAMPLING_FIELDS, " in 'sampling_params'")
    if params.get("n") not in (None, 1):
        raise ApiError(400, "only n=1 is supported", param="n")
    top = _int(body, "top_logprobs_num", 0, 0, MAX_LOGPROBS)
    logprobs = top if _flag(body, "return_logprob") else None
    rid = _get(body, "rid", str)
    assert rid is None or isinstance(rid, str)
    seed = "sampling_seed" if "sampling_seed" in params else "seed"
    return Ask(GENERATE, prompt, _int(params, "max_new_tokens", 128, 1, 1 << 31),
               _flag(body, "stream"), include_usage=False, rid=rid,
               sampling=sampling(params, ctx.tok.vocab_size, logprobs, seed))


Parser = Callable[[Mapping[str, object], Context], Ask]


def tokenize(body: Mapping[str, object], ctx: Context) -> JsonObject:
    """``/tokenize``: ``prompt`` (or SGLang's ``text``) -> ``tokens``, ``count``,
    ``max_model_len``; ``messages`` go through the chat template."""
    _refuse_unknown(body, frozenset({"model", "prompt", "text", "messages",
                                     "add_special_tokens", "add_generation_prompt"}), "")
    if "messages" in body:
        ids = _chat(ctx, _messages(body["messages"]))
    else:
        text = body.get("prompt", body.get("text"))
        if not isinstance(text, str):
            raise ApiError(400, "'prompt' must be a string", param="prompt")
        ids = _encode(ctx, text, "prompt", ctx.tok.encode)
    return {"tokens": ids, "count": len(ids), "max_model_len": ctx.max_context}


def detokenize(body: Mapping[str, object], ctx: Context) -> JsonObject:
    """``/detokenize``: ``tokens`` -> ``prompt`` (the tokenizer's ids only)."""
    _refuse_unknown(body, frozenset({"model", "tokens"}), "")
    return {"prompt": ctx.tok.decode(_ids(body.get("tokens"), "tokens", ctx.tok.vocab_size))}
