"""The subscriber: keeps a ``Mirror`` equal to an engine's tree over the event stream.

Joining: subscribe to the PUB first and buffer, then ask for a snapshot; batches at or below
the snapshot's seq are dropped, the rest applied in order. Afterwards::

    batch.seq == last + 1        apply
    batch.seq <= last            replayed twice: ignore; a live seq that did not grow: snapshot
    batch.seq >  last + 1        gap: buffer live batches, ask replay from last + 1
    replay says "too-old"        ask a fresh snapshot
    replay ends short of the gap ask a fresh snapshot (so do 3 replays that bring nothing)
    batch.epoch != epoch         the engine restarted: ask a fresh snapshot
    a Digest event disagrees     (or any event does not fit the mirror) ask a fresh snapshot
    malformed frame or reply     count it in ``malformed``, keep it in ``last_error``, go on

It never dies of its input: every frame goes through ``radixcache.wire.validate`` first.
Requests are paced by exponential backoff (``backoff_s`` doubling up to ``backoff_cap_s``): a
peer that cannot close a gap gets a few requests a second, not thousands; one out of sync for
``sync_deadline_s`` is ``unsyncable`` in ``status()``. While not live, batches wait as raw
bytes, at most ``MAX_BUFFER_BYTES``; what is dropped is recovered by replay once live. One
thread (``run``) owns the sockets and the mirror; readers of the mirror take ``lock``.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable

import zmq

from radixcache.core import events as ev
from radixcache.wire import validate
from radixcache.wire.endpoints import Endpoints, connect, gc_paused, u64
from radixcache.wire.mirror import Malformed, Mirror, MirrorError
from radixcache.wire.resync import (
    Backoff,
    Held,
    HeldBatches,
    LiveOrder,
    State,
    SubscriberStats,
    SubscriberStatus,
    u63,
)
from radixcache.wire.security import ClientCurve, client_curve

__all__ = ["MAX_BUFFER_BYTES", "MAX_REPLAY_ASKS", "State", "Subscriber", "SubscriberStats",
           "SubscriberStatus"]

SnapshotHook = Callable[[int, int, ev.Snapshot], None]
MAX_BUFFER_BYTES = 32 * 1024 * 1024  # raw batches held while a snapshot or replay is pending
_LIVE_BUDGET_S = 0.02  # time one poll round may spend on live frames (stop() stays prompt)
MAX_REPLAY_ASKS = 3  # replays in a row that bring no batch: then a snapshot is asked instead


class Subscriber:
    """Mirror of one engine. Construct, then ``run()`` in a thread (or ``start()``/``stop()``).

    ``on_snapshot(epoch, seq, snapshot)`` is called right after a snapshot was loaded and
    before any batch after it; ``on_batch(batch)`` right after each batch was applied. Both
    run on the subscriber's thread, so the mirror is exactly at that point (the recorder
    takes its keyframes there)."""

    def __init__(
        self,
        endpoints: Endpoints,
        mirror: Mirror | None = None,
        *,
        request_timeout_s: float = 2.0,
        on_batch: Callable[[ev.Batch], None] | None = None,
        on_snapshot: SnapshotHook | None = None,
        curve: ClientCurve | None = None,
        backoff_s: float = 0.05,
        backoff_cap_s: float = 2.0,
        sync_deadline_s: float = 10.0,
        silence_s: float = 3.0,
        lock: threading.Lock | None = None,
    ) -> None:
        self.endpoints = endpoints
        # CURVE client keys (default: $RADIXCACHE_CURVE_KEYS); without keys a CURVE server
        # completes no handshake, so nothing arrives and ``synced`` never gets set
        self.curve = client_curve(curve)
        self.mirror = mirror if mirror is not None else Mirror()
        self.lock = lock if lock is not None else threading.Lock()  # held while applying
        self.stats = SubscriberStats()
        self.state = State.WAIT_SNAPSHOT
        self.epoch, self.seq = 0, 0
        self.last_digest, self.last_error = "", ""
        # why the last malformed frame or reply was refused: kept when later errors (a
        # timeout, a silence) replace ``last_error``, so a peer that never syncs is explained
        self.last_malformed = ""
        self.synced = threading.Event()  # set once the first snapshot is applied
        self._on_batch, self._on_snapshot = on_batch, on_snapshot
        self._timeout = request_timeout_s
        self._backoff, self._deadline = Backoff(backoff_s, backoff_cap_s), sync_deadline_s
        self._silence, self._heard = silence_s, time.monotonic()
        # monotonic time of the last frame on either socket: the evidence the engine is alive
        self.last_frame = 0.0  # (``_heard`` restarts on a reconnect, this never does)
        self._poller = zmq.Poller()
        self._held = HeldBatches(MAX_BUFFER_BYTES)
        # the last request id sent (tags held batches); the request awaiting an answer (b"": none)
        self._req_ids, self._req_id, self._req = itertools.count(1), 0, b""
        self._sent_at, self._next_at, self._replay_from = -1e9, 0.0, 0
        self._replay_asks = 0  # replays asked since one last brought a batch (or a snapshot)
        self._order = LiveOrder()
        self._out_since: float | None = time.monotonic()
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

    def stop(self, timeout: float = 5.0) -> bool:
        """Ask ``run`` to return and wait at most ``timeout`` s for the thread started by
        ``start``; False when it is still busy (with one huge frame, say) after that."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def wait_synced(self, timeout: float) -> bool:
        """True once the first snapshot was applied (within ``timeout`` seconds)."""
        return self.synced.wait(timeout)

    def status(self) -> SubscriberStatus:
        """The stream's health for a header line (safe to call from any thread)."""
        since = self._out_since
        out = 0.0 if since is None else time.monotonic() - since
        return SubscriberStatus(self.state, self.synced.is_set(), self.stats.malformed,
                                self.last_error, round(out, 3), out > self._deadline)

    def run(self) -> None:
        """Connect, sync and follow until ``stop()``; closes its sockets on return."""
        self._connect_events()
        self._dealer = self._socket(zmq.DEALER, validate.MAX_SNAPSHOT_BYTES)
        connect(self._dealer, self.endpoints.control)
        self._poller.register(self._dealer, zmq.POLLIN)
        try:
            self._ask(State.WAIT_SNAPSHOT)
            while not self._stop.is_set():
                ready = dict(self._poller.poll(50))
                self._guarded(ready)
        finally:
            for sock in (self._sub, self._dealer):
                if sock is not None:
                    sock.close(linger=0)

    def _connect_events(self) -> None:
        """(Re)make the SUB socket. ZeroMQ drops a connection that delivers a frame over
        MAXMSGSIZE and (libzmq 4.3.5) never reconnects it: the mirror would freeze silently."""
        if self._sub is not None:
            self._poller.unregister(self._sub)
            self._sub.close(linger=0)
        self._sub = self._socket(zmq.SUB, validate.MAX_BATCH_BYTES)
        self._sub.setsockopt(zmq.RCVHWM, 100_000)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        connect(self._sub, self.endpoints.events)
        self._poller.register(self._sub, zmq.POLLIN)
        self._heard = time.monotonic()
        self._order.forget()

    def _check_silence(self) -> None:
        """No frame (engines send heartbeats) for ``silence_s``: remake the SUB, replay if live."""
        if time.monotonic() - self._heard < self._silence:
            return
        self.stats.reconnects += 1
        self.last_error = f"no frame in {self._silence:g} s: reconnected the event socket"
        self._connect_events()
        if self.state is State.LIVE:
            self._ask(State.WAIT_REPLAY, self.seq + 1)

    def _socket(self, kind: int, max_bytes: int) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(kind)
        sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)  # larger frames are dropped by ZeroMQ
        if self.curve is not None:
            self.curve.apply(sock)
        return sock

    def _guarded(self, ready: dict[zmq.Socket[bytes], int]) -> None:
        """One poll round. Input errors are handled where they arise; anything else is our bug:
        counted, kept as last_error, cured by a snapshot (a dead thread freezes the mirror)."""
        try:
            if self._dealer in ready:
                self._on_control()
            if self._sub in ready:
                self._on_live()
            self._check_silence()
            self._send_due()
        except Exception as exc:  # the guard of this thread; see the docstring
            self.stats.internal_errors += 1
            self.last_error = f"internal error: {exc!r}"
            self._ask(State.WAIT_SNAPSHOT)

    def _malformed(self, exc: Exception) -> None:
        self.stats.malformed += 1
        self.last_malformed = str(exc)
        self.last_error = f"malformed: {exc}"

    # -- requests -----------------------------------------------------------------------------
    def _ask(self, state: State, start: int = 0) -> None:
        """Wait for a snapshot (or a replay from ``start``): the request goes out when the
        backoff allows. Answers to earlier requests are ignored from now on."""
        if self.state is State.LIVE:
            self._out_since = time.monotonic()
        self.state, self._replay_from, self._req = state, start, b""
        self._next_at = self._backoff.next_at(time.monotonic(), self._sent_at)

    def _send_due(self) -> None:
        if self.state is State.LIVE:
            return
        now = time.monotonic()
        if self._req:
            if now - self._sent_at < self._timeout:
                return
            self.last_error = f"no answer to a {self.state.value} request in {self._timeout:g} s"
            self._ask(self.state, self._replay_from)
        if now < self._next_at:
            return
        if self.state is State.WAIT_REPLAY and self._replay_asks >= MAX_REPLAY_ASKS:
            self.stats.replay_fallbacks += 1
            self.last_error = (f"{self._replay_asks} replays from seq {self._replay_from} "
                               f"brought nothing: asking for a snapshot")
            self.state = State.WAIT_SNAPSHOT
        self._replay_asks += self.state is State.WAIT_REPLAY
        self._req_id = next(self._req_ids)
        self._req, self._sent_at = u64(self._req_id), now
        self.stats.requests += 1
        if self.state is State.WAIT_SNAPSHOT:
            self._request([b"snapshot", self._req])
        else:
            self._request([b"replay", self._req, u64(self._replay_from)])

    def _request(self, frames: list[bytes]) -> None:
        """Send without blocking (a DEALER with no peer, e.g. CURVE refused, blocks forever);
        an unsent request is sent again after the timeout."""
        assert self._dealer is not None
        with contextlib.suppress(zmq.Again):
            self._dealer.send_multipart(frames, zmq.NOBLOCK)

    # -- incoming -----------------------------------------------------------------------------
    def _on_live(self) -> None:
        assert self._sub is not None
        end = time.monotonic() + _LIVE_BUDGET_S
        # bounded so control replies are not starved and stop() is seen
        while time.monotonic() < end and not self._stop.is_set():
            try:
                data = self._sub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._heard = self.last_frame = time.monotonic()
            try:
                self._live_frame(data)
            except Malformed as exc:
                self._malformed(exc)

    def _live_frame(self, data: bytes) -> None:
        live = self.state is State.LIVE
        head = validate.decode_batch(data) if live else validate.decode_head(data)
        if (last := self._order.went_back(head.epoch, head.seq)) is not None:
            self.stats.seq_backwards += 1
            self._resync()  # what was held came from the old numbering
            self.last_error = (f"the engine's seq went backwards in epoch {head.epoch}: "
                               f"{head.seq} after {last}; resyncing from a snapshot")
        if live and self.state is State.LIVE and isinstance(head, ev.Batch):
            self._handle(head, data)
        else:
            self._hold(head.epoch, head.seq, data)

    def _hold(self, epoch: int, seq: int, data: bytes) -> None:
        self._held.limit = MAX_BUFFER_BYTES  # read at each call (tests lower it)
        if not self._held.add(Held(epoch, seq, self._req_id, data)):
            self.stats.buffer_dropped += 1  # the gap it leaves is replayed once live

    def _on_control(self) -> None:
        assert self._dealer is not None
        while True:
            try:
                frames = self._dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.last_frame = time.monotonic()
            if len(frames) < 2 or not self._req or frames[1] != self._req:
                continue  # a late answer to a request we gave up on, or garbage
            try:
                self._control_reply(frames[0], frames[2:])
            except Malformed as exc:
                self._malformed(exc)
                self._ask(State.WAIT_SNAPSHOT)

    def _control_reply(self, kind: bytes, rest: list[bytes]) -> None:
        if kind == b"snap" and self.state is State.WAIT_SNAPSHOT and len(rest) == 3:
            self._on_snap(u63(rest[0]), u63(rest[1]), rest[2])
        elif kind == b"batch" and self.state is State.WAIT_REPLAY and len(rest) == 1:
            batch = validate.decode_batch(rest[0])
            if batch.epoch == self.epoch and batch.seq == self.seq + 1:
                self.stats.replayed_batches += 1
                self._replay_asks = 0
                self._apply(batch)
        elif kind == b"end" and self.state is State.WAIT_REPLAY and len(rest) == 1:
            self._on_end(u63(rest[0]))
        elif kind == b"too-old" and self.state is State.WAIT_REPLAY:
            self.stats.too_old += 1
            self._ask(State.WAIT_SNAPSHOT)
        elif kind == b"error":
            text = rest[0][:200].decode(errors="replace") if rest else ""
            raise Malformed(f"the engine refused our request: {text}")
        else:
            raise Malformed(f"unexpected {kind[:16]!r} reply of {len(rest) + 2} frames "
                            f"while waiting for a {self.state.value}")

    def _on_snap(self, epoch: int, seq: int, data: bytes) -> None:
        with gc_paused():
            snapshot = validate.decode_snapshot(data)
            with self.lock:
                self.mirror.load_snapshot(snapshot, seq)
        if self.epoch and epoch != self.epoch:
            self.stats.epochs += 1
        self.epoch, self.seq, self._replay_asks = epoch, seq, 0
        self.stats.snapshots += 1
        if self._on_snapshot is not None:
            self._on_snapshot(epoch, seq, snapshot)
        self.synced.set()  # after the hook: a recorder's file exists once a waiter wakes
        self._drop_ahead(epoch, seq)
        self._go_live()

    def _on_end(self, last: int) -> None:
        self._drop_ahead(self.epoch, last)
        if self.seq < last:  # the replay skipped or broke a batch it had
            self.last_error = f"replay ended at seq {self.seq}, short of {last}"
            self._ask(State.WAIT_SNAPSHOT)
            return
        self._go_live()

    def _drop_ahead(self, epoch: int, last: int) -> None:
        for h in self._held.drop_ahead(self._req_id, epoch, last):
            self._malformed(Malformed(f"batch {h.epoch}/{h.seq} ahead of the engine's "
                                      f"{epoch}/{last}"))
            self._order.last = (epoch, last)  # the honest frames go on from the engine's seq

    def _go_live(self) -> None:
        """Apply the held live batches in order (they may reveal another gap)."""
        self.state, self._req, self._out_since = State.LIVE, b"", None
        pending = self._held.take()
        for i, h in enumerate(pending):
            try:
                self._handle(validate.decode_batch(h.data), h.data)
            except Malformed as exc:
                self._malformed(exc)
            if self.state is not State.LIVE:
                for rest in pending[i + 1:]:
                    self._hold(rest.epoch, rest.seq, rest.data)
                return
        if not self._replay_asks:  # recovered: the next gap is asked about at once
            self._backoff.reset()

    def _handle(self, batch: ev.Batch, data: bytes) -> None:
        if batch.epoch != self.epoch:
            if batch.epoch > self.epoch:  # epochs grow with time: a newer engine started
                self._hold(batch.epoch, batch.seq, data)
                self._ask(State.WAIT_SNAPSHOT)
            return  # a straggler of an older epoch
        if batch.seq <= self.seq:
            return
        if batch.seq > self.seq + 1:
            self.stats.gaps += 1
            self._hold(batch.epoch, batch.seq, data)
            self._ask(State.WAIT_REPLAY, self.seq + 1)
            return
        self._apply(batch)

    def _apply(self, batch: ev.Batch) -> None:
        checks = self.mirror.stats.digest_checks
        try:
            with self.lock:
                self.mirror.apply_batch(batch)  # a Digest event that disagrees raises here
        except MirrorError as exc:  # nothing of it applied, but its seq is lost: resync
            if isinstance(exc, Malformed):
                self._malformed(exc)
            else:
                self.last_error = f"out of sync at seq {batch.seq}: {exc}"
            self._resync()
            return
        digest = self.stats.count_batch(batch, self.mirror.stats.digest_checks - checks)
        self.seq, self.last_digest = batch.seq, digest or self.last_digest
        if self._on_batch is not None:
            self._on_batch(batch)

    def _resync(self) -> None:
        self.stats.resyncs += 1
        self._held.take()
        self._ask(State.WAIT_SNAPSHOT)
