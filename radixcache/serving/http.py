"""The HTTP front of one engine: what OpenAI clients, SGLang clients and routers speak.

``HttpFront(backend).start()`` serves, from a uvicorn thread of its own::

    GET  /health /health_generate        200 while the front runs, 503 while it drains
    GET  /server_info /model_info        SGLang's (``tokenizer_path``: the shipped tokenizer)
    GET  /v1/models /version             OpenAI's model list; the server's version
    POST /v1/completions                 prompt text or ids (``serving.openai_api``)
    POST /v1/chat/completions            messages through the tokenizer's chat template
    POST /generate                       SGLang's native body (text or input_ids)
    POST /tokenize /detokenize           text <-> ids with the shipped tokenizer
    GET  /get_load                       SGLang's load figures (sglang-router's /get_loads)
    POST /flush_cache                    empty the cache; 400 while requests run (as SGLang)
                                         (any other method: 405 with ``Allow``)
    POST /abort_request                  drop a request by its ``rid``
    GET  /metrics                        Prometheus (``serving.prometheus``)

The front never steps the engine: it submits through a ``Backend`` (``EngineBackend`` wraps an
``Engine`` that another loop steps); requests run as ``serving.http_run`` says (text encoded
off the event loop, a bound on waiting requests, a client that leaves aborts its request).
Connections that send no complete request within ``read_timeout`` seconds, or stay idle that
long between requests, are closed. Binds 127.0.0.1 unless told otherwise (IPv6 too). Once
serving, ``start`` settles the interpreter for a process it shares with a step loop
(``serving.http_interp``: start-up's objects frozen out of the garbage collector's sight).

Stopping: ``close()`` cuts what is open. A drain (what ``serve`` does on SIGTERM) is
``stop_admitting()`` (new requests 503 with ``Retry-After``, /health 503 so routers stop
sending), then ``finish_drain(grace_s, cut_now)``: the requests in flight finish, or, once the
grace is over or ``cut_now()`` says so, are answered 503 (a stream: an error event, then
``[DONE]``); then ``close()``. Every request in flight gets a whole answer either way.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import NamedTuple, TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from radixcache.core.guard import Guard, ThreadFault
from radixcache.serving import openai_api as api
from radixcache.serving.http_backend import Backend
from radixcache.serving.http_backend import EngineBackend as EngineBackend
from radixcache.serving.http_interp import Settled, settle
from radixcache.serving.http_run import Limits, Runner, error_response
from radixcache.serving.prometheus import RequestMetrics
from radixcache.traffic.tokenizer import TextTokenizer, shipped

DEFAULT_MODEL = "radixcache-tiny"
CUT_WAIT_S = 5.0  # after a cut, how long the cut requests' answers get to go out
_T = TypeVar("_T")
TOLD_NOT_TO_WAIT = "the server is shutting down and was told not to wait for this request"


def grace_over(grace_s: float) -> str:
    """Why a drain cut the requests left after its grace."""
    return (f"the server is shutting down and this request did not finish within its drain "
            f"grace of {grace_s:g} s")


class Drained(NamedTuple):
    """How a drain went."""

    in_flight: int  # HTTP requests in flight when admission stopped
    cut: int  # requests still in flight when the grace ended (answered 503)
    reason: str | None  # why they were cut (None: every request finished)


def _server_version() -> str:
    try:
        return version("radixcache")
    except PackageNotFoundError:
        return "unknown"


class _TimedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request line and headers do
    not arrive within ``timeout_keep_alive`` seconds (uvicorn times out only idle ones)."""

    _header_timer: object = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # a whole request line and headers arrived

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.timeout_keep_alive, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()  # type: ignore[attr-defined]
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if (self.cycle is None or self.cycle.response_complete) and \
                not self.transport.is_closing():
            self.transport.close()


