"""/flush_cache against a real front and engine on 127.0.0.1: POST only, refused (400, with
how many) while requests wait or run and then touching none of them, and atomic with
admission: clients and flushers at once lose no request."""

from __future__ import annotations

import threading
from collections import Counter

import httpx

from radixcache.wire import commands as cmd
from tests.helpers.http import MODEL, http_engine

CLIENTS, PER_CLIENT, FLUSHERS = 4, 40, 2


def test_get_is_refused_with_allow_post() -> None:
    with http_engine(64) as front:
        r = httpx.get(f"{front.url}/flush_cache", timeout=60)
        assert (r.status_code, r.headers["allow"]) == (405, "POST")
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert httpx.post(f"{front.url}/flush_cache", timeout=60).json() == {
            "message": "cache flushed"}


def test_a_flush_while_a_request_waits_is_refused_and_the_request_lives() -> None:
    with http_engine(64) as front:
        loop = front.backend._loop  # type: ignore[attr-defined]
        loop.command(cmd.Pause())
        answer: list[httpx.Response] = []
        t = threading.Thread(target=lambda: answer.append(httpx.post(
            f"{front.url}/v1/completions", timeout=120,
            json={"model": MODEL, "prompt": "wait for me", "max_tokens": 3})))
        t.start()
        while front.backend.counters().waiting != 1:  # queued: the engine admits nothing
            assert t.is_alive()
        refused = httpx.post(f"{front.url}/flush_cache", timeout=60)
        assert refused.status_code == 400
        assert refused.json() == {"message": "cache not flushed: 0 requests running, 1 waiting",
                                  "running": 0, "waiting": 1}
        loop.command(cmd.Resume())
        t.join(120)
        [r] = answer
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_clients_and_flushers_at_once_lose_no_request() -> None:
    """Was: a flush checked for running requests, then reset; a request admitted in between
    was cancelled (``503 request N cancelled before admission``)."""
    with http_engine(256) as front:
        done = threading.Event()
        statuses: Counter[int] = Counter()
        flushes: Counter[int] = Counter()
        lock = threading.Lock()

        def client(c: int) -> None:
            with httpx.Client(timeout=120) as http:
                for i in range(PER_CLIENT):
                    r = http.post(f"{front.url}/v1/completions", json={
                        "model": MODEL, "prompt": f"client {c} asks {i}", "max_tokens": 2})
                    ok = r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
                    with lock:
                        statuses[r.status_code if ok else -r.status_code] += 1

        def flusher() -> None:
            with httpx.Client(timeout=120) as http:
                while not done.is_set():
                    r = http.post(f"{front.url}/flush_cache")
                    with lock:
                        flushes[r.status_code] += 1

        clients = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        flushers = [threading.Thread(target=flusher) for _ in range(FLUSHERS)]
        for t in clients + flushers:
            t.start()
        for t in clients:
            t.join(600)
        done.set()
        for t in flushers:
            t.join(120)
        assert statuses == {200: CLIENTS * PER_CLIENT}
        assert set(flushes) <= {200, 400} and flushes[200] > 0
        c = front.backend.counters()
        assert (c.waiting, c.running) == (0, 0)
