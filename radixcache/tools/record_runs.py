"""Issue 12's "must reach" for recordings, run from outside as a user would: `radixcache
record --from` of (1) a flooding `serve`, (2) a `serve` killed with SIGKILL and restarted on
the same ports mid-recording, (3) a peer streaming a 20,000-deep chain; each recording read
back from its first keyframe with every Digest event checked, ``runs`` times each.

    python3 -m radixcache.tools.record_runs --runs 10      (prints one JSON object)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import zmq

from radixcache.core import events as ev
from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from radixcache.wire.endpoints import u64
from radixcache.wire.mirror import Mirror
from radixcache.wire.recording import RecordingReader

CLI = [sys.executable, "-m", "cli.main"]
FLOOD = ["--blocks", "256", "--answers", "prefill", "--workload", "flood",
         "--workload-args", "5000", "--digest-every", "4"]


def _free_base() -> int:
    while True:
        base = random.randrange(20_000, 60_000)
        try:
            for p in range(base, base + 3):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue


def _serve(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([*CLI, "serve", "--port", str(port), *FLOOD],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        reply = send_command(f"tcp://127.0.0.1:{port + 2}", cmd.Stats(), timeout_s=1.0)
        if not isinstance(reply, cmd.Error):
            return proc
    raise RuntimeError("serve did not come up")


def _record(port: int, out: Path, seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*CLI, "record", "--from", f"tcp://127.0.0.1:{port}", "--seconds",
                             str(seconds), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _check(out: Path, rec: subprocess.Popen[bytes]) -> dict[str, object]:
    _, err = rec.communicate(timeout=120)
    reader = RecordingReader(out)
    mirror, events = reader.play_all()
    keyframes = sum(1 for _ in reader.keyframes())
    tree = subprocess.run([*CLI, "tree", str(out), "--limit", "1"], capture_output=True,
                          check=False)
    return {"ok": rec.returncode == 0 and reader.damage is None and tree.returncode == 0
            and not tree.stderr and mirror.stats.digest_mismatches == 0
            and mirror.stats.digest_checks > 0,
            "events": events, "digests": mirror.stats.digest_checks, "keyframes": keyframes,
            "damage": str(reader.damage), "stderr": err.decode()[-200:]}


def flood_run(tmp: Path) -> dict[str, object]:
    """`record --from` of a flooding engine for 3 s."""
    port = _free_base()
    engine = _serve(port)
    try:
        return _check(tmp / "flood.rcx", _record(port, tmp / "flood.rcx", 3))
    finally:
        engine.kill()
        engine.wait()


def restart_run(tmp: Path) -> dict[str, object]:
    """SIGKILL of the engine 1.5 s after the recorder synced (its file appeared), a new
    engine on the same ports; the recording (20 s) must hold a keyframe of each."""
    port = _free_base()
    engine = _serve(port)
    out = tmp / "restart.rcx"
    rec = _record(port, out, 20)
    end = time.monotonic() + 60
    while not out.exists() and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(1.5)
    os.kill(engine.pid, signal.SIGKILL)
    engine.wait()
    engine = _serve(port)
    try:
        result = _check(out, rec)
        result["ok"] = bool(result["ok"]) and result["keyframes"] == 2
        return result
    finally:
        engine.kill()
        engine.wait()


def chain_run(tmp: Path, depth: int = 20_000) -> dict[str, object]:
    """A peer (raw sockets, this process) streams a chain ``depth`` nodes deep, 500 nodes a
    batch, then pins and unpins its deepest node 20 times, a digest in every batch."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    pub, router = ctx.socket(zmq.XPUB), ctx.socket(zmq.ROUTER)
    port = _free_base()
    pub.bind(f"tcp://127.0.0.1:{port}")
    router.bind(f"tcp://127.0.0.1:{port + 1}")
    rec = _record(port, tmp / "chain.rcx", 6)
    try:
        assert pub.poll(60_000) and pub.recv() == b"\x01"
        assert router.poll(60_000)
        ident, _, req = router.recv_multipart()
        truth = Mirror()
        snap = ev.Snapshot(16, 64, [ev.NodeState(0, -1, 0, b"", [], 0, 0)], 0, 1, [], 0.9, 0.8)
        truth.load_snapshot(snap)
        router.send_multipart([ident, b"snap", req, u64(3), u64(0),
                               msgspec.msgpack.encode(snap)])
        for seq, events in enumerate(_chain(depth), 1):
            for e in events:
                truth.apply(e)
            events.append(ev.Digest(truth.digest()))
            pub.send(ev.encode_batch(ev.Batch(seq, 3, time.time(), "chain", events)))
        return _check(tmp / "chain.rcx", rec)
    finally:
        pub.close(linger=0)
        router.close(linger=0)


def _chain(depth: int) -> list[list[ev.AnyEvent]]:
    out: list[list[ev.AnyEvent]] = []
    for lo in range(1, depth + 1, 500):
        out.append([ev.NodeCreated(i, i - 1, i - 1, (i % 1000).to_bytes(4, "little"),
                                   [i % 64], shared_first=False)
                    for i in range(lo, min(lo + 500, depth + 1))])
    for clock in range(20):
        out += [[ev.Pin(depth, 1), ev.Access(depth, clock + 1)], [ev.Pin(depth, -1)]]
    return out


def main() -> None:
    """Run every scenario ``--runs`` times; print one JSON object; exit 1 unless all ok."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    results: dict[str, list[dict[str, object]]] = {"flood": [], "restart": [], "chain": []}
    for _ in range(args.runs):
        for name, run in (("flood", flood_run), ("restart", restart_run), ("chain", chain_run)):
            with tempfile.TemporaryDirectory() as d:
                results[name].append(run(Path(d)))
    summary = {k: {"runs": len(v), "ok": sum(bool(r["ok"]) for r in v),
                   "events": [r["events"] for r in v], "digests": [r["digests"] for r in v],
                   "keyframes": [r["keyframes"] for r in v],
                   "failures": [r for r in v if not r["ok"]]} for k, v in results.items()}
    print(json.dumps(summary))
    sys.exit(0 if all(s["ok"] == s["runs"] for s in summary.values()) else 1)


if __name__ == "__main__":
    main()
