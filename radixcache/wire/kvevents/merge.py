"""Live batches and replayed batches merged into one strictly seq-ordered stream.

The KV-event protocol has a PUB socket (live batches, any of which may be lost) and a replay
ROUTER that answers "every batch from seq N you still hold", then an end marker. It has no
heartbeat. ``SeqMerger`` decides, from those inputs alone, what to apply and when::

    pending  {seq: payload}        every batch after ``last_seq`` that arrived, live or replayed
    apply    last_seq+1, last_seq+2, ... while present; stop at the first hole
    hole     ask a replay from last_seq+1 (one request in flight at a time); when its end marker
             comes and the hole is still open, the publisher no longer has it: the loss is
             recorded (``Health``) and the stream goes on from the next batch it has
    idle     no batch for ``idle_s``: probe the replay for batches after last_seq (a lost tail)

It owns no socket and reads no clock: the caller passes ``now`` and a ``ReplayLink``, so the
same code runs under ZeroMQ and under the property test of random interleavings.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol


class ReplayLink(Protocol):
    """The replay endpoint as the merger sees it."""

    def request(self, start: int) -> None:
        """Ask for every batch from seq ``start``; the answer ends with an end marker."""

    def reset(self) -> None:
        """Drop the request in flight (a new connection: its late answer can never arrive)."""


class Sync(enum.Enum):
    """How much of the publisher's history the view is known to hold."""

    COMPLETE = "complete"
    CATCHING_UP = "catching up"
    INCOMPLETE = "incomplete"


class Health(NamedTuple):
    """What the merger knows about the history it applied."""

    sync: Sync
    since_seq: int | None
    reason: str

    def line(self) -> str:
        """One line for a header, ``tree`` or ``stats``."""
        if self.sync is Sync.COMPLETE:
            return f"complete as far as seen ({self.reason})" if self.reason else "complete"
        return f"{self.sync.value} since seq {self.since_seq}: {self.reason}"


@dataclass(frozen=True, slots=True)
class MergeLimits:
    """Bounds of the merger (seconds and bytes)."""

    pending_bytes: int = 64 * 1024 * 1024
    replay_timeout_s: float = 3.0
    idle_s: float = 1.0
    backoff_max_s: float = 8.0


class _Request(NamedTuple):
    start: int
    sent_at: float
    hole_at: int | None  # the newest pending seq when asked: a hole below it must be filled


@dataclass(slots=True)
class MergeStats:
    """Counters of the merge."""

    applied: int = 0
    duplicates: int = 0
    replayed: int = 0
    replay_requests: int = 0
    gaps: int = 0
    lost: int = 0
    restarts: int = 0


_PENDING_OVERHEAD = 64  # bytes counted per buffered batch besides its payload


