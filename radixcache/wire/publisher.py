"""The publisher side of the event stream: PUB of batches, snapshot/replay ROUTER, command ROUTER.

One background thread owns the three sockets (ZeroMQ sockets are not thread-safe). The
engine calls ``publish(events)`` from its step loop: that assigns the batch's ``seq`` and
puts the list on a queue (a lock and an append, no encoding on the engine's time). The
thread encodes each batch once with msgspec, sends it on the PUB, keeps it in a bounded
ring for replay, answers control and command requests, and sends a heartbeat (an empty
batch with its own seq) when nothing was published for ``heartbeat_s``.

Control protocol (DEALER -> ROUTER, every integer 8-byte big-endian)::

    request  [b"snapshot", req]            reply [b"snap", req, epoch, seq, Snapshot msgpack]
    request  [b"replay", req, from_seq]    reply [b"batch", req, Batch msgpack] ... then
                                                 [b"end", req, last_seq]
                                           or    [b"too-old", req, oldest_seq_in_ring]
    anything else                          reply [b"error", req or b"", reason utf-8]

See docs/wire-format.md.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from radixcache.core import events as ev
from radixcache.core.guard import Guard
from radixcache.wire import commands as cmd
from radixcache.wire.endpoints import (
    MAX_CONTROL_BYTES,
    BindPolicy,
    Endpoints,
    bind,
    from_u64,
    gc_paused,
    new_epoch,
    remove_ipc_files,
    split_request,
    u64,
)

POLL_MS = 2
SNAPSHOT_BUDGET = 64 * 1024 * 1024  # bytes of snapshot replies per client per window
SNAPSHOT_WINDOW_S = 5.0


class SnapshotAt(NamedTuple):
    """A snapshot and the ``seq`` of the last batch whose events it already contains."""

    snapshot: ev.Snapshot
    seq: int


SnapshotFn = Callable[[], SnapshotAt]
CommandFn = Callable[[cmd.AnyCommand], cmd.AnyReply]
Tap = Callable[[list[ev.AnyEvent]], None]  # sees each sent batch's events (publisher thread)


def _no_commands(_: cmd.AnyCommand) -> cmd.AnyReply:
    return cmd.Error("this publisher takes no commands")


class PublisherStats(NamedTuple):
    """Counters of a publisher."""

    batches: int
    events: int
    heartbeats: int
    snapshots_served: int
    replays_served: int
    too_old: int
    commands: int
    bad_requests: int
    snapshots_refused: int
    commands_too_large: int  # read and refused: over MAX_COMMAND_BYTES
    command_connections_dropped: int  # closed without one readable command (see _on_monitor)


class _Pending(NamedTuple):
    seq: int
    ts: float
    events: list[ev.AnyEvent]


class Publisher:
    """Publishes batches of events; serves snapshots, replays and commands. Thread-safe publish.

    ``snapshot_fn`` must return a snapshot together with the last seq it includes; the
    caller makes that atomic with its own publishing (see ``TreeSource``). Sockets are bound
    in the constructor (``endpoints`` holds the real addresses) and served by ``start()``.
    """

    def __init__(
        self,
        endpoints: Endpoints,
        snapshot_fn: SnapshotFn,
        *,
        engine: str = "radixcache",
        commands: CommandFn = _no_commands,
        ring: int = 4096,
        heartbeat_s: float = 0.5,
        hwm: int = 10_000,
        policy: BindPolicy = BindPolicy.LOCAL_ONLY,
        epoch: int | None = None,
        guard: Guard | None = None,
        taps: Sequence[Tap] = (),
    ) -> None:
        self.epoch = new_epoch() if epoch is None else epoch
        self.engine = engine
        self._snapshot_fn, self._commands = snapshot_fn, commands
        self._ring: deque[tuple[int, bytes]] = deque(maxlen=ring)
        # the engine appends, the thread pops: no wake-up per batch (a wake-up per put
        # costs the engine a GIL hand-off; the thread polls every ``poll_ms`` instead)
        self._queue: deque[_Pending] = deque()
        self._seq_lock = threading.Lock()
        self._seq = 0
        self._last_send = time.monotonic()
        self.heartbeat_s = heartbeat_s
        self._counts = dict.fromkeys(PublisherStats._fields, 0)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._control = self._router(MAX_CONTROL_BYTES)
        self._command = self._router(cmd.MAX_COMMAND_READ_BYTES)
        self._command.setsockopt(zmq.RCVHWM, 64)  # frames of up to 1 MiB: 64 MiB a peer at most
        self._monitor = self._command.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._said: set[int] = set()  # fds of command connections that sent a readable command
        self.endpoints = Endpoints(
            bind(self._pub, endpoints.events, policy),
            bind(self._control, endpoints.control, policy),
            bind(self._command, endpoints.commands, policy),
        )
        self._thread: threading.Thread | None = None
        self.guard = guard if guard is not None else Guard()
        self._snapshot_cache: tuple[int, bytes] | None = None  # (seq, encoded) of the last one
        self._sent_to: dict[bytes, tuple[float, int]] = {}  # peer -> (window start, bytes)
        self._stopping = threading.Event()
        # called in order on the publisher's thread with each batch's events after it was
        # sent (the vLLM-format translator is one, off the engine's time)
        self._taps = tuple(taps)

    def _router(self, max_bytes: int) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)  # ZeroMQ drops a larger frame's connection
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        return sock

    # -- the engine's side ------------------------------------------------------------------
    @property
    def seq(self) -> int:
        """The seq of the last batch handed to ``publish`` (0 before the first)."""
        return self._seq

    def publish(self, events: list[ev.AnyEvent]) -> int:
        """Queue ``events`` as the next batch and return its seq. The list is owned by the
        publisher afterwards (the caller must not touch it). Never blocks on the network."""
        with self._seq_lock:
            self._seq += 1
            self._queue.append(_Pending(self._seq, time.time(), events))
            return self._seq

    def stats(self) -> PublisherStats:
        """A copy of the counters."""
        return PublisherStats(**self._counts)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Publisher:
        """Start the serving thread (idempotent); returns self."""
        if self._thread is None:
            self._thread = self.guard.start("rc-publisher", self._run)
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Send every queued batch, stop the thread and close the sockets. The sockets belong
        to the thread (ZeroMQ sockets are not thread-safe): it closes them as it ends, so a
        command or snapshot still being answered never finds them closed under it."""
        self._stopping.set()
        if self._thread is None:
            self._close_sockets()
            return
        self._thread.join(timeout)

    def _close_sockets(self) -> None:
        self._command.disable_monitor()
        for sock in (self._pub, self._control, self._command, self._monitor):
            sock.close(linger=0)
        remove_ipc_files(self.endpoints)

    def __enter__(self) -> Publisher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._close_sockets()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._control, zmq.POLLIN)
        poller.register(self._command, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            stopping = self._stopping.is_set()
            ready = dict(poller.poll(POLL_MS))
            if self._control in ready:
                self._serve_control()
            ended = self._on_monitor()
            if self._command in ready or ended:
                self._serve_commands()
            self._count_dropped(ended)  # after every command it sent was read
            self._drain()
            if stopping:
                return
            if time.monotonic() - self._last_send > self.heartbeat_s:
                self.publish([])

    def _drain(self) -> None:
        """Send every queued batch, in order."""
        q = self._queue
        while q:
            self._send(q.popleft())

    def _send(self, item: _Pending) -> None:
        payload = ev.encode_batch(ev.Batch(item.seq, self.epoch, item.ts, self.engine, item.events))
        self._pub.send(payload, copy=False)
        self._ring.append((item.seq, payload))
        self._last_send = time.monotonic()
        c = self._counts
        c["batches"] += 1
        c["events"] += len(item.events)
        c["heartbeats"] += not item.events
        if item.events:
            for tap in self._taps:
                tap(item.events)

    def _serve_control(self) -> None:
        head, body = split_request(self._control.recv_multipart())
        try:
            if len(body) == 2 and body[0] == b"snapshot":
                self._send_snapshot(head, body[1])
                return
            if len(body) == 3 and body[0] == b"replay":
                self._send_replay(head, body[1], from_u64(body[2]))
                return
            raise ValueError(f"unknown control request of {len(body)} frames")
        except ValueError as exc:
            self._counts["bad_requests"] += 1
            req = body[1] if len(body) > 1 else b""
            self._control.send_multipart([*head, b"error", req, str(exc).encode()])

    def _send_snapshot(self, head: list[bytes], req: bytes) -> None:
        self._drain()
        with gc_paused():
            at = self._snapshot_fn()
            cached = self._snapshot_cache
            if cached is not None and cached[0] == at.seq:
                data = cached[1]  # unchanged tree: the queued replies share one buffer
            else:
                data = msgspec.msgpack.encode(at.snapshot)
                self._snapshot_cache = (at.seq, data)
        self._drain()  # batches up to at.seq must be in the ring before we answer
        if not self._within_budget(head[0], len(data)):
            self._counts["snapshots_refused"] += 1
            self._control.send_multipart([*head, b"error", req, b"snapshot budget of this "
                                          b"client spent: retry in a few seconds"])
            return
        self._control.send_multipart([*head, b"snap", req, u64(self.epoch), u64(at.seq), data],
                                     copy=False)
        self._counts["snapshots_served"] += 1

    def _within_budget(self, peer: bytes, size: int) -> bool:
        """Charge ``size`` bytes of snapshot replies to ``peer``: a client that asks for
        snapshots and never reads them would otherwise queue them on the engine without end
        (400 unread requests held 358 MB). ``SNAPSHOT_BUDGET`` bytes per peer per window."""
        now = time.monotonic()
        start, spent = self._sent_to.get(peer, (now, 0))
        if now - start > SNAPSHOT_WINDOW_S:
            start, spent = now, 0
        if spent and spent + size > SNAPSHOT_BUDGET:
            return False
        if len(self._sent_to) > 1024:  # forget old peers; the map stays small
            self._sent_to = {k: v for k, v in self._sent_to.items()
                             if now - v[0] <= SNAPSHOT_WINDOW_S}
        self._sent_to[peer] = (start, spent + size)
        return True

    def _send_replay(self, head: list[bytes], req: bytes, start: int) -> None:
        oldest = self._ring[0][0] if self._ring else self._seq + 1
        if start < oldest and start <= self._seq:
            self._counts["too_old"] += 1
            self._control.send_multipart([*head, b"too-old", req, u64(oldest)])
            return
        last = start - 1
        for seq, payload in self._ring:
            if seq >= start:
                self._control.send_multipart([*head, b"batch", req, payload], copy=False)
                last = seq
        self._control.send_multipart([*head, b"end", req, u64(last)])
        self._counts["replays_served"] += 1

    def _serve_commands(self) -> None:
        """Answer every command waiting on the command socket."""
        while True:
            try:
                frames = self._command.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._serve_command(frames)

    def _serve_command(self, frames: list[zmq.Frame]) -> None:
        with contextlib.suppress(zmq.ZMQError):  # no fd: junk read as a ZMTP 1.0 peer
            self._said.add(frames[-1].get(zmq.SRCFD))
        head, body = split_request([f.bytes for f in frames])
        self._counts["commands"] += 1
        try:
            if len(body) != 1:
                raise cmd.CommandError(f"expected one frame, got {len(body)}")
            if len(body[0]) > cmd.MAX_COMMAND_BYTES:
                self._counts["commands_too_large"] += 1
            command = cmd.decode_command(body[0])
            reply = self._commands(command)
        except cmd.CommandError as exc:
            self._counts["bad_requests"] += 1
            reply = cmd.Error(str(exc))
        else:
            if isinstance(reply, cmd.StatsReply):
                reply = msgspec.structs.replace(reply, socket=self._socket_figures())
        self._command.send_multipart([*head, cmd.encode_reply(reply)])

    def _socket_figures(self) -> cmd.SocketFigures:
        """What the command socket refused, for the ``stats`` reply."""
        c = self._counts
        return cmd.SocketFigures(commands_too_large=c["commands_too_large"],
                                 command_connections_dropped=c["command_connections_dropped"])

    def _on_monitor(self) -> list[int]:
        """The fds of the command connections that ended since the last call."""
        ended: list[int] = []
        while True:
            try:
                ended.append(int(recv_monitor_message(self._monitor, zmq.NOBLOCK)["value"]))
            except zmq.Again:
                return ended

    def _count_dropped(self, ended: list[int]) -> None:
        """Count the ended connections that never sent a readable command (called after every
        command they sent was read): ZeroMQ drops a connection whose frame is over
        ``MAX_COMMAND_READ_BYTES`` before we see the frame (a peer that connects and sends
        nothing counts too: they look the same)."""
        for fd in ended:
            if fd in self._said:
                self._said.discard(fd)  # the fd may serve a new connection next
            else:
                self._counts["command_connections_dropped"] += 1

