"""SIGTERM of `radixcache record` (headless, and --from a live engine): the file is closed
whole, read back, and the command says so on stdout and exits 0 (was: it printed nothing)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from radixcache.core import events as ev
from radixcache.wire.endpoints import free_ports
from radixcache.wire.recording import RecordingReader

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _record(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cli.main", "record", *argv], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_file(path: Path, proc: subprocess.Popen[str]) -> None:
    """Until the recorder has written to its file (its SIGTERM handler is in place by then).
    The writer fills a hidden file beside the name (``.NAME.XXXXXXXX.tmp``, ``core.files``) and
    renames it into place when it closes, so that is the file to watch."""
    deadline = time.monotonic() + 120

    def written() -> bool:
        return any(f.stat().st_size > 0 for f in path.parent.glob(f".{path.name}.*.tmp"))

    while not written():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} not written within 120 s"
        time.sleep(0.05)


def _batches(path: Path) -> int:
    with RecordingReader(path) as reader:
        n = sum(type(r.item) is ev.Batch for r in reader.records())
        assert reader.damage is None
    return n


def _stopped(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (0, "")
    return out


def test_sigterm_of_a_headless_record_closes_the_file_and_says_so(tmp_path: Path) -> None:
    out_file = tmp_path / "rec.rcx"
    proc = _record(["--out", str(out_file), "--requests", "2000"])  # about 80 s of work
    _wait_for_file(out_file, proc)
    out = _stopped(proc)
    n = _batches(out_file)
    m = re.fullmatch(rf"stopped by SIGTERM: wrote {re.escape(str(out_file))}: [\d,]+ events in "
                     rf"(?P<batches>[\d,]+) batches; (?P<done>[\d,]+) of 2,000 requests finished "
                     rf"\(0 rejected\) in [\d,]+ steps, [\d.]+ s \(reads back: (?P<read>[\d,]+) "
                     rf"batches\)\n", out)
    assert m is not None, out
    assert int(m["batches"].replace(",", "")) == int(m["read"].replace(",", "")) == n
    assert int(m["done"].replace(",", "")) < 2000


def test_sigterm_of_a_live_record_closes_the_file_and_says_so(tmp_path: Path) -> None:
    port = free_ports(3)
    serve = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--port", str(port),
                              "--blocks", "256", "--loop"], env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        out_file = tmp_path / "live.rcx"
        proc = _record(["--from", f"tcp://127.0.0.1:{port}", "--seconds", "600", "--out",
                        str(out_file)])
        _wait_for_file(out_file, proc)  # opened once the snapshot arrived
        out = _stopped(proc)
    finally:
        serve.terminate()
        serve.communicate(timeout=120)
    n = _batches(out_file)
    m = re.fullmatch(rf"stopped by SIGTERM after [\d.]+ s: wrote {re.escape(str(out_file))}: "
                     rf"[\d,]+ events in (?P<batches>[\d,]+) batches, \d+ keyframes \(seq [\d,]+ "
                     rf"to [\d,]+\) \(reads back: (?P<read>[\d,]+) batches\)\n", out)
    assert m is not None, out
    assert int(m["batches"].replace(",", "")) == int(m["read"].replace(",", "")) == n
    with RecordingReader(out_file) as reader:
        note = reader.capture_note()
    assert note is not None and note.seconds < 600
