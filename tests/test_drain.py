"""SIGTERM of `serve --http` drains: a real `serve` process, real HTTP clients on loopback; each
process test both ways: the front in a child process (serve's default) and in a thread
(`--front-thread`); serve's drain is the same.

The engine is paused over its command socket before the requests are sent, so every one of them
is provably in flight (queued in the engine, counted by /get_load) when SIGTERM arrives; the
test then waits for /health to say draining, checks that a new request is refused, and resumes
the engine (or lets the grace run out, or signals again). No sleeps: each step waits on what
the server answers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from radixcache.wire.endpoints import free_ports

ROOT = Path(__file__).resolve().parents[1]
MODEL = "radixcache-tiny"
MAX_TOKENS = 6


@dataclass
class Serve:
    """A `serve --http` child process."""

    proc: subprocess.Popen[str]
    url: str
    commands: str  # its ZeroMQ command endpoint

    def command(self, c: cmd.AnyCommand) -> None:
        reply = send_command(self.commands, c, timeout_s=30)
        assert isinstance(reply, cmd.Ok), reply

    def ended(self) -> tuple[int, str]:
        """Its exit status and stderr, once it has exited."""
        _out, err = self.proc.communicate(timeout=120)
        return self.proc.returncode, err


def wait_for(what: str, ok: Callable[[], bool], timeout_s: float = 120) -> None:
    """Poll ``ok()`` (each call is a request to the server) until true."""
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _status(url: str) -> int | None:
    """GET ``url``'s status (None while nothing listens)."""
    try:
        return httpx.get(url, timeout=30).status_code
    except httpx.TransportError:
        return None


