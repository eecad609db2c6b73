"""The supervisor's replica restarts on real processes (``/bin/sh``) and a real HTTP health
endpoint, without a router: the backoff doubles while a replica keeps dying, stops at its cap,
starts over once the replica has answered for ``stable_s``; a replica that never answers
after its start is killed and started again."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from radixcache.serving.supervisor import ReplicaState, Supervisor
from tests.helpers.stream import wait_for

NOWHERE = "http://127.0.0.1:1"  # refused at once: a replica that does not answer


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        """Quiet."""


@pytest.fixture
def health() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class OneReplica:
    """A ``Supervised`` of one replica whose successive processes run ``scripts`` in turn (the
    last one for every later start); it answers ``/health`` at ``health`` only while a
    process running ``answering`` is up. Records the note the supervisor showed at every look."""

    router_backend_url = NOWHERE  # no router: the rotation finds none and does nothing

    def __init__(self, scripts: list[str], health: str, answering: str) -> None:
        self.scripts, self.health, self.answering = scripts, health, answering
        self.script = scripts.pop(0)
        self.proc = subprocess.Popen(["/bin/sh", "-c", self.script])
        self.proc.wait()  # the first one has ended before the supervisor looks
        self.notes: list[str] = []
        self.looks_up = 0  # looks that found it running and answering
        self.supervisor: Supervisor | None = None

    def replica_urls(self) -> list[str]:
        answering = self.script == self.answering and self.proc.poll() is None
        return [self.health if answering else NOWHERE]

    def router_alive(self) -> bool:
        return True

    def router_exit(self) -> int | None:
        return None

    def replica_exit(self, rank: int) -> int | None:
        assert self.supervisor is not None
        note = self.supervisor.replicas()[rank].note
        if not self.notes or self.notes[-1] != note:
            self.notes.append(note)
        code = self.proc.poll()
        self.looks_up += code is None and note == ""
        return code

    def spawn_replica(self, rank: int) -> None:
        if self.scripts:
            self.script = self.scripts.pop(0)
        self.proc = subprocess.Popen(["/bin/sh", "-c", self.script])

    def kill(self, rank: int) -> None:
        self.proc.kill()
        self.proc.wait()

    def start_router(self, workers: list[str]) -> None:
        raise AssertionError("no router here")


def supervise(c: OneReplica, **kw: float) -> Supervisor:
    c.supervisor = Supervisor(c, interval_s=0.02, probe_s=0.5, **kw)
    return c.supervisor.start()


def test_the_backoff_doubles_to_its_cap_and_starts_over_once_the_replica_stayed_up(
        health: str) -> None:
    c = OneReplica(["exit 3", "exit 3", "exit 3", "exec sleep 60"], health, "exec sleep 60")
    s = supervise(c, backoff_s=0.05, backoff_cap_s=0.1, stable_s=0.1)
    try:
        assert wait_for(lambda: s.replicas()[0] == ReplicaState(0, True, 3, ""), timeout=30)
        looks = c.looks_up
        # each look is at least interval_s (0.02 s) after the last: 10 more span > stable_s
        assert wait_for(lambda: c.looks_up >= looks + 10, timeout=30)
        c.proc.kill()  # a crash of the replica that had stayed up
        assert wait_for(lambda: s.replicas()[0].restarts == 4 and c.notes[-1] == "", timeout=30)
    finally:
        s.stop()
        c.kill(0)
    assert c.notes == ["", "restarting in 0.05 s: exited 3", "starting",
                       "restarting in 0.1 s: exited 3", "starting",
                       "restarting in 0.1 s: exited 3", "starting", "",  # the cap: 0.1
                       "restarting in 0.05 s: exited -9", "starting", ""]  # started over


def test_a_replica_that_never_answers_after_its_start_is_killed_and_started_again(
        health: str) -> None:
    c = OneReplica(["exit 3", "exec sleep 60"], health, "never")
    s = supervise(c, backoff_s=0.05, startup_s=0.2)
    try:
        assert wait_for(lambda: s.replicas()[0].restarts == 2, timeout=30)
    finally:
        s.stop()
        c.kill(0)
    assert c.notes[:5] == ["", "restarting in 0.05 s: exited 3", "starting",
                           "not healthy 0.2 s after start", "restarting in 0.1 s: exited -9"]
