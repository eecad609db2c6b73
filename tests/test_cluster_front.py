"""The cluster's front door (``serving/router_front.py``) on loopback, against a real stdlib
HTTP server standing in for sglang-router: a request is held while the router is down and
answered once it listens; a router that drops a request without answering gets it again;
what it refuses (token-id prompts, chunked uploads, huge heads) gets one clear error; a
client that leaves closes the router's connection."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest

from radixcache.serving.cluster import free_port_run
from radixcache.serving.router_front import MAX_HEAD, TOKEN_IDS, RouterFront
from tests.helpers.stream import wait_for


class Backend(BaseHTTPRequestHandler):
    """Answers ``POST /v1/completions`` with the body it got; ``/hang`` waits until the
    front closes the connection, then says so; ``/drop`` closes once without answering."""

    entered: ClassVar[threading.Event] = threading.Event()
    closed: ClassVar[threading.Event] = threading.Event()
    drops: ClassVar[list[int]] = [1]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/drop" and self.drops[0] > 0:
            self.drops[0] -= 1
            self.close_connection = True
            return  # no answer: as a router killed with the request in flight
        if self.path == "/hang":
            self.entered.set()
            self.rfile.read(1)  # b"" once the front closes its side
            self.closed.set()
            return
        out = json.dumps({"got": json.loads(body), "connection": self.headers["Connection"]})
        data = out.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        """Quiet."""


@pytest.fixture
def port() -> int:
    return free_port_run(1)


@pytest.fixture
def backend(port: int) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", port), Backend)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def front_to(port: int, hold_s: float = 30.0) -> RouterFront:
    return RouterFront("127.0.0.1", 0, ("127.0.0.1", port), lambda: True, hold_s=hold_s).start()


def test_a_request_is_held_while_the_router_is_down_and_answered_once_it_listens(
        port: int) -> None:
    front = front_to(port)
    got: list[httpx.Response] = []
    t = threading.Thread(target=lambda: got.append(httpx.post(
        f"{front.url}/v1/completions", json={"prompt": "hi"}, timeout=60)))
    t.start()
    try:
        assert wait_for(lambda: front.held == 1, timeout=10)  # refused, held
        server = ThreadingHTTPServer(("127.0.0.1", port), Backend)  # the router is back
        threading.Thread(target=server.serve_forever, daemon=True).start()
        t.join(60)
        server.shutdown()
        server.server_close()
    finally:
        front.close()
    (r,) = got
    assert r.status_code == 200
    assert r.json() == {"got": {"prompt": "hi"}, "connection": "close"}


def test_a_request_the_router_dropped_unanswered_is_sent_again(
        backend: ThreadingHTTPServer, port: int) -> None:
    Backend.drops[0] = 1
    front = front_to(port)
    try:
        r = httpx.post(f"{front.url}/drop", json={"prompt": "again"}, timeout=30)
    finally:
        front.close()
    assert (r.status_code, r.json()["got"], front.held, Backend.drops) == (
        200, {"prompt": "again"}, 1, [0])


def test_a_router_down_past_the_hold_is_a_503_with_retry_after(port: int) -> None:
    front = front_to(port, hold_s=0.2)
    try:
        r = httpx.post(f"{front.url}/v1/completions", json={"prompt": "hi"}, timeout=30)
    finally:
        front.close()
    assert (r.status_code, r.headers["retry-after"]) == (503, "1")
    assert r.json()["error"]["message"] == "the router has not answered for 0.2 s"


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2], [3]]])
def test_token_id_prompts_get_one_clear_error_from_the_front(
        backend: ThreadingHTTPServer, port: int, prompt: list[object]) -> None:
    front = front_to(port)
    try:
        r = httpx.post(f"{front.url}/v1/completions", json={"prompt": prompt}, timeout=30)
        text = httpx.post(f"{front.url}/v1/completions", json={"prompt": ["a", "b"]},
                          timeout=30)
    finally:
        front.close()
    assert r.status_code == 400
    assert r.json() == {"error": {"message": TOKEN_IDS, "type": "invalid_request_error",
                                  "param": None, "code": None}}
    assert text.json()["got"] == {"prompt": ["a", "b"]}  # a list of texts goes through


def _raw(front: RouterFront, data: bytes) -> bytes:
    with socket.create_connection((front.host, front.port), timeout=30) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_bytes_after_the_request_are_not_a_client_leaving(backend: ThreadingHTTPServer,
                                                           port: int) -> None:
    front = front_to(port)
    try:  # a stray CRLF after the body (old clients send one)
        out = _raw(front, b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}\r\n")
    finally:
        front.close()
    assert out.split(b"\r\n", 1)[0] == b"HTTP/1.0 200 OK"
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["got"] == {}


def test_what_the_front_refuses_is_one_line_each(backend: ThreadingHTTPServer,
                                                 port: int) -> None:
    front = front_to(port)
    try:
        chunked = _raw(front, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        huge = _raw(front, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEAD + b"\r\n\r\n")
        bad = _raw(front, b"NONSENSE\r\n\r\n")
        length = _raw(front, b"POST / HTTP/1.1\r\nContent-Length: lots\r\n\r\n")
    finally:
        front.close()
    firsts = [r.split(b"\r\n", 1)[0] for r in (chunked, huge, bad, length)]
    assert firsts == [b"HTTP/1.1 411 Length Required",
                      b"HTTP/1.1 431 Request Header Fields Too Large",
                      b"HTTP/1.1 400 Bad Request", b"HTTP/1.1 400 Bad Request"]
    assert [json.loads(r.split(b"\r\n\r\n", 1)[1])["error"]["message"]
            for r in (chunked, huge, bad, length)] == [
        "chunked uploads are not taken: send Content-Length",
        f"request head over {MAX_HEAD} bytes", "malformed request line",
        "Content-Length is not a number"]


def test_a_client_that_leaves_closes_the_routers_connection(backend: ThreadingHTTPServer,
                                                            port: int) -> None:
    Backend.entered.clear()
    Backend.closed.clear()
    front = front_to(port)
    try:
        with socket.create_connection((front.host, front.port), timeout=30) as s:
            s.sendall(b"POST /hang HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            assert Backend.entered.wait(10)  # the router has it
            assert not Backend.closed.is_set()
        # the client left: the front closes its side, the router (here: the backend) sees it
        assert Backend.closed.wait(10)
    finally:
        front.close()
