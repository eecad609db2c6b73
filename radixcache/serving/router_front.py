"""The cluster's front door: one small HTTP relay that holds the public port and forwards every
request to sglang-router, holding it while the router is down or restarting.

::

    client ──► RouterFront (the public port) ──► sglang-router (a private port) ──► replicas
               one asyncio thread of `cluster`    restarted by the supervisor

Per request (one per client connection: the front asks the router for ``Connection: close``,
so every answer ends with its connection and a client opens a new one for the next):

- the head (``MAX_HEAD`` bytes at most) and a ``Content-Length`` body (``MAX_BODY``) are read
  whole; a chunked upload gets 411, a head too large 431, a body too large 413, a malformed
  head 400, each with OpenAI's error body and one line naming what is wrong;
- a prompt of token ids to ``/v1/completions`` gets a 400 from here: sglang-router 0.3.2's
  typed body takes text only and answers 422 with a serde message (``/generate`` with
  ``input_ids`` goes through it, and a replica takes both);
- the request is sent to the router while ``ready()`` says the router is up; while the
  connection is refused, or the router closes it before the first byte of an answer (it was
  killed with the request in flight), the same bytes are sent again every ``poll_s``, for up to
  ``hold_s``; after that the client gets 503 with ``Retry-After``. Resending is safe because no
  answer reached anyone: the killed router's connections to the replicas closed with it, and a
  replica cancels a request whose client left;
- once the first byte has come, the answer is relayed as it arrives (streams included) until
  the router closes; a router that dies in the middle of an answer cuts it (the client sees a
  truncated body, an error, never a short answer passed off as whole);
- a client that leaves closes the router's connection, so the replica cancels its request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from radixcache.core.guard import Guard

MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"expect", b"te",
                        b"upgrade", b"transfer-encoding"})
TOKEN_IDS = ("token-id prompts are not forwarded by sglang-router 0.3.2 (its /v1/completions "
             "takes text): send text, use /generate with input_ids, or call a replica")


class Request(NamedTuple):
    """One client request, read whole."""

    method: bytes
    path: bytes
    raw: bytes  # what the router is sent: head (hop-by-hop headers dropped) and body
    body: bytes


class Refused(Exception):
    """A request answered by the front itself: status, reason phrase, one-line message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def error_answer(status: int, reason: str, message: str, extra: str = "") -> bytes:
    """A whole HTTP answer with OpenAI's error body."""
    kind = "invalid_request_error" if status < 500 else "service_unavailable"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": None}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{extra}connection: close\r\n\r\n").encode() + body


