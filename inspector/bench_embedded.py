"""``bench tui --embedded``: the same load as ``BenchSource``, through the embedded engine's path.

``FloodService`` is the CLI's model-free cache (a ``TreeDriver``) as a ``CacheService`` whose
steps also carry ``BenchSource``'s flood: a step every 10 ms, with as many Access events as
keep ``events_per_s`` (50,000) and, while ``changing`` is set, ``requests_per_batch`` new
requests through the tree. It runs inside an ``EmbeddedSource``: the real ``ServiceLoop``
(state lock, command handler, Watermark + Counters samples every 100 ms) and the real feed
thread. So the frames and the commands measured here meet the loop exactly as they do in
``radixcache inspect`` / ``demo`` with an embedded engine.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

import numpy as np
import numpy.typing as npt

from inspector.embedded import EmbeddedSource
from radixcache.core import events as ev
from radixcache.core.nodes import EvictResult
from radixcache.serving.loop import LoopConfig
from radixcache.serving.service import CacheService, Submitted
from radixcache.serving.stats import Stats
from radixcache.traffic.workloads import Workload
from radixcache.wire import commands as cmd

FLOOD_CLOCK = 1 << 40  # the flood's access clocks start here (past any the tree hands out)


class FloodableCache(CacheService, Protocol):
    """The CLI's model-free cache: a cache service that can also serve one sequence now."""

    def serve_now(self, tokens: npt.NDArray[np.uint32]) -> None:
        """Serve one sequence at once, outside the queue."""
        ...

    def __len__(self) -> int:
        """Nodes."""
        ...


class FloodService:
    """``inner`` plus a steady flood of Access events, one step every ``interval`` s."""

    def __init__(self, inner: FloodableCache, *, events_per_s: int = 50_000,
                 requests_per_batch: int = 4, interval: float = 0.01) -> None:
        self.inner = inner
        self.events_per_s = events_per_s
        self.requests_per_batch = requests_per_batch
        self.interval = interval
        self.changing = threading.Event()
        self.streamed = 0  # events published (the flood's and the tree's)
        self._rng = np.random.default_rng(1)
        self._clock = FLOOD_CLOCK
        self._start = -1.0  # the first step's time: the flood starts with the loop
        self._next_at = 0.0
        self._flood: list[ev.AnyEvent] = []

    # -- what differs from the inner cache -------------------------------------------------
    def busy(self) -> bool:
        """A flood step is due, or the inner cache has work."""
        return time.perf_counter() >= self._next_at or self.inner.busy()

    def step(self) -> None:
        """The inner cache's step, new requests while ``changing``, the owed Access events."""
        t0 = time.perf_counter()
        if self._start < 0:
            self._start = t0
        if self.inner.busy():
            self.inner.step()
        if self.changing.is_set():
            for _ in range(self.requests_per_batch):
                tokens = self._rng.integers(0, 64, int(self._rng.integers(3, 12)),
                                            dtype=np.uint32)
                self.inner.serve_now(tokens)  # a prompt that does not fit is refused
        owed = int((t0 - self._start) * self.events_per_s) - self.streamed
        for _ in range(max(0, owed)):
            self._flood.append(ev.Access(0, self._clock))
            self._clock += 1
        self._next_at = t0 + self.interval

    def take_events(self) -> list[ev.AnyEvent]:
        """The inner cache's events, then the flood's."""
        out = self.inner.take_events()
        out += self._flood
        self._flood = []
        self.streamed += len(out)
        return out

    # -- the rest is the inner cache's ------------------------------------------------------
    @property
    def paused(self) -> bool:
        """The inner cache's."""
        return self.inner.paused

    def submit_workload(self, workload: Workload) -> Submitted:
        """The inner cache's."""
        return self.inner.submit_workload(workload)

    def pause(self) -> None:
        """The inner cache's."""
        self.inner.pause()

    def resume(self) -> None:
        """The inner cache's."""
        self.inner.resume()

    def evict(self, tokens: int) -> EvictResult:
        """The inner cache's."""
        return self.inner.evict(tokens)

    def set_watermarks(self, high: float, low: float) -> None:
        """The inner cache's."""
        self.inner.set_watermarks(high, low)

    def reset(self) -> int:
        """The inner cache's."""
        return self.inner.reset()

    def set_schedule(self, policy: cmd.SchedulePolicy) -> None:
        """The inner cache's."""
        self.inner.set_schedule(policy)

    def snapshot(self) -> ev.Snapshot:
        """The inner cache's."""
        return self.inner.snapshot()

    def digest(self) -> str:
        """The inner cache's."""
        return self.inner.digest()

    def watermark(self) -> ev.Watermark:
        """The inner cache's."""
        return self.inner.watermark()

    def counters(self) -> ev.Counters:
        """The inner cache's."""
        return self.inner.counters()

    def stats(self) -> Stats:
        """The inner cache's."""
        return self.inner.stats()

    def close(self) -> None:
        """The inner cache's."""
        self.inner.close()


def embedded_flood(cache: FloodableCache) -> tuple[EmbeddedSource, FloodService]:
    """An ``EmbeddedSource`` over ``cache`` flooded as ``BenchSource`` floods: samples every
    100 ms, no digests (as the bench stream has none)."""
    flood = FloodService(cache)
    config = LoopConfig(digest_every=0, sample_every_s=0.1)
    return EmbeddedSource(flood, config), flood
