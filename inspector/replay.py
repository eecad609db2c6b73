"""ReplaySource: a recording played into the feed, with play/pause, step, speed and seek.

``load_recording(path)`` reads a file written by ``radixcache record`` (``RecordingReader``)
into a ``Recording``: its batches and the file's own keyframes. A damaged file loads up to
the damage; ``Recording.damage`` says where it stopped and the replay bar shows it. A file
recorded with ``--model DIR`` names the folder in its header (``model_dir``): the replay's
previews are that folder's tokenizer's text when the folder is on this machine, else ids
with a note saying why (``ModelWords``, as a live engine's); older files, and files of the
seeded model, show the workloads' words.

A ``Recording`` is the batches in order plus keyframes: ``(i, snapshot)`` says the state
before batch ``i`` equals ``snapshot``. Stepping back loads the nearest keyframe at or before
the target and applies the batches after it, so any position costs at most one keyframe
interval of batches.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from inspector.engine_facts import ModelWords
from inspector.feed import Feed
from inspector.layout import TokenText
from inspector.sources import ConnState, SourceStatus
from radixcache.core import events as ev
from radixcache.core.guard import Guard
from radixcache.wire import commands as cmd
from radixcache.wire.mirror import Mirror, MirrorError, MirrorStats
from radixcache.wire.recording import Keyframe, RecordingError, RecordingReader

MAX_GAP_S = 0.5  # a pause in the recording longer than this plays as this


@dataclass
class Recording:
    """Batches and keyframes (keyframe indexes strictly increasing, the first one 0)."""

    batches: list[ev.Batch] = field(default_factory=list)
    keyframes: list[tuple[int, ev.Snapshot]] = field(default_factory=list)
    name: str = "recording"
    damage: str = ""
    model_dir: str = ""  # the header's model folder ("": the seeded model, or an older file)

    def add(self, batch: ev.Batch) -> None:
        """Append a batch (a ``LocalSource`` recorder)."""
        self.batches.append(batch)

    def keyframe(self, snapshot: ev.Snapshot) -> None:
        """The state before the next batch is ``snapshot``."""
        self.keyframes.append((len(self.batches), snapshot))


def load_recording(path: str | Path) -> Recording:
    """All batches and keyframes of a record file, in file order. A keyframe's index is the
    number of batches before it. Raises ``RecordingError`` when the file is not a recording
    or holds no keyframe before its first batch; damage later in the file ends the recording
    there and is described in ``damage`` (``stopped at byte N: reason``)."""
    reader = RecordingReader(path)
    folder = reader.header.config.get("model_dir", "")
    rec = Recording(name=Path(path).name, model_dir=folder if isinstance(folder, str) else "")
    for record in reader.records():
        item = record.item
        if isinstance(item, Keyframe):
            rec.keyframe(item.snapshot)
        else:
            rec.add(item)
    if reader.damage is not None:
        rec.damage = f"stopped at byte {reader.damage.offset:,}: {reader.damage.reason}"
    if not rec.keyframes or rec.keyframes[0][0] != 0:
        where = f" ({rec.damage})" if rec.damage else ""
        raise RecordingError(f"{path}: no keyframe before the first batch{where}")
    return rec


class Tally:
    """The counters a clean pass from the start gives at each keyframe: a snapshot holds the
    tree but not the counts, so a seek restores these with it (any seek then shows what a
    clean pass to that batch shows, never a double count)."""

    def __init__(self, rec: Recording) -> None:
        self.at: list[tuple[MirrorStats, ev.Counters | None]] = []
        m = Mirror()
        marks = dict(rec.keyframes)
        m.load_snapshot(rec.keyframes[0][1])
        for i in range(len(rec.batches) + 1):
            if i in marks:
                self.at.append((dataclasses.replace(m.stats), m.counters))
            if i == len(rec.batches):
                break
            try:
                m.apply_batch(rec.batches[i])
            except MirrorError:  # a damaged stretch: keep counting from the next keyframe
                if i + 1 in marks:
                    stats = m.stats
                    m.load_snapshot(marks[i + 1])
                    m.stats = stats

    def restore(self, mirror: Mirror, k: int) -> None:
        """Put keyframe ``k``'s counters into ``mirror`` (just loaded from that keyframe)."""
        stats, counters = self.at[k]
        mirror.stats = dataclasses.replace(stats)
        mirror.counters = counters


@dataclass
class Position:
    """Where the replay stands: ``index`` batches applied out of ``total``."""

    index: int
    total: int
    playing: bool
    speed: float
    keyframes: list[int]
    note: str = ""


