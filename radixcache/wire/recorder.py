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
import threading
import time
from typing import NamedTuple

from radixcache.core import events as ev
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.mirror import Mirror
from radixcache.wire.recording import (
    CaptureNote,
    RecordingWriteError,
    RecordingWriter,
    mirror_snapshot,
)
from radixcache.wire.security import ClientCurve
from radixcache.wire.subscriber import State, Subscriber

STOP_WAIT_S = 0.5
BUSY_AT_END = ("the stream's thread was still busy with a frame when the time was up "
               "(not in the file)")


class RecordResult(NamedTuple):
    """What a live recording got: ``synced`` False means nothing was written; ``note`` is
    what the file's capture note says (None without a file); ``failed`` a write error."""

    synced: bool
    events: int
    batches: int
    keyframes: int
    malformed: int
    resyncs: int
    last_error: str
    note: CaptureNote | None = None
    failed: str = ""


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
        self.seqs: tuple[int, int] | None = None  # first and last seq written
        self.failed: RecordingWriteError | None = None
        self._lock = threading.Lock()  # the subscriber's thread writes, stop() closes
        self._closed = False
        # set by stop(): the subscriber's thread was still busy after STOP_WAIT_S (it is a
        # daemon; whatever it holds is dropped with the process)
        self.busy_at_end = False
        self._seconds = 0.0
        self.mirror = Mirror()
        self.subscriber = Subscriber(endpoints, self.mirror, on_batch=self._on_batch,
                                     on_snapshot=self._on_snapshot, curve=curve,
                                     request_timeout_s=request_timeout_s)

    def _on_snapshot(self, epoch: int, seq: int, snapshot: ev.Snapshot) -> None:
        with self._lock:
            if self._closed or self.failed is not None:
                return
            try:
                if self.writer is None:
                    self.writer = RecordingWriter(self.path, {"source": self.source},
                                                  keyframe_every=self.keyframe_every)
                self.writer.write_keyframe(seq, epoch, snapshot)
            except RecordingWriteError as exc:  # a full disk: the file keeps what it has
                self.failed = exc
                return
            self.keyframes += 1

    def _on_batch(self, batch: ev.Batch) -> None:
        with self._lock:
            writer = self.writer
            if self._closed or self.failed is not None or writer is None:
                return
            try:
                writer.write_batch(batch)
                first = batch.seq if self.seqs is None else self.seqs[0]
                self.seqs = (first, batch.seq)
                if writer.needs_keyframe:
                    writer.write_keyframe(batch.seq, batch.epoch, mirror_snapshot(self.mirror))
                    self.keyframes += 1
            except RecordingWriteError as exc:
                self.failed = exc

    def start(self) -> LiveRecorder:
        """Start following the engine (the subscriber's thread); returns self."""
        self.subscriber.start()
        return self

    def stop(self) -> RecordResult:
        """Stop following and close the file: the capture note, the index and the tail. Waits
        at most ``STOP_WAIT_S`` for the subscriber's thread (busy with a huge frame, say) and
        as long again for a frame it is writing: what it has not written by then is left out,
        and the note says so (or ``failed`` says there is no note)."""
        sub = self.subscriber
        self.busy_at_end = not sub.stop(timeout=STOP_WAIT_S)
        if not self._lock.acquire(timeout=STOP_WAIT_S):  # still writing a huge keyframe
            self._closed = True  # it writes nothing after that frame
            return RecordResult(self.writer is not None, 0, 0, self.keyframes,
                                sub.stats.malformed, sub.stats.resyncs, sub.last_error, None,
                                f"{self.path}: the stream's thread was still writing a keyframe "
                                f"when the time was up: the file has no capture note")
        try:
            again, self._closed = self._closed, True  # a second stop writes nothing more
            w, note = self.writer, None
            if w is not None and self.failed is None and not again:
                note = self._note(w)
                try:
                    w.write_note(note)
                    w.close()
                except RecordingWriteError as exc:
                    self.failed = exc
        finally:
            self._lock.release()
        return RecordResult(w is not None, w.events if w else 0, w.batches if w else 0,
                            self.keyframes, sub.stats.malformed, sub.stats.resyncs,
                            sub.last_error, note, str(self.failed or ""))

    def _note(self, w: RecordingWriter) -> CaptureNote:
        sub, s = self.subscriber, self.subscriber.stats
        status = sub.status()
        first, last = self.seqs or (sub.seq, sub.seq)
        lost = s.gaps + s.malformed + s.resyncs + s.seq_backwards + s.buffer_dropped
        error = sub.last_error
        if self.busy_at_end:
            lost, error = lost + 1, BUSY_AT_END + (f"; {error}" if error else "")
        return CaptureNote(self._seconds, w.events, w.batches, self.keyframes, first, last,
                           status.state.value, status.out_of_sync_s, s.gaps, s.too_old,
                           s.malformed, s.resyncs, s.seq_backwards, s.buffer_dropped,
                           error, status.state is State.LIVE and not lost)

    def run_for(self, seconds: float, stop: threading.Event | None = None) -> RecordResult:
        """Record for ``seconds`` (less when a write fails or ``stop`` is set: a SIGTERM),
        then stop and close the file. The note says how long it recorded."""
        self._seconds = seconds
        self.start()
        t0 = time.monotonic()
        deadline = t0 + seconds
        stop = stop if stop is not None else threading.Event()
        try:
            while self.failed is None and (left := deadline - time.monotonic()) > 0:
                if stop.wait(min(left, 0.05)):
                    self._seconds = round(time.monotonic() - t0, 3)
                    break
        finally:
            result = self.stop()
        return result
