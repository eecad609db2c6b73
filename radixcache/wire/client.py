"""A client of an engine's command socket: one typed command, one reply."""
from __future__ import annotations

import time

import zmq

from radixcache.wire import commands as cmd
from radixcache.wire.endpoints import MAX_CONTROL_BYTES, connect
from radixcache.wire.security import ClientCurve, client_curve


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
        connect(sock, endpoint)
        deadline = time.monotonic() + timeout_s
        sock.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))  # the send waits for the pipe
        try:  # (there at once, unless a refused handshake dropped it: then it may not come)
            sock.send(cmd.encode_command(command))
            sent = True
        except zmq.Again:
            sent = False
        if not sent or not sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            how = "with CURVE keys" if keys is not None else "without CURVE keys"
            why = "" if sent else "no connection: "
            return cmd.Error(f"no reply from {endpoint} within {timeout_s:g} s ({why}engine "
                             f"down, or it refused this client, which connected {how})")
        try:
            return cmd.decode_reply(sock.recv_multipart()[-1])
        except cmd.CommandError as exc:
            return cmd.Error(str(exc))
