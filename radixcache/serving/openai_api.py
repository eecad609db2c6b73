"""Parsing a request body into what the engine runs: every field is either honoured or
refused with a 400 that names it (never silently ignored).

Three dialects reach the same engine call (``prompt ids, max_new_tokens, policy``):

- OpenAI ``/v1/completions``: ``prompt`` as text or token ids, ``max_tokens``;
- OpenAI ``/v1/chat/completions``: ``messages`` through the shipped tokenizer's chat template;

Without ``max_tokens`` (``max_completion_tokens``) an OpenAI request runs to the context's end
or its end of sequence, as OpenAI's and vLLM's do, when the model has one (a checkpoint); the
seeded model never ends an answer, so there the defaults stay finite: 16 for completions
(OpenAI's legacy default), 64 for chat. ``/generate`` keeps SGLang's 128.
- SGLang ``/generate``: ``text`` or ``input_ids``, ``sampling_params``.

A body's bytes are decoded into its typed ``openai_bodies`` struct (``decode``): a field of the
wrong type or range is a 400 whose message and ``param`` name it. Then what types cannot say is
checked here. Honoured: ``temperature`` / ``top_p`` / ``top_k`` / ``seed`` (greedy when the
temperature is under ``GREEDY_BELOW`` or absent, so the default stays deterministic), ``stop``
(strings) and ``stop_token_ids``, ``logprobs`` / ``top_logprobs`` (SGLang: ``return_logprob``
/ ``top_logprobs_num``), ``echo``, ``stream`` with ``stream_options.include_usage`` and
``continuous_usage_stats`` (vLLM's: every chunk carries the usage so far), ``ignore_eos`` (a
checkpoint's answers end at its end of sequence unless it is set; the seeded model has none),
``split_special_tokens`` (a prompt's marker text as plain text; chat messages always are),
``user`` and ``metadata`` (carried, not used). Refused unless at their no-op value: the fields
in ``NOOP`` (``n``, ``best_of``, ``suffix``, ``response_format``, ``tools``, penalties, ...).
Any other field: 400. Every refusal is an ``ApiError`` that the front turns into OpenAI's
error body with its status code."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

import msgspec

from radixcache.serving import openai_bodies as b
from radixcache.serving.sampling import GREEDY_BELOW, Sampling
from radixcache.traffic.tokenizer import TextTokenizer

JsonObject = dict[str, object]
COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's legacy default (a model that never ends only)
CHAT_DEFAULT_TOKENS = 64  # (a model that never ends only: see the module doc)
GENERATE_DEFAULT_TOKENS = 128  # SGLang's default max_new_tokens
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
    """What parsing needs: the tokenizer, the ids a prompt may hold, the engine's context, and
    whether the model ends its answers (an end of sequence: see the module doc's defaults)."""

    tok: TextTokenizer
    vocab: int
    max_context: int
    ends: bool = False

    def default_tokens(self, prompt: Sequence[int], finite: int) -> int:
        """An OpenAI request's ``max_tokens`` when it gives none: the rest of the context
        when the model ends its answers, else ``finite``."""
        return max(1, self.max_context - len(prompt) + 1) if self.ends else finite

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
    model: str | None = None  # the model the client named (OpenAI dialects: checked)


# -- decoding: bytes -> a typed body, or the ApiError naming the field -------------------------
_B = TypeVar("_B", bound=msgspec.Struct)
_AT = re.compile(r"^(?P<detail>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_LONE_HIGH = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])")
_NESTED = frozenset({"sampling_params", "stream_options"})  # param: the field inside them
# one decoder per body (built once: a decoder compiles its type)
_COMPLETION, _CHAT = msgspec.json.Decoder(b.CompletionBody), msgspec.json.Decoder(b.ChatBody)
_GENERATE = msgspec.json.Decoder(b.GenerateBody)
_TOKENIZE = msgspec.json.Decoder(b.TokenizeBody)
_DETOKENIZE = msgspec.json.Decoder(b.DetokenizeBody)
_ABORT = msgspec.json.Decoder(b.AbortBody)


def decode(raw: bytes, decoder: msgspec.json.Decoder[_B]) -> _B:
    """``raw`` (a request body) decoded into its struct; a 400 naming the field for anything
    else."""
    try:
        body = _decode(raw, decoder)
    except msgspec.ValidationError as exc:
        raise _refusal(str(exc)) from None
    except (msgspec.DecodeError, RecursionError) as exc:  # JSON, UTF-8, nesting depth
        why = str(exc)[:200]
        if _LONE_HIGH.search(raw):  # msgspec says "Input data was truncated"
            why = "a string holds a lone UTF-16 surrogate escape"
        raise ApiError(400, f"body is not valid JSON: {why}") from None
    _refuse_noops(body, "")
    return body


_RAW_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _decode(raw: bytes, decoder: msgspec.json.Decoder[_B]) -> _B:
    """``decoder.decode(raw)``; a field at null is absent, even one this front does not know
    (as before the typed bodies): what some clients send for every option they leave unset."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        at = _AT.match(str(exc))
        lean = _without_nulls(raw) if at and _UNKNOWN.match(at["detail"]) else None
        if lean is None:
            raise
        return decoder.decode(lean)


def _without_nulls(raw: bytes) -> bytes | None:
    """``raw`` (an object) without its fields at null, nor those of ``sampling_params`` and
    ``stream_options``; None when it drops nothing."""
    def lean(fields: dict[str, msgspec.Raw]) -> dict[str, msgspec.Raw]:
        return {k: v for k, v in fields.items() if bytes(v) != b"null"}
    fields = _RAW_FIELDS.decode(raw)
    out = lean(fields)
    for name in _NESTED & set(out):
        with contextlib.suppress(msgspec.DecodeError):  # not an object: left to the decoder
            out[name] = msgspec.Raw(msgspec.json.encode(lean(_RAW_FIELDS.decode(out[name]))))
    lean_raw = msgspec.json.encode(out)
    return None if lean_raw == msgspec.json.encode(fields) else lean_raw


def _refusal(text: str) -> ApiError:
    """msgspec's ``"Expected `int`, got `str` - at `$.max_tokens`"`` as an ``ApiError`` whose
    message names the field (``'max_tokens': Expected ...``) and whose ``param`` is it (a
    message's field: ``messages``; inside ``sampling_params`` or ``stream_options``: the
    inner name)."""
    m = _AT.match(text)
    detail, path = (m["detail"], m["path"] or "") if m else (text, "")
    names = [name or f"[{index}]" for name, index in _STEP.findall(path)]
    unknown = _UNKNOWN.match(detail)
    if unknown:
        where = f" in '{names[-1]}'" if names else ""
        name = unknown["name"]
        return ApiError(400, f"unrecognized request argument '{name}'{where}",
                        param=name if not names or names[0] in _NESTED else names[0])
    if not names:
        return ApiError(400, f"body: {detail}")
    param = names[1] if names[0] in _NESTED and len(names) > 1 else names[0]
    return ApiError(400, f"'{''.join(n if n[0] == '[' else '.' + n for n in names)[1:]}': "
                    f"{detail}", param=param)


def _refuse_noops(body: msgspec.Struct, where: str) -> None:
    """Each ``NOOP`` field set in ``body`` holds one of its no-op values (same type)."""
    if not isinstance(body, b.NoOps):
        return
    for name, choices in b.NOOP.items():
        value = getattr(body, name)
        if value is None or any(type(value) is type(c) and value == c for c in choices):
            continue
        only = " or ".join(map(repr, choices)) or "null"
        raise ApiError(400, f"'{name}' is not supported{where} (only {only})", param=name)


def _ids(value: Sequence[object] | None, name: str, vocab: int) -> list[int]:
    if not value:
        raise ApiError(400, f"'{name}' must be a non-empty list of token ids", param=name)
    ids: list[int] = []
    for t in value:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
            raise ApiError(400, f"'{name}' holds a token id outside [0, {vocab})", param=name)
        ids.append(t)
    return ids


def sampling(body: b.SamplingFields, vocab: int, logprobs: int | None,
             seed: int | None) -> Sampling:
    """The sampling fields shared by every dialect (``body`` is the top level for OpenAI,
    ``sampling_params`` for SGLang); ``vocab`` bounds stop token ids. A temperature under
    ``GREEDY_BELOW`` (1e-5) is greedy: the limit of sampling as the temperature falls, and
    what vLLM does under its ``_SAMPLING_EPS``; any ``top_p`` in (0, 1] keeps at least the
    likeliest token, so a ``top_p`` as small as 1e-320 is the argmax."""
    stop = body.stop if body.stop is not None else []
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    ids = body.stop_token_ids
    stop_ids = frozenset(_ids(ids, "stop_token_ids", vocab)) if ids else frozenset[int]()
    temperature = body.temperature or 0.0
    return Sampling(temperature if temperature >= GREEDY_BELOW else 0.0,
                    body.top_p if body.top_p is not None else 1.0, max(body.top_k or 0, 0),
                    seed, logprobs, stops, stop_ids, bool(body.ignore_eos))


def _encode(ctx: Context, text: str, name: str, encode: Callable[[str], list[int]]) -> list[int]:
    if len(text) > ctx.max_chars:
        raise ApiError(400, f"'{name}' holds {len(text)} characters: more than the "
                       f"{ctx.max_chars} the context can hold", param=name,
                       code="context_length_exceeded")
    try:
        return encode(text)
    except ValueError as exc:
        raise ApiError(400, f"'{name}': {exc}", param=name) from None


def _text(ctx: Context, value: str, name: str, *, split_special: bool | None) -> list[int]:
    """``value`` encoded; its marker text (``<bos>``, ``<hdr>``, ...) as the control tokens
    unless ``split_special`` (HF's ``split_special_tokens``), then as plain text."""
    encode = ctx.tok.encode_plain if split_special else ctx.tok.encode
    ids = _encode(ctx, value, name, encode)
    if not ids:
        raise ApiError(400, f"'{name}' holds no tokens", param=name)
    return ids


def _prompt(body: b.CompletionBody, ctx: Context) -> list[int]:
    if body.prompt is None:
        raise ApiError(400, "'prompt' is required", param="prompt")
    value: str | Sequence[object] = body.prompt
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        return _text(ctx, value, "prompt", split_special=body.split_special_tokens)
    if value and isinstance(value[0], str | list):
        raise ApiError(400, "batched prompts are not supported: send one prompt per request",
                       param="prompt")
    return _ids(value, "prompt", ctx.vocab)


class _Streaming(NamedTuple):
    stream: bool
    usage: bool  # the usage chunk at the end
    continuous: bool  # and the usage so far in every chunk (vLLM: only with ``usage``)


def _stream(body: b.OpenAIFields) -> _Streaming:
    stream, opts = body.stream, body.stream_options
    usage = bool(opts and opts.include_usage)
    continuous = bool(opts and opts.continuous_usage_stats)
    if (usage or continuous) and not stream:
        raise ApiError(400, "'stream_options' is only allowed with 'stream': true",
                       param="stream_options")
    return _Streaming(bool(stream), usage, usage and continuous)


def parse_completion(raw: bytes, ctx: Context) -> Ask:
    """An OpenAI ``/v1/completions`` body. Raises ``ApiError``."""
    body = decode(raw, _COMPLETION)
    prompt = _prompt(body, ctx)
    if body.echo and body.logprobs is not None:
        raise ApiError(400, "'echo' with 'logprobs' is not supported (prompt logprobs)",
                       param="echo")
    st = _stream(body)
    n = body.max_tokens or ctx.default_tokens(prompt, COMPLETION_DEFAULT_TOKENS)
    return Ask(COMPLETION, prompt, n, st.stream,
               st.usage, sampling(body, ctx.tok.vocab_size, body.logprobs, body.seed),
               bool(body.echo), continuous_usage=st.continuous, model=body.model)


def _messages(messages: Sequence[b.Message]) -> list[tuple[str, str]]:
    return [(m.role, m.content if isinstance(m.content, str) else
             "".join(p.text for p in m.content)) for m in messages]


def _chat(ctx: Context, messages: Sequence[b.Message] | None) -> list[int]:
    """The chat template over ``messages``: their text is encoded as plain text (a message
    cannot forge a turn with marker text)."""
    if messages is None:
        raise ApiError(400, "'messages' is required", param="messages")
    pairs = _messages(messages)
    chars = sum(len(c) for _, c in pairs)
    if chars > ctx.max_chars:
        raise ApiError(400, f"'messages' hold {chars} characters: more than the "
                       f"{ctx.max_chars} the context can hold", param="messages",
                       code="context_length_exceeded")
    try:
        return ctx.tok.chat(pairs)
    except ValueError as exc:
        raise ApiError(400, f"'messages': {exc}", param="messages") from None


def parse_chat(raw: bytes, ctx: Context) -> Ask:
    """An OpenAI ``/v1/chat/completions`` body. Raises ``ApiError``."""
    body = decode(raw, _CHAT)
    prompt = _chat(ctx, body.messages)
    n = (body.max_completion_tokens or body.max_tokens
         or ctx.default_tokens(prompt, CHAT_DEFAULT_TOKENS))
    top = body.top_logprobs or 0
    logprobs = top if body.logprobs else None
    if top and logprobs is None:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    st = _stream(body)
    return Ask(CHAT, prompt, n, st.stream, st.usage,
               sampling(body, ctx.tok.vocab_size, logprobs, body.seed),
               continuous_usage=st.continuous, model=body.model)


def _generate_prompt(body: b.GenerateBody, ctx: Context) -> list[int]:
    text, ids = body.text, body.input_ids
    if isinstance(text, list) or (ids and isinstance(ids[0], list)):
        raise ApiError(400, "batched /generate (a list of texts or of id lists) is not "
                       "supported: send one request per prompt", param="text")
    if (text is None) == (ids is None):
        raise ApiError(400, "exactly one of 'text' or 'input_ids' is required", param="text")
    if text is not None:
        return _text(ctx, text, "text", split_special=body.split_special_tokens)
    return _ids(ids, "input_ids", ctx.vocab)


def parse_generate(raw: bytes, ctx: Context) -> Ask:
    """An SGLang ``/generate`` body (``text`` or ``input_ids``). Raises ``ApiError``."""
    body = decode(raw, _GENERATE)
    prompt = _generate_prompt(body, ctx)
    params = body.sampling_params or b.SamplingParams()
    _refuse_noops(params, " in 'sampling_params'")
    top = body.top_logprobs_num or 0
    logprobs = top if body.return_logprob else None
    seed = params.sampling_seed if params.sampling_seed is not None else params.seed
    return Ask(GENERATE, prompt, params.max_new_tokens or GENERATE_DEFAULT_TOKENS,
               bool(body.stream), include_usage=False, rid=body.rid, model=body.model,
               sampling=sampling(params, ctx.tok.vocab_size, logprobs, seed))


Parser = Callable[[bytes, Context], Ask]


def tokenize(raw: bytes, ctx: Context) -> JsonObject:
    """``/tokenize``: ``prompt`` (or SGLang's ``text``) -> ``tokens``, ``count``,
    ``max_model_len``; ``messages`` go through the chat template."""
    body = decode(raw, _TOKENIZE)
    if body.messages is not None:
        ids = _chat(ctx, body.messages)
    else:
        text = body.prompt if body.prompt is not None else body.text
        if text is None:
            raise ApiError(400, "'prompt' is required", param="prompt")
        encode = ctx.tok.encode_plain if body.split_special_tokens else ctx.tok.encode
        ids = _encode(ctx, text, "prompt", encode)
    return {"tokens": ids, "count": len(ids), "max_model_len": ctx.max_context}


def detokenize(raw: bytes, ctx: Context) -> JsonObject:
    """``/detokenize``: ``tokens`` -> ``prompt`` (the tokenizer's ids only)."""
    body = decode(raw, _DETOKENIZE)
    return {"prompt": ctx.tok.decode(_ids(body.tokens, "tokens", ctx.tok.vocab_size))}


def abort_rid(raw: bytes) -> str:
    """``/abort_request``'s ``rid``."""
    return decode(raw, _ABORT).rid
