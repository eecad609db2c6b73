"""Recordings of a live engine read back with equal digests (issue 12 item 1), and the reader
and `tree FILE` report damage instead of printing a partial tree (items 5, 7, 8)."""

from __future__ import annotations

import os
import re
import select
import threading
from pathlib import Path

import pytest

from cli.main import main
from radixcache.core import events as ev
from radixcache.wire.endpoints import Endpoints, u64
from radixcache.wire.mirror import Mirror
from radixcache.wire.recorder import LiveRecorder
from radixcache.wire.recording import Keyframe, RecordingError, RecordingReader, RecordingWriter
from tests.helpers.hostile import FakeEngine, TreeFeed, encode
from tests.helpers.stream import drive, make_source, prompts, serving, wait_for


def read_back(path: Path) -> tuple[Mirror, RecordingReader]:
    reader = RecordingReader(path)
    mirror, _ = reader.play_all()  # every digest of the file checked on the way
    return mirror, reader


def flood(source, stop: threading.Event, batches: int = 600) -> None:
    """Publish ``batches`` batches of two requests (or fewer, when ``stop`` is set first)."""
    reqs = prompts(400, seed=3)
    i = 0
    while not stop.is_set() and i < 2 * batches:
        drive(source, reqs[i % 400:i % 400 + 2], per_step=2)
        i += 2


def test_record_from_a_flooding_engine_reads_back_with_equal_digests(tmp_path):
    source = make_source(num_blocks=256, digest_every=4)
    out = tmp_path / "flood.rcx"
    with serving(source) as pub:
        stop = threading.Event()
        driver = threading.Thread(target=flood, args=(source, stop), daemon=True)
        drive(source, prompts(20, seed=4), per_step=2)  # the recorder joins a non-empty tree
        rec = LiveRecorder(pub.endpoints, out, keyframe_every=500).start()
        try:
            assert rec.subscriber.wait_synced(30)
            driver.start()  # the flood runs while the recorder follows it
            driver.join(120)  # a bounded flood: it ends by itself
            assert not driver.is_alive()
            assert wait_for(lambda: rec.subscriber.seq == pub.seq, 60)
            assert rec.subscriber.stats.batches >= 200
        finally:
            stop.set()
            result = rec.stop()
    assert result.synced and result.malformed == 0 and result.resyncs == 0
    assert result.keyframes >= 2  # the first one and at least one periodic one
    mirror, reader = read_back(out)
    assert reader.damage is None
    assert mirror.stats.digest_checks >= 40 and mirror.stats.digest_mismatches == 0
    assert mirror.digest() == source.tree.digest()


def test_record_across_an_engine_restart_reads_back_with_equal_digests(tmp_path):
    # ipc: a TCP port freed by the first engine can be taken meanwhile by the subscriber's own
    # reconnect (a self-connect) or another process; the SIGKILL run on TCP is record_runs
    endpoints = Endpoints.ipc(str(tmp_path / "engine"))
    first = make_source(num_blocks=256, digest_every=2)
    out = tmp_path / "restart.rcx"
    with serving(first, endpoints, epoch=1000) as pub:
        rec = LiveRecorder(pub.endpoints, out, request_timeout_s=0.5).start()
        drive(first, prompts(30, seed=1))
        assert wait_for(lambda: rec.subscriber.seq == pub.seq)
    second = make_source(num_blocks=256, digest_every=2)
    with serving(second, endpoints, epoch=2000) as pub2:
        drive(second, prompts(30, seed=2))
        assert wait_for(lambda: rec.subscriber.epoch == pub2.epoch
                        and rec.subscriber.seq == pub2.seq, 20)
        result = rec.stop()
    assert result.keyframes == 2 and rec.subscriber.stats.epochs == 1
    mirror, reader = read_back(out)
    assert reader.damage is None and mirror.stats.digest_mismatches == 0
    assert mirror.digest() == second.tree.digest()
    kinds = [type(r.item).__name__ for r in reader.records()]
    assert kinds.count("Keyframe") == 2


def chain_batches(depth: int, per_batch: int) -> list[list[ev.AnyEvent]]:
    """A chain ``depth`` nodes deep (one token each), then a request pinning its deepest
    node, with the digest after every batch (computed by a mirror on the engine's side)."""
    truth = Mirror()
    truth.load_snapshot(ev.Snapshot(16, 64, [ev.NodeState(0, -1, 0, b"", [], 0, 0)],
                                    0, 1, [], 0.92, 0.85))
    out = []
    for lo in range(1, depth + 1, per_batch):
        events: list[ev.AnyEvent] = [
            ev.NodeCreated(i, i - 1, i - 1, (i % 1000).to_bytes(4, "little"), [i % 64], False)
            for i in range(lo, min(lo + per_batch, depth + 1))]
        out.append(events)
    out += [[ev.Pin(depth, 1), ev.Access(depth, 5)], [ev.Pin(depth, -1)]]
    for events in out:
        for e in events:
            truth.apply(e)
        events.append(ev.Digest(truth.digest()))
    return out


