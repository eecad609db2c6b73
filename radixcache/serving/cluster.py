"""Many engine replicas behind a real router: the processes of ``radixcache cluster``.

``Cluster(config).start()`` spawns, on 127.0.0.1::

    rank r   radixcache serve --http H+r --port Z+3r      (Z+3r..Z+3r+2: events, snapshot,
                                                          commands; serve binds three in a row)
    router   sglang-router launch --port Q --worker-urls http://127.0.0.1:H+r ... --policy P
    front    RouterFront on R (the public port), forwarding to Q (``serving.router_front``)

HTTP ports are offset by rank as vLLM offsets data-parallel ranks; a base of 0 picks a free run.
``start`` returns once every replica's ``/health`` and the router's answer; it raises
``ClusterError`` (one line: which process, why) and stops what it started when one cannot start
(the router not installed, a port taken, a replica exiting). sglang-router is looked for beside
``sys.executable`` (a virtual environment's ``bin``, on PATH or not), then on PATH. The
``Supervisor`` restarts a replica or a router that dies and keeps the router's workers to the
replicas that answer; the front holds requests while the router is down. ``kill(r)`` sends
SIGKILL to a replica (the supervisor starts it again), ``restart(r)`` stops it and has it
started at once. ``close()`` stops every process.
"""

from __future__ import annotations

import enum
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

from radixcache.core.procs import parent_death_signal
from radixcache.serving.router_front import RouterFront
from radixcache.serving.supervisor import (
    ReplicaState,
    RouterState,
    Supervisor,
    router_workers,
)

ROUTER_EXE = "sglang-router"
ROUTER_VERSION = "0.3.2"
INSTALL_HINT = "pip install 'radixcache[cluster]'"
ZMQ_STRIDE = 3


class RoutePolicy(enum.StrEnum):
    """sglang-router's routing policies."""

    CACHE_AWARE = "cache_aware"
    ROUND_ROBIN = "round_robin"
    POWER_OF_TWO = "power_of_two"
    RANDOM = "random"


def router_exe() -> str | None:
    """sglang-router's executable: beside ``sys.executable`` (the environment this Python runs
    in, whether or not its ``bin`` is on PATH), else on PATH; None when neither has it."""
    beside = Path(sys.executable).parent / ROUTER_EXE
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(ROUTER_EXE)


class ClusterError(RuntimeError):
    """A process of the cluster could not start; every process started is stopped."""


class ClusterConfig(NamedTuple):
    """What ``Cluster`` starts. Ports of 0 are picked free at ``start``."""

    replicas: int = 2
    policy: RoutePolicy = RoutePolicy.CACHE_AWARE
    blocks: int = 2048
    http_base: int = 0
    zmq_base: int = 0
    router_port: int = 0
    startup_s: float = 60.0
    router_args: tuple[str, ...] = ()  # more sglang-router flags (e.g. --cache-threshold 0.5)
    schedule: str = "fcfs"  # each replica's scheduling policy (``serve --schedule``)
    model_args: tuple[str, ...] = ()  # each replica's model (``serve --model DIR --dtype D``)


class Replica(NamedTuple):
    """One rank's ports."""

    rank: int
    http_port: int
    zmq_port: int

    @property
    def url(self) -> str:
        """Its HTTP front."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def events(self) -> str:
        """Its event stream (snapshot/replay and commands on the next two ports)."""
        return f"tcp://127.0.0.1:{self.zmq_port}"


def port_taken(port: int) -> bool:
    """True when ``port`` cannot be bound on 127.0.0.1 now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive ports free on 127.0.0.1 now (racy, as any probe)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + count < 65000 and not any(port_taken(base + i) for i in range(count)):
            return base
    raise ClusterError(f"no {count} free consecutive ports on 127.0.0.1")


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True when ``GET url`` answers 200 within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class _Proc(NamedTuple):
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


