"""The HTTP front of one engine: what OpenAI clients, SGLang clients and routers speak.

``HttpFront(backend).start()`` serves, from a uvicorn thread of its own::

    GET  /health /health_generate        200 while the front runs (routers poll it)
    GET  /server_info /model_info        SGLang's, what sglang-router reads at start
    GET  /v1/models                      OpenAI's model list (one model)
    POST /v1/completions                 prompt text or ids, max_tokens, stream (SSE)
    POST /v1/chat/completions            messages through the workloads' chat template
    POST /generate                       SGLang's native body (text or input_ids)
    GET  /metrics                        Prometheus text (``serving.prometheus``)

The front never steps the engine: it submits through a ``Backend`` (``EngineBackend`` wraps an
``Engine`` that another loop steps) and waits on the request's handle from the event loop;
streamed tokens come from the engine's per-token hook, handed to the loop thread-safely.
Bodies over ``max_body`` bytes get 413; every error is OpenAI's JSON body. Binds 127.0.0.1
unless told otherwise.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from radixcache.core.guard import Guard, ThreadFault
from radixcache.serving import openai_api as api
from radixcache.serving.engine import (
    Engine,
    RequestCancelled,
    RequestHandle,
    RequestRejected,
    RequestResult,
)
from radixcache.serving.loop import ServiceLoop
from radixcache.serving.prometheus import Histogram, prometheus_text
from radixcache.serving.requests import TokenHook
from radixcache.serving.stats import Stats
from radixcache.traffic.chattext import TextCodec

MAX_BODY = 1 << 20  # bytes; a 16k-token prompt as text is ~100 KiB
DEFAULT_MODEL = "radixcache-tiny"


class Backend(Protocol):
    """What the front needs of a running engine."""

    @property
    def vocab_size(self) -> int:
        """Token ids are in ``[0, vocab_size)``."""
        ...

    @property
    def max_context(self) -> int:
        """Positions the whole pool holds (prompt + output of one request at most)."""
        ...

    def submit(self, prompt: Sequence[int], max_new_tokens: int,
               on_token: TokenHook | None) -> RequestHandle:
        """Queue one request (thread-safe); ``ValueError`` for a malformed one."""
        ...

    def stats(self) -> Stats:
        """The engine's figures now, read between two steps (may wait for one step)."""
        ...


class EngineBackend:
    """An ``Engine`` stepped by ``loop`` (``serve``'s): a submit wakes the loop (it waits on
    an event when idle); figures are read under the loop's state lock."""

    def __init__(self, engine: Engine, loop: ServiceLoop) -> None:
        self.engine = engine
        self._loop = loop

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size."""
        return self.engine.config.model.vocab_size

    @property
    def max_context(self) -> int:
        """Blocks times block size."""
        return self.engine.config.num_blocks * self.engine.config.block_size

    def submit(self, prompt: Sequence[int], max_new_tokens: int,
               on_token: TokenHook | None) -> RequestHandle:
        """``Engine.submit`` then wake the stepping loop."""
        handle = self.engine.submit(prompt, max_new_tokens, on_token=on_token)
        self._loop.wake()
        return handle

    def stats(self) -> Stats:
        """``Engine.stats`` between two steps (the loop's state lock: a step's counts are
        all in or all out)."""
        return self._loop.stats()


def _error(exc: api.ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _read_json(request: Request, limit: int) -> dict[str, object]:
    """The body as a JSON object; 413 past ``limit`` bytes (counted as they arrive)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise api.ApiError(413, f"request body over {limit} bytes")
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > limit:
            raise api.ApiError(413, f"request body over {limit} bytes")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise api.ApiError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise api.ApiError(400, "body must be a JSON object")
    return body


