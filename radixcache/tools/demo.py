"""The demo's harness: a ``radixcache serve`` child process on private ipc:// endpoints, a
thread feeding it a mix of workloads, and a headless follower that compares its mirror with the
engine.

::

    demo ──Popen──▶ radixcache serve --ipc /tmp/rc-demo-XXXX/engine   (own process)
      │                 ▲ commands (ipc://…-commands)      │ events (ipc://…-events)
      ├─ MixLoop thread ┘ "chat 8 --seed 3", "tot 3 3", …   ▼
      └─ inspector (or, with --no-inspect, a Subscriber) ◀──┘

The engine is always stopped on the way out (SIGTERM, then SIGKILL after a grace period). On
Linux the engine also gets SIGTERM if the demo process itself is killed
(``PR_SET_PDEATHSIG``). When it died on its own, its log is kept and its path printed.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from radixcache.core.procs import parent_death_signal
from radixcache.serving.stats import Stats
from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from radixcache.wire.endpoints import Endpoints

if TYPE_CHECKING:  # headless only: the inspector's demo starts without them (first frame)
    from radixcache.analysis.follow import Follower
    from radixcache.wire.subscriber import Subscriber

MAX_QUEUED = 24  # the loop waits while this many requests wait (engine busy or paused)
DEFAULT_MIX = ("chat 8", "system 30 256", "tot 3 3", "fork 8")
"""One round of the demo's workload; each round uses the next seed, so the tree keeps changing."""


class DemoError(Exception):
    """The demo's engine process did not come up (the reason is its last log line)."""


class EngineStats(NamedTuple):
    """The engine's answer to ``stats``, read typed: the cache's figures and its stream's."""

    cache: Stats
    stream: cmd.StreamFigures


class DemoStats(NamedTuple):
    """What a headless demo saw: the engine's counters and the stream a subscriber followed."""

    seconds: float
    first_tree_s: float
    workloads_sent: int
    served: int
    queued: int
    nodes: int
    mirror_nodes: int
    splits: int
    merges: int
    evicted_nodes: int
    batches: int
    digest_checks: int
    resyncs: int
    predicted_hit_rate: float  # the follower's LRU curve at the pool, requests one at a time
    measured_hit_rate: float  # the engine's over the same stretch (batched)
    missed_tokens_by_cause: dict[str, int]  # why the followed requests missed


class EngineProcess:
    """A ``radixcache serve`` child process on ipc:// endpoints in a private temp directory.

    ``start()`` then ``wait_ready()``; ``stop()`` (idempotent, also on ``__exit__``) ends the
    process and removes the directory, so nothing is left behind."""

    def __init__(self, blocks: int, grace_s: float = 5.0, schedule: str = "fcfs",
                 model_args: tuple[str, ...] = (), reserve: str = "grow") -> None:
        self.blocks = blocks
        self.schedule = schedule
        self.model_args = model_args  # e.g. ("--model", DIR, "--dtype", "auto")
        self.reserve = reserve
        self.grace_s = grace_s
        self.dir = Path(tempfile.mkdtemp(prefix="rc-demo-", dir=_short_tmp()))
        self.endpoints = Endpoints.ipc(str(self.dir / "engine"))
        self.log = self.dir / "engine.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._terminated_at: float | None = None  # when SIGTERM was sent (monotonic)
        self._died = False  # the engine had exited on its own before it was told to

    def command(self) -> list[str]:
        """The engine's command line: this interpreter running ``radixcache serve``."""
        return [sys.executable, "-m", "cli.main", "serve", "--ipc", str(self.dir / "engine"),
                "--blocks", str(self.blocks), "--schedule", self.schedule,
                "--reserve", self.reserve, *self.model_args]

    def start(self) -> EngineProcess:
        """Start ``command()`` with its output going to DIR/engine.log."""
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, preexec_fn=parent_death_signal())
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> float:
        """Wait until the command endpoint answers ``stats``; returns the seconds waited.

        Raises ``CliError`` (with the engine's last log line) when the process exits first or
        does not answer within ``timeout_s``."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc is None or self.proc.poll() is not None:
                raise DemoError(f"the engine exited before it answered: {self._last_log_line()}")
            if isinstance(self.send(cmd.Stats(), timeout_s=0.25), cmd.StatsReply):
                return time.monotonic() - t0
        raise DemoError(f"the engine did not answer within {timeout_s:g} s: "
                       f"{self._last_log_line()}")

    def send(self, command: cmd.AnyCommand, timeout_s: float = 5.0) -> cmd.AnyReply:
        """One command round trip (``Error`` on timeout, never raises)."""
        return send_command(self.endpoints.commands, command, timeout_s=timeout_s)

    def stats(self) -> EngineStats | None:
        """The engine's figures (None when it does not answer them)."""
        try:
            reply = cmd.stats_reply(self.send(cmd.Stats()))
            cache = Stats.of(reply)
        except cmd.CommandError:
            return None
        return None if reply.stream is None else EngineStats(cache, reply.stream)

    def terminate(self) -> None:
        """Send SIGTERM now and return (idempotent): the engine shuts down while the caller
        closes its own side; ``stop()`` then waits what is left of ``grace_s``."""
        if self.proc is None or self._terminated_at is not None:
            return
        self._died = self.proc.poll() is not None
        self._terminated_at = time.monotonic()
        if not self._died:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int | None:
        """SIGTERM (unless ``terminate`` sent it), then SIGKILL ``grace_s`` after it; remove
        the temp dir. Returns the exit code. When the engine had died on its own, or exited
        with a failure, its log is kept (moved next to the temp dir) and its path printed on
        stderr."""
        code = None
        self.terminate()
        died = self._died
        if self.proc is not None:
            if self.proc.poll() is None:
                assert self._terminated_at is not None
                left = self.grace_s - (time.monotonic() - self._terminated_at)
                try:
                    self.proc.wait(max(left, 0.0))
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            code = self.proc.returncode
        if died or code not in (0, None, -signal.SIGTERM, -signal.SIGKILL):
            self._keep_log(code)
        shutil.rmtree(self.dir, ignore_errors=True)
        return code

    def _keep_log(self, code: int | None) -> None:
        kept = self.dir.parent / f"{self.dir.name}-engine.log"
        with contextlib.suppress(OSError):
            shutil.move(self.log, kept)
            print(f"the engine exited with status {code}; its log: {kept}", file=sys.stderr)

    def _last_log_line(self) -> str:
        with contextlib.suppress(OSError):
            lines = self.log.read_text(errors="replace").strip().splitlines()
            if lines:
                return lines[-1]
        return "no output"

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _short_tmp() -> str | None:
    """/tmp where the default temp dir would make ipc:// paths too long for a Unix socket."""
    default = tempfile.gettempdir()
    return "/tmp" if len(default) > 60 and Path("/tmp").is_dir() else None