class ReplaySource:
    """A ``Source`` and ``ReplayControls`` over a ``Recording``; starts paused at batch 0."""

    def __init__(self, recording: Recording) -> None:
        if not recording.keyframes or recording.keyframes[0][0] != 0:
            raise ValueError("a recording needs a keyframe before its first batch")
        self.rec = recording
        self.index = 0
        self.playing = False
        self.speed = 1.0
        self._feed: Feed | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.guard = Guard()  # the player thread's: a fault is shown in the status line
        self._started = time.time()
        # ShareGPT recordings show words (loaded on first miss); a model's, its folder's text
        self._vocab = ModelWords()
        self._vocab.adopt(recording.model_dir, local=True)
        self._tally = Tally(recording)

    # -- Source ----------------------------------------------------------------------------
    def start(self, feed: Feed) -> None:
        """Load the first keyframe and start the (paused) player thread."""
        self._feed = feed
        self._goto(0)
        self._thread = self.guard.start("rc-replay", self._run)

    def stop(self) -> None:
        """Stop the player (idempotent)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def status(self) -> SourceStatus:
        """REPLAY with ``batch i/n`` and the speed in ``detail``."""
        state = "playing" if self.playing else "paused"
        detail = f"{state} {self.index:,}/{len(self.rec.batches):,} ×{self.speed:g}"
        if self.rec.damage:
            detail += " · damaged file"
        if self.guard.fault is not None:
            detail += f" · {self.guard.fault.line()}"
        return SourceStatus(ConnState.REPLAY, self.rec.name, self._started, detail,
                            paused=not self.playing)

    def send(self, command: cmd.AnyCommand) -> cmd.AnyReply:
        """A recording cannot be steered."""
        return cmd.Error("replay: commands cannot be sent to a recording")

    def vocabulary(self) -> TokenText:
        """The recorded model folder's text (``ModelWords``), else the synthetic workloads'
        words, then ShareGPT's once loaded (``DatasetWords``)."""
        return self._vocab

    # -- ReplayControls --------------------------------------------------------------------
    def position(self) -> Position:
        """Index, total, play state, speed, keyframe indexes."""
        return Position(self.index, len(self.rec.batches), self.playing, self.speed,
                        [i for i, _ in self.rec.keyframes], self.rec.damage)

    def toggle(self) -> None:
        """Play/pause."""
        self.playing = not self.playing and self.index < len(self.rec.batches)
        self._wake.set()

    def step(self, count: int) -> None:
        """Pause and move ``count`` batches (clamped to the recording)."""
        self.playing = False
        self._goto(self.index + count)

    def seek_keyframe(self, direction: int) -> None:
        """Pause and jump to the next/previous keyframe."""
        self.playing = False
        marks = [i for i, _ in self.rec.keyframes]
        if direction > 0:
            later = [i for i in marks if i > self.index]
            self._goto(later[0] if later else len(self.rec.batches))
        else:
            earlier = [i for i in marks if i < self.index]
            self._goto(earlier[-1] if earlier else 0)

    def set_speed(self, factor: float) -> None:
        """Multiply the speed, clamped to 1/16 .. 64."""
        self.speed = min(64.0, max(1 / 16, self.speed * factor))

    # -- moving ----------------------------------------------------------------------------
    def _goto(self, target: int) -> None:
        """Make the feed's state the one after ``target`` batches."""
        feed = self._feed
        if feed is None:
            return
        target = max(0, min(target, len(self.rec.batches)))
        with self._lock:
            if target < self.index or target == 0 or self._keyframe_closer(target):
                k = bisect_right([i for i, _ in self.rec.keyframes], target) - 1
                at, snap = self.rec.keyframes[k]
                ts = self.rec.batches[at - 1].ts if at else (
                    self.rec.batches[0].ts if self.rec.batches else time.time())
                seq = self.rec.batches[at - 1].seq if at else 0
                feed.load(snap, seq, ts, restore=partial(self._tally.restore, k=k))
                self.index = at
            while self.index < target:
                feed.apply(self.rec.batches[self.index])
                self.index += 1

    def _keyframe_closer(self, target: int) -> bool:
        k = bisect_right([i for i, _ in self.rec.keyframes], target) - 1
        return self.rec.keyframes[k][0] > self.index

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.playing or self.index >= len(self.rec.batches):
                self.playing = self.playing and self.index < len(self.rec.batches)
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            cur = self.rec.batches[self.index]
            prev_ts = self.rec.batches[self.index - 1].ts if self.index else cur.ts
            gap = min(MAX_GAP_S, max(0.0, cur.ts - prev_ts)) / self.speed
            if gap and self._stop.wait(gap):
                return
            if self.playing:
                self._goto(self.index + 1)
