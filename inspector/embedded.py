"""EmbeddedSource: a cache service running in the inspector's process, in its ``ServiceLoop``.

The same loop and command handler as ``radixcache serve``, with the batches handed to the
``Feed`` through a queue instead of a socket. The caller builds the service (a ``TreeDriver``
or an ``Engine``: the CLI and the tests do; the inspector never constructs a tree or an
engine) and this source owns it from ``start`` to ``stop``.

The inspector sees what a live subscriber sees, and never waits on the engine::

    rc-service-loop  (state lock)  step, publish: batch ──► queue (bounded)
    rc-embedded-feed (feed lock)   batch ◄── queue: Feed.apply (mirror, watchers)
    UI thread        (feed lock)   frame: Feed.take + the frame view

The loop never takes the feed's lock (a frame in progress does not hold up a step or a
command) and the UI never takes the loop's (``status`` and ``idle`` read published state:
``ServiceLoop.working``, the commands in flight, the batches not yet applied). The stepping
thread waits between two steps, holding no lock, while the feed is more than ``FEED_BEHIND``
batches behind (``ServiceLoop``'s ``pace``): the engine runs at the pace the inspector
applies, as it did when it applied its batches itself, and the view is never far behind.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from inspector.engine_facts import EngineFacts, ModelWords
from inspector.feed import Feed
from inspector.replay import Recording
from inspector.sources import ConnState, SourceStatus
from radixcache.core import events as ev
from radixcache.core.guard import Guard
from radixcache.serving.http_interp import settle
from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
from radixcache.serving.service import CacheService
from radixcache.wire import commands as cmd

FEED_BEHIND = 4  # batches published but not yet applied, past which the loop's steps wait


class EmbeddedSource:
    """A ``Source`` over ``service`` stepped by a ``ServiceLoop`` on its own thread.

    ``recording`` (optional) receives every batch and a keyframe every ``keyframe_every``
    batches, so a session can be replayed. ``clock`` stamps the batches (tests fix it).
    ``settle``: ``start`` freezes what start-up made out of the collector's sight and makes
    young collections rarer (``serving.http_interp.settle``, as serve's front does)."""

    def __init__(self, service: CacheService, config: LoopConfig | None = None, *,
                 clock: Callable[[], float] = time.time, recording: Recording | None = None,
                 keyframe_every: int = 16, settle: bool = True) -> None:
        self.service = service
        self._settle = settle  # ``start`` settles the interpreter (``serving.http_interp``)
        self.config = config if config is not None else LoopConfig()
        self.clock = clock
        self.recording = recording
        self.keyframe_every = keyframe_every
        self.loop: ServiceLoop | None = None
        self._feed: Feed | None = None
        self._text = ModelWords()
        self.facts = EngineFacts()  # the service's, read at ``start``
        self._started = clock()
        self._commands = 0  # in flight
        self._count_lock = threading.Lock()
        self._batches: queue.Queue[ev.Batch | None] = queue.Queue()
        self._applied = threading.Condition()  # notified after every batch the feed applied
        self.guard = Guard()  # the feed thread's
        self._applier: threading.Thread | None = None

    # -- Source ------------------------------------------------------------------------------
    def start(self, feed: Feed) -> None:
        """Load the service's snapshot into ``feed`` and start stepping."""
        self._feed = feed
        self.facts = EngineFacts.of(self.service.stats())
        self._text.adopt(self.facts.model_dir, local=True)  # an engine in this process
        self.service.take_events()
        snapshot = self.service.snapshot()
        if self.recording is not None:
            self.recording.keyframe(snapshot)
        feed.load(snapshot, 0, self.clock())
        # the step loop, the feed thread and the app share one interpreter, as serve's HTTP
        # front does: what start-up built goes out of the collector's sight and young
        # collections get rarer (a full collection over a 100k-node tree and its mirror held
        # the GIL for 160-220 ms, in frames and in commands' replies)
        if self._settle:
            settle()
        self._applier = self.guard.start("rc-embedded-feed", self._apply_batches)
        sink = BatchSink(self._on_batch, engine="embedded", clock=self.clock)
        self.loop = ServiceLoop(self.service, sink, self.config, pace=self._wait_for_feed)
        self.loop.sample()  # a first memory and counter sample, before any step
        self.loop.start()

    def _on_batch(self, batch: ev.Batch) -> None:
        """The loop's sink (its thread, its lock held): record, then queue for the feed."""
        rec = self.recording
        if rec is not None:
            rec.add(batch)
            if len(rec.batches) % self.keyframe_every == 0:
                rec.keyframe(self.service.snapshot())
        if self.guard.fault is None:  # a dead feed thread applies nothing: never queue
            self._batches.put(batch)

    def _wait_for_feed(self) -> None:
        """The loop's pace (its thread, no lock held): wait while the feed is behind."""
        with self._applied:
            while self._batches.unfinished_tasks > FEED_BEHIND and self.guard.fault is None:
                self._applied.wait(0.1)

    def _apply_batches(self) -> None:
        """The feed thread: apply each batch in order, as a subscriber's thread does."""
        feed = self._feed
        assert feed is not None
        while True:
            batch = self._batches.get()
            try:
                if batch is None:
                    return
                feed.apply(batch)
            finally:
                self._batches.task_done()
                with self._applied:
                    self._applied.notify_all()

    def stop(self) -> None:
        """Stop stepping, close the service, then the feed thread once it has applied what
        was published (idempotent)."""
        if self.loop is not None:
            self.loop.close()
            self.loop = None
        if self._applier is not None:
            self._batches.put(None)
            self._applier.join()
            self._applier = None

    def status(self) -> SourceStatus:
        """LOCAL; ``busy`` while the service has work or a command is in flight; the fault of
        the loop's thread or the feed's, if one died, as the detail. Takes no lock."""
        loop = self.loop
        died = loop.fault if loop is not None and loop.fault is not None else self.guard.fault
        fault = died.line() if died is not None else ""
        # why device memory is missing: the last Watermark the mirror applied (one attribute
        # read of an immutable event, no feed lock: the app asks for status outside it)
        wm = self._feed.mirror.watermark if self._feed is not None else None
        note = (wm.note or "") if wm is not None else ""
        return SourceStatus(ConnState.LOCAL, "embedded", self._started, fault, not self.idle(),
                            note, kv_bytes_per_block=self.facts.kv_bytes_per_block,
                            kv_bytes_per_token=self.facts.kv_bytes_per_token)

    def send(self, command: cmd.AnyCommand) -> cmd.AnyReply:
        """Run ``command`` through the loop's handler (between two steps) and reply.

        ``stats`` is the service's figures without the stream's (``StatsReply.stream`` is
        absent, as its doc says of an embedded loop): the stream's figures carry the tree's
        digest now, computed under the state lock over every node (635 ms at 100,000 nodes),
        which held up every step and was 99% of a ``stats`` command's wait; the inspector is
        the stream's consumer and has its seq and batches already."""
        if self.loop is None:
            return cmd.Error("the embedded engine is not running")
        with self._count_lock:
            self._commands += 1
        try:
            if isinstance(command, cmd.Stats):
                return self.loop.stats().reply()
            return self.loop.command(command)
        finally:
            with self._count_lock:
                self._commands -= 1

    def vocabulary(self) -> ModelWords:
        """The synthetic workloads' words, then ShareGPT's once loaded; a checkpoint's
        tokenizer when the service serves one (its ``stats`` names the folder)."""
        return self._text

    def idle(self) -> bool:
        """True when nothing waits to be served, no command is in flight and every published
        batch is in the feed. Reads published state only, in the order that cannot say idle
        too early: the loop's ``working`` (set after its batch is queued), the commands in
        flight (counted down after their batch is queued), then the batches not applied."""
        loop = self.loop
        if loop is None:
            return self._batches.unfinished_tasks == 0
        return not loop.working and self._commands == 0 and self._batches.unfinished_tasks == 0