class _Stream:
    """One request's tokens as they are chosen, delivered on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.queue: asyncio.Queue[int | None] = asyncio.Queue()

    def token(self, t: int) -> None:  # the engine's stepping thread
        self._loop.call_soon_threadsafe(self.queue.put_nowait, t)

    def done(self, _handle: object) -> None:  # the thread that finishes the request
        self._loop.call_soon_threadsafe(self.queue.put_nowait, None)


class HttpFront:
    """The HTTP server over one ``Backend``. ``start()``, then ``close()``."""

    def __init__(self, backend: Backend, host: str = "127.0.0.1", port: int = 0, *,
                 model: str = DEFAULT_MODEL, max_body: int = MAX_BODY) -> None:
        self.backend, self.model, self.max_body = backend, model, max_body
        self.codec = TextCodec()
        self.ttft = Histogram()
        self.started = time.time()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))  # here, so a taken port fails in the caller's thread
        self.host, self.port = host, int(self._sock.getsockname()[1])
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self.guard = Guard()  # a dead server thread is recorded, not silent
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    @property
    def fault(self) -> ThreadFault | None:
        """How the server thread died, if it did."""
        return self.guard.fault

    def start(self) -> HttpFront:
        """Serve from a guarded thread; returns once the server accepts connections."""
        self._thread = thread = self.guard.start("rc-http", self._serve)
        deadline = time.monotonic() + 10
        while not self._server.started and thread.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError(f"HTTP front on {self.url} did not start within 10 s")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        """Stop serving (open streams are cut) and release the port."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(5)
        self._sock.close()

    def _serve(self) -> None:
        self._server.run(sockets=[self._sock])

    # -- the app ------------------------------------------------------------------------------
    def app(self) -> Starlette:
        """The Starlette application (its routes are this front's methods)."""
        routes = [
            Route("/health", self.health), Route("/health_generate", self.health),
            Route("/server_info", self.server_info), Route("/get_server_info", self.server_info),
            Route("/model_info", self.model_info), Route("/get_model_info", self.model_info),
            Route("/v1/models", self.models), Route("/metrics", self.metrics),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/generate", self.generate, methods=["POST"]),
        ]
        handlers = {HTTPException: self._http_error, Exception: self._internal_error}
        return Starlette(routes=routes, exception_handlers=handlers)

    async def _http_error(self, _request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(api.ApiError(exc.status_code, str(exc.detail), kind=kind))

    async def _internal_error(self, _request: Request, exc: Exception) -> Response:
        return _error(api.ApiError(500, f"internal error: {type(exc).__name__}: {exc}",
                                   kind="internal_server_error"))

    async def health(self, _request: Request) -> Response:
        """200, empty: the engine's front is up."""
        return Response(status_code=200)

    async def server_info(self, _request: Request) -> Response:
        """SGLang-style server info with the engine's counters."""
        figures = (await asyncio.to_thread(self.backend.stats)).figures()
        return JSONResponse({"model_path": self.model, "version": "radixcache",
                             "max_total_num_tokens": self.backend.max_context, **figures})

    async def model_info(self, _request: Request) -> Response:
        """SGLang's model info."""
        return JSONResponse({"model_path": self.model, "tokenizer_path": None,
                             "is_generation": True})

    async def models(self, _request: Request) -> Response:
        """OpenAI's model list."""
        card = {"id": self.model, "object": "model", "created": int(self.started),
                "owned_by": "radixcache", "max_model_len": self.backend.max_context}
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics(self, _request: Request) -> Response:
        """Prometheus text."""
        stats = await asyncio.to_thread(self.backend.stats)  # waits for a step, not the loop
        text = prometheus_text(stats, self.ttft, self.model)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def completions(self, request: Request) -> Response:
        """OpenAI completions."""
        return await self._serve_api(request, lambda body: api.parse_completion(
            body, self.codec, self.backend.vocab_size))

    async def chat(self, request: Request) -> Response:
        """OpenAI chat completions."""
        return await self._serve_api(request, lambda body: api.parse_chat(body, self.codec))

    async def generate(self, request: Request) -> Response:
        """SGLang's ``/generate``."""
        return await self._serve_api(request, lambda body: api.parse_generate(
            body, self.codec, self.backend.vocab_size))

    # -- running a request ----------------------------------------------------------------------
    async def _serve_api(self, request: Request,
                         parse: Callable[[dict[str, object]], api.Ask]) -> Response:
        try:
            body = await _read_json(request, self.max_body)
            ask = parse(body)
            model = body.get("model")
            if ask.dialect is not api.GENERATE and model not in (None, self.model):
                raise api.ApiError(404, f"model '{model}' does not exist (serving "
                                   f"'{self.model}')", kind="not_found_error", param="model",
                                   code="model_not_found")
            stream = _Stream(asyncio.get_running_loop())
            handle = self._submit(ask, stream)
            if ask.stream:
                return StreamingResponse(self._events(ask, handle, stream),
                                         media_type="text/event-stream")
            return JSONResponse(api.response(ask, await self._outcome(handle, stream),
                                             self.model))
        except api.ApiError as exc:
            return _error(exc)

    def _submit(self, ask: api.Ask, stream: _Stream) -> RequestHandle:
        if len(ask.prompt) + ask.max_tokens - 1 > self.backend.max_context:
            raise api.ApiError(400, f"prompt ({len(ask.prompt)} tokens) plus max_tokens "
                               f"({ask.max_tokens}) exceed the context of "
                               f"{self.backend.max_context} tokens",
                               code="context_length_exceeded")
        try:
            handle = self.backend.submit(ask.prompt, ask.max_tokens, stream.token)
        except ValueError as exc:
            raise api.ApiError(400, str(exc)) from None
        handle.add_done_callback(stream.done)
        return handle

    async def _outcome(self, handle: RequestHandle, stream: _Stream) -> api.Outcome:
        while await stream.queue.get() is not None:
            pass
        return self._finished(handle)

    def _finished(self, handle: RequestHandle) -> api.Outcome:
        try:
            result: RequestResult = handle.result(0)
        except RequestRejected as exc:
            raise api.ApiError(400, str(exc), code="context_length_exceeded") from None
        except RequestCancelled as exc:
            raise api.ApiError(503, str(exc), kind="service_unavailable") from None
        m = result.metrics
        self.ttft.observe(m.ttft_ms / 1e3)
        return api.Outcome(f"cmpl-{handle.id}", m.prompt_tokens, m.hit_tokens, result.tokens,
                           self.codec.decode(result.tokens))

    async def _events(self, ask: api.Ask, handle: RequestHandle,
                      stream: _Stream) -> AsyncIterator[bytes]:
        """Server-sent events: one chunk per token, then usage if asked, then ``[DONE]``."""
        rid, tokens, sent = f"cmpl-{handle.id}", [], ""
        while (t := await stream.queue.get()) is not None:
            tokens.append(t)
            text = self.codec.decode(tokens)
            if ask.dialect is api.GENERATE:  # SGLang streams the text so far
                yield _sse({"text": text, "output_ids": list(tokens)})
            else:  # OpenAI streams the new text: the chunks concatenate to the answer
                yield _sse(api.chunk(ask, rid, self.model, text[len(sent):], None))
            sent = text
        try:
            o = self._finished(handle)
        except api.ApiError as exc:
            yield _sse(exc.body())
            return
        if ask.dialect is api.GENERATE:
            yield _sse({"text": o.text, "output_ids": list(o.output),
                        "meta_info": api.meta_info(o)})
        else:
            yield _sse(api.chunk(ask, rid, self.model, "", "length"))
            if ask.include_usage:
                yield _sse(api.usage_chunk(ask, o, self.model))
        yield b"data: [DONE]\n\n"


def _sse(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
