"""Faults: the engine process killed mid-stream, a frozen or slow subscriber, a pool full
of locked blocks. The first runs the real ``radixcache serve`` process on loopback."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import pytest
import zmq

from radixcache.core import events as ev
from radixcache.core.pool import KVPool, PoolExhausted
from radixcache.core.tree import RadixTree
from radixcache.serving.engine import Engine, EngineConfig
from radixcache.serving.model import ModelConfig
from radixcache.serving.stats import Stats
from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from radixcache.wire.endpoints import Endpoints, u64
from radixcache.wire.mirror import Mirror
from radixcache.wire.publisher import Publisher, SnapshotAt
from radixcache.wire.subscriber import Subscriber
from tests.helpers.stream import caught_up, drive, make_source, prompts, serving, wait_for

ROOT = Path(__file__).resolve().parents[1]


def _free_port_triple() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port > 65000:
            continue
        try:
            for p in (port + 1, port + 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no three free consecutive ports")


def _serve(port: int, workload: str) -> tuple[subprocess.Popen[str], int]:
    """Start ``radixcache serve``; returns the process and its epoch once it is serving."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--blocks", "256",
         "--workload", workload],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "400"},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"serving epoch (\d+)", line)
        if found:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining
            return proc, int(found.group(1))
    raise AssertionError(f"serve exited with {proc.wait()}")


def _engine_snapshot(endpoints: Endpoints) -> tuple[int, str]:
    """(seq, digest) of the engine's own tree, asked over the control socket."""
    with zmq.Context.instance().socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoints.control)
        sock.send_multipart([b"snapshot", u64(99)])
        assert sock.poll(5000)
        _, _, _, seq, data = sock.recv_multipart()
    m = Mirror()
    m.load_snapshot(msgspec.msgpack.decode(data, type=ev.Snapshot))
    return int.from_bytes(seq, "big"), m.digest()


def _pause_and_drain(endpoints: Endpoints) -> tuple[int, str]:
    """Pause the engine and wait until its running requests have finished (``pause`` stops
    admission only), then return ``_engine_snapshot``: nothing changes the tree after it, so
    a subscriber at or past its seq must hold the same digest."""
    reply = send_command(endpoints.commands, cmd.Pause())
    assert isinstance(reply, cmd.Ok) and "paused" in reply.message, reply

    def drained() -> bool:
        return Stats.of(send_command(endpoints.commands, cmd.Stats())).running == 0

    assert wait_for(drained, timeout=30.0)
    return _engine_snapshot(endpoints)


def test_sigkill_mid_stream_then_restart_resyncs():
    port = _free_port_triple()
    endpoints = Endpoints.tcp("127.0.0.1", port)
    first, epoch1 = _serve(port, "flood 2000")
    sub = Subscriber(endpoints, request_timeout_s=0.3).start()
    second = None
    try:
        assert sub.wait_synced(10)
        assert wait_for(lambda: sub.stats.batches >= 20)
        first.send_signal(signal.SIGKILL)  # mid-stream: the flood is still running
        assert first.wait(5) == -signal.SIGKILL
        second, epoch2 = _serve(port, "chat 3")
        assert epoch2 > epoch1
        # liveness bounds (generous); the recovery time itself is a figure of the benches
        assert wait_for(lambda: sub.epoch == epoch2, timeout=10.0)
        seq, digest = _pause_and_drain(endpoints)
        assert wait_for(lambda: sub.epoch == epoch2 and sub.seq >= seq, timeout=10.0)
        with sub.lock:
            assert sub.mirror.digest() == digest
        assert sub.stats.epochs == 1
        assert sub.stats.malformed == 0
    finally:
        sub.stop()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(10)


def test_frozen_subscriber_never_blocks_the_engine():
    """A SUB that never reads: the PUB drops past SNDHWM, the engine side holds nothing."""
    source = make_source()
    pub = Publisher(Endpoints.tcp("127.0.0.1", 0), lambda: SnapshotAt(source.tree.snapshot(), 0),
                    hwm=50, ring=64)
    with pub, zmq.Context.instance().socket(zmq.SUB) as frozen:
        frozen.setsockopt(zmq.RCVHWM, 50)
        frozen.setsockopt(zmq.SUBSCRIBE, b"")
        frozen.connect(pub.endpoints.events)
        # connected once a heartbeat gets through (the slow joiner); read that one, then never
        assert wait_for(lambda: bool(pub.publish([]) and frozen.poll(20)), timeout=10)
        frozen.recv()
        for _ in range(20_000):
            pub.publish([ev.Watermark(1, 2, 0.9, 0.8, 0, 0)])
        assert wait_for(lambda: pub.stats().batches == pub.seq, timeout=10)
        assert pub.stats().events == 20_000


