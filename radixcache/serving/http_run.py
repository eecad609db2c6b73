"""Running one HTTP request on the engine: read, parse, submit, answer or stream, and let go.

``Runner`` holds what every request shares:

- a bound on HTTP requests in flight (``Limits.max_waiting``): past it, 429 with
  ``Retry-After`` before the body is read;
- a read timeout for the body (408) and a body size limit (413); the body's bytes are decoded
  into its typed struct by ``openai_api`` (anything else, 5,000-digit integers and deep
  nesting included, is a 400 naming the field, never a 500);
- parsing and tokenizing on one worker thread, off the event loop (``/health`` answers while
  a long prompt is encoded), after a cheap character count refuses text that cannot fit;
- a client that leaves (before, during or after its first token, streamed or not) aborts its
  request: the engine drops it at its next step and unpins its nodes; it is counted with
  ``finished_reason="abort"``; nothing is logged;
- a drain (``stop_admitting``, then ``cut`` if the grace runs out): a request in flight is one
  whose response is not yet wholly sent; after ``stop_admitting`` a new one gets 503 with
  ``Retry-After`` and ``idle`` is set once none is left; ``cut`` answers every one left 503
  (a stream: an error event, then ``[DONE]``), one still sending its body included.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
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
from radixcache.serving.requests import (
    RequestCancelled,
    RequestFailed,
    RequestRejected,
    RequestResult,
)
from radixcache.serving.sampling import Piece, RequestPolicy
from radixcache.traffic.tokenizer import TextTokenizer

MAX_BODY = 1 << 20  # bytes
DRAINING = "the server is shutting down: send this request to another server or retry"


class Limits(NamedTuple):
    """What one front accepts."""

    max_body: int = MAX_BODY
    max_waiting: int = 1024  # HTTP requests in flight (parsing, queued, running, streaming)
    read_timeout_s: float = 30.0  # for a request's headers, its body, and an idle connection


def error_response(exc: api.ApiError,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
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


def parse_large(parse: api.Parser, raw: bytes, ctx: api.Context) -> api.Ask:
    """``parse(raw, ctx)``; then, after a large body, the heap is trimmed (``_libc_trim``)."""
    try:
        return parse(raw, ctx)
    finally:
        if len(raw) > TRIM_AFTER and _TRIM is not None:
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
        self.cut_reason: str | None = None  # set by ``cut``: the answer is this 503
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
        # the ids through this piece (its token's hook ran first): the queue can fall behind
        # the ids, and a chunk carries its own piece's ids, not the ones that came since
        self._push(piece._replace(upto=len(self.ids)))

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
            raise api.ApiError(503, self.cut_reason or str(exc),
                               kind="service_unavailable") from None
        except RequestFailed as exc:  # an exception in the engine's step failed it only
            self._record("abort", 0.0)
            raise api.ApiError(500, str(exc), kind="server_error") from None
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

    def cut(self, why: str) -> None:
        """End the request now (a drain ran out of time): its answer is a 503 saying ``why``.
        A request that has finished already keeps its answer."""
        if not self.finished:
            self.cut_reason = why
            assert self.handle.id is not None
            self.runner.backend.abort(self.handle.id)

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
        # on the event loop only: requests in flight, and the drain's state
        self.waiting = 0
        self.draining = False  # set by ``stop_admitting``
        self.cut_reason: str | None = None  # set by ``cut``
        self._cut = asyncio.Event()  # set by ``cut``: a body still arriving is not waited for
        self._runs: set[_Run] = set()  # submitted and not yet finished
        self._rids: dict[str, _Run] = {}
        self._encoder = ThreadPoolExecutor(1, thread_name_prefix="rc-http-encode")
        # set (on the event loop) once draining and nothing is in flight: what the thread
        # stopping the front waits on
        self.idle = threading.Event()

    def close(self) -> None:
        """Stop the encoding thread."""
        self._encoder.shutdown(wait=False, cancel_futures=True)

    def context(self) -> api.Context:
        """What parsing needs: the tokenizer and the limits of the engine."""
        b = self.backend
        return api.Context(self.tokenizer, b.vocab_size, b.max_context, bool(self.eos_ids))

    # -- the drain (called on the event loop) -----------------------------------------------------
    def stop_admitting(self) -> int:
        """From now on every new request is answered 503 with ``Retry-After`` (and /health
        says draining); returns the requests in flight. ``idle`` is set once none is."""
        self.draining = True
        if not self.waiting:
            self.idle.set()
        return self.waiting

    def cut(self, why: str) -> int:
        """Answer every request in flight 503 ``why`` now (streams: an error event, then
        ``[DONE]``); one still being read or parsed gets the same (one the engine finished
        meanwhile keeps its answer). Returns the requests in flight."""
        self.cut_reason = why
        self._cut.set()
        for run in list(self._runs):
            run.cut(why)
        return self.waiting

    def _leave(self) -> None:
        """One request's response is over (sent, or its client gone)."""
        self.waiting -= 1
        if self.draining and not self.waiting:
            self.idle.set()

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
        def find(raw: bytes) -> api.JsonObject:
            rid = api.abort_rid(raw)
            run = self._rids.get(rid)
            if run is not None:
                run.abort()
            return {"rid": rid, "found": run is not None}
        return await self._simple(request, find, threaded=False)

    # -- the work ------------------------------------------------------------------------------
    async def _simple(self, request: Request,
                      work: Callable[[bytes], api.JsonObject], *,
                      threaded: bool = True) -> Response:
        try:
            body = await self._body(request)
            loop = asyncio.get_running_loop()
            answer = await loop.run_in_executor(self._encoder, work, body) if threaded \
                else work(body)
            return JSONResponse(answer)
        except api.ApiError as exc:
            return error_response(exc)
        except ClientDisconnect:
            return Response(status_code=499)

    async def _body(self, request: Request) -> bytes:
        """The body's bytes, read within the read timeout (408). A drain's ``cut`` ends the
        wait (503)."""
        read = asyncio.ensure_future(asyncio.wait_for(
            read_body(request, self.limits.max_body), self.limits.read_timeout_s))
        cut = asyncio.ensure_future(self._cut.wait())
        try:
            await asyncio.wait([cast("asyncio.Future[object]", read),
                                cast("asyncio.Future[object]", cut)],
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            cut.cancel()
            unread = not read.done()
            if unread:
                read.cancel()
        if unread:
            raise self._cut_error()
        try:
            return read.result()
        except TimeoutError:
            raise api.ApiError(408, f"request body not received within "
                               f"{self.limits.read_timeout_s:g} s") from None

    def _cut_error(self) -> api.ApiError:
        return api.ApiError(503, self.cut_reason or DRAINING, kind="service_unavailable")

    async def _serve(self, request: Request, parse: api.Parser) -> Response:
        if self.draining:
            return error_response(api.ApiError(503, DRAINING, kind="service_unavailable"),
                                  headers={"Retry-After": "1"})
        if self.waiting >= self.limits.max_waiting:
            return error_response(api.ApiError(
                429, f"{self.waiting} requests in flight: try again shortly",
                kind="rate_limit_error"), headers={"Retry-After": "1"})
        self.waiting += 1
        try:
            response, run = await self._respond(request, parse)
        except BaseException:
            self._leave()
            raise
        return _Sent(response, self._leave if run is None else lambda: self._closed(run))

    async def _respond(self, request: Request,
                       parse: api.Parser) -> tuple[Response, _Run | None]:
        """The response, and the run when it streams (its end aborts the run)."""
        try:
            raw = await self._body(request)
            loop = asyncio.get_running_loop()
            ask = await loop.run_in_executor(self._encoder, parse_large, parse, raw,
                                             self.context())
            self._check(ask)
            run = self._submit(ask)
            if ask.stream:
                events = StreamingResponse(self._stream(run, request),
                                           media_type="text/event-stream")
                return events, run
            return JSONResponse(await self._answer(run, request)), None
        except api.ApiError as exc:
            return error_response(exc), None
        except ClientDisconnect:
            return Response(status_code=499), None

    def _check(self, ask: api.Ask) -> None:
        model = ask.model
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
        if self.cut_reason is not None:
            raise self._cut_error()
        try:
            run = _Run(self, ask)
        except ValueError as exc:
            raise api.ApiError(400, str(exc)) from None
        self._runs.add(run)
        run.on_done(lambda: self._runs.discard(run))
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
        self._leave()


class _Sent(Response):
    """``inner``, then ``on_close`` once it is over however it ends (wholly sent, or a client
    that left before its first byte): a request is in flight until then."""

    def __init__(self, inner: Response, on_close: Callable[[], None]) -> None:
        # no ``Response.__init__``: the status, headers and body are ``inner``'s
        self._inner, self._on_close = inner, on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send ``inner``, then ``on_close``."""
        try:
            await self._inner(scope, receive, send)
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