def test_record_of_a_deep_chain_reads_back_with_equal_digests(tmp_path):
    engine = FakeEngine()
    out = tmp_path / "deep.rcx"
    rec = LiveRecorder(engine.endpoints, out).start()
    try:
        engine.wait_subscribed()
        ident, (_, req) = engine.request()
        root = ev.Snapshot(16, 64, [ev.NodeState(0, -1, 0, b"", [], 0, 0)], 0, 1, [], 0.9, 0.8)
        engine.reply(ident, b"snap", req, u64(3), u64(0), encode(root))
        batches = chain_batches(2_000, 500)
        for seq, events in enumerate(batches, 1):
            engine.publish(ev.encode_batch(ev.Batch(seq, 3, 0.0, "deep", events)))
        assert wait_for(lambda: rec.subscriber.seq == len(batches))
        result = rec.stop()
    finally:
        engine.close()
    assert (result.events, result.malformed) == (2_000 + 3 + len(batches), 0)
    mirror, reader = read_back(out)
    assert reader.damage is None
    assert mirror.stats.digest_checks == len(batches) and len(mirror.nodes) == 2_001


# -- the reader and `tree FILE` ---------------------------------------------------------------
def small_recording(path: Path) -> None:
    snap = ev.Snapshot(16, 8, [ev.NodeState(0, -1, 0, b"", [], 0, 0)], 0, 1, [], 0.9, 0.8)
    with RecordingWriter(path, {}) as w:
        w.write_keyframe(0, 1, snap)
        for seq in (1, 2):
            tok = (seq * 7).to_bytes(4, "little")
            w.write_batch(ev.Batch(seq, 1, 0.0, "t", [ev.NodeCreated(seq, 0, 0, tok, [seq],
                                                                     False)]))


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


def test_tree_of_a_cut_file_says_where_on_stderr(tmp_path, capsys):
    path = tmp_path / "cut.rcx"
    small_recording(path)
    data = path.read_bytes()
    second = [r.offset for r in RecordingReader(path).records()][-1]
    path.write_bytes(data[:second + 5])
    code, out, err = run_cli(["tree", str(path)], capsys)
    assert code == 0
    assert "root (1 nodes)" in out and "events read" not in out
    assert err.splitlines() == ["1 events read",
                                f"warning: stopped at byte {second:,}: truncated frame header"]


def test_tree_when_the_only_keyframe_is_damaged_exits_1_with_one_line(tmp_path, capsys):
    path = tmp_path / "bad.rcx"
    small_recording(path)
    key = next(r.offset for r in RecordingReader(path).records() if isinstance(r.item, Keyframe))
    data = bytearray(path.read_bytes())
    data[key + 12] ^= 0xFF
    path.write_bytes(bytes(data))
    code, out, err = run_cli(["tree", str(path)], capsys)
    assert (code, out) == (1, "")
    assert err.splitlines() == [f"error: {path}: no readable keyframe at or before event "
                                f"{2**62} (bad keyframe: checksum mismatch at byte {key})"]


def test_tree_prints_block_counts_runs_and_text(tmp_path, capsys):
    path = tmp_path / "ok.rcx"
    snap = ev.Snapshot(16, 32, [ev.NodeState(0, -1, 0, b"", [], 0, 0)], 0, 1, [], 0.9, 0.8)
    tokens = b"".join(t.to_bytes(4, "little") for t in range(1, 41))
    with RecordingWriter(path, {}) as w:
        w.write_keyframe(0, 1, snap)
        w.write_batch(ev.Batch(1, 1, 0.0, "t", [
            ev.NodeCreated(1, 0, 0, tokens, [4, 5, 6, 20], False)]))
    code, out, err = run_cli(["tree", str(path)], capsys)
    assert (code, err) == (0, "1 events read\n")
    assert '4 blocks b4-6,b20 r0' in out and "n1 [40 tok] \"" in out and '…"' in out