def test_slow_subscriber_overflowing_the_hwm_recovers_by_snapshot(tmp_path):
    frozen, release = threading.Event(), threading.Event()

    def on_batch(_: ev.Batch) -> None:
        if frozen.is_set():
            release.wait(60)

    source = make_source(num_blocks=256)
    with serving(source, Endpoints.ipc(str(tmp_path / "slow")), ring=32) as pub:
        sub = Subscriber(pub.endpoints, on_batch=on_batch, request_timeout_s=0.5).start()
        try:
            assert sub.wait_synced(5)
            frozen.set()
            drive(source, prompts(5, seed=1))  # the first of these freezes the subscriber
            for _ in range(120_000):  # more than its RCVHWM (100k) and the ring (32) hold
                pub.publish([])
            drive(source, prompts(40, seed=2))
            assert wait_for(lambda: pub.stats().batches == pub.seq, timeout=20)
            frozen.clear()
            release.set()
            assert wait_for(caught_up(sub, pub), timeout=30)
            with sub.lock:
                assert sub.mirror.digest() == source.tree.digest()
            assert sub.stats.too_old >= 1
            assert sub.stats.snapshots == 1 + sub.stats.too_old
            assert sub.stats.resyncs == 0
        finally:
            release.set()
            sub.stop()


def test_pool_full_of_locked_blocks():
    tree = RadixTree(KVPool(8, 16))
    m = tree.match_and_pin(list(range(100)))
    held = tree.allocate(m, 128)  # every block, held by a "running request"
    m2 = tree.match_and_pin(list(range(500, 520)))
    tree.check()
    digest = tree.digest()
    with pytest.raises(PoolExhausted, match="need 2 blocks, 0 free and nothing more evictable"):
        tree.allocate(m2, 20)
    assert tree.digest() == digest  # refused: the tree is unchanged
    assert tree.alloc.free_count == 0
    tree.check()
    tree.release(held)
    tree.unpin(m.node)
    lease = tree.allocate(m2, 20)
    tree.insert(list(range(500, 520)), lease)
    tree.unpin(m2.node)
    tree.check()
    assert sum(n.pins for n in tree.snapshot().nodes) == 0


def test_engine_waits_while_the_pool_is_locked_then_serves():
    engine = Engine(EngineConfig(num_blocks=8, model=ModelConfig(vocab_size=1000)))
    try:
        tree = engine.tree
        m = tree.match_and_pin(list(range(100)))
        held = tree.allocate(m, 128)  # locked outside the engine
        h = engine.submit(list(range(20)), 3)
        for _ in range(5):
            report = engine.step()
            assert (report.admitted, report.sequences) == (0, 0)
        assert not h.done()
        assert (engine.stats().waiting, engine.stats().running) == (1, 0)
        tree.check()
        tree.release(held)
        tree.unpin(m.node)
        for _ in range(10):
            engine.step()
        assert len(h.result(0).tokens) == 3
        tree.check()
        assert sum(n.pins for n in tree.snapshot().nodes) == 0
    finally:
        engine.close()


_WATCHER = """
import sys, time
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.subscriber import Subscriber
sub = Subscriber(Endpoints.tcp("127.0.0.1", int(sys.argv[1]))).start()
assert sub.wait_synced(10)
print("synced", flush=True)
time.sleep(60)
"""


def test_inspector_process_killed_the_engine_serves_on_and_a_new_one_syncs():
    """A subscriber process (what the inspector runs) is SIGKILLed mid-stream: the engine keeps
    serving commands and batches, and a subscriber that comes back converges (digest equal)."""
    port = _free_port_triple()
    endpoints = Endpoints.tcp("127.0.0.1", port)
    engine, _ = _serve(port, "flood 2000")
    watcher = subprocess.Popen([sys.executable, "-c", _WATCHER, str(port)],
                               stdout=subprocess.PIPE, text=True)
    sub = None
    try:
        assert watcher.stdout is not None and watcher.stdout.readline() == "synced\n"
        watcher.send_signal(signal.SIGKILL)
        assert watcher.wait(5) == -signal.SIGKILL
        before = send_command(endpoints.commands, cmd.Stats())
        assert isinstance(before, cmd.StatsReply), before
        sub = Subscriber(endpoints, request_timeout_s=0.3).start()
        assert sub.wait_synced(30)
        assert wait_for(lambda: sub.stats.batches >= 5)  # the engine kept publishing
        seq, digest = _pause_and_drain(endpoints)
        assert wait_for(lambda: sub.seq >= seq, timeout=10.0)
        with sub.lock:
            assert sub.mirror.digest() == digest
        assert engine.poll() is None
    finally:
        if sub is not None:
            sub.stop()
        if watcher.poll() is None:
            watcher.kill()
        engine.send_signal(signal.SIGTERM)
        engine.wait(10)
