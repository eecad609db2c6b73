"""The HTTP front in a process of its own (``serve --http --front-process``): a real child
process over the real front wire (ZeroMQ on ipc://), beside an in-process front on the same
engine. Every answer through the child equals the in-process front's (greedy, seeded sampling,
logprobs, stop strings, chat, SGLang's /generate, streamed and not); a client that leaves
aborts its request in the engine; /abort_request, /flush_cache and /metrics go through; the
engine's port drops frames that do not decode and answers a bad submit, never dies of one.
(The drain through the child: tests/test_drain.py.)"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
import zmq

from radixcache.serving.engine import Engine, EngineConfig
from radixcache.serving.front_process import FrontProcess
from radixcache.serving.http import EngineBackend, HttpFront
from radixcache.serving.model import tiny_model
from radixcache.serving.server import Server
from radixcache.wire import frontwire as fw
from radixcache.wire.endpoints import Endpoints, free_ports

MODEL = "radixcache-tiny"
_http = httpx.Client(timeout=120)


class Pair(NamedTuple):
    """One engine served by an in-process front and by a front process."""

    engine: Engine
    inner: HttpFront
    child: FrontProcess


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    engine = Engine(EngineConfig(num_blocks=256, model=tiny_model()))
    server = Server(engine, Endpoints.tcp("127.0.0.1", free_ports(3))).start()
    inner = HttpFront(EngineBackend(engine, server.loop), settle=False).start()
    child = FrontProcess(server, engine, "127.0.0.1", 0, settle=False).start()
    try:
        yield Pair(engine, inner, child)
    finally:
        inner.close()
        child.close()
        server.close()


def _until(holds: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not holds():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def _same(obj: object) -> object:
    """``obj`` without what differs between two answers to the same request: response ids
    and creation times."""
    if isinstance(obj, dict):
        return {k: _same(v) for k, v in obj.items()
                if k not in ("id", "created")}
    if isinstance(obj, list):
        return [_same(v) for v in obj]
    return obj


def _ask(url: str, path: str, body: dict[str, object]) -> tuple[int, object]:
    """The answer to one request on a cold cache: the same forward both ways, so the same
    floats (a cache hit moves logprobs in their 7th digit)."""
    assert _http.post(f"{url}/flush_cache").status_code == 200
    if not body.get("stream"):
        r = _http.post(url + path, json=body)
        return r.status_code, _same(r.json())
    with _http.stream("POST", url + path, json=body) as r:
        events = [line.removeprefix("data: ") for line in r.iter_lines()
                  if line.startswith("data: ")]
        return r.status_code, [e if e == "[DONE]" else _same(json.loads(e)) for e in events]


CHAT = [{"role": "user", "content": "tell me about radix trees"}]
ASKS: list[tuple[str, dict[str, object]]] = [
    ("/v1/completions", {"prompt": "hello there", "max_tokens": 12}),
    ("/v1/completions", {"prompt": "hello there", "max_tokens": 12, "stream": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "sampled words", "max_tokens": 16, "temperature": 0.9,
                         "top_p": 0.8, "top_k": 40, "seed": 7, "logprobs": 3}),
    ("/v1/completions", {"prompt": "sampled words", "max_tokens": 16, "temperature": 0.9,
                         "seed": 7, "logprobs": 2, "stream": True, "echo": True}),
    ("/v1/completions", {"prompt": "hello there", "max_tokens": 40, "stop": ["ong", "e"]}),
    ("/v1/completions", {"prompt": "hello there", "max_tokens": 40, "stop": ["ong"],
                         "stream": True}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 10, "logprobs": True,
                              "top_logprobs": 2}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 10, "stream": True,
                              "stream_options": {"include_usage": True}}),
    ("/generate", {"text": "generate this", "sampling_params": {"max_new_tokens": 8}}),
    ("/generate", {"input_ids": [5, 6, 7, 8], "stream": True,
                   "sampling_params": {"max_new_tokens": 8, "temperature": 0.5, "seed": 3}}),
    ("/v1/completions", {"prompt": [1, 2, 4095], "max_tokens": 3}),
    ("/v1/completions", {"prompt": [1, 2, 999999], "max_tokens": 3}),  # refused by name
    ("/v1/completions", {"prompt": "x", "max_tokens": 1 << 20}),  # past the context
    ("/v1/completions", {"prompt": "x", "max_tokens": 2, "model": "other"}),  # 404
]


@pytest.mark.parametrize(("path", "body"), ASKS, ids=[f"{p} {i}" for i, (p, _) in
                                                      enumerate(ASKS)])
def test_every_answer_through_the_front_process_equals_the_in_process_fronts(
        pair: Pair, path: str, body: dict[str, object]) -> None:
    body = {"model": MODEL, **body} if "model" not in body and path != "/generate" else body
    inner = _ask(pair.inner.url, path, body)
    child = _ask(pair.child.url, path, body)
    assert child == inner
    assert inner[0] in (200, 400, 404)


def test_continuous_usage_counts_every_token_once_through_the_front_process(
        pair: Pair) -> None:
    """The usage so far in each chunk counts the ids that had arrived when the chunk was made
    (in process too: when the event loop lags, a chunk counts ids a later one carries), so it
    is checked for what holds either way: it never falls, and it ends at the answer's."""
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 10, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    _status, events = _ask(pair.child.url, "/v1/chat/completions", body)
    assert isinstance(events, list) and events[-1] == "[DONE]"
    counts = [e["usage"]["completion_tokens"] for e in events[:-1]]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 10
    assert events[-2]["usage"]["total_tokens"] == events[-2]["usage"]["prompt_tokens"] + 10


