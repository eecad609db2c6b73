"""The HTTP front in a process of its own (``serve --http --front-process``).

::

    serve (the engine's process)                       the front's process
    ─────────────────────────────                      ───────────────────────────────────
    rc-service-loop  steps the engine                  rc-http         uvicorn: the routes
    rc-publisher     events, commands (ZeroMQ)         rc-http-encode  parsing, tokenizing
    rc-engine-port   ROUTER ◄── ipc:// (0700 dir) ───► rc-front-wire   DEALER: tokens in,
    rc-engine-ask    counters, flush                                   text and SSE out
    FrontProcess     binds the HTTP port, passes the socket, drains the front on SIGTERM

``FrontProcess(server, engine, host, port)`` binds the HTTP socket in serve's process (a bad
port fails there, before anything starts, as without a front process), starts the engine's
port (``serving.engine_port``) on an ``ipc://`` endpoint in a private directory, and runs
``python -m radixcache.serving.front_process --engine ENDPOINT --fd N``, which inherits the
socket and serves the same ``HttpFront`` over a ``WireBackend``. The child ignores Ctrl-C (the
terminal sends it to both: serve decides) and exits when serve's process is gone.

The drain is serve's as before (``stop_admitting`` then ``finish_drain``, the same lines on
stderr): serve sends ``Drain``, the front stops admitting and answers how many requests are in
flight; serve keeps the grace and its second signal and sends ``Cut(reason)`` when either runs
out; the front answers ``Drained`` and exits.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from radixcache.core.guard import ThreadFault
from radixcache.core.procs import parent_death_signal
from radixcache.serving.engine import Engine
from radixcache.serving.engine_port import EnginePort
from radixcache.serving.http import (
    CUT_WAIT_S,
    DEFAULT_MODEL,
    TOLD_NOT_TO_WAIT,
    Drained,
    HttpFront,
    bound_socket,
    grace_over,
)
from radixcache.serving.http_backend import EngineBackend
from radixcache.serving.http_interp import Settled, settle
from radixcache.serving.http_wire import WireBackend
from radixcache.serving.server import Server
from radixcache.traffic.tokenizer import TextTokenizer, shipped
from radixcache.wire import frontwire as fw

START_S = 120.0  # the child imports torch and the tokenizer: slow on a loaded machine
PARENT_POLL_S = 0.2


def engine_facts(engine: Engine) -> fw.Facts:
    """What a front needs of ``engine`` (``HttpFront``'s model name, tokenizer, limits)."""
    c, m = engine.config, engine.model
    folder = None if engine.text is None or c.checkpoint is None else str(c.checkpoint.path)
    return fw.Facts(m.vocab_size, m.id_space, engine.max_context,
                    engine.pool.bytes_per_block(), None if folder is None else m.name, folder,
                    sorted(m.eos_ids) if folder is not None else [])


class FrontProcess:
    """serve's handle on its front's process: what ``HttpFront`` offers serve (``url``,
    ``fault``, ``stop_admitting``, ``finish_drain``, ``close``). ``start()`` returns once the
    child serves."""

    def __init__(self, server: Server, engine: Engine, host: str, port: int, *,
                 settle: bool = True) -> None:
        self._sock = bound_socket(host, port)  # OSError/ValueError here, as HttpFront's
        self.host, self.port = host, int(self._sock.getsockname()[1])
        self._dir = tempfile.mkdtemp(prefix="rc-front-")  # 0700: only this user connects
        tokenizer = engine.text if engine.text is not None else shipped()
        self.port_ = EnginePort(EngineBackend(engine, server.loop), f"ipc://{self._dir}/engine",
                                tokenizer, engine_facts(engine))
        server.after_step(self.port_.after_step)
        self._proc: subprocess.Popen[bytes] | None = None
        self._in_flight = 0
        self._closed = False
        # the engine's process settles its interpreter once serving has started, as
        # ``HttpFront.start`` does in the process it runs in (``http_interp``): without it a
        # full collection of start-up's objects (torch's) took 146 ms inside a step
        self._settle = settle
        self.settled: Settled | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` (``http://[::1]:port`` for IPv6)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def fault(self) -> ThreadFault | None:
        """The port's thread's death, or the child's end while serving."""
        if self.port_.fault is not None:
            return self.port_.fault
        proc = self._proc
        if proc is not None and not self._closed and proc.poll() is not None:
            return ThreadFault("front-process", f"the HTTP front's process exited with status "
                               f"{proc.returncode}", "")
        return None

    def start(self) -> FrontProcess:
        """Start the port and the child; returns once the child serves HTTP (``RuntimeError``
        when it exits first or does not within ``START_S``)."""
        self.port_.start()
        fd = self._sock.fileno()
        # the child imports this very package (a checkout run with PYTHONPATH included)
        root = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "radixcache.serving.front_process", "--engine",
             self.port_.endpoint, "--fd", str(fd)], pass_fds=[fd], env=env,
            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_S
        while not self.port_.ready.wait(0.1):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the HTTP front's process did not start on {self.url}")
        if self._settle:
            self.settled = settle()  # start-up is over: what it made is never garbage
        return self

    def _wait_said(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self.port_.said_changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0 or (self._proc is not None and self._proc.poll() is not None):
                    return False
                self.port_.said_changed.wait(min(left, 0.1))
        return True

    def stop_admitting(self) -> int:
        """The front answers new requests 503 from now on; returns its requests in flight."""
        self.port_.tell_fronts(fw.Drain(float("inf")))
        self._wait_said(lambda: self.port_.drain_said().draining is not None, 30)
        self._in_flight = self.port_.drain_said().draining or 0
        return self._in_flight

    def finish_drain(self, grace_s: float, cut_now: Callable[[], bool]) -> Drained:
        """``HttpFront.finish_drain``'s, the front's process doing the answering; then the
        child is waited for (``close``)."""
        deadline = time.monotonic() + grace_s
        why: str | None = None

        def drained() -> bool:
            return self.port_.drain_said().drained is not None

        while why is None and not self._wait_said(
                drained, min(0.1, max(0.0, deadline - time.monotonic()))):
            if self._proc is not None and self._proc.poll() is not None:
                break
            if cut_now():
                why = TOLD_NOT_TO_WAIT
            elif deadline - time.monotonic() <= 0:
                why = grace_over(grace_s)
        if why is not None:
            self.port_.tell_fronts(fw.Cut(why))
            self._wait_said(drained, CUT_WAIT_S + 5)
        d = self.port_.drain_said().drained
        self.close()
        if d is None:
            return Drained(self._in_flight, 0, why)
        return Drained(self._in_flight, d.cut, d.reason)

    def close(self) -> None:
        """End the child (it has answered ``Drained``, or is killed), then the port."""
        self._closed = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.port_.close()
        self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)


# -- the child --------------------------------------------------------------------------------
class _Orders:
    """serve's drain orders as the child's wire thread hears them."""

    def __init__(self) -> None:
        self.drain = threading.Event()
        self.cut: str | None = None
        self.changed = threading.Event()

    def on_drain(self, _grace_s: float) -> None:
        self.drain.set()
        self.changed.set()

    def on_cut(self, reason: str) -> None:
        self.cut = reason
        self.changed.set()


def _tokenizer(facts: fw.Facts) -> TextTokenizer:
    if facts.tokenizer_dir is None:
        return shipped()
    from radixcache.traffic.folder_tokenizer import FolderTokenizer

    return FolderTokenizer(Path(facts.tokenizer_dir))


def serve_front(endpoint: str, fd: int) -> int:
    """The child's life: serve HTTP on the inherited socket ``fd`` over the engine at
    ``endpoint`` until serve drains it or its process is gone; returns the exit status."""
    parent = os.getppid()
    orders = _Orders()
    backend = WireBackend(endpoint, on_drain=orders.on_drain, on_cut=orders.on_cut).start()
    facts = backend.facts
    sock = socket.socket(fileno=fd)
    front = HttpFront(backend, model=facts.model or DEFAULT_MODEL, tokenizer=_tokenizer(facts),
                      eos_ids=frozenset(facts.eos_ids), sock=sock).start()
    backend.send(fw.Ready())
    while not orders.drain.is_set():
        orders.changed.wait(PARENT_POLL_S)
        fault = front.fault or backend.fault
        if os.getppid() != parent or fault is not None:
            if fault is not None:
                print(f"error: {fault.line()}", file=sys.stderr)
            front.close()
            backend.close()
            return 1
    n = front.stop_admitting()
    backend.send(fw.Draining(n))
    while not front.runner.idle.is_set() and orders.cut is None and os.getppid() == parent:
        orders.changed.wait(0.1)
        orders.changed.clear()
    why = None if front.runner.idle.is_set() else orders.cut
    cut = front.cut_and_close(why)
    backend.send(fw.Drained(n, cut, why))
    backend.close()  # what was sent leaves first
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m radixcache.serving.front_process --engine ENDPOINT --fd N``."""
    p = argparse.ArgumentParser(prog="radixcache-front")
    p.add_argument("--engine", required=True)
    p.add_argument("--fd", type=int, required=True)
    a = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches serve too: serve decides
    _die_with_parent()
    return serve_front(a.engine, a.fd)


def _die_with_parent() -> None:
    """Have Linux end this process as soon as serve's is gone (a SIGKILLed replica): it holds
    the inherited HTTP socket, which a restarted serve binds again at once. Asked here, in
    the child, not as serve's ``preexec_fn`` (serve forks with threads running); should serve
    die before this line, ``serve_front`` sees it gone within ``PARENT_POLL_S``."""
    ask = parent_death_signal()
    if ask is not None:
        ask()


if __name__ == "__main__":
    sys.exit(main())
