"""Running one HTTP request on the engine: read, parse, submit, answer or stream, and let go.

``Runner`` holds what every request shares:

- a bound on HTTP requests in flight (``Limits.max_waiting``): past it, 429 with
  ``Retry-After`` before the body is read;
- a read timeout for the body (408) and a body size limit (413); a body Python cannot parse
  (5,000-digit integers, deep nesting) is a 400, never a 500;
- parsing and tokenizing on one worker thread, off the event loop (``/health`` answers while
  a long prompt is encoded), after a cheap character count refuses text that cannot fit;
- a client that leaves (before, during or after its first token, streamed or not) aborts its
  request: the engine drops it at its next step and unpins its nodes; it is counted with
  ``finished_reason="abort"``; nothing is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, cast

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from radixcache.serving import openai_api as api
from radixcache.serving import openai_out as out
from radixcache.serving.http_backend import Backend
from radixcache.serving.http_stream import stream_events
from radixcache.serving.prometheus import RequestMetrics, RequestTimes
from radixcache.serving.requests import RequestCancelled, RequestRejected, RequestResult
from radixcache.serving.sampling import Piece, RequestPolicy
from radixcache.traffic.tokenizer import TextTokenizer

MAX_BODY = 1 << 20  # bytes


class Limits(NamedTuple):
    """What one front accepts."""

    max_body: int = MAX_BODY
    max_waiting: int = 1024  # HTTP requests in flight (parsing, queued, running, streaming)
    read_timeout_s: float = 30.0  # for a request's headers, its body, and an idle connection


def error_response(exc: api.ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's error body with the error's status."""
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes; 413 past ``limit`` bytes (counted as they arrive)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise api.ApiError(413, f"request body over {limit} bytes")
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > limit:
            raise api.ApiError(413, f"request body over {limit} bytes")
    return bytes(raw)


