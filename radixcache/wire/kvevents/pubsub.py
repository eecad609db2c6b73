"""ZeroMQ ends of the KV-event protocol: our publisher, and a client of anyone's publisher.

    PUB frames    [topic, seq (8 bytes big-endian), payload]
    replay        DEALER sends [b"", start_seq]; gets [b"", topic, seq, payload] ...
                  ended by [b"", b"", 0xFF x 8, b""]
                  (older: [b"", seq, payload] ... ended by [b"", 0xFF x 8, b""])

The client hands every frame to a ``SeqMerger`` (strict seq order, replay on a hole, probes when
idle, says when history is lost) and applies what it releases to a ``BlockView``.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from radixcache.core.guard import Guard
from radixcache.wire.endpoints import (
    MAX_BATCH_BYTES,
    MAX_CONTROL_BYTES,
    BindPolicy,
    bind,
    from_u64,
    remove_ipc_files,
    u64,
)
from radixcache.wire.kvevents.codec import (
    BlockHash,
    Cleared,
    Engine,
    KVEventBatch,
    KVEventsError,
    WireEvent,
    WireFormat,
    decode_batch,
    encode_payload,
)
from radixcache.wire.kvevents.merge import Health, MergeLimits, ReplayLink, SeqMerger
from radixcache.wire.kvevents.view import Block, BlockView

TOPIC = b"kv-events"
END_SEQ = b"\xff" * 8
_Ctx = zmq.Context[zmq.Socket[bytes]]


# -- the publisher ---------------------------------------------------------------------------
class KVEventPublisher:
    """PUB of KV-event batches (topic ``kv-events``) and its replay ROUTER, in one thread."""

    def __init__(
        self, events: str, replay: str, *, ring: int = 4096, hwm: int = 10_000,
        policy: BindPolicy = BindPolicy.LOCAL_ONLY, topic: bytes = TOPIC,
    ) -> None:
        self.topic = topic
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub: zmq.Socket[bytes] = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
        self._replay.setsockopt(zmq.MAXMSGSIZE, MAX_CONTROL_BYTES)
        self._replay.setsockopt(zmq.LINGER, 0)
        self.endpoints = (bind(self._pub, events, policy), bind(self._replay, replay, policy))
        self._ring: deque[tuple[int, bytes]] = deque(maxlen=ring)
        self._queue: queue.SimpleQueue[tuple[float, list[WireEvent]] | None] = queue.SimpleQueue()
        self.seq = -1  # vLLM numbers its first batch 0
        self.guard = Guard()  # a death is printed and kept in ``guard.fault``
        self._thread = self.guard.start("rc-kvevents", self._run)

    def publish(self, events: list[WireEvent]) -> None:
        """Queue one batch (nothing is sent for an empty list)."""
        if events:
            self._queue.put((time.time(), events))

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, stop; the thread closes its own sockets as it ends (ZeroMQ
        sockets are not thread-safe: closing them here could cut a replay it is sending)."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._pub.close(linger=0)
            self._replay.close(linger=0)
            remove_ipc_files(self.endpoints)

    def _serve(self) -> None:
        while True:
            if self._replay.poll(0):
                self._serve_replay()
            try:
                item = self._queue.get(timeout=0.005)
            except queue.Empty:
                continue
            if item is None:
                return
            self.seq += 1
            payload = encode_payload(KVEventBatch(item[0], item[1]))
            self._pub.send_multipart([self.topic, u64(self.seq), payload])
            self._ring.append((self.seq, payload))

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            return
        ident, _, start = frames
        first = from_u64(start)
        for seq, payload in self._ring:
            if seq >= first:
                self._replay.send_multipart([ident, b"", self.topic, u64(seq), payload])
        self._replay.send_multipart([ident, b"", b"", END_SEQ, b""])


# -- the client ------------------------------------------------------------------------------
class _DealerLink:
    """The replay endpoint over a DEALER; ``reset`` reconnects, so an answer to an abandoned
    request can never be mistaken for the answer to the next one."""

    def __init__(self, ctx: _Ctx, endpoint: str) -> None:
        self._ctx, self._endpoint = ctx, endpoint
        self.socket = self._connect()

    def _connect(self) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self._endpoint)
        return sock

    def request(self, start: int) -> None:
        """Ask for every batch from ``start`` (never blocks: a full queue drops the ask,
        and the merger's timeout asks again)."""
        with contextlib.suppress(zmq.Again):
            self.socket.send_multipart([b"", u64(start)], zmq.NOBLOCK)

    def reset(self) -> None:
        """A fresh connection."""
        self.socket.close(linger=0)
        self.socket = self._connect()

    def close(self) -> None:
        """Close the socket."""
        self.socket.close(linger=0)


@dataclass(slots=True)
class ClientStats:
    """Counters of a ``KVEventsClient`` besides its view's and its merger's."""

    batches: int = 0
    malformed: int = 0
    last_error: str = ""


class KVStream:
    """A followed KV-event stream without its sockets: frames in, ``BlockView`` out.

    Batches are applied exactly once and strictly in seq order from ``start_seq``; with a
    replay ``link`` a hole is filled by a replay (the batches after it wait, bounded in
    bytes), without one it is skipped. ``health()`` says whether the view is known to hold the
    whole history. A malformed frame, batch or event is counted (``stats.malformed``,
    ``stats.last_error``) and the stream goes on.
    """

    def __init__(self, link: ReplayLink | None, *, start_seq: int = 0,
                 limits: MergeLimits | None = None, view: BlockView | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.view = view if view is not None else BlockView(clock)
        self.stats = ClientStats()
        self.fmt: WireFormat | None = None
        self.ranks: set[int] = set()  # the data-parallel ranks this stream has spoken for
        self._clock = clock
        self.merger = SeqMerger(self._apply, link, start_seq=start_seq, now=clock(),
                                limits=limits, on_restart=self._restarted)

    def _restarted(self) -> None:
        # a view shared by several ranks' streams keeps the other ranks' copies
        for rank in self.ranks:
            self.view.drop_rank(rank)

    @property
    def blocks(self) -> dict[BlockHash, Block]:
        """Alive blocks by hash."""
        return self.view.blocks

    @property
    def version(self) -> int:
        """Grows on every applied event."""
        return self.view.version

    @property
    def last_seq(self) -> int:
        """The last seq applied (``start_seq - 1`` before the first)."""
        return self.merger.last_seq

    def health(self) -> Health:
        """Complete, catching up or incomplete (since which seq, and why)."""
        return self.merger.health(self._clock())

    def _malformed(self, what: str) -> None:
        self.stats.malformed += 1
        self.stats.last_error = what

    def _apply(self, seq: int, payload: bytes) -> None:
        """One batch, in seq order (called by the merger)."""
        try:
            batch = decode_batch(payload)
        except KVEventsError as exc:
            self._malformed(f"seq {seq}: {exc}")
            return
        self.stats.batches += 1
        if self.fmt is None or self.fmt.engine is Engine.UNKNOWN:
            self.fmt = batch.fmt
        for error in batch.errors:
            self._malformed(f"seq {seq}: {error}")
        self.ranks.add(batch.rank)
        for e in batch.events:
            self.view.apply(e, batch.rank)
            if isinstance(e, Cleared):
                self.merger.history_restarted()


class KVEventsClient(KVStream):
    """A ``KVStream`` fed by a vLLM/SGLang publisher's PUB socket and its replay ROUTER.
    ``poll(timeout_s)`` processes what arrived; ``run_for(seconds)`` loops; ``close()``."""

    def __init__(self, endpoint: str, replay: str | None = None, *, start_seq: int = 0,
                 topic: bytes = b"", limits: MergeLimits | None = None,
                 view: BlockView | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        ctx: _Ctx = zmq.Context.instance()
        self._sub: zmq.Socket[bytes] = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic)
        try:
            self._sub.connect(endpoint)
            self._link = _DealerLink(ctx, replay) if replay is not None else None
        except zmq.ZMQError:
            self._sub.close(linger=0)  # a bad endpoint: raise, leaving no socket behind
            raise
        super().__init__(self._link, start_seq=start_seq, limits=limits, view=view, clock=clock)

    def run_for(self, seconds: float) -> None:
        """Process batches for ``seconds``."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.poll(min(left, 0.05))

    def poll(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s``, process every frame that arrived, then the timers."""
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        if self._link is not None:
            poller.register(self._link.socket, zmq.POLLIN)
        ready = dict(poller.poll(int(timeout_s * 1000)))
        if self._link is not None and self._link.socket in ready:
            self._on_replay(self._link.socket)
        if self._sub in ready:
            self._on_live()
        self.merger.tick(self._clock())

    def _on_live(self) -> None:
        while True:
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or len(frames[1]) != 8:
                self._malformed(f"live frame: {len(frames)} parts, expected [topic, seq, payload]")
                continue
            self.merger.live(from_u64(frames[1]), frames[2], self._clock())

    def _on_replay(self, sock: zmq.Socket[bytes]) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            body = frames[1:] if frames and frames[0] == b"" else frames
            # [seq, payload] (older) or [topic, seq, payload]
            if len(body) not in (2, 3) or len(body[-2]) != 8:
                self._malformed(f"replay frame: {len(body)} parts, expected [topic, seq, payload]")
            elif body[-2] == END_SEQ:
                self.merger.replay_end(self._clock())
            else:
                self.merger.replayed(from_u64(body[-2]), body[-1], self._clock())

    def close(self) -> None:
        """Close the sockets."""
        self._sub.close(linger=0)
        if self._link is not None:
            self._link.close()
