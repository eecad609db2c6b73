"""Where an engine's sockets live and how they may be bound, and the wire's integer framing.

``Endpoints`` names the three sockets of one engine (event PUB on P, snapshot/replay ROUTER
on P+1, command ROUTER on P+2, as vLLM offsets its KV-event ports); ``BindPolicy`` says which
addresses may be bound (127.0.0.1 and ipc:// unless the user asks otherwise) and whether the
sockets are CURVE servers. Every integer in a control frame is 8 bytes big-endian (``u64``).
"""
from __future__ import annotations

import contextlib
import enum
import gc
import os
import random
import socket
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar, NamedTuple
from urllib.parse import urlsplit

import zmq

from radixcache.wire.security import ServerKeys

MAX_CONTROL_BYTES = 64 * 1024
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


class EndpointError(ValueError):
    """An endpoint that cannot be used as given (malformed, or refused by the bind policy)."""


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
        """``tcp://host:port``, ``port + 1`` and ``port + 2`` (port 0: each a random free port;
        an IPv6 host such as ``::1`` is bracketed)."""
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
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
            raise EndpointError(f"expected tcp://HOST:PORT or ipc://PATH, got {events!r}")
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
        raise EndpointError(
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
    allow_ipv6(sock, endpoint)
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def allow_ipv6(sock: zmq.Socket[bytes], endpoint: str) -> None:
    """Let ``sock`` bind or connect an IPv6 address such as tcp://[::1]:5557 (ZeroMQ sockets
    are IPv4-only until told; ``::1`` is on the loopback list, so it must work)."""
    if endpoint.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)


def connect(sock: zmq.Socket[bytes], endpoint: str) -> None:
    """``sock.connect(endpoint)``, IPv6 addresses included."""
    allow_ipv6(sock, endpoint)
    sock.connect(endpoint)


def remove_ipc_files(endpoints: Iterable[str]) -> None:
    """Delete the socket files of the ipc:// endpoints a closed publisher had bound (ZeroMQ
    leaves them behind)."""
    for e in endpoints:
        if e.startswith("ipc://"):
            with contextlib.suppress(OSError):
                os.unlink(e.removeprefix("ipc://"))


def split_request(frames: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """ROUTER frames -> (routing prefix to send back, body). Accepts REQ-style empty delimiters."""
    if len(frames) >= 2 and frames[1] == b"":
        return frames[:2], frames[2:]
    return frames[:1], frames[1:]


def free_ports(count: int) -> int:
    """A port P such that P .. P + count - 1 are free on 127.0.0.1 right now (an engine binds
    events on P, snapshot/replay on P + 1, commands on P + 2, vLLM KV events on P + 3, P + 4)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count > 65535:
            continue
        try:
            held = []
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return base
    raise EndpointError(f"no {count} consecutive free ports on 127.0.0.1")