def parse_json(raw: bytes) -> dict[str, object]:
    """``raw`` as a JSON object; 400 for anything but a JSON object Python can hold."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSON, UTF-8, int digits, nesting depth
        raise api.ApiError(400, f"body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise api.ApiError(400, "body must be a JSON object")
    return body


def _libc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None elsewhere. Encoding one huge word allocates about
    100 bytes a character for a moment; glibc keeps what was freed, so a server's RSS would
    hold the high-water mark of the largest prompts it was sent."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], object] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return lambda: trim(0)


_TRIM = _libc_trim()
TRIM_AFTER = 64 << 10  # bytes of body after which the encoding thread trims the heap


def parse_large(parse: api.Parser, body: dict[str, object], ctx: api.Context,
                size: int) -> api.Ask:
    """``parse(body, ctx)``; then, after a large body, the heap is trimmed (``_libc_trim``)."""
    try:
        return parse(body, ctx)
    finally:
        if size > TRIM_AFTER and _TRIM is not None:
            _TRIM()


class _Run:
    """One submitted request: its policy, its pieces on the event loop, its timing."""

    def __init__(self, runner: Runner, ask: api.Ask) -> None:
        self.runner, self.ask = runner, ask
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Piece | None] = asyncio.Queue()
        self.policy = RequestPolicy(ask.sampling, runner.tokenizer, self._piece,
                                    eos_ids=runner.eos_ids)
        self.ids: list[int] = []
        self.t0 = time.perf_counter()
        self.first = self.last = 0.0
        b = runner.backend
        self.handle = b.submit(ask.prompt, ask.max_tokens, self._token, self.policy)
        self.handle.add_done_callback(lambda _h: self._push(None))
        self.finished = False
        self.rest = Piece("", [])  # what the answer had not streamed when it ended

    @property
    def rid(self) -> str:
        """The response id."""
        return f"cmpl-{self.handle.id}"

    def _push(self, item: Piece | None) -> None:
        with contextlib.suppress(RuntimeError):  # the front closed its loop: nobody waits
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def on_done(self, call: Callable[[], object]) -> None:
        """``call()`` on the event loop once the request is over."""
        def done(_handle: object) -> None:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(call)
        self.handle.add_done_callback(done)

    def _piece(self, piece: Piece) -> None:  # the engine's thread
        self._push(piece)

    def _token(self, token: int) -> None:  # the engine's thread
        now = time.perf_counter()
        self.runner.stats.token(now - self.last if self.last else None)
        self.first = self.first or now
        self.last = now
        self.ids.append(token)

    def outcome(self) -> out.Outcome:
        """The finished request (call after the queue's ``None``); raises ``ApiError``."""
        self.finished = True
        try:
            result: RequestResult = self.handle.result(0)
        except RequestRejected as exc:
            self._record("abort", 0.0)
            raise api.ApiError(400, str(exc), code="context_length_exceeded") from None
        except RequestCancelled as exc:
            self._record("abort", 0.0)
            raise api.ApiError(503, str(exc), kind="service_unavailable") from None
        m, p = result.metrics, self.policy
        self.rest = p.finish()
        self._record("length" if p.stopped is None else "stop", m.queue_ms / 1e3)
        text = p.text
        if self.ask.echo:
            text = self.runner.tokenizer.decode(self.ask.prompt) + text
        return out.Outcome(self.rid, m.prompt_tokens, m.hit_tokens,
                           result.tokens, text, p.stopped, p.logprobs)

    def abort(self) -> None:
        """The client left: drop the request (once) and count it."""
        if not self.finished:
            self.finished = True
            assert self.handle.id is not None
            self.runner.backend.abort(self.handle.id)
            self._record("abort", 0.0)

    def _record(self, reason: str, queue_s: float) -> None:
        now = time.perf_counter()
        ttft = self.first - self.t0 if self.first else 0.0
        self.runner.stats.finished(RequestTimes(
            queue_s or ttft, ttft, now - self.t0, len(self.ask.prompt), len(self.ids), reason))


async def _until_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Runner:
    """Serves the request endpoints of one front (see the module doc)."""

    def __init__(self, backend: Backend, tokenizer: TextTokenizer,
                 stats: RequestMetrics, limits: Limits, model: str) -> None:
        self.backend, self.tokenizer, self.stats = backend, tokenizer, stats
        self.limits, self.model = limits, model
        self.eos_ids: frozenset[int] = frozenset()  # the model's (HttpFront sets them)
        self.waiting = 0  # requests in flight; touched on the event loop only
        self._rids: dict[str, _Run] = {}
        self._encoder = ThreadPoolExecutor(1, thread_name_prefix="rc-http-encode")

    def close(self) -> None:
        """Stop the encoding thread."""
        self._encoder.shutdown(wait=False, cancel_futures=True)

    def context(self) -> api.Context:
        """What parsing needs: the tokenizer and the limits of the engine."""
        b = self.backend
        return api.Context(self.tokenizer, b.vocab_size, b.max_context)

    # -- endpoints -----------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        """OpenAI completions."""
        return await self._serve(request, api.parse_completion)

    async def chat(self, request: Request) -> Response:
        """OpenAI chat completions."""
        return await self._serve(request, api.parse_chat)

    async def generate(self, request: Request) -> Response:
        """SGLang's ``/generate``."""
        return await self._serve(request, api.parse_generate)

    async def tokenize(self, request: Request) -> Response:
        """``{"prompt": text}`` -> ``{"tokens": ids, "count": n}`` (vLLM's shape)."""
        return await self._simple(request, lambda b: api.tokenize(b, self.context()))

    async def detokenize(self, request: Request) -> Response:
        """``{"tokens": ids}`` -> ``{"prompt": text}``."""
        return await self._simple(request, lambda b: api.detokenize(b, self.context()))

    async def abort_request(self, request: Request) -> Response:
        """SGLang's ``/abort_request``: ``{"rid": id}`` drops that request (200 either way,
        as SGLang; ``found`` says whether it was running)."""
        def find(body: dict[str, object]) -> api.JsonObject:
            rid = body.get("rid")
            if not isinstance(rid, str):
                raise api.ApiError(400, "'rid' must be a string", param="rid")
            run = self._rids.get(rid)
            if run is not None:
                run.abort()
            return {"rid": rid, "found": run is not None}
        return await self._simple(request, find, threaded=False)

    # -- the work ------------------------------------------------------------------------------
    async def _simple(self, request: Request,
                      work: Callable[[dict[str, object]], api.JsonObject], *,
                      threaded: bool = True) -> Response:
        try:
            body, _size = await self._body(request)
            loop = asyncio.get_running_loop()
            answer = await loop.run_in_executor(self._encoder, work, body) if threaded \
                else work(body)
            return JSONResponse(answer)
        except api.ApiError as exc:
            return error_response(exc)
        except ClientDisconnect:
            return Response(status_code=499)

    async def _body(self, request: Request) -> tuple[dict[str, object], int]:
        """The body, read within the read timeout (408), parsed on the encoding thread; and
        its size in bytes."""
        try:
            raw = await asyncio.wait_for(read_body(request, self.limits.max_body),
                                         self.limits.read_timeout_s)
        except TimeoutError:
            raise api.ApiError(408, f"request body not received within "
                               f"{self.limits.read_timeout_s:g} s") from None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._encoder, parse_json, raw), len(raw)

    async def _serve(self, request: Request, parse: api.Parser) -> Response:
        if self.waiting >= self.limits.max_waiting:
            return error_response(api.ApiError(
                429, f"{self.waiting} requests in flight: try again shortly",
                kind="rate_limit_error"), headers={"Retry-After": "1"})
        self.waiting += 1
        streaming = False
        try:
            body, size = await self._body(request)
            loop = asyncio.get_running_loop()
            ask = await loop.run_in_executor(self._encoder, parse_large, parse, body,
                                             self.context(), size)
            self._check(body, ask)
            run = self._submit(ask)
            if ask.stream:
                streaming = True
                return _Streamed(self._stream(run, request), lambda: self._closed(run))
            return JSONResponse(await self._answer(run, request))
        except api.ApiError as exc:
            return error_response(exc)
        except ClientDisconnect:
            return Response(status_code=499)
        finally:
            if not streaming:
                self.waiting -= 1

    def _check(self, body: dict[str, object], ask: api.Ask) -> None:
        model = body.get("model")
        if ask.dialect is not api.GENERATE and model not in (None, self.model):
            raise api.ApiError(404, f"model '{model}' does not exist (serving "
                               f"'{self.model}')", kind="not_found_error", param="model",
                               code="model_not_found")
        if len(ask.prompt) + ask.max_tokens - 1 > self.backend.max_context:
            raise api.ApiError(400, f"prompt ({len(ask.prompt)} tokens) plus max_tokens "
                               f"({ask.max_tokens}) exceed the context of "
                               f"{self.backend.max_context} tokens",
                               code="context_length_exceeded")
        if ask.rid is not None and ask.rid in self._rids:
            raise api.ApiError(400, f"request id '{ask.rid}' is already running", param="rid")

    def _submit(self, ask: api.Ask) -> _Run:
        try:
            run = _Run(self, ask)
        except ValueError as exc:
            raise api.ApiError(400, str(exc)) from None
        if ask.rid is not None:
            self._rids[ask.rid] = run
            rid = ask.rid
            run.on_done(lambda: self._rids.pop(rid, None))
        return run

    async def _answer(self, run: _Run, request: Request) -> api.JsonObject:
        """Wait for the whole answer, aborting the request if the client leaves first."""
        async def done() -> None:
            while await run.queue.get() is not None:
                pass
        finished, gone = asyncio.ensure_future(done()), asyncio.ensure_future(
            _until_gone(request))
        try:
            await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not finished.done():
                finished.cancel()
                run.abort()
        if not finished.done() or finished.cancelled():
            raise ClientDisconnect
        return out.response(run.ask, run.outcome(), self.model, self.tokenizer)

    async def _stream(self, run: _Run, request: Request) -> AsyncIterator[bytes]:
        """Server-sent events until ``[DONE]``; the request is aborted if the client leaves."""
        gone = asyncio.ensure_future(_until_gone(request))
        try:
            async for chunk in _sse_chunks(run, gone, self.model, self.tokenizer):
                yield chunk
        finally:
            gone.cancel()
            run.abort()  # a no-op once the request is finished

    def _closed(self, run: _Run) -> None:
        """A streamed response ended, sent or not (its generator may never have started)."""
        run.abort()
        self.waiting -= 1


class _Streamed(StreamingResponse):
    """Server-sent events that call ``on_close`` once the response is over, however it ends
    (a client that left before the first byte included)."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send, then ``on_close``."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _sse_chunks(run: _Run, gone: asyncio.Future[None], model: str,
                      tok: TextTokenizer) -> AsyncIterator[bytes]:
    async def next_piece() -> Piece | bool | None:
        get = asyncio.ensure_future(run.queue.get())
        await asyncio.wait([cast("asyncio.Future[object]", get),
                            cast("asyncio.Future[object]", gone)],
                           return_when=asyncio.FIRST_COMPLETED)
        if not get.done():
            get.cancel()
            return False  # the client left
        return get.result()

    async for chunk in stream_events(run, next_piece, model, tok):
        yield chunk