def test_stop_strings_end_the_answer_where_the_in_process_front_ends_it(pair: Pair) -> None:
    body: dict[str, object] = {"model": MODEL, "prompt": "hello there", "max_tokens": 40}
    whole = _http.post(f"{pair.child.url}/v1/completions", json=body).json()
    text = whole["choices"][0]["text"]
    stop = text[len(text) // 2:len(text) // 2 + 3]  # a piece of the answer's middle
    stopped = _http.post(f"{pair.child.url}/v1/completions", json={**body, "stop": [stop]})
    choice, usage = stopped.json()["choices"][0], stopped.json()["usage"]
    assert (choice["finish_reason"], choice["text"]) == ("stop", text[:text.index(stop)])
    # the engine ended the request there (its stop strings decided in the engine's process)
    assert usage["completion_tokens"] < 40


def _idle(engine: Engine) -> bool:
    s = engine.stats()
    return (s.running, s.waiting) == (0, 0)


def _aborts(url: str) -> float:
    for line in _http.get(f"{url}/metrics").text.splitlines():
        if line.startswith("vllm:request_success_total") and 'finished_reason="abort"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_that_leaves_aborts_its_request_in_the_engine(pair: Pair) -> None:
    before = pair.engine.stats().finished
    body = {"model": MODEL, "prompt": "a story that never ends", "max_tokens": 4000,
            "stream": True}
    with _http.stream("POST", f"{pair.child.url}/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"text":"' in line and '"text":""' not in line:
                break  # the first token arrived: it is running; now leave
    _until(lambda: _idle(pair.engine))
    assert pair.engine.stats().finished == before  # dropped, not finished
    _until(lambda: _aborts(pair.child.url) == 1.0)


def test_abort_request_by_rid_through_the_front_process(pair: Pair) -> None:
    body = {"text": "go on and on", "rid": "mine", "sampling_params": {"max_new_tokens": 4000}}
    answer: list[httpx.Response] = []
    t = threading.Thread(target=lambda: answer.append(
        _http.post(f"{pair.child.url}/generate", json=body)))
    t.start()
    _until(lambda: pair.engine.stats().running == 1)
    again = _http.post(f"{pair.child.url}/generate", json=body)
    assert (again.status_code, again.json()["error"]["param"]) == (400, "rid")
    found = _http.post(f"{pair.child.url}/abort_request", json={"rid": "mine"}).json()
    t.join(120)
    assert found == {"rid": "mine", "found": True}
    assert answer[0].status_code == 503
    assert answer[0].json()["error"]["type"] == "service_unavailable"
    _until(lambda: _idle(pair.engine))


def test_flush_and_server_info_through_the_front_process(pair: Pair) -> None:
    _until(lambda: _idle(pair.engine))
    r = _http.post(f"{pair.child.url}/flush_cache")
    assert (r.status_code, r.json()) == (200, {"message": "cache flushed"})
    assert pair.engine.stats().used_blocks == 0
    info = _http.get(f"{pair.child.url}/get_server_info").json()
    mine = _http.get(f"{pair.inner.url}/get_server_info").json()
    assert info == mine
    assert (info["used_blocks"], info["running"], info["max_total_num_tokens"]) == \
        (0, 0, 256 * 16)


def test_the_engines_port_drops_frames_that_do_not_decode_and_answers_a_bad_submit(
        pair: Pair) -> None:
    port = pair.child.port_
    dropped = port.dropped
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60_000)
    sock.connect(port.endpoint)
    try:
        sock.send(b"\x93\xa6submit\x01")  # msgpack, but no frame
        sock.send(b"not msgpack at all")
        sock.send(fw.encode(fw.Submit(1, [], 4, fw.SamplingFrame())))  # an empty prompt
        assert fw.to_front(sock.recv()) == fw.Done(1, "invalid", "prompt must hold at "
                                                   "least one token", None)
        sock.send(fw.encode(fw.Submit(2, [3, 4], 2, fw.SamplingFrame())))
        frames = [fw.to_front(sock.recv())]
        while not isinstance(frames[-1], fw.Done) and len(frames) < 4:
            frames.append(fw.to_front(sock.recv()))
    finally:
        sock.close()
    assert port.dropped == dropped + 2
    # the tokens of a step each, or of both steps in one frame (the port sends what the steps
    # made since it last sent), then the request's end
    assert {type(f) for f in frames[:-1]} == {fw.Tokens} and 1 <= len(frames) - 1 <= 2
    done = frames[-1]
    assert isinstance(done, fw.Done) and done.error is None and done.metrics is not None
    tokens = [t for f in frames[:-1] if isinstance(f, fw.Tokens) for _, t, _ in f.items]
    assert len(tokens) == done.metrics.output_tokens == 2
    assert pair.child.fault is None


def test_front_process_without_http_is_refused_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--front-process"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: --front-process needs --http (it runs the HTTP " \
        "front)\n"


def test_the_engines_process_settles_its_interpreter_once_the_front_serves() -> None:
    """With the front in a child, serve's process still steps beside a port and a publisher:
    it freezes what start-up made and raises the young threshold, as ``HttpFront.start``
    does in its own process (``http_interp``)."""
    import gc

    from radixcache.serving.http_interp import GEN0_THRESHOLD

    threshold = gc.get_threshold()
    gc.unfreeze()
    engine = Engine(EngineConfig(num_blocks=64, model=tiny_model()))
    server = Server(engine, Endpoints.tcp("127.0.0.1", free_ports(3))).start()
    child = FrontProcess(server, engine, "127.0.0.1", 0)
    try:
        assert child.settled is None
        child.start()
        assert child.settled is not None
        # (other threads free frozen objects as they go: the count only falls)
        assert child.settled.frozen >= gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GEN0_THRESHOLD, *threshold[1:])
        assert _http.get(f"{child.url}/health").status_code == 200
    finally:
        child.close()
        server.close()
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_the_front_process_is_answered_through_its_own_pull_from_the_stepping_thread(
        pair: Pair) -> None:
    """The child named its PULL in Hello: the port sends it everything through a PUSH of
    its own (from the stepping thread after each step), and answers still equal the
    in-process front's (the tests above)."""
    assert pair.child.port_.pushed == 1
    r = _http.post(f"{pair.child.url}/v1/completions",
                   json={"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert pair.child.port_.pushed == 1


def test_a_hello_naming_a_pull_the_port_may_not_connect_to_is_answered_through_the_router(
        pair: Pair, tmp_path: Path) -> None:
    port = pair.child.port_
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60_000)
    sock.connect(port.endpoint)
    try:  # another directory than the port's own: not connected to
        sock.send(fw.encode(fw.Hello(f"ipc://{tmp_path}/elsewhere")))
        assert isinstance(fw.to_front(sock.recv()), fw.Facts)
        assert port.pushed == 1  # the child's only
    finally:
        sock.close()


@pytest.mark.parametrize(("out", "allowed"), [
    ("ipc:///run/rc-front-x/front-1", True),
    ("ipc:///run/rc-front-x/sub/front-1", False),
    ("ipc:///tmp/front-1", False),
    ("ipc:///run/rc-front-x/../rc-front-y/front-1", False),
    ("tcp://127.0.0.1:5555", True),
    ("tcp://[::1]:5555", True),
    ("tcp://10.0.0.1:5555", False),
    ("tcp://127.0.0.1:*", False),
    ("inproc://x", False),
    ("", False),
])
def test_which_pulls_the_engines_port_connects_to(out: str, allowed: bool) -> None:
    assert fw.out_allowed(out, fw.endpoint_dir("ipc:///run/rc-front-x/engine")) is allowed


def test_a_front_process_that_dies_has_its_requests_aborted_in_the_engine() -> None:
    """Nobody reads a dead front's tokens: when its PULL goes away (SIGKILL), the port
    aborts that front's requests instead of running them to their end."""
    import signal as sig

    engine = Engine(EngineConfig(num_blocks=512, model=tiny_model()))
    server = Server(engine, Endpoints.tcp("127.0.0.1", free_ports(3))).start()
    child = FrontProcess(server, engine, "127.0.0.1", 0, settle=False).start()
    first = threading.Event()

    def client() -> None:
        body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 6000, "stream": True}
        try:
            with httpx.stream("POST", f"{child.url}/v1/completions", json=body,
                              timeout=120) as r:
                for _ in r.iter_lines():
                    first.set()
        except httpx.HTTPError:
            pass  # the front was killed under it

    t = threading.Thread(target=client, daemon=True)
    t.start()
    try:
        assert first.wait(60)
        assert engine.stats().running == 1
        proc = child._proc
        assert proc is not None
        proc.send_signal(sig.SIGKILL)
        _until(lambda: child.port_.lost == 1 and engine.stats().running == 0, 30)
        st = engine.stats()
        assert (st.cancelled, st.finished) == (1, 0)
        assert st.output_tokens < 6000
        assert child.port_.pushed == 0
    finally:
        child.close()
        server.close()
        t.join(10)
