"""The live recorder: a subscriber's stream written to a recording file.

Keyframes are right by construction: the first keyframe, and one after every resync (an
engine restart, a gap older than the engine's ring, an event that did not fit), is the very
snapshot the subscriber loaded, written with that snapshot's (epoch, seq) *before* any batch
after it (``Subscriber.on_snapshot``). Periodic keyframes are taken in ``on_batch``, which
runs right after the batch was applied, so the mirror is exactly at that batch's seq. A batch
is written once, after the keyframe it follows. (The first version took the keyframe from
the mirror after the batch had been applied and then wrote the batch too: every reader
applied it twice.)
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

from radixcache.core import events as ev
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.mirror import Mirror
from radixcache.wire.recording import RecordingWriter, mirror_snapshot
from radixcache.wire.security import ClientCurve
from radixcache.wire.subscriber import Subscriber


class RecordResult(NamedTuple):
    """What a live recording got: ``synced`` False means nothing was written."""

    synced: bool
    events: int
    batches: int
    keyframes: int
    malformed: int
    resyncs: int
    last_error: str


class LiveRecorder:
    """Records the engine at ``endpoints`` into ``path`` while ``run_for`` runs. The file is
    created at the first snapshot (no file when the engine never answers)."""

    def __init__(self, endpoints: Endpoints, path: str | os.PathLike[str], *,
                 keyframe_every: int = 50_000, curve: ClientCurve | None = None,
                 request_timeout_s: float = 2.0) -> None:
        self.path = path
        self.keyframe_every = keyframe_every
        self.source = endpoints.events
        self.writer: RecordingWriter | None = None
        self.keyframes = 0
        self.mirror = Mirror()
        self.subscriber = Subscriber(endpoints, self.mirror, on_batch=self._on_batch,
                                     on_snapshot=self._on_snapshot, curve=curve,
                                     request_timeout_s=request_timeout_s)

    def _on_snapshot(self, epoch: int, seq: int, snapshot: ev.Snapshot) -> None:
        if self.writer is None:
            self.writer = RecordingWriter(self.path, {"source": self.source},
                                          keyframe_every=self.keyframe_every)
        self.writer.write_keyframe(seq, epoch, snapshot)
        self.keyframes += 1

    def _on_batch(self, batch: ev.Batch) -> None:
        writer = self.writer
        assert writer is not None  # a batch is applied only after a snapshot was loaded
        writer.write_batch(batch)
        if writer.needs_keyframe:
            writer.write_keyframe(batch.seq, batch.epoch, mirror_snapshot(self.mirror))
            self.keyframes += 1

    def start(self) -> LiveRecorder:
        """Start following the engine (the subscriber's thread); returns self."""
        self.subscriber.start()
        return self

    def stop(self) -> RecordResult:
        """Stop following and close the file (index and tail written)."""
        sub = self.subscriber
        sub.stop()
        w = self.writer
        if w is not None:
            w.close()
        return RecordResult(w is not None, w.events if w else 0, w.batches if w else 0,
                            self.keyframes, sub.stats.malformed, sub.stats.resyncs,
                            sub.last_error)

    def run_for(self, seconds: float) -> RecordResult:
        """Record for ``seconds``, then stop and close the file."""
        self.start()
        try:
            time.sleep(seconds)
        finally:
            result = self.stop()
        return result
