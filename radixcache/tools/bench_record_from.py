"""`bench cli` key ``record_from_s``: the wall time of ``radixcache record --from ENDPOINT
--seconds 2`` in a fresh process against a peer that keeps the recorder busy past the deadline.

The peer (raw ZeroMQ sockets on 127.0.0.1, in a thread of this process: an XPUB for batches
on P, a ROUTER on P + 1 that answers snapshot requests with an empty pool of 4,194,304
blocks) publishes batches of one ``alloc`` of 10M block ids: each takes the subscriber seconds to
apply, so the capture ends with the stream's thread still busy. The command must still end
about a second after ``--seconds`` (start-up aside): it was 11.6 s for ``--seconds 4``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import zmq

from radixcache.core import events as ev
from radixcache.wire.endpoints import free_ports, u64
from radixcache.wire.recformat import ENC
from radixcache.wire.validate import MAX_NUM_BLOCKS

SECONDS = 2.0
BLOCK_IDS = 10_000_000  # ids < 256: CPython's cached ints keep the peer's list small


class _BusyPeer:
    """Answers snapshot requests, then publishes huge batches (one per 0.1 s) until closed."""

    def __init__(self) -> None:
        port = free_ports(2)
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.pub, self.router = ctx.socket(zmq.XPUB), ctx.socket(zmq.ROUTER)
        for i, sock in enumerate((self.pub, self.router)):
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(f"tcp://127.0.0.1:{port + i}")
        self.events = f"tcp://127.0.0.1:{port}"
        root = ev.NodeState(0, -1, 0, b"", [], 0, 0)
        self.snapshot = ENC.encode(ev.Snapshot(16, MAX_NUM_BLOCKS, [root], 0, 1, [], 0.9, 0.8))
        self.alloc = ev.BlockAlloc([i & 0xFF for i in range(BLOCK_IDS)])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="busy-peer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        subscribed = answered = False
        seq = 0
        while not self._stop.is_set():
            if self.pub.poll(0) and self.pub.recv()[:1] == b"\x01":
                subscribed = True  # (an XPUB: frames go out once the subscriber listens)
            if self.router.poll(100):
                ident, *body = self.router.recv_multipart()
                if len(body) >= 2 and body[0] == b"snapshot":
                    self.router.send_multipart([ident, b"snap", body[1], u64(1), u64(0),
                                                self.snapshot])
                    answered = True
            elif subscribed and answered:  # seq 1, 2, ... after the snapshot at seq 0
                seq += 1
                self.pub.send(ev.encode_batch(ev.Batch(seq, 1, 0.0, "busy", [self.alloc])))

    def close(self) -> None:
        """Stop the thread and close both sockets."""
        self._stop.set()
        self._thread.join()
        self.pub.close()
        self.router.close()


def record_from_seconds(out: Path, cli: list[str]) -> float:
    """Wall seconds of ``record --from`` the busy peer for ``SECONDS`` (-1 when it failed)."""
    import subprocess

    peer = _BusyPeer()
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([*cli, "record", "--from", peer.events, "--seconds",
                               f"{SECONDS:g}", "--out", str(out)], capture_output=True,
                              check=False, timeout=120)
        wall = time.perf_counter() - t0
    finally:
        peer.close()
    return round(wall, 3) if proc.returncode == 0 else -1.0