class SeqMerger:
    """Applies each seq exactly once, in order, and says when history was lost.

    ``apply(seq, payload)`` is called for seq ``start_seq``, then each following seq that
    arrives; a seq is skipped only when the publisher cannot supply it any more (or there is no
    replay link), and then ``health`` reports the loss until ``history_restarted`` is called
    (an ``AllBlocksCleared`` makes the view whole again).
    """

    def __init__(self, apply: Callable[[int, bytes], None], link: ReplayLink | None, *,
                 start_seq: int = 0, now: float = 0.0, limits: MergeLimits | None = None,
                 on_restart: Callable[[], None] = lambda: None) -> None:
        self._apply = apply
        self._on_restart = on_restart
        self._last_live_seq: int | None = None
        self._link = link
        self.limits = limits or MergeLimits()
        self.last_seq = start_seq - 1
        self.stats = MergeStats()
        self._pending: dict[int, bytes] = {}
        self._pending_bytes = 0
        self._inflight: _Request | None = None
        self._reply_first: int | None = None
        self._lost: tuple[int, str] | None = None
        self._unanswered_since: float | None = None
        self._last_heard = now
        self._confirmed = link is None
        self._backoff = self.limits.idle_s
        self._next_try = now
        if link is not None:
            self._ask(start_seq, None, now)

    @property
    def pending_bytes(self) -> int:
        """Bytes of batches waiting behind a hole (bounded by ``limits.pending_bytes``)."""
        return self._pending_bytes

    def live(self, seq: int, payload: bytes, now: float) -> None:
        """A batch from the PUB socket (whose seqs only grow, unless the publisher restarted)."""
        if self._last_live_seq is not None and seq < self._last_live_seq:
            self._restart()
        self._last_live_seq = seq
        self._last_heard = now
        self._backoff = self.limits.idle_s
        self._insert(seq, payload, now)

    def replayed(self, seq: int, payload: bytes, now: float) -> None:
        """A batch from a replay answer."""
        self.stats.replayed += 1
        self._last_heard = now
        if self._reply_first is None:
            self._reply_first = seq
        self._insert(seq, payload, now)

    def replay_end(self, now: float) -> None:
        """The end marker of the replay answer in flight."""
        req, first = self._inflight, self._reply_first
        self._inflight, self._reply_first = None, None
        self._last_heard = now
        if req is None:
            return  # an answer nobody is waiting for (a peer repeating itself)
        self._confirmed = True
        self._unanswered_since = None
        if first is not None or req.hole_at is not None:
            self._backoff = self.limits.idle_s  # news: probe soon again; an empty probe backs off
        if first is not None and first > req.start and self.last_seq < first - 1:
            self._lose(f"replay buffer starts at {first}", first)
        elif self._pending and req.hole_at is not None and self.last_seq < req.hole_at:
            self._lose(f"replay has no seq {self.last_seq + 1}", min(self._pending))
        self._follow_up(now)

    def tick(self, now: float) -> None:
        """Time passed: retry a silent replay (new connection, backoff), probe when idle."""
        req = self._inflight
        if req is not None:
            if now - req.sent_at >= self.limits.replay_timeout_s and self._link is not None:
                self._link.reset()
                self._inflight, self._reply_first = None, None
                self._next_try = now + self._backoff
                self._backoff = min(self._backoff * 2, self.limits.backoff_max_s)
            return
        if self._link is None or now < self._next_try:
            return
        if self._pending:
            self._ask(self.last_seq + 1, max(self._pending), now)
        elif now - self._last_heard >= self._backoff:
            self._ask(self.last_seq + 1, None, now)  # a lost tail shows only if we ask
            self._backoff = min(self._backoff * 2, self.limits.backoff_max_s)

    def _restart(self) -> None:
        """The publisher started over from seq 0 (an engine restart): everything held describes
        a cache that is gone. Start again at seq 0; the batches before the one that showed the
        restart are a hole like any other (replayed, or reported lost)."""
        self.stats.restarts += 1
        if self._link is not None and self._inflight is not None:
            self._link.reset()
        self._pending.clear()
        self._pending_bytes = 0
        self._inflight, self._reply_first, self._unanswered_since = None, None, None
        self.last_seq = -1
        self._lost = None
        self._on_restart()

    def history_restarted(self) -> None:
        """The view was just emptied by the publisher: what was lost before no longer matters."""
        self._lost = None

    def health(self, now: float) -> Health:
        """Incomplete only on evidence of a loss: a hole that nothing filled, or one that waits
        on a replay endpoint that stays silent. Quiet is not loss (vLLM and SGLang send no
        heartbeat): a stream with no hole is complete as far as it was seen, and a missing or
        silent replay endpoint only adds that a lost last batch would go unseen."""
        nxt = self.last_seq + 1
        if self._lost is not None:
            return Health(Sync.INCOMPLETE, *self._lost)
        silent = self._silent_for(now)
        quiet = f"replay endpoint silent for {silent:.0f} s" if silent is not None else ""
        if self._pending:
            if quiet:
                return Health(Sync.INCOMPLETE, nxt, quiet)
            return Health(Sync.CATCHING_UP, nxt,
                          f"waiting for a replay, {len(self._pending):,} batches held back")
        if not self._confirmed and not quiet:
            return Health(Sync.CATCHING_UP, nxt, "waiting for a replay, 0 batches held back")
        note = quiet or ("no replay endpoint" if self._link is None else "")
        if self.stats.applied == 0 and note:  # nothing seen, nothing confirmed
            return Health(Sync.CATCHING_UP, nxt, f"no batch yet ({note})")
        return Health(Sync.COMPLETE, None, note)

    def _silent_for(self, now: float) -> float | None:
        asked = self._unanswered_since
        if asked is None or now - asked < self.limits.replay_timeout_s:
            return None
        return now - asked

    def _ask(self, start: int, hole_at: int | None, now: float) -> None:
        assert self._link is not None
        self._inflight = _Request(start, now, hole_at)
        self._reply_first = None
        if self._unanswered_since is None:
            self._unanswered_since = now
        self.stats.replay_requests += 1
        self._link.request(start)

    def _insert(self, seq: int, payload: bytes, now: float) -> None:
        if seq <= self.last_seq or seq in self._pending:
            self.stats.duplicates += 1
            return
        had_hole = bool(self._pending)
        self._pending[seq] = payload
        self._pending_bytes += len(payload) + _PENDING_OVERHEAD
        self._drain()
        if self._pending_bytes > self.limits.pending_bytes:
            self._lose(f"{self._pending_bytes:,} bytes buffered behind the hole",
                       min(self._pending))
        if self._pending and not had_hole:
            self.stats.gaps += 1
        self._follow_up(now)

    def _drain(self) -> None:
        while (payload := self._pending.pop(self.last_seq + 1, None)) is not None:
            self._pending_bytes -= len(payload) + _PENDING_OVERHEAD
            self.last_seq += 1
            self.stats.applied += 1
            self._apply(self.last_seq, payload)

    def _follow_up(self, now: float) -> None:
        """After new input: skip a hole nothing can fill, or ask for it."""
        if not self._pending or self._inflight is not None:
            return
        if self._link is None:
            self._lose("no replay endpoint", min(self._pending))
        elif now >= self._next_try:
            self._ask(self.last_seq + 1, max(self._pending), now)

    def _lose(self, reason: str, resume_at: int) -> None:
        """Give up seqs ``last_seq+1 .. resume_at-1`` and apply what follows."""
        if self._lost is None:
            self._lost = (self.last_seq + 1, reason)
        self.stats.lost += resume_at - self.last_seq - 1
        self.last_seq = resume_at - 1
        for seq in [s for s in self._pending if s <= self.last_seq]:
            self._pending_bytes -= len(self._pending.pop(seq)) + _PENDING_OVERHEAD
        self._drain()
