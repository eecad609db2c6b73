"""ServiceLoop: the one loop that steps a cache service and publishes what it did.

Every way of running a cache -- ``serve``, the embedded engine of ``inspect``/``demo``,
headless ``record``, the screenshots and the benchmarks -- is a ``CacheService`` (an
``Engine`` or a ``TreeDriver``) inside one ``ServiceLoop`` whose events go to one ``Sink``
(a ZeroMQ ``Publisher``, or ``BatchSink`` in process). The loop owns:

- the state lock: steps, commands and snapshots take it, so a snapshot served with seq S holds
  exactly the events of batches 1..S, and a command runs between two steps;
- the batch cadence: one batch per step, a ``Digest`` every ``digest_every`` batches (the
  only place that decides it), a ``Watermark`` and a ``Counters`` sample every
  ``sample_every_s`` (the heartbeat, also while idle);
- the idle program: ``loop`` command lines injected in turn whenever the service is idle;
- the guard: when the stepping thread dies, a ``Fault`` event is published and ``fault`` is
  set (``serve`` then exits non-zero).

::

    loop thread:   with lock.turn(): service.step(); publish(take_events() [+ Digest])   seq S+1
    command:       with lock: handle(service, c); publish(take_events())          seq S+2
    snapshot:      with lock: publish(leftover events); snapshot(), seq

Every step is timed phase by phase (``timeline``, a ``serving.timeline.StepTimeline``: lock
wait, step, forward, off-CPU, publish, GC, the gap between steps); ``stats`` carries its
p50/p99/max over the last steps.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple, Protocol, runtime_checkable

import msgspec

from radixcache.core import events as ev
from radixcache.core.guard import Guard, ThreadFault
from radixcache.serving.service import CacheService, handle
from radixcache.serving.statelock import StateLock
from radixcache.serving.stats import Stats
from radixcache.serving.timeline import GC_CLOCK, StepRow, StepTimeline
from radixcache.wire import commands as cmd
from radixcache.wire.publisher import SnapshotAt


class Sink(Protocol):
    """Where the loop's batches go: numbers them and hands them on."""

    @property
    def seq(self) -> int:
        """The seq of the last batch published (0 before the first)."""
        ...

    def publish(self, events: list[ev.AnyEvent]) -> int:
        """Publish ``events`` as the next batch; returns its seq. Owns the list afterwards."""
        ...


@runtime_checkable
class ForwardClock(Protocol):
    """A service that counts the seconds its model's forwards took (the engine)."""

    @property
    def forward_s(self) -> float:
        """Seconds in forwards since it started."""
        ...


class BatchSink:
    """An in-process ``Sink``: numbers batches 1, 2, ... and calls ``on_batch`` with each."""

    def __init__(self, on_batch: Callable[[ev.Batch], None], *, epoch: int = 1,
                 engine: str = "radixcache", clock: Callable[[], float] = time.time) -> None:
        self.on_batch, self.epoch, self.engine, self.clock = on_batch, epoch, engine, clock
        self._seq = 0

    @property
    def seq(self) -> int:
        """The seq of the last batch published."""
        return self._seq

    def publish(self, events: list[ev.AnyEvent]) -> int:
        """Number the batch and hand it to ``on_batch`` at once."""
        self._seq += 1
        self.on_batch(ev.Batch(self._seq, self.epoch, self.clock(), self.engine, events))
        return self._seq


class Sampling(enum.Enum):
    """When a loop adds a ``Watermark`` + ``Counters`` sample to its batches."""

    PERIODIC = "periodic"  # every ``sample_every_s``, also while idle (the heartbeat)
    EVERY_BATCH = "every-batch"  # in every step's and command's batch, never while idle


class LoopConfig(NamedTuple):
    """How a loop paces its batches."""

    digest_every: int = 64  # a Digest event every N batches (0: never)
    sample_every_s: float = 0.25  # with PERIODIC sampling
    program: tuple[str, ...] = ()  # command lines injected in turn whenever idle ({n}: round)
    sampling: Sampling = Sampling.PERIODIC


DEFAULT_PROGRAM = ("chat 8", "system 40 --seed {n}", "tot 2 4 --seed {n}", "fork 12 --seed {n}",
                   "flood 40 --seed {n}")


