"""`radixcache serve` runs the real Engine (tiny model) behind real loopback sockets, and headless
`radixcache record` writes the engine's steps to a file whose replay matches its digests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from typer.testing import CliRunner

from cli.main import app
from radixcache.core import events as ev
from radixcache.serving.stats import Stats
from radixcache.traffic.workloads import build_workload
from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.recording import Keyframe, RecordingReader
from radixcache.wire.subscriber import Subscriber

ROOT = Path(__file__).resolve().parents[1]
CHAT3 = len(build_workload("chat", ["3"]).requests)


def _free_port_triple() -> int:
    """A port P with P, P+1 and P+2 free on 127.0.0.1 right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 2 >= 65536:
            continue
        socks = [socket.socket() for _ in range(3)]
        try:
            for i, s in enumerate(socks):
                s.bind(("127.0.0.1", port + i))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no three consecutive free ports")


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _stats(endpoint: str) -> Stats:
    return Stats.of(send_command(endpoint, cmd.Stats(), timeout_s=10))


def _stream(endpoint: str) -> cmd.StreamFigures:
    stream = cmd.stats_reply(send_command(endpoint, cmd.Stats(), timeout_s=10)).stream
    assert stream is not None
    return stream


@pytest.fixture(scope="module")
def served() -> Iterator[Endpoints]:
    port = _free_port_triple()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--blocks", "512",
         "--digest-every", "4", "--device", "cpu"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200"},
    )
    endpoints = Endpoints.tcp("127.0.0.1", port)
    try:
        _wait_for(lambda: isinstance(send_command(endpoints.commands, cmd.Stats(), 0.5),
                                     cmd.StatsReply)
                  or proc.poll() is not None, 30, "the server to answer")
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        yield endpoints
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_served_engine_runs_a_workload_and_its_stream_matches_the_tree(served):
    finished: set[int] = set()
    started: set[int] = set()
    seqs: list[int] = []
    lock = threading.Lock()

    def on_batch(batch: ev.Batch) -> None:
        with lock:
            seqs.append(batch.seq)
            for e in batch.events:
                if isinstance(e, ev.RequestFinish):
                    finished.add(e.req)
                elif isinstance(e, ev.RequestStart):
                    started.add(e.req)

    sub = Subscriber(served, on_batch=on_batch).start()
    try:
        assert sub.wait_synced(10)
        before = _stats(served.commands)
        reply = send_command(served.commands, cmd.StartWorkload("chat", ["3"]), timeout_s=10)
        assert isinstance(reply, cmd.Ok) and reply.values == {"requests": CHAT3}
        assert reply.message.startswith(f"chat: {CHAT3} requests submitted (")
        first = before.submitted
        want = set(range(first, first + CHAT3))
        _wait_for(lambda: finished >= want, 30, "every RequestFinish")
        stats = _stats(served.commands)
        assert (stats.submitted, stats.finished, stats.rejected) == (
            first + CHAT3, first + CHAT3, 0)
        assert (stats.running, stats.waiting) == (0, 0)
        _wait_for(lambda: sub.seq >= _stream(served.commands).seq, 10, "the stream")
        # the server is idle now: the tree no longer changes, so the mirror must equal it
        assert sub.mirror.digest() == _stream(served.commands).digest
        assert finished == want and started == want
        assert sub.stats.digest_checks > 0
        assert (sub.stats.resyncs, sub.stats.gaps, sub.stats.malformed) == (0, 0, 0)
        assert sub.stats.snapshots == 1
        with lock:
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    finally:
        sub.stop()


def test_bad_commands_get_errors_and_the_server_keeps_serving(served):
    reply = send_command(served.commands, cmd.StartWorkload("nope", []), timeout_s=10)
    assert reply == cmd.Error("unknown workload 'nope' (known: chat, system, tot, fork, flood)")
    reply = send_command(served.commands, cmd.SetWatermark(0.5, 0.9), timeout_s=10)
    assert isinstance(reply, cmd.Error)
    with zmq.Context.instance().socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(served.commands)
        sock.send(b"\x93garbage")
        assert sock.poll(10_000)
        raw = cmd.decode_reply(sock.recv_multipart()[-1])
    assert isinstance(raw, cmd.Error) and raw.message.startswith("not a command")
    assert send_command(served.commands, cmd.Pause(), timeout_s=10) == cmd.Ok(
        "paused", {"running": 0, "waiting": 0})
    assert _stats(served.commands).paused is True
    assert send_command(served.commands, cmd.Resume(), timeout_s=10) == cmd.Ok("resumed")
    assert _stats(served.commands).paused is False


def test_headless_record_writes_engine_steps_that_replay_to_its_digest(tmp_path):
    out = tmp_path / "run.rcx"
    result = CliRunner().invoke(app, ["record", "--workload", "chat", "--requests", "12",
                                      "--blocks", "4096", "--out", str(out)])
    assert result.exit_code == 0, result.output
    reader = RecordingReader(out)
    assert (reader.header.config["requests"], reader.header.config["model"]) == (12, "tiny")
    records = [r.item for r in reader.records()]
    assert reader.damage is None
    batches = [b for b in records if isinstance(b, ev.Batch)]
    assert isinstance(records[0], Keyframe) and records[0].seq == 0
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))
    done = [e.req for b in batches for e in b.events if isinstance(e, ev.RequestFinish)]
    assert sorted(done) == list(range(12))
    last = batches[-1].events[-1]
    assert isinstance(last, ev.Digest)
    mirror, _ = reader.mirror_at(2**62)
    assert mirror.digest() == last.value
