"""The one cache service: what a client may ask of a running cache, and the one command handler.

``CacheService`` is the protocol. Two classes implement it: ``Engine`` (the tiny model, prefix
reuse, continuous batching) and ``TreeDriver`` (the same tree with no model: a request's output
is its forced output). ``handle(service, command)`` is the only place that maps the typed
commands of ``wire.commands`` onto it and words the replies, for every front end: the ZeroMQ
command socket of ``serve``, the embedded engine of ``inspect``/``demo``, headless ``record``,
the screenshots and the benchmarks (they all run ``ServiceLoop`` in ``serving.loop``).

Adding a command: one struct in ``wire/commands.py`` (and its row in ``CONTROLS``), one method
on the protocol and its two implementations, one ``case`` in ``handle`` below (mypy fails
without it: the match ends in ``assert_never``).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, assert_never

from radixcache.core import events as ev
from radixcache.core.tree import EvictResult, TreeError
from radixcache.serving.stats import Figures, Stats
from radixcache.traffic.workloads import Workload, WorkloadError, build_workload
from radixcache.wire import commands as cmd

# A command socket is local, but one client could still queue millions of requests (40 floods
# of 10,000 while paused took 2.4 GB): past this many waiting requests a submit is refused.
MAX_WAITING = 20_000


class ServiceError(Exception):
    """A request of a client that the service refuses; the service is unchanged."""


class QueueFull(ServiceError):
    """Submitting would put more than ``MAX_WAITING`` requests in the waiting queue."""


def check_room(waiting: int, more: int) -> None:
    """Raise ``QueueFull`` when ``more`` requests on top of ``waiting`` would pass
    ``MAX_WAITING`` (every ``submit_workload`` asks before queueing anything)."""
    if waiting + more > MAX_WAITING:
        raise QueueFull(f"queue full: {waiting} requests waiting, {more} more would pass the "
                        f"limit of {MAX_WAITING}")


class Submitted(NamedTuple):
    """What ``submit`` queued: ``requests`` of ``workload.name`` and whether the service is
    paused (the requests then wait for ``resume``)."""

    requests: int
    paused: bool


class CacheService(Protocol):
    """A running cache that one ``ServiceLoop`` steps and publishes.

    Every method is called with the loop's state lock held (one thread at a time), so an
    implementation needs no locking of its own for the loop's sake.
    """

    @property
    def paused(self) -> bool:
        """True between ``pause()`` and ``resume()``."""
        ...

    def submit_workload(self, workload: Workload) -> Submitted:
        """Queue every request of ``workload`` (a request with ``after = i`` only once request
        ``i`` is done). Raises ``QueueFull`` and queues nothing when the queue would pass
        ``MAX_WAITING``."""
        ...

    def pause(self) -> None:
        """Stop admitting waiting requests; running ones finish."""
        ...

    def resume(self) -> None:
        """Admit waiting requests again."""
        ...

    def evict(self, tokens: int) -> EvictResult:
        """Evict at least ``tokens`` tokens of unpinned LRU leaves, or as many as can go."""
        ...

    def set_watermarks(self, high: float, low: float) -> None:
        """Set the eviction band; ``ValueError`` unless 0 < low <= high <= 1."""
        ...

    def reset(self) -> int:
        """Cancel every waiting and running request, empty the cache, start a new counter
        generation; returns how many requests were cancelled."""
        ...

    def set_schedule(self, policy: cmd.SchedulePolicy) -> None:
        """Order the waiting queue by ``policy`` from the next step on; ``ServiceError`` when
        the service has no scheduler."""
        ...

    def busy(self) -> bool:
        """True when ``step`` has work: running requests, or waiting ones while not paused."""
        ...

    def step(self) -> object:
        """One scheduling step (its events are taken by ``take_events``); what it returns
        (the engine's ``StepReport``) is the implementation's to define."""
        ...

    def take_events(self) -> list[ev.AnyEvent]:
        """Every event since the last call, in the order the changes happened."""
        ...

    def snapshot(self) -> ev.Snapshot:
        """The whole cache state (events up to now are already taken by the caller)."""
        ...

    def digest(self) -> str:
        """The tree's structure digest (``RadixTree.digest``)."""
        ...

    def watermark(self) -> ev.Watermark:
        """A memory sample now (pool use, marks, NVML device memory or why it is missing)."""
        ...

    def counters(self) -> ev.Counters:
        """The cumulative counters since start or the last reset."""
        ...

    def stats(self) -> Stats:
        """Every figure now (the ``stats`` reply, the heartbeat's counters, ``/metrics``)."""
        ...

    def close(self) -> None:
        """Cancel what is unfinished and release the service's resources."""
        ...


def handle(service: CacheService, c: cmd.AnyCommand) -> cmd.AnyReply:
    """Do one command on ``service`` and word its reply. The caller holds the loop's state lock
    (``ServiceLoop.command``). A refused command leaves the service unchanged."""
    try:
        return _handle(service, c)
    except (WorkloadError, ServiceError, TreeError, ValueError) as exc:
        return cmd.Error(str(exc))


def _pause_reply(c: ev.Counters) -> cmd.Ok:
    """Pause stops admission only: say so when requests are still running (they go on
    stepping until they finish), so nobody reads "paused" and watches blocks still move."""
    values: dict[str, float | int | str] = {"running": c.running, "waiting": c.waiting}
    waiting = f", {c.waiting:,} waiting stay queued" if c.waiting else ""
    if c.running == 0:
        return cmd.Ok(f"paused{waiting}", values)
    return cmd.Ok(f"admission paused: {c.running:,} running requests go on to finish"
                  f"{waiting} (resume admits them)", values)


def _handle(s: CacheService, c: cmd.AnyCommand) -> cmd.AnyReply:
    match c:
        case cmd.StartWorkload():
            w = build_workload(c.name, c.args)
            done = s.submit_workload(w)
            state = "queued (engine paused)" if done.paused else "submitted"
            return cmd.Ok(f"{c.name}: {done.requests} requests {state} ({w.source})",
                          {"requests": done.requests})
        case cmd.Pause():
            s.pause()
            return _pause_reply(s.counters())
        case cmd.Resume():
            s.resume()
            return cmd.Ok("resumed")
        case cmd.SetWatermark():
            s.set_watermarks(c.high, c.low)
            return cmd.Ok(f"watermarks high {c.high:.0%} low {c.low:.0%}")
        case cmd.Evict():
            return _evict_reply(s.evict(c.tokens), c.tokens)
        case cmd.Reset():
            n = s.reset()
            return cmd.Ok(f"reset: the cache is empty ({n} requests cancelled)",
                          {"cancelled": n})
        case cmd.Stats():
            return s.stats().reply()
        case cmd.SetSchedule():
            s.set_schedule(c.policy)
            return cmd.Ok(f"schedule {c.policy}: the waiting queue is ordered by it from the "
                          "next step")
        case cmd.TakeSnapshot():  # the loop's: it publishes the snapshot in the stream
            return cmd.Error(f"unsupported command {type(c).__name__}")
        case _:
            assert_never(c)


def _evict_reply(r: EvictResult, asked: int) -> cmd.AnyReply:
    values: Figures = {"nodes": r.nodes, "tokens": r.tokens, "blocks": r.blocks}
    if r.tokens == 0:
        return cmd.Ok(f"evicted nothing of {asked} tokens: no unpinned leaf (every cached "
                      "node is pinned by a running request, or the cache is empty)", values)
    short = " (all that was evictable)" if r.exhausted else ""
    return cmd.Ok(f"evicted {r.nodes} nodes, {r.tokens} tokens, {r.blocks} blocks{short}",
                  values)
