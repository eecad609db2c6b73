"""The bodies the HTTP front answers: OpenAI's completion, chat and chunk shapes, SGLang's
``/generate`` results, usage and logprobs. Pure functions of the parsed ``Ask`` and the
request's ``Outcome``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from radixcache.serving.openai_api import CHAT, GENERATE, Ask, JsonObject
from radixcache.serving.sampling import TokenLogprob
from radixcache.traffic.tokenizer import TextTokenizer


class Outcome(NamedTuple):
    """What the engine did for one request."""

    rid: str
    prompt_tokens: int
    cached_tokens: int
    output: Sequence[int]
    text: str  # the answer, cut at a stop string; the prompt first when echoed
    stopped: str | int | None  # the stop string or id that ended it; None: its length did
    logprobs: Sequence[TokenLogprob]

    @property
    def finish_reason(self) -> str:
        """OpenAI's ``finish_reason``."""
        return "length" if self.stopped is None else "stop"


def usage(o: Outcome) -> JsonObject:
    """OpenAI's usage block (``prompt_tokens_details.cached_tokens``: the prefix-cache hit)."""
    return {**usage_so_far(o.prompt_tokens, len(o.output)),
            "prompt_tokens_details": {"cached_tokens": o.cached_tokens}}


def completion_logprobs(entries: Sequence[TokenLogprob], tok: TextTokenizer,
                        offset: int) -> JsonObject | None:
    """``/v1/completions``' logprobs block (``text_offset`` from ``offset`` characters)."""
    if not entries:
        return None
    tokens = [tok.decode([e.token]) for e in entries]
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{tok.decode([i]): p for i, p in e.top} for e in entries],
            "text_offset": offsets}


def _one(token: int, logprob: float, tok: TextTokenizer) -> JsonObject:
    text = tok.decode([token])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def chat_logprobs(entries: Sequence[TokenLogprob], tok: TextTokenizer) -> JsonObject:
    """Chat's ``logprobs.content`` list."""
    return {"content": [{**_one(e.token, e.logprob, tok),
                         "top_logprobs": [_one(i, p, tok) for i, p in e.top]}
                        for e in entries]}


def response(ask: Ask, o: Outcome, model: str, tok: TextTokenizer) -> JsonObject:
    """The whole (non-streamed) answer in ``ask``'s dialect."""
    if ask.dialect is GENERATE:
        return generate_result(o, o.text, list(o.output), tok, ask)
    head = _head(ask, o.rid, model)
    wants = ask.sampling.logprobs is not None
    if ask.dialect is CHAT:
        message = {"role": "assistant", "content": o.text}
        choice: JsonObject = {"index": 0, "message": message,
                              "logprobs": chat_logprobs(o.logprobs, tok) if wants else None,
                              "finish_reason": o.finish_reason}
    else:
        lp = completion_logprobs(o.logprobs, tok, 0) if wants else None
        choice = {"index": 0, "text": o.text, "logprobs": lp, "finish_reason": o.finish_reason}
    return {**head, "choices": [choice], "usage": usage(o)}


def meta_info(o: Outcome, tok: TextTokenizer, ask: Ask) -> JsonObject:
    """SGLang's ``meta_info``."""
    n = len(o.output)
    reason: JsonObject = ({"type": "length", "length": n} if o.stopped is None
                          else {"type": "stop", "matched": o.stopped})
    info: JsonObject = {"id": o.rid, "prompt_tokens": o.prompt_tokens, "completion_tokens": n,
                        "cached_tokens": o.cached_tokens, "finish_reason": reason}
    if ask.sampling.logprobs is not None:
        info["output_token_logprobs"] = [[e.logprob, e.token, tok.decode([e.token])]
                                         for e in o.logprobs]
        info["output_top_logprobs"] = [[[p, i, tok.decode([i])] for i, p in e.top]
                                       for e in o.logprobs]
    return info


def generate_result(o: Outcome, text: str, ids: list[int], tok: TextTokenizer,
                    ask: Ask) -> JsonObject:
    """One ``/generate`` body (the whole answer, or one streamed chunk's new part)."""
    return {"text": text, "output_ids": ids, "meta_info": meta_info(o, tok, ask)}


def _head(ask: Ask, rid: str, model: str) -> JsonObject:
    kind = "chat.completion" if ask.dialect is CHAT else "text_completion"
    if ask.stream and ask.dialect is CHAT:
        kind = "chat.completion.chunk"
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model}


def chunk(ask: Ask, rid: str, model: str, text: str, reason: str | None, *,
          logprobs: JsonObject | None = None, role: bool = False) -> JsonObject:
    """One streamed piece (OpenAI dialects): chat's ``delta`` (``role`` in the first chunk)
    or a completion's ``text``, with its ``logprobs`` when asked; the last carries
    ``reason``."""
    if ask.dialect is CHAT:
        delta: JsonObject = {"role": "assistant", "content": text} if role else (
            {"content": text} if text or reason is None else {})
        choice: JsonObject = {"index": 0, "delta": delta, "logprobs": logprobs,
                              "finish_reason": reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason}
    return {**_head(ask, rid, model), "choices": [choice]}


def usage_chunk(ask: Ask, o: Outcome, model: str) -> JsonObject:
    """The final usage-only chunk sent when ``stream_options.include_usage`` is set."""
    return {**_head(ask, o.rid, model), "choices": [], "usage": usage(o)}


def usage_so_far(prompt_tokens: int, completion_tokens: int) -> JsonObject:
    """The usage a chunk carries with ``continuous_usage_stats`` (vLLM's three counts)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
