"""The streaming client of ``radixcache load`` and ``bench serve``: an OpenAI ``stream: true``
request's Server-Sent Events, chunk by chunk, over aiohttp.

A client on the server's machine takes its CPU from the server, so the client is the light
one that SGLang's ``bench_serving`` and vLLM's ``benchmark_serving`` stream with (aiohttp, its
HTTP parser in C). Measured on 2 cores (300 completions of 32 streamed tokens sent at once to
``serve --http``): httpx's client spent 2.2-2.5 CPU seconds, aiohttp's 0.42, and the server
answered 73-77 requests/s beside the first and 91-98 beside the second.

``session(limit, timeout_s)`` opens a session of at most ``limit`` connections, each socket
operation (connect, a read) bounded by ``timeout_s`` (no bound on a whole answer: a long one
streams for as long as it streams); ``stream(session, url, body)`` yields ``(arrival,
chunk)`` for every ``data:`` line but ``[DONE]``, ``arrival`` its ``time.perf_counter()``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec

# what a request can fail of on the way (a refused connection, a reset, a timeout)
CLIENT_ERRORS = (aiohttp.ClientError, TimeoutError)
# nothing was sent: the connection was refused (a router being restarted)
Refused = aiohttp.ClientConnectorError

_decode = msgspec.json.Decoder().decode


class StreamRefused(RuntimeError):
    """The server answered the request with another status than 200."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status


def session(limit: int, timeout_s: float) -> aiohttp.ClientSession:
    """A client session (``async with``): at most ``limit`` connections at once (the others
    wait for one), each connect and each read bounded by ``timeout_s``."""
    timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_read=timeout_s)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit), timeout=timeout)


async def stream(s: aiohttp.ClientSession, url: str, body: dict[str, Any]
                 ) -> AsyncIterator[tuple[float, dict[str, Any]]]:
    """POST ``body`` to ``url`` and yield each event's arrival time and JSON object;
    ``StreamRefused`` when the status is not 200, ``ValueError`` for an event that is not
    JSON."""
    async with s.post(url, json=body) as resp:
        if resp.status != 200:
            raise StreamRefused(resp.status, await resp.read())
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            at = time.perf_counter()
            try:
                chunk = _decode(line[6:])
            except msgspec.DecodeError as exc:
                raise ValueError(f"an event that is not JSON: {line[:120]!r} ({exc})") from None
            if isinstance(chunk, dict):
                yield at, chunk