class ServiceLoop:
    """Steps ``service`` on its own thread (``start``) or synchronously (``run_until_idle``),
    publishing every change to ``sink``. ``close()`` stops the thread and the service."""

    def __init__(self, service: CacheService, sink: Sink, config: LoopConfig | None = None,
                 *, clock: Callable[[], float] = time.monotonic,
                 pace: Callable[[], None] | None = None) -> None:
        self.service, self.sink = service, sink
        # called by the stepping thread after each step, with no lock held: a sink whose
        # consumer runs on another thread (the embedded inspector's feed) waits here until
        # that consumer has caught up, so a command never waits on the consumer
        self._pace = pace
        self.config = config if config is not None else LoopConfig()
        self.lock = StateLock()  # the state lock (see the module doc): fair to commands
        self.guard = Guard(self._on_fault)
        self._clock = clock
        self._batches = 0
        self._last_sample = clock()  # the first periodic sample comes one period in
        self._rounds = 0
        self.program_error: str | None = None  # why the idle program stopped
        # published state, read without the lock: whether the service had work after the
        # last step or command (set once that step's or command's batch is published)
        self.working = False
        self.timeline = StepTimeline()  # where each step's time went (serving.timeline)
        self._last_end: float | None = None  # when the last step's batch was out, if stepping
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- publishing (lock held) -----------------------------------------------------------
    def _publish(self, events: list[ev.AnyEvent]) -> None:
        self._batches += 1
        every = self.config.digest_every
        if every and self._batches % every == 0:
            events.append(ev.Digest(self.service.digest()))
        self.sink.publish(events)

    def _sample(self) -> list[ev.AnyEvent]:
        self._last_sample = self._clock()
        return [self.service.watermark(), self.service.counters()]

    def _flush(self, *, sample: bool = False) -> None:
        events = self.service.take_events()
        if sample:
            events += self._sample()
        if events:
            self._publish(events)

    def _sample_due(self, *, stepped: bool) -> bool:
        if self.config.sampling is Sampling.EVERY_BATCH:
            return stepped
        return self._clock() - self._last_sample >= self.config.sample_every_s

    # -- what clients call ----------------------------------------------------------------
    def command(self, c: cmd.AnyCommand) -> cmd.AnyReply:
        """Do one command between two steps; its events go out as one batch before the reply
        (with a memory and counter sample, so every view shows its effect at once)."""
        with self.lock:
            if isinstance(c, cmd.TakeSnapshot):
                self._flush()
                seq = self.sink.seq
                self._publish([self.service.snapshot()])
                return cmd.Ok(f"snapshot after seq {seq}", {"seq": seq})
            reply = handle(self.service, c)
            if isinstance(c, cmd.Stats):  # reads only: publishes nothing
                if isinstance(reply, cmd.StatsReply):
                    reply = msgspec.structs.replace(reply, stream=self._stream_figures())
                return reply
            self._flush(sample=True)
            self.working = self.service.busy()
        self._wake.set()
        return reply

    def stats(self) -> Stats:
        """The service's figures between two steps (waits for the step in progress)."""
        with self.lock:
            return self.service.stats()

    def sample(self) -> None:
        """Publish a memory and counter sample now (with any events not yet published)."""
        with self.lock:
            self._flush(sample=True)

    def command_line(self, line: str) -> str:
        """Parse and do a command typed by a person; returns what to show them."""
        try:
            reply = self.command(cmd.parse_command_line(line))
        except cmd.CommandError as exc:
            return f"error: {exc}"
        return f"error: {reply.message}" if isinstance(reply, cmd.Error) else reply.message

    def _stream_figures(self) -> cmd.StreamFigures:
        fault = self.guard.fault
        return cmd.StreamFigures(seq=self.sink.seq, batches=self._batches,
                                 digest=self.service.digest(), program_rounds=self._rounds,
                                 program_error=self.program_error,
                                 fault=None if fault is None else fault.line(),
                                 timeline=self.timeline.figures())

    def snapshot_at(self) -> SnapshotAt:
        """The service's snapshot and the seq of the last batch it includes (events recorded
        since the last batch are published first, so the two agree)."""
        with self.lock:
            self._flush()
            return SnapshotAt(self.service.snapshot(), self.sink.seq)

    @contextlib.contextmanager
    def changing(self) -> Iterator[CacheService]:
        """Hold the state lock while the caller changes the service directly (a benchmark or a
        test driving the tree request by request), then publish what changed as one batch."""
        with self.lock:
            yield self.service
            self._flush()

    @property
    def fault(self) -> ThreadFault | None:
        """How the stepping thread died, if it did."""
        return self.guard.fault

    # -- stepping -------------------------------------------------------------------------
    def step_once(self) -> bool:
        """One step if there is work (then publishes it); a sample when one is due; the next
        program entry when idle. Returns whether the service stepped."""
        asked = time.perf_counter()
        with self.lock.turn():
            worked = self.service.busy()
            if worked:
                self._timed_step(asked, sample=self._sample_due(stepped=True))
            elif self._sample_due(stepped=False):
                self._flush(sample=True)
            self.working = self.service.busy()
        self._last_end = time.perf_counter() if worked else None
        if not worked and self.config.program and self.program_error is None \
                and not self.service.paused:
            self._inject_next()
        return worked

    def _timed_step(self, asked: float, *, sample: bool) -> None:
        """One step and its batch (lock held), recorded in ``timeline`` (its module doc)."""
        got = time.perf_counter()
        gc0, fwd0, cpu0 = GC_CLOCK.total_s, self._forward_s(), time.thread_time()
        self.service.step()
        stepped, cpu1 = time.perf_counter(), time.thread_time()
        fwd1 = self._forward_s()
        self._flush(sample=sample)
        done = time.perf_counter()
        gap = asked - self._last_end if self._last_end is not None else float("nan")
        self.timeline.record(StepRow(gap, got - asked, stepped - got, fwd1 - fwd0,
                                     max(0.0, (stepped - got) - (cpu1 - cpu0)), done - stepped,
                                     GC_CLOCK.total_s - gc0))

    def _forward_s(self) -> float:
        return self.service.forward_s if isinstance(self.service, ForwardClock) else 0.0

    def run_until_idle(self, max_steps: int | None = None, *,
                       until: Callable[[], bool] | None = None) -> int:
        """Step in this thread until the service has no work (or ``max_steps``, or ``until()``
        is true before a step); returns the steps taken. The last batch carries a sample and a
        ``Digest``."""
        steps = 0
        while self.service.busy() and (max_steps is None or steps < max_steps) \
                and (until is None or not until()):
            asked = time.perf_counter()
            with self.lock.turn():
                self._timed_step(asked, sample=self._sample_due(stepped=True))
            self._last_end = time.perf_counter()
            steps += 1
        with self.lock:  # the closing batch: exactly one Digest, whatever the cadence says
            events = [*self.service.take_events(), *self._sample(),
                      ev.Digest(self.service.digest())]
            self._batches += 1
            self.sink.publish(events)
        return steps

    def _inject_next(self) -> None:
        program = self.config.program
        line = program[self._rounds % len(program)].format(n=self._rounds // len(program))
        self._rounds += 1
        reply = self.command_line(line)
        if reply.startswith("error:"):  # a bad entry must not spin: stop the program
            self.program_error = f"program entry {line!r}: {reply}"

    def start(self) -> ServiceLoop:
        """Start stepping on a guarded thread (idempotent)."""
        if self._thread is None:
            self._thread = self.guard.start("rc-service-loop", self._run)
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.step_once():
                if self._pace is not None:
                    self._pace()
                continue
            self._wake.wait(0.01)  # a submit from outside ``command`` (HTTP) waits 10 ms at most
            self._wake.clear()

    def wake(self) -> None:
        """Step at once if there is work (after a submit from outside ``command``)."""
        self._wake.set()

    def _on_fault(self, fault: ThreadFault) -> None:
        with self.lock:
            self._publish([*self.service.take_events(), ev.Fault(fault.thread, fault.error)])

    def stop(self) -> None:
        """Stop the stepping thread after its current step; the service keeps its state
        (``run_until_idle`` or ``start`` carries on)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self._stop.clear()

    def close(self) -> None:
        """Stop the thread, then close the service (unfinished requests are cancelled)."""
        self.stop()
        with self.lock:
            self.service.close()
            self._flush()