@pytest.mark.parametrize("make, message", [
    (lambda p: Path("/dev/zero"), "not a regular file"),
    (lambda p: (os.mkfifo(p / "fifo"), p / "fifo")[1], "not a regular file"),
    (lambda p: (p / "e").write_bytes(b"") or p / "e", "empty file"),
])
def test_devices_fifos_and_empty_files_are_refused_at_once(tmp_path, make, message, capsys):
    path = make(tmp_path)
    code, out, err = run_cli(["tree", str(path)], capsys)
    assert (code, out) == (1, "")
    assert err == f"error: {path}: {message}\n"


def test_a_sparse_8_gib_file_is_read_without_memory(tmp_path):
    path = tmp_path / "sparse.rcx"
    with open(path, "wb") as f:
        f.truncate(8 * 2**30)
    with pytest.raises(RecordingError, match="bad magic"):
        RecordingReader(path)
    with pytest.raises(RecordingError, match="exceeds the 1,024-byte limit"):
        RecordingReader(path, max_bytes=1024)


def test_record_from_a_dead_port_fails_on_stderr(tmp_path, capsys):
    code, out, err = run_cli(["record", "--from", "tcp://127.0.0.1:9", "--seconds", "0.3",
                              "--out", str(tmp_path / "x.rcx")], capsys)
    assert (code, out) == (1, "")
    assert err.startswith("error: no snapshot from tcp://127.0.0.1:9 in 0.3 s")
    assert not (tmp_path / "x.rcx").exists()


# -- issue 24 item 4: a stream it cannot sync is said so, on stderr and in the file ------------
def test_record_from_a_stream_with_a_gap_never_replayed_says_what_it_missed(tmp_path, capsys):
    from radixcache.serving.cluster import free_port_run

    engine, feed = FakeEngine(free_port_run(3)), TreeFeed()
    out = tmp_path / "gap.rcx"
    stop = threading.Event()

    def peer() -> None:
        engine.wait_subscribed()
        ident, (_, req) = engine.request()
        engine.reply(ident, *feed.snapshot_frames(req))
        feed.batch()  # seq 1 is lost ...
        engine.publish(feed.batch())  # ... seq 2 arrives, and no replay ever answers
        while not stop.is_set():
            engine.no_request(0.1)

    thread = threading.Thread(target=peer)
    thread.start()
    try:
        code, stdout, err = run_cli(["record", "--from", engine.endpoints.events,
                                     "--seconds", "1.5", "--out", str(out)], capsys)
    finally:
        stop.set()
        thread.join()
        engine.close()
    assert code == 0
    assert " ".join(stdout.split()) == f"wrote {out}: 0 events in 0 batches, 1 keyframes " \
                                        f"(seq 0 to 0)"  # (the console wraps long lines)
    # was: a recording of 0 batches and not a word
    assert re.fullmatch(r"warning: incomplete capture \(noted in the file\): ended waiting for "
                        r"a replay, out of sync for \d+\.\d s of 1\.5 s; 1 gaps\n", err), err
    with RecordingReader(out) as reader:
        note = reader.capture_note()
        assert reader.header.format_version == 2
    assert note is not None
    assert (note.batches, note.events, note.gaps, note.state, note.complete) == (
        0, 0, 1, "replay", False)


# -- issue 24: record --from honours --seconds: no wait in stop() outlasts STOP_WAIT_S --------
def _synced_recorder(engine: FakeEngine, out: Path) -> tuple[LiveRecorder, TreeFeed]:
    feed = TreeFeed()
    rec = LiveRecorder(engine.endpoints, out)
    rec.start()
    engine.wait_subscribed()
    ident, (_, req) = engine.request()
    engine.reply(ident, *feed.snapshot_frames(req))
    assert rec.subscriber.wait_synced(10)
    return rec, feed


def test_stop_returns_while_the_stream_thread_is_stuck_in_a_frame_and_says_so(tmp_path):
    """A frame that keeps the subscriber's thread busy past the deadline (a lock storm on a
    deep chain, a 48 MB block list) was left out without a word: 0 batches, complete."""
    engine, out = FakeEngine(), tmp_path / "busy.rcx"
    entered, release = threading.Event(), threading.Event()
    released_by_test: list[bool] = []

    def stuck(e: ev.AnyEvent) -> None:  # the thread applying the frame cannot go on
        if isinstance(e, ev.NodeCreated) and not entered.is_set():
            entered.set()
            released_by_test.append(release.wait(60))

    try:
        rec, feed = _synced_recorder(engine, out)
        rec.mirror.watch(stuck)
        engine.publish(feed.batch())
        assert entered.wait(10)
        result = rec.stop()  # would wait as long as the frame takes (60 s here)
        release.set()
    finally:
        release.set()
        engine.close()
    assert wait_for(lambda: released_by_test)
    assert released_by_test == [True]  # stop() returned while the thread was still stuck
    assert result.note is not None and result.failed == ""
    note = result.note
    assert (note.batches, note.events, note.complete) == (0, 0, False)
    assert note.last_error == ("the stream's thread was still busy with a frame when the time "
                               "was up (not in the file)")
    with RecordingReader(out) as reader:
        assert reader.capture_note() == note


