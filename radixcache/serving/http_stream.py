"""The server-sent events of one streamed request, in its dialect.

OpenAI (completions and chat): a chat's first chunk carries ``role: assistant`` (an echoed
completion's first chunk, the prompt); then one chunk per piece of new text, with its
logprobs when asked; the last chunk carries ``finish_reason`` (``stop`` or ``length``); then
the usage chunk when ``stream_options.include_usage`` is set (with ``continuous_usage_stats``,
as vLLM, every chunk before it also carries the usage so far); then ``[DONE]``. A request that
ends in an error after its stream began (cut by a drain) sends one ``{"error": ...}`` event
instead of its last chunk, then ``[DONE]``, as vLLM does.

SGLang ``/generate``: each chunk carries only the new text and the new ``output_ids`` (what
SGLang sends with ``stream_output``: the chunks concatenate to the answer; a 2,000-token answer
streams in about its own size, not the square of it), ``meta_info`` with ``completion_tokens``
so far; the last chunk the whole ``meta_info`` with its ``finish_reason``; then ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from radixcache.serving import openai_api as api
from radixcache.serving import openai_out as out
from radixcache.serving.sampling import Piece
from radixcache.traffic.tokenizer import TextTokenizer

DONE = b"data: [DONE]\n\n"  # the end of every stream, an answer's or an error's
NextPiece = Callable[[], Awaitable[Piece | bool | None]]  # False: the client left


class StreamedRun(Protocol):
    """What streaming needs of a running request (``http_run``'s)."""

    ask: api.Ask
    ids: list[int]  # output ids so far
    rest: Piece  # set by ``outcome``: what the answer had not streamed when it ended

    @property
    def rid(self) -> str:
        """The response id."""
        ...

    def outcome(self) -> out.Outcome:
        """The finished request; raises ``ApiError``."""
        ...


def sse(obj: api.JsonObject) -> bytes:
    """One ``data:`` event."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _Chunks:
    """Turns pieces into one dialect's chunks (tracks the ids and characters sent)."""

    def __init__(self, run: StreamedRun, model: str, tok: TextTokenizer) -> None:
        self.run, self.ask, self.model, self.tok = run, run.ask, model, tok
        self.rid = run.rid
        self.ids_sent = self.chars_sent = 0

    def first(self) -> list[bytes]:
        if self.ask.dialect is api.CHAT:
            return [self._sse(out.chunk(self.ask, self.rid, self.model, "", None, role=True))]
        if self.ask.dialect is api.COMPLETION and self.ask.echo:
            prompt = self.tok.decode(self.ask.prompt)
            self.chars_sent += len(prompt)
            return [self._sse(out.chunk(self.ask, self.rid, self.model, prompt, None))]
        return []

    def _sse(self, chunk: api.JsonObject) -> bytes:
        if self.ask.continuous_usage:
            chunk["usage"] = out.usage_so_far(len(self.ask.prompt), self.ids_sent)
        return sse(chunk)

    def piece(self, p: Piece, reason: str | None) -> bytes:
        ids = self.run.ids[self.ids_sent:p.upto] if p.upto >= 0 else self.run.ids[self.ids_sent:]
        self.ids_sent += len(ids)
        if self.ask.dialect is api.GENERATE:
            return sse({"text": p.text, "output_ids": ids,
                        "meta_info": {"id": self.rid, "completion_tokens": self.ids_sent,
                                      "finish_reason": None}})
        logprobs = None
        if p.logprobs:
            logprobs = (out.chat_logprobs(p.logprobs, self.tok) if self.ask.dialect is api.CHAT
                        else out.completion_logprobs(p.logprobs, self.tok, self.chars_sent))
        self.chars_sent += len(p.text)
        return self._sse(out.chunk(self.ask, self.rid, self.model, p.text, reason,
                                   logprobs=logprobs))

    def last(self, o: out.Outcome, rest: Piece) -> list[bytes]:
        if self.ask.dialect is api.GENERATE:
            ids = self.run.ids[self.ids_sent:]
            return [sse(out.generate_result(o, rest.text, ids, self.tok, self.ask))]
        chunks = [self.piece(rest, o.finish_reason)]
        if self.ask.include_usage:
            chunks.append(sse(out.usage_chunk(self.ask, o, self.model)))
        return chunks


async def stream_events(run: StreamedRun, next_piece: NextPiece, model: str,
                        tok: TextTokenizer) -> AsyncIterator[bytes]:
    """Every event of ``run`` (see the module doc); stops quietly when the client leaves."""
    c = _Chunks(run, model, tok)
    for first in c.first():
        yield first
    while (p := await next_piece()) is not None:
        if p is False:
            return
        assert isinstance(p, Piece)
        if p.text or p.logprobs:
            yield c.piece(p, None)
    try:
        o = run.outcome()
    except api.ApiError as exc:  # cut by a drain, /abort_request: the error, [DONE]
        yield sse(exc.body())
        yield DONE
        return
    for last in c.last(o, run.rest):
        yield last
    yield DONE