@pytest.fixture
def serve(request: pytest.FixtureRequest) -> Iterator[Serve]:
    extra: list[str] = getattr(request, "param", [])
    zmq, http = free_ports(3), free_ports(1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--port", str(zmq),
                             "--http", str(http), "--blocks", "1024", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    s = Serve(proc, f"http://127.0.0.1:{http}", f"tcp://127.0.0.1:{zmq + 2}")
    try:
        wait_for("/health", lambda: _status(f"{s.url}/health") == 200
                 or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()
        yield s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@dataclass
class Answer:
    """One client's request and what came back."""

    path: str
    stream: bool
    status: int = 0
    body: dict[str, object] = field(default_factory=dict)  # a non-streamed answer
    events: list[str] = field(default_factory=list)  # a stream's ``data:`` payloads


def _ask(client: httpx.Client, url: str, a: Answer, i: int) -> None:
    body: dict[str, object] = {"model": MODEL, "max_tokens": MAX_TOKENS, "stream": a.stream}
    if a.path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": f"question number {i}"}]
    else:
        body["prompt"] = f"prompt number {i} for the drain"
    if not a.stream:
        r = client.post(url + a.path, json=body)
        a.status, a.body = r.status_code, r.json()
        return
    with client.stream("POST", url + a.path, json=body) as r:
        a.status = r.status_code
        a.events = [line.removeprefix("data: ") for line in r.iter_lines()
                    if line.startswith("data: ")]


def _send(s: Serve, n: int) -> tuple[list[Answer], list[threading.Thread]]:
    """``n`` requests (completions and chat, streamed and not, in turn), each on its own
    thread; returns once the paused engine holds all ``n`` in its queue."""
    client = httpx.Client(timeout=300, limits=httpx.Limits(max_connections=n))
    answers = [Answer(("/v1/completions", "/v1/chat/completions")[i // 2 % 2], i % 2 == 0)
               for i in range(n)]
    threads = [threading.Thread(target=_ask, args=(client, s.url, a, i))
               for i, a in enumerate(answers)]
    for t in threads:
        t.start()
    wait_for(f"{n} queued requests", lambda: httpx.get(
        f"{s.url}/get_load", timeout=30).json()[0]["num_waiting_reqs"] == n)
    return answers, threads


def _sigterm_and_wait_for_the_drain(s: Serve) -> None:
    s.proc.send_signal(signal.SIGTERM)
    wait_for("/health to say draining", lambda: _status(f"{s.url}/health") == 503)
    health = httpx.get(f"{s.url}/health", timeout=30)
    assert health.json() == {"status": "draining"}


def _complete(a: Answer) -> bool:
    """A whole answer: MAX_TOKENS tokens, finish_reason length, a stream ending in [DONE]."""
    if a.status != 200:
        return False
    if not a.stream:
        choice = a.body["choices"][0]  # type: ignore[index]
        return choice["finish_reason"] == "length" and \
            a.body["usage"]["completion_tokens"] == MAX_TOKENS  # type: ignore[index]
    last = json.loads(a.events[-2])
    return a.events[-1] == "[DONE]" and last["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("serve", [["--front-thread"], []], indirect=True,
                         ids=["in-process", "front-process"])
def test_sigterm_with_24_requests_in_flight_answers_all_24(serve: Serve) -> None:
    serve.command(cmd.Pause())
    answers, threads = _send(serve, 24)
    _sigterm_and_wait_for_the_drain(serve)
    refused = httpx.post(f"{serve.url}/v1/completions", timeout=30,
                         json={"model": MODEL, "prompt": "too late", "max_tokens": 2})
    assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
    assert refused.json()["error"]["type"] == "service_unavailable"
    serve.command(cmd.Resume())
    for t in threads:
        t.join(300)
    assert [a for a in answers if not _complete(a)] == []
    assert sum(a.stream for a in answers) == 12
    rc, err = serve.ended()
    assert rc == 0, err
    assert "Traceback" not in err and "ERROR" not in err
    assert "draining: 24 HTTP requests in flight, grace 30 s" in err
    assert "drained: every request answered (24 in flight)" in err


def _cut(a: Answer, why: str) -> bool:
    """Answered 503 ``why`` in OpenAI's error shape (a stream: the error event, then
    [DONE], after at most the role chunk)."""
    if not a.stream:
        return a.status == 503 and why in a.body["error"]["message"]  # type: ignore[index]
    error = json.loads(a.events[-2])
    return a.status == 200 and a.events[-1] == "[DONE]" and len(a.events) <= 3 and \
        error["error"]["type"] == "service_unavailable" and why in error["error"]["message"]


@pytest.mark.parametrize("serve", [["--drain-s", "0.5", "--front-thread"], ["--drain-s", "0.5"]],
                         indirect=True, ids=["in-process", "front-process"])
def test_a_drain_whose_grace_runs_out_answers_every_request_503(serve: Serve) -> None:
    serve.command(cmd.Pause())  # nothing will finish
    answers, threads = _send(serve, 4)
    serve.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(300)
    why = "did not finish within its drain grace of 0.5 s"
    assert [a for a in answers if not _cut(a, why)] == []
    rc, err = serve.ended()
    assert rc == 0, err
    assert "Traceback" not in err and "ERROR" not in err
    assert f"drain cut short: 4 requests answered 503 (the server is shutting down and this " \
           f"request {why})" in err


@pytest.mark.parametrize("serve", [["--drain-s", "600", "--front-thread"], ["--drain-s", "600"]],
                         indirect=True, ids=["in-process", "front-process"])
def test_a_second_signal_cuts_the_grace_short(serve: Serve) -> None:
    serve.command(cmd.Pause())
    answers, threads = _send(serve, 4)
    _sigterm_and_wait_for_the_drain(serve)
    serve.proc.send_signal(signal.SIGINT)  # Ctrl-C, as a second SIGTERM, ends the wait
    for t in threads:
        t.join(300)
    why = "was told not to wait for this request"
    assert [a for a in answers if not _cut(a, why)] == []
    rc, err = serve.ended()
    assert rc == 0, err
    assert "Traceback" not in err and "drain cut short: 4 requests answered 503" in err


def test_a_running_stream_and_a_body_still_arriving_are_answered_when_cut() -> None:
    """In process: a stream the engine is decoding, and a request whose body is half sent,
    when a drain with no grace cuts them: the stream gets an error event, then [DONE]; the
    half-sent request a 503 in OpenAI's shape; the front then closes."""
    from tests.helpers.http import http_engine

    with http_engine(512) as front:
        client = httpx.Client(timeout=120)
        events: list[str] = []
        first = threading.Event()

        def stream() -> None:
            body = {"model": MODEL, "prompt": "go on", "max_tokens": 4000, "stream": True}
            with client.stream("POST", f"{front.url}/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line.removeprefix("data: "))
                        first.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(120)  # decoding: its first token was streamed
        with socket.create_connection(("127.0.0.1", front.port)) as half:
            half.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                         b"application/json\r\ncontent-length: 100\r\n\r\n{\"prompt\": ")
            wait_for("both in flight", lambda: httpx.get(
                f"{front.url}/get_load", timeout=30).json()[0]["num_http_requests"] == 2)
            assert front.stop_admitting() == 2
            drained = front.finish_drain(0.0, lambda: False)
            answer = half.recv(65536).decode()
        t.join(120)
    assert drained.cut == drained.in_flight == 2
    assert drained.reason is not None and "drain grace of 0 s" in drained.reason
    error = json.loads(events[-2])["error"]
    assert events[-1] == "[DONE]" and error["type"] == "service_unavailable"
    assert error["message"] == drained.reason
    head, _, body = answer.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 503 ")
    assert json.loads(body)["error"]["message"] == drained.reason


@pytest.mark.parametrize("serve", [[]], indirect=True, ids=["front-process"])
def test_the_front_process_says_unhealthy_while_its_engine_is_stopped(serve: Serve) -> None:
    """A router health-checks the front; with the front in a process of its own, a stopped
    engine (SIGSTOP) must not look healthy: /health pings the engine's port, and says 503
    until it answers again."""
    serve.proc.send_signal(signal.SIGSTOP)  # serve's process is the engine's
    try:
        r = httpx.get(f"{serve.url}/health", timeout=30)
        assert r.status_code == 503
        assert r.json() == {"status": "engine not answering",
                            "detail": "the engine did not answer 'ping' within 2 s"}
    finally:
        serve.proc.send_signal(signal.SIGCONT)
    wait_for("/health after SIGCONT", lambda: _status(f"{serve.url}/health") == 200)
    serve.proc.send_signal(signal.SIGTERM)
    rc, err = serve.ended()
    assert rc == 0, err


@pytest.mark.parametrize("serve", [[]], indirect=True, ids=["front-process"])
def test_a_killed_serve_takes_its_front_process_and_its_http_port_with_it(serve: Serve) -> None:
    """SIGKILL of serve (a crashed replica): its front's process ends with it, so nothing
    holds the HTTP socket and a restarted serve binds the same port."""
    pid = serve.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1
    front = int(children[0])
    serve.proc.send_signal(signal.SIGKILL)
    serve.proc.communicate(timeout=30)

    def gone() -> bool:
        try:
            state = Path(f"/proc/{front}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        return state in ("Z", "X")  # ended (a zombie until init reaps it)

    wait_for("the front's process to end", gone, timeout_s=10)
    port = int(serve.url.rsplit(":", 1)[1])
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