class MixLoop:
    """A thread that sends the next workload of the mix every ``interval_s`` seconds,
    round after round with a new seed, unless the engine has ``MAX_QUEUED`` requests waiting."""

    def __init__(self, engine: EngineProcess, mix: tuple[str, ...], interval_s: float) -> None:
        self.engine, self.mix, self.interval_s = engine, mix, interval_s
        self.sent = 0
        self.requests = 0  # requests in the workloads the engine accepted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rc-demo-mix", daemon=True)

    def _next(self) -> cmd.StartWorkload:
        name, *args = self.mix[self.sent % len(self.mix)].split()
        return cmd.StartWorkload(name, [*args, "--seed", str(self.sent // len(self.mix))])

    def _run(self) -> None:
        while True:
            now = self.engine.stats()
            if now is not None and now.cache.waiting < MAX_QUEUED:
                reply = self.engine.send(self._next())
                self.sent += 1
                if isinstance(reply, cmd.Ok):  # a workload's reply names its requests
                    self.requests += int(reply.values["requests"])
            if self._stop.wait(self.interval_s):
                return

    def start(self) -> MixLoop:
        """Send the first workload now, then one per interval."""
        self._thread.start()
        return self

    def stop(self, join_s: float = 10.0) -> None:
        """Stop sending (idempotent); wait up to ``join_s`` for a send in flight (the demo's
        quit waits for none: the engine is stopped next, and the thread is a daemon)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(join_s)


def headless(engine: EngineProcess, loop: MixLoop, seconds: float) -> DemoStats:
    """Follow the engine's stream for ``seconds`` with a subscriber, then pause the engine and
    compare the subscriber's mirror with the engine's tree."""
    t0 = time.monotonic()
    from radixcache.analysis.follow import Follower
    from radixcache.wire.mirror import Mirror
    from radixcache.wire.subscriber import Subscriber

    mirror = Mirror()
    follower = Follower(mirror)  # what the inspector's what-if and why screens follow
    sub = Subscriber(engine.endpoints, mirror).start()
    first = -1.0
    try:
        while time.monotonic() - t0 < seconds:
            if first < 0 and len(sub.mirror.nodes) > 1:
                first = time.monotonic() - t0
            time.sleep(0.02)
        loop.stop()
        stats, stream = _paused_stats(engine)
        _catch_up(sub, stream.seq)
    finally:
        sub.stop()
    return DemoStats(round(time.monotonic() - t0, 2), round(first, 3), loop.sent,
                     stats.finished,
                     loop.requests - stats.finished,  # waiting, running, dependent
                     stats.nodes,
                     len(sub.mirror.nodes) - 1, stats.splits,
                     stats.merges, stats.evicted_nodes,
                     sub.stats.batches, sub.stats.digest_checks, sub.stats.resyncs,
                     *_follow_figures(follower))


def _follow_figures(f: Follower) -> tuple[float, float, dict[str, int]]:
    """Predicted against measured at the pool, and the followed requests' missed tokens by
    cause (``radixcache.analysis.misses``)."""
    r = f.curve
    return (round(r.curve().hit_rate_at(r.capacity_tokens), 4), round(r.measured_rate, 4),
            f.misses.totals())


def _paused_stats(engine: EngineProcess) -> EngineStats:
    """Pause, then read the counters until two reads agree (the running requests finished).
    The step loop's timeline moves while the loop idles, so it is not compared."""
    engine.send(cmd.Pause())

    def settled(s: EngineStats | None) -> tuple[Stats, cmd.StreamFigures] | None:
        return None if s is None else (s.cache, msgspec.structs.replace(s.stream, timeline={}))

    before = engine.stats()
    for _ in range(600):  # up to 30 s: requests already admitted run to their end
        time.sleep(0.05)
        now = engine.stats()
        if now is not None and settled(now) == settled(before):
            return now
        before = now
    raise DemoError("the engine did not settle after pause")


def _catch_up(sub: Subscriber, seq: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sub.seq < seq:
        if time.monotonic() > deadline:
            raise DemoError(f"the stream stopped at seq {sub.seq}, engine at {seq}")
        time.sleep(0.02)


