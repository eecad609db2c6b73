"""The subscriber's state and recovery parts: its counters and status, request pacing
(``Backoff``), the live batches held while a snapshot or replay is pending (``HeldBatches``,
capped in bytes). Losses for tests and benches happen on the wire (``tools.lossy``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from radixcache.core import events as ev
from radixcache.wire.endpoints import from_u64
from radixcache.wire.validate import MAX_INT, Malformed


@dataclass(slots=True)
class SubscriberStats:
    """What the subscriber received and how it recovered."""

    batches: int = 0
    events: int = 0
    gaps: int = 0
    replayed_batches: int = 0
    snapshots: int = 0
    epochs: int = 0
    malformed: int = 0
    too_old: int = 0
    resyncs: int = 0
    digest_checks: int = 0
    digest_ok: int = 0
    requests: int = 0  # snapshot and replay requests sent
    buffer_dropped: int = 0  # live batches not buffered (byte cap), recovered by replay later
    reconnects: int = 0  # event socket re-made after a silence (an oversized frame kills it)
    seq_backwards: int = 0  # live frames whose seq did not grow within an epoch: resynced
    replay_fallbacks: int = 0  # snapshots asked after MAX_REPLAY_ASKS fruitless replays
    internal_errors: int = 0  # exceptions that are bugs of ours, not of the input (must stay 0)

    def count_batch(self, batch: ev.Batch, digests: int) -> str:
        """Count an applied batch that checked ``digests`` Digest events; returns the last
        digest value it carried when it checked any, else ""."""
        self.batches += 1
        self.events += len(batch.events)
        if not digests:
            return ""
        self.digest_checks += digests
        self.digest_ok = self.digest_checks
        return next(e.value for e in reversed(batch.events) if type(e) is ev.Digest)


class State(enum.Enum):
    """Where the subscriber is in its protocol."""

    WAIT_SNAPSHOT = "snapshot"
    WAIT_REPLAY = "replay"
    LIVE = "live"


class SubscriberStatus(NamedTuple):
    """What a UI shows about the stream: ``unsyncable`` once it stayed out of sync past the
    deadline; ``last_error`` the latest malformed frame or failed recovery, as one line."""

    state: State
    synced: bool
    malformed: int
    last_error: str
    out_of_sync_s: float
    unsyncable: bool




class Backoff:
    """When the next request may go: at once after a quiet spell, then ``first`` seconds after
    the previous one, doubling with each further request up to ``cap``. ``reset()`` after a
    recovery that worked, so the next honest gap is asked about at once."""

    def __init__(self, first: float, cap: float) -> None:
        self.first, self.cap = first, cap
        self._failures = 0

    def next_at(self, now: float, last_sent: float) -> float:
        """The earliest time for the next request (counts this one as a further try)."""
        if now - last_sent > 2 * self.cap:
            self._failures = 0  # quiet for a while: start over
        delay = self.first * 2 ** (self._failures - 1) if self._failures else 0.0
        self._failures = min(self._failures + 1, 32)
        return last_sent + min(self.cap, delay)

    def reset(self) -> None:
        """The stream recovered."""
        self._failures = 0


class LiveOrder:
    """The (epoch, seq) of the last frame read from the event socket. A PUB delivers one
    connection's frames in order and every batch (heartbeats too) takes the next seq, so a
    seq that does not grow within an epoch is an engine that numbers over: never a duplicate
    to drop in silence (those come from replies to a replay, not from the PUB)."""

    def __init__(self) -> None:
        self.last: tuple[int, int] | None = None

    def went_back(self, epoch: int, seq: int) -> int | None:
        """The seq this frame came after when it went backwards, else None; remembers it."""
        last, self.last = self.last, (epoch, seq)
        if last is not None and last[0] == epoch and seq <= last[1]:
            return last[1]
        return None

    def forget(self) -> None:
        """A new event socket: its first frame may come before the old one's last."""
        self.last = None


class Held(NamedTuple):
    """A live batch held as raw bytes; ``tag``: the last request id sent when it arrived."""

    epoch: int
    seq: int
    tag: int
    data: bytes


class HeldBatches:
    """Raw live batches kept while not live, at most ``limit`` bytes in all (raw bytes: a
    decoded batch costs ~5x its msgpack, and bytes are what a peer controls)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[Held] = []
        self.bytes = 0

    def add(self, item: Held) -> bool:
        """Keep ``item``; False (nothing kept) when it would pass the limit."""
        if self.bytes + len(item.data) > self.limit:
            return False
        self.items.append(item)
        self.bytes += len(item.data)
        return True

    def drop_ahead(self, tag: int, epoch: int, last: int) -> list[Held]:
        """Remove and return the batches that arrived before request ``tag`` was sent yet
        claim to be past what the engine answered to it (``epoch``, ``last``): no engine
        published them, and kept they would re-open the same gap forever."""
        bogus = [h for h in self.items if h.tag < tag and (h.epoch, h.seq) > (epoch, last)]
        if bogus:
            self.items = [h for h in self.items if not (h.tag < tag
                                                       and (h.epoch, h.seq) > (epoch, last))]
            self.bytes -= sum(len(h.data) for h in bogus)
        return bogus

    def take(self) -> list[Held]:
        """Everything held, in (epoch, seq) order; the buffer is empty afterwards."""
        items, self.items, self.bytes = self.items, [], 0
        items.sort(key=lambda h: (h.epoch, h.seq))
        return items


def u63(data: bytes) -> int:
    """A non-negative u64 field of a control reply; raises ``Malformed``."""
    try:
        value = from_u64(data)
    except ValueError as exc:
        raise Malformed(f"control field: {exc}") from None
    if not 0 <= value <= MAX_INT:
        raise Malformed(f"control field {value} out of range")
    return value
