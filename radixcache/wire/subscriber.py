"""The subscriber: keeps a ``Mirror`` equal to an engine's tree over the event stream.

Joining: subscribe to the PUB first and buffer, then ask for a snapshot; batches at or below
the snapshot's seq are dropped, the rest applied in order. Afterwards::

    batch.seq == last + 1        apply
    batch.seq <= last            duplicate, ignore
    batch.seq >  last + 1        gap: buffer live batches, ask replay from last + 1
    replay says "too-old"        ask a fresh snapshot
    batch.epoch != epoch         the engine restarted: ask a fresh snapshot
    a Digest event disagrees     (or any event does not fit the mirror) ask a fresh snapshot
    undecodable frame            count it in ``malformed`` and go on

A request that gets no answer within ``request_timeout_s`` is sent again. All of it runs in
one thread (``run``), which owns the sockets and the mirror; readers of the mirror take
``lock``. ``stop()`` makes ``run`` return within ~50 ms.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import zmq

from radixcache.core import events as ev
from radixcache.wire.endpoints import MAX_BATCH_BYTES, Endpoints, from_u64, gc_paused, u64
from radixcache.wire.mirror import Mirror, MirrorError
from radixcache.wire.security import ClientCurve, client_curve

MAX_BUFFERED = 100_000
_SNAPSHOT = msgspec.msgpack.Decoder(ev.Snapshot)


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
    dropped_by_hook: int = 0
    digest_checks: int = 0
    digest_ok: int = 0


class State(enum.Enum):
    """Where the subscriber is in its protocol."""

    WAIT_SNAPSHOT = "snapshot"
    WAIT_REPLAY = "replay"
    LIVE = "live"


DropHook = Callable[[int], bool]


def drop_one_percent(seq: int) -> bool:
    """A deterministic pseudo-random 1% of seqs (a test hook): multiplicative hashing."""
    return (seq * 2654435761) % 2**32 % 100 == 0


class HashDrop:
    """A deterministic pseudo-random ``fraction`` of seqs (a test hook): multiplicative hashing
    of the seq into [0, 2**32), dropped below ``fraction * 2**32``. Records what it dropped."""

    def __init__(self, fraction: float) -> None:
        self.threshold = int(fraction * 2**32)
        self.dropped: set[int] = set()

    def __call__(self, seq: int) -> bool:
        """True when ``seq`` is to be dropped (and remembered in ``dropped``)."""
        if (seq * 2654435761) % 2**32 < self.threshold:
            self.dropped.add(seq)
            return True
        return False


class Subscriber:
    """Mirror of one engine. Construct, then ``run()`` in a thread (or ``start()``/``stop()``)."""

    def __init__(
        self,
        endpoints: Endpoints,
        mirror: Mirror | None = None,
        *,
        drop: DropHook | None = None,
        request_timeout_s: float = 2.0,
        on_batch: Callable[[ev.Batch], None] | None = None,
        curve: ClientCurve | None = None,
    ) -> None:
        self.endpoints = endpoints
        # CURVE client keys (default: $RADIXCACHE_CURVE_KEYS); without keys a CURVE server
        # completes no handshake, so nothing arrives and ``synced`` never gets set
        self.curve = client_curve(curve)
        self.mirror = mirror if mirror is not None else Mirror()
        self.lock = threading.Lock()
        self.stats = SubscriberStats()
        self.state = State.WAIT_SNAPSHOT
        self.epoch = 0
        self.seq = 0
        self.last_digest = ""
        self.synced = threading.Event()  # set once the first snapshot is applied
        self._drop, self._on_batch = drop, on_batch
        self._timeout = request_timeout_s
        self._buffer: list[ev.Batch] = []
        self._req_ids = itertools.count(1)
        self._req = b""
        self._req_sent = 0.0
        self._replay_from = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sub: zmq.Socket[bytes] | None = None
        self._dealer: zmq.Socket[bytes] | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Subscriber:
        """Run in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.run, name="rc-subscriber", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Ask ``run`` to return and wait for the thread started by ``start``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_synced(self, timeout: float) -> bool:
        """True once the first snapshot was applied (within ``timeout`` seconds)."""
        return self.synced.wait(timeout)

    def run(self) -> None:
        """Connect, sync and follow until ``stop()``; closes its sockets on return."""
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RCVHWM, 100_000)
        self._sub.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._dealer = self._ctx.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES)
        if self.curve is not None:
            self.curve.apply(self._sub)
            self.curve.apply(self._dealer)
        self._sub.connect(self.endpoints.events)
        self._dealer.connect(self.endpoints.control)
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        poller.register(self._dealer, zmq.POLLIN)
        try:
            self._ask_snapshot()
            while not self._stop.is_set():
                ready = dict(poller.poll(50))
                if self._dealer in ready:
                    self._on_control()
                if self._sub in ready:
                    self._on_live()
                self._retry_if_late()
        finally:
            self._sub.close(linger=0)
            self._dealer.close(linger=0)

    # -- requests -----------------------------------------------------------------------------
    def _new_req(self) -> bytes:
        self._req = u64(next(self._req_ids))
        self._req_sent = time.monotonic()
        return self._req

    def _request(self, frames: list[bytes]) -> None:
        """Send without blocking: a DEALER with no peer (e.g. its CURVE handshake was refused)
        would block ``send`` forever; an unsent request is sent again by ``_retry_if_late``."""
        assert self._dealer is not None
        with contextlib.suppress(zmq.Again):
            self._dealer.send_multipart(frames, zmq.NOBLOCK)

    def _ask_snapshot(self) -> None:
        self.state = State.WAIT_SNAPSHOT
        self._request([b"snapshot", self._new_req()])

    def _ask_replay(self, start: int) -> None:
        self.state = State.WAIT_REPLAY
        self._replay_from = start
        self._request([b"replay", self._new_req(), u64(start)])

    def _retry_if_late(self) -> None:
        if self.state is State.LIVE or time.monotonic() - self._req_sent < self._timeout:
            return
        if self.state is State.WAIT_SNAPSHOT:
            self._ask_snapshot()
        else:
            self._ask_replay(self._replay_from)

    # -- incoming -----------------------------------------------------------------------------
    def _on_live(self) -> None:
        assert self._sub is not None
        for _ in range(1000):  # bounded so control replies are not starved
            try:
                data = self._sub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                batch = ev.decode_batch(data)
            except (msgspec.DecodeError, ValueError):
                self.stats.malformed += 1
                continue
            if self._drop is not None and self._drop(batch.seq):
                self.stats.dropped_by_hook += 1
                continue
            if self.state is State.LIVE:
                self._handle(batch)
            elif len(self._buffer) < MAX_BUFFERED:
                self._buffer.append(batch)
            # else: dropped here; the gap it leaves is replayed once we are live again

    def _on_control(self) -> None:
        assert self._dealer is not None
        while True:
            try:
                frames = self._dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) < 2 or frames[1] != self._req:
                continue  # a late answer to a request we gave up on, or garbage
            try:
                self._control_reply(frames[0], frames[2:])
            except (msgspec.DecodeError, ValueError):
                self.stats.malformed += 1

    def _control_reply(self, kind: bytes, rest: list[bytes]) -> None:
        if kind == b"snap" and self.state is State.WAIT_SNAPSHOT:
            with gc_paused():
                self._load(from_u64(rest[0]), from_u64(rest[1]), _SNAPSHOT.decode(rest[2]))
        elif kind == b"batch" and self.state is State.WAIT_REPLAY:
            batch = ev.decode_batch(rest[0])
            if batch.epoch == self.epoch and batch.seq == self.seq + 1:
                self.stats.replayed_batches += 1
                self._apply(batch)
        elif kind == b"end" and self.state is State.WAIT_REPLAY:
            self._go_live()
        elif kind == b"too-old" and self.state is State.WAIT_REPLAY:
            self.stats.too_old += 1
            self._ask_snapshot()
        elif kind == b"error":
            self.stats.malformed += 1

    def _load(self, epoch: int, seq: int, snapshot: ev.Snapshot) -> None:
        with self.lock:
            self.mirror.load_snapshot(snapshot)
        if self.epoch and epoch != self.epoch:
            self.stats.epochs += 1
        self.epoch, self.seq = epoch, seq
        self.stats.snapshots += 1
        self.synced.set()
        self._go_live()

    def _go_live(self) -> None:
        """Apply the buffered live batches in order (they may reveal another gap)."""
        self.state = State.LIVE
        pending, self._buffer = self._buffer, []
        pending.sort(key=lambda b: b.seq)
        for i, batch in enumerate(pending):
            self._handle(batch)
            if self.state is not State.LIVE:
                self._buffer.extend(pending[i + 1:])
                return

    def _handle(self, batch: ev.Batch) -> None:
        if batch.epoch != self.epoch:
            if batch.epoch > self.epoch:  # epochs grow with time: a newer engine started
                self._buffer.append(batch)
                self._ask_snapshot()
            return  # a straggler of an older epoch
        if batch.seq <= self.seq:
            return
        if batch.seq > self.seq + 1:
            self.stats.gaps += 1
            self._buffer.append(batch)
            self._ask_replay(self.seq + 1)
            return
        self._apply(batch)

    def _apply(self, batch: ev.Batch) -> None:
        checks = self.mirror.stats.digest_checks
        try:
            with self.lock:
                self.mirror.apply_batch(batch)  # a Digest event that disagrees raises here
        except MirrorError:
            self.stats.resyncs += 1
            self._buffer.clear()
            self._ask_snapshot()
            return
        if self.mirror.stats.digest_checks != checks:
            self.stats.digest_checks += self.mirror.stats.digest_checks - checks
            self.stats.digest_ok = self.stats.digest_checks
            self.last_digest = next(e.value for e in reversed(batch.events)
                                    if type(e) is ev.Digest)
        self.seq = batch.seq
        self.stats.batches += 1
        self.stats.events += len(batch.events)
        if self._on_batch is not None:
            self._on_batch(batch)