class Cluster:
    """The replicas and the router of one cluster (see the module doc)."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self._tmp = tempfile.TemporaryDirectory(prefix="rc-cluster-")  # the processes' logs
        self.workdir = Path(self._tmp.name)
        n = config.replicas
        http = config.http_base or free_port_run(n)
        zmq = config.zmq_base or free_port_run(ZMQ_STRIDE * n)
        self.replicas = [Replica(r, http + r, zmq + ZMQ_STRIDE * r) for r in range(n)]
        self.router_port = config.router_port or free_port_run(1)  # the front's: public
        self.backend_port = free_port_run(1)  # sglang-router's own, behind the front
        # written by the thread that starts the cluster, then only by the supervisor's
        self._procs: dict[int, _Proc] = {}
        self._router: _Proc | None = None
        self.supervisor = Supervisor(self, startup_s=config.startup_s)  # once all answer
        self.front: RouterFront | None = None

    @property
    def router_url(self) -> str:
        """The public address of the router (its front): what clients are given."""
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def router_backend_url(self) -> str:
        """sglang-router's own address, behind the front (the supervisor's admin calls)."""
        return f"http://127.0.0.1:{self.backend_port}"

    def start(self) -> Cluster:
        """Start every replica and the router and wait until all answer (see the module doc)."""
        try:
            if router_exe() is None:
                raise ClusterError(f"{ROUTER_EXE} is not installed: {INSTALL_HINT}")
            for port in (self.router_port, self.backend_port,
                         *(r.http_port for r in self.replicas)):
                if port_taken(port):
                    raise ClusterError(f"port {port} on 127.0.0.1 is taken")
            self.front = RouterFront("127.0.0.1", self.router_port,
                                     ("127.0.0.1", self.backend_port),
                                     lambda: self.supervisor.state().up)
            for r in self.replicas:
                self._procs[r.rank] = self._spawn_replica(r)
            for r in self.replicas:
                self._wait(self._procs[r.rank], f"{r.url}/health")
            self.start_router(self.replica_urls())
        except BaseException:
            self.close()
            raise
        self.front.start()
        self.supervisor.start()
        return self

    def replica_urls(self) -> list[str]:
        """Each rank's HTTP front, by rank."""
        return [r.url for r in self.replicas]

    def start_router(self, workers: list[str]) -> None:
        """Start the router with ``workers`` and wait until it answers and lists every one of
        them that answers (it registers them in the background after its ``/health`` answers;
        one that died meanwhile is the supervisor's to add back once it is restarted)."""
        exe = router_exe()
        if exe is None:
            raise ClusterError(f"{ROUTER_EXE} is not installed: {INSTALL_HINT}")
        self._router = router = self._spawn("router", self._router_argv(exe, workers))
        self._wait(router, f"{self.router_backend_url}/health")
        deadline = time.monotonic() + self.config.startup_s
        while not {w for w in workers if http_ok(f"{w}/health")} <= set(
                router_workers(self.router_backend_url) or ()):
            if router.popen.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"router did not register its {len(workers)} workers")
            time.sleep(0.05)

    def _router_argv(self, exe: str, workers: list[str]) -> list[str]:
        return [exe, "launch", "--host", "127.0.0.1", "--port", str(self.backend_port),
                "--worker-urls", *workers,
                "--policy", str(self.config.policy),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port_run(1)),
                "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                "--health-success-threshold", "1", "--log-level", "warn",
                *self.config.router_args]

    def _spawn_replica(self, r: Replica) -> _Proc:
        argv = [sys.executable, "-m", "cli.main", "serve", "--endpoint-host", "127.0.0.1",
                "--port", str(r.zmq_port), "--http", str(r.http_port),
                "--blocks", str(self.config.blocks), "--schedule", self.config.schedule,
                *self.config.model_args]
        return self._spawn(f"replica {r.rank}", argv)

    def _spawn(self, name: str, argv: list[str]) -> _Proc:
        log = self.workdir / (name.replace(" ", "-") + ".log")
        with log.open("wb") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=dict(os.environ),
                                     start_new_session=True,  # Ctrl-C reaches us, not them
                                     preexec_fn=parent_death_signal())  # nor outlive us
        return _Proc(name, popen, log)

    def _wait(self, proc: _Proc, health: str) -> None:
        deadline = time.monotonic() + self.config.startup_s
        while not http_ok(health):
            if proc.popen.poll() is not None:
                raise ClusterError(f"{proc.name} exited ({proc.popen.returncode}): "
                                   f"{_last_line(proc.log)}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{proc.name} not healthy after {self.config.startup_s:g} s"
                                   f" ({health})")
            time.sleep(0.1)

    # -- faults --------------------------------------------------------------------------------
    def kill(self, rank: int) -> None:
        """SIGKILL replica ``rank`` (no goodbye: as a crash) and reap it; the supervisor
        starts it again."""
        p = self._procs[rank].popen
        p.send_signal(signal.SIGKILL)
        p.wait()

    def replica_exit(self, rank: int) -> int | None:
        """Replica ``rank``'s exit status (None while it runs)."""
        return self._procs[rank].popen.poll()

    def spawn_replica(self, rank: int) -> None:
        """Start replica ``rank``'s process again on its ports (the supervisor's; it has
        exited); returns at once."""
        self._procs[rank] = self._spawn_replica(self.replicas[rank])

    def replica_states(self) -> tuple[ReplicaState, ...]:
        """The supervisor's word on every replica (restarts, what it does next)."""
        return self.supervisor.replicas()

    def restart(self, rank: int, timeout: float = 60.0) -> None:
        """Stop replica ``rank`` (SIGTERM) if it runs, have the supervisor start it again at
        once, and return when it answers ``/health``; raises ``ClusterError`` when it is not
        back within ``timeout`` seconds."""
        p = self._procs[rank].popen
        if p.poll() is None:
            p.terminate()
            p.wait()
        before = self.supervisor.replicas()[rank].restarts
        self.supervisor.restart_replica_now(rank)
        deadline = time.monotonic() + timeout
        while True:
            st = self.supervisor.replicas()[rank]
            if st.restarts > before and st.up:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"replica {rank} not back after {timeout:g} s: {st.note}")
            time.sleep(0.05)

    def kill_router(self) -> None:
        """SIGKILL the router."""
        if self._router is not None:
            self._router.popen.send_signal(signal.SIGKILL)
            self._router.popen.wait()

    def router_alive(self) -> bool:
        """True while the router process runs."""
        return self._router is not None and self._router.popen.poll() is None

    def router_state(self) -> RouterState:
        """The supervisor's word on the router (restarts, what it does next, the rotation)."""
        return self.supervisor.state()

    def router_exit(self) -> int | None:
        """The router's exit status (None while it runs or before it started)."""
        return None if self._router is None else self._router.popen.poll()

    def restart_router(self, timeout: float = 60.0) -> None:
        """Stop the router and have the supervisor start it again at once; returns when it
        answers. Raises ``ClusterError`` when it is not back within ``timeout`` seconds."""
        if self._router is not None and self._router.popen.poll() is None:
            self._router.popen.terminate()
            self._router.popen.wait()
        self.supervisor.restart_now()
        deadline = time.monotonic() + timeout
        while not self.supervisor.state().up or not self.router_alive():
            if time.monotonic() > deadline:
                raise ClusterError(f"router not back after {timeout:g} s: "
                                   f"{self.supervisor.state().note}")
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the front, the router and every replica (SIGTERM, then SIGKILL after 5 s)."""
        self.supervisor.stop()
        if self.front is not None:
            self.front.close()
        procs = [*self._procs.values(), *([self._router] if self._router else [])]
        for p in procs:
            if p.popen.poll() is None:
                p.popen.terminate()
        for p in procs:
            try:
                p.popen.wait(5)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
        self._procs, self._router = {}, None
        self._tmp.cleanup()


def _last_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(no output)"
