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

import enum
import gc
import random
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar, NamedTuple
from urllib.parse import urlsplit

import msgspec
import numpy as np
import zmq

from radixcache.core import events as ev
from radixcache.core.tree import RadixTree
from radixcache.wire import commands as cmd
from radixcache.wire.security import ClientCurve, ServerKeys, client_curve

MAX_CONTROL_BYTES = 64 * 1024
POLL_MS = 2
MAX_BATCH_BYTES = 256 * 1024 * 1024
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
_U64 = 8


def u64(value: int) -> bytes:
    """``value`` as 8 bytes big-endian (signed, so -1 is 0xFF x 8)."""
    return value.to_bytes(_U64, "big", signed=True)


def from_u64(data: bytes) -> int:
    """Inverse of ``u64``; raises ``ValueError`` unless ``data`` is 8 bytes."""
    if len(data) != _U64:
        raise ValueError(f"expected 8 bytes, got {len(data)}")
    return int.from_bytes(data, "big", signed=True)


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC inside (building or loading a 100k-node snapshot creates ~1M objects:
    with GC on, repeated full collections triple the time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def new_epoch() -> int:
    """A fresh epoch: milliseconds since 1970 in the high bits, random low bits (63 bits, > 0)."""
    return ((int(time.time() * 1000) << 20) | random.getrandbits(20)) & (2**63 - 1) or 1


class Reach(enum.Enum):
    """Which addresses an endpoint may bind: loopback/ipc only (the default), or any."""

    LOCAL_ONLY = "local"
    ANY = "any"


@dataclass(frozen=True, slots=True)
class BindPolicy:
    """Where sockets may bind and whether they are CURVE servers.

    ``BindPolicy.LOCAL_ONLY`` (the default: 127.0.0.1 / ipc only, no CURVE) and
    ``BindPolicy.ANY`` (any address, unauthenticated, with a warning) are the two plain
    policies; ``policy.with_curve(keys)`` makes every socket bound under it a CURVE server
    and allows any address (the keys are the explicit opt-in; a warning still says so).
    """

    reach: Reach
    curve: ServerKeys | None = None

    LOCAL_ONLY: ClassVar[BindPolicy]
    ANY: ClassVar[BindPolicy]

    def with_curve(self, keys: ServerKeys) -> BindPolicy:
        """This policy with CURVE on every bound socket and any address allowed."""
        return BindPolicy(Reach.ANY, keys)


BindPolicy.LOCAL_ONLY = BindPolicy(Reach.LOCAL_ONLY)
BindPolicy.ANY = BindPolicy(Reach.ANY)


class Endpoints(NamedTuple):
    """The three endpoints of one engine: event PUB, snapshot/replay ROUTER, command ROUTER."""

    events: str
    control: str
    commands: str

    @classmethod
    def tcp(cls, host: str = "127.0.0.1", port: int = 5557) -> Endpoints:
        """``tcp://host:port``, ``port + 1`` and ``port + 2`` (port 0: each a random free port)."""
        if port == 0:
            return cls(*(f"tcp://{host}:*" for _ in range(3)))
        return cls(f"tcp://{host}:{port}", f"tcp://{host}:{port + 1}", f"tcp://{host}:{port + 2}")

    @classmethod
    def ipc(cls, base: str) -> Endpoints:
        """``ipc://BASE-events``, ``-control`` and ``-commands``."""
        base = base.removeprefix("ipc://")
        return cls(f"ipc://{base}-events", f"ipc://{base}-control", f"ipc://{base}-commands")

    @classmethod
    def from_events(cls, events: str) -> Endpoints:
        """The endpoints of an engine given its event endpoint (tcp port P -> P+1, P+2)."""
        if events.startswith("ipc://"):
            return cls.ipc(events.removesuffix("-events"))
        parts = urlsplit(events)
        if parts.scheme != "tcp" or parts.port is None:
            raise ValueError(f"expected tcp://HOST:PORT or ipc://PATH, got {events!r}")
        return cls.tcp(parts.hostname or "127.0.0.1", parts.port)


def check_bind(endpoint: str, policy: BindPolicy) -> None:
    """Refuse (``ValueError``) a non-loopback tcp bind unless ``policy`` is ANY; then warn."""
    parts = urlsplit(endpoint)
    if parts.scheme in ("ipc", "inproc"):
        return
    host = parts.netloc.rsplit(":", 1)[0]
    if host in LOOPBACK_HOSTS:
        return
    if policy.reach is Reach.LOCAL_ONLY:
        raise ValueError(
            f"refusing to bind {endpoint}: only 127.0.0.1 or ipc:// unless explicitly allowed"
        )
    if policy.curve is not None:
        warnings.warn(f"binding {endpoint}: reachable from other machines; CURVE-encrypted and "
                      "authenticated (only the client keys in the key directory)", stacklevel=2)
        return
    warnings.warn(f"binding {endpoint}: the event stream and commands are reachable from "
                  "other machines and are not authenticated", stacklevel=2)


def bind(sock: zmq.Socket[bytes], endpoint: str, policy: BindPolicy) -> str:
    """Bind after ``check_bind`` (a CURVE server when ``policy.curve`` is set); returns the
    address actually bound (resolves port ``*``)."""
    check_bind(endpoint, policy)
    if policy.curve is not None:
        policy.curve.apply(sock)
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def split_request(frames: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """ROUTER frames -> (routing prefix to send back, body). Accepts REQ-style empty delimiters."""
    if len(frames) >= 2 and frames[1] == b"":
        return frames[:2], frames[2:]
    return frames[:1], frames[1:]


class SnapshotAt(NamedTuple):
    """A snapshot and the ``seq`` of the last batch whose events it already contains."""

    snapshot: ev.Snapshot
    seq: int


SnapshotFn = Callable[[], SnapshotAt]
CommandFn = Callable[[cmd.AnyCommand], cmd.AnyReply]


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
    ) -> None:
        self.epoch = new_epoch() if epoch is None else epoch
        self.engine = engine
        self._snapshot_fn, self._commands = snapshot_fn, commands
        self._ring: deque[tuple[int, bytes]] = deque(maxlen=ring)
        # the engine appends, the thread pops: no wake-up per batch (a wake-up per put
        # costs the engine a GIL hand-off; the thread polls every ``poll_ms`` instead)
        self._queue: deque[_Pending | bytes] = deque()
        self._seq_lock = threading.Lock()
        self._seq = 0
        self._last_send = time.monotonic()
        self.heartbeat_s = heartbeat_s
        self._counts = dict.fromkeys(PublisherStats._fields, 0)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._control = self._router()
        self._command = self._router()
        self.endpoints = Endpoints(
            bind(self._pub, endpoints.events, policy),
            bind(self._control, endpoints.control, policy),
            bind(self._command, endpoints.commands, policy),
        )
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # called on the publisher's thread with each batch's events after it was sent
        # (the vLLM-format translator hangs here, off the engine's time)
        self.tap: Callable[[list[ev.AnyEvent]], None] | None = None

    def _router(self) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_CONTROL_BYTES)
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

    def inject_raw(self, frame: bytes) -> None:
        """Send ``frame`` as is on the PUB, in order with the batches (tests of malformed input)."""
        self._queue.append(frame)

    def stats(self) -> PublisherStats:
        """A copy of the counters."""
        return PublisherStats(**self._counts)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Publisher:
        """Start the serving thread (idempotent); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rc-publisher", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Send every queued batch, stop the thread and close the sockets."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for sock in (self._pub, self._control, self._command):
            sock.close(linger=0)

    def __enter__(self) -> Publisher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._control, zmq.POLLIN)
        poller.register(self._command, zmq.POLLIN)
        while True:
            stopping = self._stopping.is_set()
            for sock, _ in poller.poll(POLL_MS):
                if sock is self._control:
                    self._serve_control()
                else:
                    self._serve_command()
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

    def _send(self, item: _Pending | bytes) -> None:
        if isinstance(item, bytes):
            self._pub.send(item)
            return
        payload = ev.encode_batch(ev.Batch(item.seq, self.epoch, item.ts, self.engine, item.events))
        self._pub.send(payload, copy=False)
        self._ring.append((item.seq, payload))
        self._last_send = time.monotonic()
        c = self._counts
        c["batches"] += 1
        c["events"] += len(item.events)
        c["heartbeats"] += not item.events
        if self.tap is not None and item.events:
            self.tap(item.events)

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
            data = msgspec.msgpack.encode(at.snapshot)
        self._drain()  # batches up to at.seq must be in the ring before we answer
        self._control.send_multipart([*head, b"snap", req, u64(self.epoch), u64(at.seq), data])
        self._counts["snapshots_served"] += 1

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

    def _serve_command(self) -> None:
        head, body = split_request(self._command.recv_multipart())
        self._counts["commands"] += 1
        try:
            if len(body) != 1:
                raise cmd.CommandError(f"expected one frame, got {len(body)}")
            reply = self._commands(cmd.decode_command(body[0]))
        except cmd.CommandError as exc:
            self._counts["bad_requests"] += 1
            reply = cmd.Error(str(exc))
        self._command.send_multipart([*head, cmd.encode_reply(reply)])


def send_command(
    endpoint: str, command: cmd.AnyCommand, timeout_s: float = 5.0,
    curve: ClientCurve | None = None,
) -> cmd.AnyReply:
    """Send one command to an engine's command endpoint and wait for its reply.

    ``curve``: the client keys (default: those of ``$RADIXCACHE_CURVE_KEYS``, else none).
    Returns ``Error`` (never raises) when no reply came within ``timeout_s`` -- which is also
    what a client without keys the server accepts gets (the handshake never completes)."""
    keys = client_curve(curve)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    with ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_CONTROL_BYTES)
        if keys is not None:
            keys.apply(sock)
        sock.connect(endpoint)
        try:
            sock.send(cmd.encode_command(command), zmq.NOBLOCK)  # a fresh connect has its pipe
        except zmq.Again:
            return cmd.Error(f"cannot send to {endpoint}: no connection")
        if not sock.poll(int(timeout_s * 1000)):
            how = "with CURVE keys" if keys is not None else "without CURVE keys"
            return cmd.Error(f"no reply from {endpoint} within {timeout_s:g} s (engine down, or "
                             f"it refused this client, which connected {how})")
        try:
            return cmd.decode_reply(sock.recv_multipart()[-1])
        except cmd.CommandError as exc:
            return cmd.Error(str(exc))

# -- a tree as an event source (the engine, or a test/benchmark driver) ----------------------


class TreeSource:
    """Publishes a tree's events. ``publisher`` is set after construction (it needs
    ``snapshot_at``); until then ``flush`` keeps the events in the tree."""

    def __init__(self, tree: RadixTree, *, digest_every: int = 64) -> None:
        self.tree = tree
        self.digest_every = digest_every
        self.publisher: Publisher | None = None
        self.step_lock = threading.Lock()
        self._batches = 0

    @contextmanager
    def step(self) -> Iterator[RadixTree]:
        """Hold the step lock while mutating the tree, then publish what changed."""
        with self.step_lock:
            yield self.tree
            self._flush_locked()

    def flush(self) -> int:
        """Publish the events recorded since the last flush as one batch; returns its seq."""
        with self.step_lock:
            return self._flush_locked()

    def _flush_locked(self) -> int:
        if self.publisher is None:
            return 0
        events = self.tree.take_events()
        self._batches += 1
        if self.digest_every and self._batches % self.digest_every == 0:
            events.append(ev.Digest(self.tree.digest()))
        return self.publisher.publish(events)

    def snapshot_at(self) -> SnapshotAt:
        """The tree's snapshot and the seq of the last batch it includes."""
        with self.step_lock:
            if self.publisher is None:
                raise RuntimeError("TreeSource has no publisher yet")
            leftover = self.tree.take_events()
            if leftover:
                self.publisher.publish(leftover)
            return SnapshotAt(self.tree.snapshot(), self.publisher.seq)


def serve_request(tree: RadixTree, tokens: Sequence[int] | np.ndarray) -> int:
    """Run one request through the tree as an engine would (match, allocate, insert, unlock)
    with no model; evicts as needed. Returns the matched length."""
    m = tree.match_and_lock(tokens)
    try:
        lease = tree.allocate(m, len(tokens))
        tree.insert(tokens, lease)
    finally:
        tree.unlock(m.node)
    return m.length
