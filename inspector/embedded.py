"""EmbeddedSource: a cache service running in the inspector's process, in its ``ServiceLoop``.

The same loop and command handler as ``radixcache serve``, with the batches handed straight to
the ``Feed`` instead of a socket. The caller builds the service (a ``TreeDriver`` or an
``Engine``: the CLI and the tests do; the inspector never constructs a tree or an engine) and
this source owns it from ``start`` to ``stop``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from inspector.feed import Feed
from inspector.replay import Recording
from inspector.sources import ConnState, DatasetWords, SourceStatus
from radixcache.core import events as ev
from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
from radixcache.serving.service import CacheService
from radixcache.wire import commands as cmd


class EmbeddedSource:
    """A ``Source`` over ``service`` stepped by a ``ServiceLoop`` on its own thread.

    ``recording`` (optional) receives every batch and a keyframe every ``keyframe_every``
    batches, so a session can be replayed. ``clock`` stamps the batches (tests fix it)."""

    def __init__(self, service: CacheService, config: LoopConfig | None = None, *,
                 clock: Callable[[], float] = time.time, recording: Recording | None = None,
                 keyframe_every: int = 16) -> None:
        self.service = service
        self.config = config if config is not None else LoopConfig()
        self.clock = clock
        self.recording = recording
        self.keyframe_every = keyframe_every
        self.loop: ServiceLoop | None = None
        self._feed: Feed | None = None
        self._text = DatasetWords()
        self._started = clock()
        self._commands = 0  # in flight
        self._count_lock = threading.Lock()

    # -- Source ------------------------------------------------------------------------------
    def start(self, feed: Feed) -> None:
        """Load the service's snapshot into ``feed`` and start stepping."""
        self._feed = feed
        self.service.take_events()
        snapshot = self.service.snapshot()
        if self.recording is not None:
            self.recording.keyframe(snapshot)
        feed.load(snapshot, 0, self.clock())
        sink = BatchSink(self._on_batch, engine="embedded", clock=self.clock)
        self.loop = ServiceLoop(self.service, sink, self.config)
        self.loop.sample()  # a first memory and counter sample, before any step
        self.loop.start()

    def _on_batch(self, batch: ev.Batch) -> None:
        rec = self.recording
        if rec is not None:
            rec.add(batch)
            if len(rec.batches) % self.keyframe_every == 0:
                rec.keyframe(self.service.snapshot())
        assert self._feed is not None
        self._feed.apply(batch)

    def stop(self) -> None:
        """Stop stepping and close the service (idempotent)."""
        if self.loop is not None:
            self.loop.close()
            self.loop = None

    def status(self) -> SourceStatus:
        """LOCAL; ``busy`` while the service has work or a command is in flight; the loop's
        fault, if its thread died, as the detail."""
        loop = self.loop
        fault = loop.fault.line() if loop is not None and loop.fault is not None else ""
        # why device memory is missing: the last Watermark the mirror applied (one attribute
        # read of an immutable event, no feed lock: the app asks for status outside it)
        wm = self._feed.mirror.watermark if self._feed is not None else None
        note = (wm.note or "") if wm is not None else ""
        return SourceStatus(ConnState.LOCAL, "embedded", self._started, fault, not self.idle(),
                            note)

    def send(self, command: cmd.AnyCommand) -> cmd.AnyReply:
        """Run ``command`` through the loop's handler (between two steps) and reply."""
        if self.loop is None:
            return cmd.Error("the embedded engine is not running")
        with self._count_lock:
            self._commands += 1
        try:
            return self.loop.command(command)
        finally:
            with self._count_lock:
                self._commands -= 1

    def vocabulary(self) -> DatasetWords:
        """The synthetic workloads' words, then ShareGPT's once loaded."""
        return self._text

    def idle(self) -> bool:
        """True when nothing waits to be served, no command is in flight and every step's
        batch is in the feed (a step and its batch happen under the loop's lock)."""
        loop = self.loop
        if loop is None:
            return True
        with loop.lock:
            return not self.service.busy() and self._commands == 0
