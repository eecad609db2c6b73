"""A soak run: an ``Engine`` on a small pool under mixed workloads from several threads,
checked against its own event stream every few seconds.

What it does::

    N submitter threads ──submit──> Engine in a ServiceLoop ──each batch──> Mirror
        chat / system / tot / fork / flood          │
        (outputs capped: the run is about           └─ every ``check_every_s``, on the
         churn, not decode length)                     scheduler thread between steps:
                                                       evict / reset faults, tree.check(),
                                                       mirror.digest() == tree.digest()

The checks run on the loop's thread inside its sink (the loop's state lock held), where
nothing else mutates the tree (submitters only queue), so the digest comparison is exact,
never racy. A violation (invariant broken, an event that does not fit the mirror, digests
that differ) is recorded and the mirror is reloaded from a snapshot (a recovery) so the run
goes on and finds more. At the end the run drains every request and verifies that nothing is
left pinned.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from radixcache.core import events as ev
from radixcache.core.guard import Guard
from radixcache.core.invariants import InvariantError
from radixcache.serving.engine import Engine, EngineConfig, RequestHandle, RequestRejected
from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
from radixcache.traffic.workloads import Workload, WorkloadRequest, build_workload
from radixcache.wire.mirror import Mirror, MirrorError

# name -> small parameters, so one workload takes well under a second on a CPU
MIX: tuple[tuple[str, dict[str, int | str]], ...] = (
    ("chat", {"conversations": 2}),
    ("system", {"users": 6, "system_tokens": 96}),
    ("tot", {"depth": 2, "branching": 3}),
    ("fork", {"branches": 6}),
    ("flood", {"requests": 12}),
)


class SoakConfig(NamedTuple):
    """How long and how hard to soak. ``num_blocks`` is small so eviction happens."""

    seconds: float = 60.0
    num_blocks: int = 160
    threads: int = 3
    check_every_s: float = 1.0
    max_new_tokens: int = 4  # outputs are capped at this many (forced) tokens
    reset_every: int = 7  # every Nth check resets the engine (cancels what runs); 0: never
    evict_tokens: int = 256  # every other check evicts this many tokens
    seed: int = 0


class SoakStatus(NamedTuple):
    """Figures so far (for a progress display)."""

    elapsed: float
    requests: int
    events: int
    checks: int
    violations: int


class SoakReport(NamedTuple):
    """The outcome of a soak. ``violations`` lists what went wrong (empty when sound)."""

    submitted: int
    requests: int  # finished with output
    rejected: int
    cancelled: int  # by the injected resets
    workloads: int
    events: int
    checks: int
    recoveries: int  # mirror reloads after a violation
    resets: int
    evictions: int  # evict commands injected
    evicted_nodes: int  # Evict events in the stream (watermark and injected)
    hit_rate: float
    final_nodes: int
    final_locks: int  # sum of node locks at the end: must be 0
    final_request_blocks: int  # blocks still held by requests at the end: must be 0
    seconds: float
    violations: list[str]


@dataclass(slots=True)
class _Counters:
    events: int = 0
    checks: int = 0
    recoveries: int = 0
    resets: int = 0
    evictions: int = 0
    workloads: int = 0
    submitted: int = 0
    finished: int = 0
    rejected: int = 0
    cancelled: int = 0
    evicted_nodes: int = 0
    hit_tokens: int = 0
    prompt_tokens: int = 0
    violations: list[str] = field(default_factory=list)


def _capped(r: WorkloadRequest, cap: int) -> tuple[list[int], int, list[int] | None]:
    """(prompt, max_new, forced) with the output capped at ``cap`` tokens."""
    n = min(r.max_new_tokens, cap)
    forced = None if r.forced_output is None else [int(t) for t in r.forced_output[:n]]
    return [int(t) for t in r.prompt], n, forced


class Soak:
    """One soak run. ``run(progress)`` blocks for ``config.seconds`` plus the drain."""

    def __init__(self, config: SoakConfig | None = None) -> None:
        self.config = cfg = config or SoakConfig()
        self.engine = Engine(EngineConfig(num_blocks=cfg.num_blocks, max_step_tokens=256))
        sink = BatchSink(lambda batch: self._on_step(batch.events))
        self.loop = ServiceLoop(self.engine, sink, LoopConfig(0, sample_every_s=0.5))
        self.tree = self.engine.tree
        self.mirror = Mirror(self.tree.B, cfg.num_blocks)
        self.mirror.load_snapshot(self.tree.snapshot())
        self.engine.take_events()
        self._c = _Counters()
        self._stop = threading.Event()
        self._count_lock = threading.Lock()
        self._last_check = time.monotonic()
        self._t0 = time.monotonic()

    # -- the checks (scheduler thread) -------------------------------------------------------
    def _on_step(self, events: list[ev.AnyEvent]) -> None:
        self._apply(events)
        if time.monotonic() - self._last_check >= self.config.check_every_s:
            self._inject_fault()
            self.check()

    def _apply(self, events: list[ev.AnyEvent]) -> None:
        self._c.events += len(events)
        self._c.evicted_nodes += sum(type(e) is ev.Evict for e in events)
        try:
            for e in events:
                self.mirror.apply(e)
        except MirrorError as exc:
            self._violation(f"event does not fit the mirror: {exc}")

    def _inject_fault(self) -> None:
        """Every other check evicts; every ``reset_every``-th resets (cancels running work)."""
        n = self._c.checks + 1
        if self.config.reset_every and n % self.config.reset_every == 0:
            self.engine.reset()
            self._c.resets += 1
        elif n % 2 == 0:
            self.engine.evict(self.config.evict_tokens)
            self._c.evictions += 1

    def check(self) -> None:
        """Drain events into the mirror, run ``tree.check()`` and compare the digests. Call
        only where no step runs (inside the sink, or with the loop stopped)."""
        self._apply(self.engine.take_events())
        self._last_check = time.monotonic()
        self._c.checks += 1
        try:
            self.tree.check()
        except InvariantError as exc:
            self._violation(f"tree invariant: {exc}")
        tree_digest, mirror_digest = self.tree.digest(), self.mirror.digest()
        if tree_digest != mirror_digest:
            self._violation(f"digest mismatch: tree {tree_digest} mirror {mirror_digest}")

    def _violation(self, message: str) -> None:
        self._c.violations.append(f"{time.monotonic() - self._t0:.2f}s {message}")
        self.mirror.load_snapshot(self.tree.snapshot())
        self._c.recoveries += 1

    # -- the submitters ------------------------------------------------------------------------
    def _submit_workload(self, w: Workload) -> None:
        """Submit every request; a dependent one after the request it follows is done."""
        handles: list[RequestHandle] = []
        for r in w.requests:
            if r.after is not None:
                handles[r.after].exception(None)
            prompt, n, forced = _capped(r, self.config.max_new_tokens)
            handles.append(self.engine.submit(prompt, n, forced))
        for h in handles:
            h.exception(None)
        self._tally(handles)

    def _tally(self, handles: list[RequestHandle]) -> None:
        with self._count_lock:
            self._c.workloads += 1
            self._c.submitted += len(handles)
            for h in handles:
                err = h.exception(0)
                if err is None:
                    m = h.result(0).metrics
                    self._c.finished += 1
                    self._c.hit_tokens += m.hit_tokens
                    self._c.prompt_tokens += m.prompt_tokens
                elif isinstance(err, RequestRejected):
                    self._c.rejected += 1
                else:
                    self._c.cancelled += 1

    def _submitter(self, index: int) -> None:
        rng = random.Random(self.config.seed * 1000 + index)
        while not self._stop.is_set():
            name, params = MIX[rng.randrange(len(MIX))]
            self._submit_workload(build_workload(name, {**params, "seed": rng.randrange(2**31)}))

    # -- the run -------------------------------------------------------------------------------
    def status(self) -> SoakStatus:
        """Figures so far."""
        c = self._c
        return SoakStatus(time.monotonic() - self._t0, c.finished, c.events, c.checks,
                          len(c.violations))

    def run(self, progress: Callable[[SoakStatus], None] | None = None) -> SoakReport:
        """Soak for ``config.seconds``, drain, check once more, close the engine."""
        self._t0 = self._last_check = time.monotonic()
        self.loop.start()
        guard = Guard()  # a submitter's death is a finding of the soak, not a quieter run
        threads = [guard.start(f"soak-{i}", partial(self._submitter, i))
                   for i in range(self.config.threads)]
        while time.monotonic() - self._t0 < self.config.seconds:
            if progress is not None:
                progress(self.status())
            time.sleep(0.2)
        self._stop.set()
        for t in threads:
            t.join()
        if guard.fault is not None:
            self._c.violations.append(guard.fault.line())
        self.loop.stop()
        self.check()
        report = self._report(time.monotonic() - self._t0)
        self.engine.close()
        return report

    def _report(self, seconds: float) -> SoakReport:
        snap = self.tree.snapshot()
        c = self._c
        return SoakReport(
            c.submitted, c.finished, c.rejected, c.cancelled, c.workloads, c.events, c.checks,
            c.recoveries, c.resets, c.evictions, c.evicted_nodes,
            c.hit_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
            len(self.tree), sum(n.pins for n in snap.nodes), len(snap.request_blocks),
            seconds, list(c.violations),
        )


def run_soak(
    config: SoakConfig, progress: Callable[[SoakStatus], None] | None = None
) -> SoakReport:
    """Run one soak (see the module doc); the report's ``violations`` is empty when sound."""
    return Soak(config).run(progress)
