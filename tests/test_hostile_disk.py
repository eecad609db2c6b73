"""A full disk (issue 24 item 1): `record --out` and `export --out` end with one line on stderr
and exit 1, and what was written before stays readable.

The disk is made full with RLIMIT_FSIZE in the child process (writes past the limit fail with
EFBIG, as a full filesystem fails them with ENOSPC: both are an ``OSError`` of ``write``), so
the test runs anywhere, without root or a mount. The real CLI runs in a subprocess.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from radixcache.wire.recording import RecordingReader, RecordingWriter

ROOT = Path(__file__).resolve().parent.parent


def run_capped(args: list[str], limit: int) -> subprocess.CompletedProcess[str]:
    """``radixcache ARGS`` in a child that may write files of at most ``limit`` bytes."""
    def cap() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True,
                          text=True, preexec_fn=cap, env=env, cwd=ROOT, timeout=300)


def test_record_on_a_full_disk_is_one_line_and_the_file_stays_readable(tmp_path):
    out = tmp_path / "full.rcx"
    r = run_capped(["record", "--workload", "chat", "--requests", "40", "--out", str(out)],
                   40_000)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()  # one line, no blank one left by the progress bar
    assert len(lines) == 1 and lines[0].startswith(f"error: {out}: File too large: "), lines
    assert "Traceback" not in r.stderr and r.stdout == ""
    with RecordingReader(out) as reader:
        records = list(reader.records())
        assert reader.damage is None  # cut back to the last whole frame: nothing half written
        mirror, events = reader.play_all()
        assert reader.damage is None
    assert out.stat().st_size <= 40_000
    assert len(records) >= 2 and events > 0
    assert f"the file holds the first {events:,} events" in lines[0]
    assert mirror.nodes  # the state those events build


def test_export_on_a_full_disk_is_one_line_and_leaves_the_old_file(tmp_path):
    rec = tmp_path / "run.rcx"
    r = run_capped(["record", "--workload", "chat", "--requests", "40", "--out", str(rec)],
                   10**9)
    assert (r.returncode, r.stderr) == (0, "")
    target = tmp_path / "run.jsonl"
    target.write_text("the export of yesterday\n")
    r = run_capped(["export", str(rec), "--out", str(target)], 50_000)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [f"error: {target}: File too large (nothing written; "
                                     f"the file there is unchanged)"]
    assert target.read_text() == "the export of yesterday\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl", "run.rcx"]  # no temp


def test_a_writer_that_cannot_write_its_index_keeps_every_batch(tmp_path):
    """The close of a recording on a full disk: the batches stay, the index is left out."""
    path = tmp_path / "x.rcx"
    from radixcache.core import events as ev
    from radixcache.wire.recording import RecordingError

    snap = ev.Snapshot(16, 8, [ev.NodeState(0, -1, 0, b"", [], 0, 0)], 0, 1, [], 0.9, 0.8)
    w = RecordingWriter(path, {})
    w.write_keyframe(0, 1, snap)
    w.write_batch(ev.Batch(1, 1, 0.0, "t", [ev.NodeCreated(1, 0, 0, b"\x07\x00\x00\x00", [1],
                                                             False)]))
    size = os.fstat(w._f.fileno()).st_size
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 10, hard))
    try:
        try:
            w.close()
        except RecordingError as exc:
            message = str(exc)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert message == f"{path}: File too large: the file holds the first 1 events (no index)"
    assert path.stat().st_size == size
    with RecordingReader(path) as reader:
        mirror, events = reader.play_all()
    assert (events, reader.damage, sorted(mirror.nodes)) == (1, None, [0, 1])


def test_the_live_recorder_on_a_full_disk_stops_and_keeps_the_file_readable(tmp_path):
    """The live recorder (`record --from`) stops at the write that failed and keeps what it
    wrote readable (the limit is set once it has synced: this process's files may not grow
    past 20 KB more while the engine floods)."""
    from radixcache.wire.recorder import LiveRecorder
    from tests.helpers.stream import drive, make_source, prompts, serving, wait_for

    source = make_source(num_blocks=256, digest_every=4)
    out = tmp_path / "live.rcx"
    with serving(source) as pub:
        rec = LiveRecorder(pub.endpoints, out).start()
        assert rec.subscriber.wait_synced(30)
        assert rec.writer is not None and not out.exists()  # written beside, renamed at close
        limit = os.fstat(rec.writer._f.fileno()).st_size + 20_000
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        try:
            reqs = prompts(400, seed=3)
            for i in range(0, 400, 2):
                drive(source, reqs[i:i + 2], per_step=2)
                if rec.failed is not None:
                    break
            assert wait_for(lambda: rec.failed is not None, 30)
            result = rec.stop()
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, old)
    assert result.failed.startswith(f"{out}: File too large: the file holds the first ")
    assert result.note is None  # nothing more was written after the failure
    with RecordingReader(out) as reader:
        _, events = reader.play_all()
        assert reader.damage is None
    assert out.stat().st_size <= limit
    assert result.failed == f"{out}: File too large: the file holds the first {events:,} events"
