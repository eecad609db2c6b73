"""Clients that leave, stall or flood: each leaving client's request is dropped at the
engine's next step (streamed or not, waiting or running), counted as an abort, and logs
nothing; the queue of HTTP requests is bounded; a connection that sends nothing is closed;
bodies Python cannot hold are 400s."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from radixcache.serving.http import HttpFront
from radixcache.serving.http_run import Limits
from tests.helpers.http import MODEL, http_engine, scrape

LONG = {"model": MODEL, "prompt": "a story that never ends", "max_tokens": 900}


@pytest.fixture
def front(caplog: pytest.LogCaptureFixture) -> Iterator[HttpFront]:
    caplog.set_level(logging.INFO)
    uvicorn_log = logging.getLogger("uvicorn")  # it does not propagate to the root
    uvicorn_log.addHandler(caplog.handler)
    try:
        with http_engine(64, Limits(max_waiting=8, read_timeout_s=1.0)) as f:
            yield f
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    # nothing logged for clients that left, stalled or were refused
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def _engine_idle(front: HttpFront) -> tuple[int, int]:
    m = front.backend.engine.stats()  # type: ignore[attr-defined]
    return m.running, m.waiting


def _until(holds: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait until ``holds()`` (polled every 10 ms); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not holds():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def _wait_idle(front: HttpFront) -> None:
    # the aborts land at the engine's next step
    _until(lambda: _engine_idle(front) == (0, 0) and front.runner.waiting == 0)


def _send_and_leave(front: HttpFront, body: bytes) -> None:
    engine = front.backend.engine  # type: ignore[attr-defined]
    before = engine.stats().submitted
    with socket.create_connection((front.host, front.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: " + str(len(body)).encode()
                  + b"\r\n\r\n" + body)
        _until(lambda: engine.stats().submitted > before)  # admitted: then the client leaves


def test_clients_that_leave_free_their_requests(front: HttpFront) -> None:
    import json

    streamed = json.dumps({**LONG, "stream": True}).encode()
    plain = json.dumps(LONG).encode()
    for body in (plain, streamed, plain, streamed):
        _send_and_leave(front, body)
    _wait_idle(front)
    assert _engine_idle(front) == (0, 0)
    assert front.runner.waiting == 0
    engine = front.backend.engine  # type: ignore[attr-defined]
    engine.tree.check()
    assert engine.pinned_blocks() == 0  # every pin released
    r = httpx.post(f"{front.url}/v1/completions", timeout=30,
                   json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert r.json()["usage"]["completion_tokens"] == 2
    values = scrape(front)
    m = (("model_name", MODEL),)
    assert values[("vllm:request_success_total", (("finished_reason", "abort"), *m))] == 4
    assert values[("vllm:request_success_total", (("finished_reason", "length"), *m))] == 1
    assert engine.stats().cancelled == 4


def test_abort_request_by_rid(front: HttpFront) -> None:
    import threading

    got: list[httpx.Response] = []
    body = {"text": "go on", "rid": "r-1", "sampling_params": {"max_new_tokens": 900}}
    t = threading.Thread(target=lambda: got.append(
        httpx.post(f"{front.url}/generate", json=body, timeout=60)))
    t.start()
    _until(lambda: _engine_idle(front)[0] == 1)
    again = httpx.post(f"{front.url}/generate", json=body, timeout=10)
    assert (again.status_code, again.json()["error"]["param"]) == (400, "rid")
    r = httpx.post(f"{front.url}/abort_request", json={"rid": "r-1"}, timeout=10)
    assert r.json() == {"rid": "r-1", "found": True}
    t.join(30)
    assert got[0].status_code == 503  # the waiting client is told its request was dropped
    assert httpx.post(f"{front.url}/abort_request", json={"rid": "r-1"},
                      timeout=10).json() == {"rid": "r-1", "found": False}
    _wait_idle(front)
    assert _engine_idle(front) == (0, 0)


def test_the_queue_is_bounded_with_retry_after(front: HttpFront) -> None:
    socks = [socket.create_connection((front.host, front.port)) for _ in range(8)]
    try:  # 8 requests whose bodies never finish: the front's 8 places are taken
        for s in socks:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                      b"\r\n{")
        _until(lambda: front.runner.waiting == 8)  # the front holds all 8 places
        r = httpx.post(f"{front.url}/v1/completions", json=LONG, timeout=10)
        assert (r.status_code, r.headers["retry-after"]) == (429, "1")
        assert r.json()["error"]["type"] == "rate_limit_error"
        # the slow bodies time out (408) after the read timeout, and the places come back
        replies = [s.recv(4096) for s in socks]
        assert all(x.startswith(b"HTTP/1.1 408 ") for x in replies)
    finally:
        for s in socks:
            s.close()
    _wait_idle(front)
    r = httpx.post(f"{front.url}/v1/completions", timeout=30,
                   json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200


def test_a_connection_that_sends_no_request_is_closed(front: HttpFront) -> None:
    with socket.create_connection((front.host, front.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\n")  # and never the rest of the headers
        s.settimeout(10)  # the read timeout is 1 s: a socket.timeout here would fail
        assert s.recv(4096) == b""  # closed by the server
    with socket.create_connection((front.host, front.port)) as idle:
        idle.settimeout(10)
        assert idle.recv(4096) == b""


@pytest.mark.parametrize("raw", [
    b'{"prompt": ' + b"1" * 5000 + b"}",  # an integer Python will not convert
    b"[" * 100_000 + b"]" * 100_000,  # nesting deeper than the parser recurses
    b'{"prompt": "\\ud800", "max_tokens": 1e999}',
    b"\xff\xfe{}",
])
def test_bodies_python_cannot_hold_are_400(front: HttpFront, raw: bytes) -> None:
    r = httpx.post(f"{front.url}/v1/completions", content=raw, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