class HttpFront:
    """The HTTP server over one ``Backend``. ``start()``, then ``close()``."""

    def __init__(self, backend: Backend, host: str = "127.0.0.1", port: int = 0, *,
                 model: str = DEFAULT_MODEL, limits: Limits | None = None,
                 tokenizer: TextTokenizer | None = None,
                 eos_ids: frozenset[int] = frozenset(), settle: bool = True,
                 sock: socket.socket | None = None) -> None:
        self.backend, self.model = backend, model
        # ``start`` settles the interpreter for serving beside a step loop (``http_interp``)
        self._settle = settle
        self.settled: Settled | None = None
        self.limits = limits if limits is not None else Limits()
        self.tokenizer = tokenizer if tokenizer is not None else shipped()
        if backend.vocab_size < self.tokenizer.vocab_size:  # a checkpoint's may be padded
            raise ValueError(f"the model's vocabulary ({backend.vocab_size}) is smaller than "
                             f"the tokenizer's ({self.tokenizer.vocab_size})")
        self.stats = RequestMetrics(backend.counters, model)
        self.runner = Runner(backend, self.tokenizer, self.stats, self.limits, model)
        self.runner.eos_ids = eos_ids  # answers end there unless a request sets ignore_eos
        self.started = time.time()
        # here: a bad port fails in the caller; ``sock``: bound already (a front process's,
        # bound by the process that started it)
        self._sock = sock if sock is not None else bound_socket(host, port)
        name = self._sock.getsockname()
        self.host, self.port = host if sock is None else str(name[0]), int(name[1])
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=1, http=_TimedH11,
                                timeout_keep_alive=max(1, int(self.limits.read_timeout_s)))
        # uvicorn's own grace (its shutdown waits that long for open connections) matters
        # only for ``close()`` without a drain: a drain leaves nothing in flight
        self._server = uvicorn.Server(config)
        self.guard = Guard()  # a dead server thread is recorded, not silent
        self._thread: threading.Thread | None = None
        self._in_flight = 0  # requests in flight when ``stop_admitting`` was called

    @property
    def url(self) -> str:
        """``http://host:port`` (``http://[::1]:port`` for IPv6)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

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
        if self._settle:
            self.settled = settle()  # start-up is over: what it made is never garbage
        return self

    def close(self) -> None:
        """Stop serving (open streams are cut) and release the port."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(5)
        self._sock.close()
        self.runner.close()

    def _serve(self) -> None:
        self._server.run(sockets=[self._sock])

    # -- draining (from another thread than the server's) ---------------------------------------
    def _on_loop(self, call: Callable[[], _T]) -> _T:
        """``call()`` on the server's event loop (the runner's state lives there)."""
        async def run() -> _T:
            return call()
        loop = self._server.servers[0].get_loop()
        return asyncio.run_coroutine_threadsafe(run(), loop).result(30)

    def stop_admitting(self) -> int:
        """New requests get 503 with ``Retry-After`` and /health 503 from now on; returns the
        HTTP requests in flight."""
        self._in_flight = self._on_loop(self.runner.stop_admitting)
        return self._in_flight

    def finish_drain(self, grace_s: float, cut_now: Callable[[], bool]) -> Drained:
        """After ``stop_admitting``: wait until no request is in flight, at most ``grace_s``
        seconds and only while ``cut_now()`` is false (checked every 0.1 s); then answer the
        ones left 503, give their answers ``CUT_WAIT_S`` to go out, and ``close()``."""
        r = self.runner
        deadline = time.monotonic() + grace_s
        why: str | None = None
        while not r.idle.is_set() and why is None:
            if cut_now():
                why = TOLD_NOT_TO_WAIT
            elif (left := deadline - time.monotonic()) <= 0:
                why = grace_over(grace_s)
            else:
                r.idle.wait(min(0.1, left))
        cut = self.cut_and_close(why)
        return Drained(self._in_flight, cut, why)

    def cut_and_close(self, why: str | None) -> int:
        """After ``stop_admitting``: answer the requests still in flight 503 saying ``why``
        (none when ``why`` is None), give their answers ``CUT_WAIT_S`` to go out, and
        ``close()``; returns how many were in flight when cut."""
        r, cut = self.runner, 0
        if why is not None:
            reason = why
            cut = self._on_loop(lambda: r.cut(reason))
            r.idle.wait(CUT_WAIT_S)
        self.close()
        return cut

    # -- the app ------------------------------------------------------------------------------
    def app(self) -> Starlette:
        """The Starlette application (its routes are this front's methods)."""
        r = self.runner
        routes = [
            Route("/health", self.health), Route("/health_generate", self.health),
            Route("/server_info", self.server_info), Route("/get_server_info", self.server_info),
            Route("/model_info", self.model_info), Route("/get_model_info", self.model_info),
            Route("/v1/models", self.models), Route("/metrics", self.metrics),
            Route("/version", self.version), Route("/get_load", self.get_load),
            Route("/flush_cache", self.flush_cache, methods=["POST"]),
            Route("/abort_request", r.abort_request, methods=["POST"]),
            Route("/tokenize", r.tokenize, methods=["POST"]),
            Route("/detokenize", r.detokenize, methods=["POST"]),
            Route("/v1/completions", r.completions, methods=["POST"]),
            Route("/v1/chat/completions", r.chat, methods=["POST"]),
            Route("/generate", r.generate, methods=["POST"]),
        ]
        handlers = {HTTPException: self._http_error, Exception: self._internal_error}
        return Starlette(routes=routes, exception_handlers=handlers)

    async def _http_error(self, _request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(api.ApiError(exc.status_code, str(exc.detail), kind=kind),
                              headers=exc.headers)  # a 405's ``Allow``

    async def _internal_error(self, _request: Request, exc: Exception) -> Response:
        return error_response(api.ApiError(500, f"internal error: {type(exc).__name__}: {exc}",
                                           kind="internal_server_error"))

    async def health(self, _request: Request) -> Response:
        """200, empty: the engine's front is up; 503 ``{"status": "draining"}`` while it
        drains (routers stop sending); 503 ``{"status": "engine not answering"}`` when the
        engine runs in another process that does not answer a ping (``Backend.alive``)."""
        if self.runner.draining:
            return JSONResponse({"status": "draining"}, status_code=503,
                                headers={"Retry-After": "1"})
        why = await run_in_threadpool(self.backend.alive)
        if why is not None:
            return JSONResponse({"status": "engine not answering", "detail": why},
                                status_code=503)
        return Response(status_code=200)

    async def server_info(self, _request: Request) -> Response:
        """SGLang-style server info with the engine's counters."""
        c = await run_in_threadpool(self.backend.counters)  # waits for a step: off the loop
        return JSONResponse({**self._paths(), "version": _server_version(),
                             "max_total_num_tokens": self.backend.max_context,
                             "max_running_requests": self.limits.max_waiting,
                             "kv_bytes_per_block": self.backend.kv_bytes_per_block,
                             "kv_bytes_per_token": self.backend.kv_bytes_per_block // c.block_size,
                             **c._asdict()})

    def _paths(self) -> dict[str, str]:
        """SGLang's names: ``model_path`` is the directory of the model's files (the tokenizer
        and its config: the weights come from a seed, not a file), so that sglang-router loads
        the tokenizer from it instead of asking a hub for the served name; clients send
        ``served_model_name``."""
        path = str(self.tokenizer.path)
        return {"model_path": path, "tokenizer_path": path, "served_model_name": self.model}

    async def model_info(self, _request: Request) -> Response:
        """SGLang's model info: where the tokenizer is (a Hugging Face tokenizer directory)."""
        return JSONResponse({**self._paths(), "is_generation": True,
                             "vocab_size": self.backend.vocab_size})

    async def models(self, _request: Request) -> Response:
        """OpenAI's model list."""
        card = {"id": self.model, "object": "model", "created": int(self.started),
                "owned_by": "radixcache", "root": str(self.tokenizer.path),
                "max_model_len": self.backend.max_context, "vocab_size": self.backend.vocab_size}
        return JSONResponse({"object": "list", "data": [card]})

    async def version(self, _request: Request) -> Response:
        """The server's version."""
        return JSONResponse({"version": _server_version()})

    async def get_load(self, _request: Request) -> Response:
        """SGLang's load figures, one entry per data-parallel rank (here one): what
        sglang-router's ``/get_loads`` sums (``num_tokens``, tokens held by running
        requests) and what its power-of-two policy balances on."""
        c = await run_in_threadpool(self.backend.counters)  # waits for a step: off the loop
        return JSONResponse([{"dp_rank": 0, "num_reqs": c.running + c.waiting,
                              "num_running_reqs": c.running, "num_waiting_reqs": c.waiting,
                              "num_tokens": c.pinned_blocks * c.block_size,
                              "num_http_requests": self.runner.waiting}])

    async def flush_cache(self, _request: Request) -> Response:
        """Empty the cache; 400 while requests are queued or running (SGLang's rule), with
        how many: none of them is touched (``Backend.flush``)."""
        f = await run_in_threadpool(self.backend.flush)  # waits for a step: off the loop
        if not f.done:
            return JSONResponse({"message": f"cache not flushed: {f.running} requests running, "
                                 f"{f.waiting} waiting", "running": f.running,
                                 "waiting": f.waiting}, status_code=400)
        return JSONResponse({"message": "cache flushed"})

    async def metrics(self, _request: Request) -> Response:
        """Prometheus text."""
        text = await run_in_threadpool(self.stats.text)
        return Response(text, media_type="text/plain; version=0.0.4")


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (IPv4 or IPv6). ``ValueError`` for a port outside
    0-65535, ``OSError`` when the address cannot be bound."""
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is outside 0-65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except (OSError, OverflowError):
        sock.close()
        raise
    return sock
