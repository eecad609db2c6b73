"""Where the inspector's batches come from, and where its commands go.

A ``Source`` runs its own thread that decodes batches and applies them through a ``Feed``;
the app only polls ``status()`` and calls ``send()``. Sources here:

- ``LocalSource`` (``inspector.local``): an in-process radix tree driven by seeded workloads
  (tests, screenshots, ``radixcache inspect --local``);
- ``ReplaySource`` (``inspector.replay``): a recording, with play/pause/step/seek;
- ``LiveSource`` (``inspector.live``): a running engine over ZeroMQ.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

from inspector.feed import Feed
from inspector.layout import TokenText
from radixcache.commands import AnyCommand, AnyReply


class ConnState(Enum):
    """What the header's dot says."""

    LIVE = "live"
    RESYNCING = "resyncing"
    DISCONNECTED = "disconnected"
    REPLAY = "replay"
    LOCAL = "local"


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """A source's state right now. ``since`` is when ``state`` began (time.time());
    ``memory_note`` explains missing device figures (``NVML unavailable: ...``)."""

    state: ConnState
    endpoint: str
    since: float
    detail: str = ""
    busy: bool = False
    memory_note: str = ""


@runtime_checkable
class Source(Protocol):
    """A stream of batches into a ``Feed`` plus a command channel."""

    def start(self, feed: Feed) -> None:
        """Begin delivering batches to ``feed`` from the source's own thread."""

    def stop(self) -> None:
        """Stop the thread and release sockets/files; idempotent."""

    def status(self) -> SourceStatus:
        """The current connection state (cheap, any thread)."""

    def send(self, command: AnyCommand) -> AnyReply:
        """Deliver a command and return the reply (may block: call it off the UI thread)."""

    def vocabulary(self) -> TokenText | None:
        """How to render token ids as text, when the source knows its workloads."""


class ReplayPosition(Protocol):
    """Where a replay stands."""

    index: int
    total: int
    playing: bool
    speed: float
    keyframes: list[int]
    note: str


@runtime_checkable
class ReplayControls(Protocol):
    """The extra controls of a replaying source."""

    def position(self) -> ReplayPosition:
        """Index of the next batch, batches in all, play state, speed, keyframe indexes, and a
        note on where a damaged file stopped (empty when whole)."""

    def toggle(self) -> None:
        """Play if paused, pause if playing."""

    def step(self, count: int) -> None:
        """Pause, then move ``count`` batches forward (negative: back)."""

    def seek_keyframe(self, direction: int) -> None:
        """Pause, then jump to the next (+1) or previous (-1) keyframe."""

    def set_speed(self, factor: float) -> None:
        """Multiply the playback speed by ``factor`` (clamped to 1/16 .. 64)."""