def is_token_ids(prompt: object) -> bool:
    """True for a prompt of token ids: ``[1, 2]`` or ``[[1, 2], [3]]`` (OpenAI's two forms)."""
    if not isinstance(prompt, list) or not prompt:
        return False
    first = prompt[0]
    return isinstance(first, int) or (isinstance(first, list) and bool(first)
                                      and isinstance(first[0], int))


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Request:
    """Read one request whole (see the module doc); raises ``Refused`` for what it refuses and
    ``asyncio.IncompleteReadError`` when the client leaves before it is whole."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise Refused(431, "Request Header Fields Too Large",
                      f"request head over {MAX_HEAD} bytes") from None
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise Refused(400, "Bad Request", "malformed request line")
    headers = [(k.strip().lower(), v.strip()) for k, _, v in
               (line.partition(b":") for line in lines[1:])]
    names = {k: v for k, v in headers}
    if b"transfer-encoding" in names:
        raise Refused(411, "Length Required", "chunked uploads are not taken: send "
                                              "Content-Length")
    try:
        length = int(names.get(b"content-length", b"0"))
    except ValueError:
        raise Refused(400, "Bad Request", "Content-Length is not a number") from None
    if not 0 <= length <= MAX_BODY:
        raise Refused(413, "Content Too Large", f"body over {MAX_BODY} bytes")
    if names.get(b"expect", b"").lower() == b"100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = await reader.readexactly(length)
    kept = [lines[0], *(line for (k, _), line in zip(headers, lines[1:], strict=True)
                        if k not in HOP_BY_HOP), b"connection: close"]
    path = parts[1].split(b"?", 1)[0]
    return Request(parts[0], path, b"\r\n".join(kept) + b"\r\n\r\n" + body, body)


def refuse_token_ids(req: Request) -> None:
    """Raise ``Refused`` (400) for a token-id prompt to ``/v1/completions``."""
    if req.method != b"POST" or req.path != b"/v1/completions":
        return
    try:
        doc = json.loads(req.body)
    except ValueError:
        return  # the router says what is wrong with it
    if isinstance(doc, dict) and is_token_ids(doc.get("prompt")):
        raise Refused(400, "Bad Request", TOKEN_IDS)


class RouterFront:
    """The relay of the module doc on ``host:port`` (0: a free port) to ``backend``."""

    def __init__(self, host: str, port: int, backend: tuple[str, int],
                 ready: Callable[[], bool], *, hold_s: float = 30.0,
                 poll_s: float = 0.02) -> None:
        self.backend, self.ready = backend, ready
        self.hold_s, self.poll_s = hold_s, poll_s
        self._sock = socket.create_server((host, port))  # raises OSError now: port taken
        self.host, self.port = host, int(self._sock.getsockname()[1])
        self.held = 0  # requests held (sent again) at least once: written by the front's thread
        self._loop = asyncio.new_event_loop()
        self._stopped = asyncio.Event()
        self._thread: threading.Thread | None = None
        self.guard = Guard()

    @property
    def url(self) -> str:
        """The public address."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> RouterFront:
        """Serve on a daemon thread; returns self."""
        self._thread = self.guard.start("rc-router-front", self._run)
        return self

    def close(self) -> None:
        """Stop serving and close the port (requests in flight are cut)."""
        if self._thread is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(10)
        self._sock.close()

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        server = await asyncio.start_server(self._serve, sock=self._sock, limit=MAX_HEAD)
        async with server:
            await self._stopped.wait()
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:  # the connections in flight: cut, their sockets closed
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            req = await read_request(reader, writer)
            refuse_token_ids(req)
            work = asyncio.ensure_future(self._forward(req, writer))
            gone = asyncio.ensure_future(_until_eof(reader))  # the client left
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            for task in (work, gone):
                task.cancel()
            await asyncio.gather(work, gone, return_exceptions=True)
        except Refused as exc:
            writer.write(error_answer(exc.status, exc.reason, exc.message))
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client left
        finally:
            await _close(writer)

    async def _forward(self, req: Request, writer: asyncio.StreamWriter) -> None:
        deadline, held = time.monotonic() + self.hold_s, False
        while True:
            got = await self._attempt(req)
            if got is not None:
                break
            if time.monotonic() > deadline:
                writer.write(error_answer(503, "Service Unavailable",
                                          f"the router has not answered for {self.hold_s:g} s",
                                          "retry-after: 1\r\n"))
                return
            if not held:
                self.held, held = self.held + 1, True
            await asyncio.sleep(self.poll_s)
        up_reader, up_writer, first = got
        try:
            data = first
            while data:
                writer.write(data)
                await writer.drain()
                data = await up_reader.read(65536)
        except OSError:
            pass  # either side went away: the client sees its answer cut
        finally:
            await _close(up_writer)

    async def _attempt(self, req: Request) -> tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                                    bytes] | None:
        """Send ``req`` to the router: its connection and the first bytes of the answer, or
        None when the router refused the connection or closed it without answering."""
        if not self.ready():
            return None
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.backend)
        except OSError:
            return None
        try:
            up_writer.write(req.raw)
            await up_writer.drain()
            first = await up_reader.read(65536)
        except OSError:
            first = b""
        except asyncio.CancelledError:
            await _close(up_writer)
            raise
        if not first:
            await _close(up_writer)
            return None
        return up_reader, up_writer, first


async def _until_eof(reader: asyncio.StreamReader) -> None:
    """Return when the client closes its side; what it sends after its request (a stray CRLF,
    a pipelined request: answered with ``Connection: close``, so never read) is dropped."""
    while await reader.read(65536):
        pass


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