def test_stop_returns_while_a_keyframe_write_is_blocked_and_says_there_is_no_note(tmp_path):
    """The recorder writes a keyframe while holding its lock; a write that blocks (a FIFO no
    one reads; a slow disk) must not hold stop() past its bound."""
    engine, out = FakeEngine(), tmp_path / "fifo.rcx"
    os.mkfifo(out)
    reader_fd = os.open(out, os.O_RDONLY | os.O_NONBLOCK)  # opened, never read: writes block
    stopped = threading.Event()
    drained_after_stop: list[bool] = []

    recs: list[LiveRecorder] = []

    def drain() -> None:  # after stop() returned (or 60 s): the blocked write completes
        drained_after_stop.append(stopped.wait(60))
        while not (recs and recs[0].keyframes == 1):  # until that write returned
            if select.select([reader_fd], [], [], 0.1)[0] and not os.read(reader_fd, 1 << 16):
                break
        os.close(reader_fd)

    feed = TreeFeed(num_blocks=4096)
    for _ in range(400):  # a snapshot of 160 KB: more than the pipe's 64 KiB buffer
        feed.batch(requests=4)
    drainer = threading.Thread(target=drain)
    drainer.start()
    try:
        rec = LiveRecorder(engine.endpoints, out).start()
        recs.append(rec)
        engine.wait_subscribed()
        ident, (_, req) = engine.request()
        engine.reply(ident, *feed.snapshot_frames(req))
        assert wait_for(lambda: rec.writer is not None)
        result = rec.stop()  # was: waited for the keyframe's write, for ever
    finally:
        stopped.set()
        drainer.join()
        engine.close()
    assert drained_after_stop == [True]
    assert (result.synced, result.note) == (True, None)
    assert result.failed == (f"{out}: the stream's thread was still writing a keyframe when "
                             f"the time was up: the file has no capture note")


def test_record_from_a_peer_whose_snapshot_is_refused_says_why(tmp_path, capsys):
    """A snapshot refused as malformed (a node of 16M tokens on 1 block), then silence: the
    error said "no frame in 3 s: reconnected the event socket", as if the engine were down."""
    from radixcache.serving.cluster import free_port_run

    engine, out = FakeEngine(free_port_run(3)), tmp_path / "x.rcx"
    big = ev.NodeState(1, 0, 0, b"\x01\x00\x00\x00" * (1 << 20), [0], 0, 0)
    bad = ev.Snapshot(16, 64, [ev.NodeState(0, -1, 0, b"", [], 0, 0), big], 0, 2, [], 0.9, 0.8)
    stop = threading.Event()

    def peer() -> None:  # the first request gets the bad snapshot, later ones nothing
        ident, (_, req) = engine.request(timeout=30)
        engine.reply(ident, b"snap", req, u64(7), u64(0), encode(bad))
        while not stop.is_set():
            engine.no_request(0.1)

    thread = threading.Thread(target=peer)
    thread.start()
    try:
        code, stdout, err = run_cli(["record", "--from", engine.endpoints.events,
                                     "--seconds", "3.5", "--out", str(out)], capsys)
    finally:
        stop.set()
        thread.join()
        engine.close()
    assert (code, stdout) == (1, "")
    assert err == (f"error: no snapshot from {engine.endpoints.events} in 3.5 s (1 malformed; "
                   f"last: snapshot node 1: 1,048,576 tokens from position 0 need 65,536 blocks "
                   f"of 16, not 1)\n")
    assert not out.exists()


def test_bench_cli_record_from_runs_the_real_command_to_a_noted_file(tmp_path):
    """``bench cli``'s ``record_from_s``: the real command against its busy peer exits 0 and
    writes a capture note (whether the thread is still busy at the end depends on the CPU;
    ``test_stop_returns_while_the_stream_thread_is_stuck_*`` proves what happens when it is)."""
    from radixcache.tools.bench_cli import CLI
    from radixcache.tools.bench_record_from import record_from_seconds

    out = tmp_path / "busy.rcx"
    assert record_from_seconds(out, CLI) > 0  # -1: the command failed
    with RecordingReader(out) as reader:
        note = reader.capture_note()
    assert note is not None
    assert (note.seconds, note.keyframes, note.malformed, note.state) == (2.0, 1, 0, "live")
