"""Files written for a user (issue 33 item 5): `export --out`, `record --out`, `whatif --plot`
never replace what is not a regular file and never leave a half-written one.

``core.files.Output`` writes beside the name and renames (so the old file stays whole until
the new one is, and a failed write leaves it as it was, with no temporary file); a character
device or a FIFO is written into and stays what it was; a directory, a block device or a
socket is refused in one line. Real devices (a null device node made with ``mknod`` when the
tests run as root, else /dev/null), real FIFOs with a reader thread, real sockets; a full
disk is RLIMIT_FSIZE in a child process, as in ``test_hostile_disk``.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import socket
import stat
import threading
from pathlib import Path

import pytest

from cli.main import main
from radixcache.core import events as ev
from radixcache.core.files import FileRefused, Output, WriteFailed, write_whole
from radixcache.serving.server import record_file
from radixcache.traffic.workloads import build_workload
from radixcache.wire.export import jsonl_lines
from radixcache.wire.recording import RecordingError, RecordingReader, RecordingWriter
from tests.test_hostile_disk import run_capped


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    code = exc.value.code
    assert isinstance(code, int)
    return code, out, err


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rec") / "chat.rcx"
    record_file(path, build_workload("chat", ["6", "--seed", "3"]), model=False, blocks=160,
                keyframe_every=200, step_requests=4)
    return path


def expected_jsonl(path: Path) -> bytes:
    with RecordingReader(path) as reader:
        items = [r.item for r in reader.fitting_records()]
    return "".join(line + "\n" for line in jsonl_lines(items)).encode()


def drain(fd: int, got: bytearray) -> None:
    """Read a FIFO until its writer closes it (``select`` wakes on data, and on the hang-up
    only once a writer has come and gone)."""
    while select.select([fd], [], [], 60)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        got.extend(chunk)


def null_device(tmp_path: Path) -> Path:
    """A character device to write to: a node of the null device (1, 3) in ``tmp_path`` when
    root may make one, else /dev/null itself."""
    if os.geteuid() == 0:
        node = tmp_path / "null"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        return node
    return Path("/dev/null")


def test_export_into_a_character_device_writes_into_it_and_keeps_it(recording, tmp_path,
                                                                    capsys):
    """Was: "wrote NODE", exit 0, and NODE a regular file holding the export (``os.replace``
    over the device; as root, /dev/null itself)."""
    device = null_device(tmp_path)
    before = os.stat(device)
    assert run(["export", str(recording), "--out", str(device)], capsys) == (
        0, f"wrote {device}\n", "")
    after = os.stat(device)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert after.st_ino == before.st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == (["null"] if os.geteuid() == 0
                                                          else [])  # no temporary file


def test_export_into_a_fifo_streams_to_its_reader(recording, tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, open before the writer
    got = bytearray()
    t = threading.Thread(target=drain, args=(fd, got))
    t.start()
    code, out, err = run(["export", str(recording), "--out", str(fifo)], capsys)
    t.join(60)
    os.close(fd)
    assert (code, out, err) == (0, f"wrote {fifo}\n", "")
    assert bytes(got) == expected_jsonl(recording)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_fifo_with_no_reader_is_refused_at_once(recording, tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert run(["export", str(recording), "--out", str(fifo)], capsys) == (
        1, "", f"error: {fifo}: a FIFO with no reader (start its reader first)\n")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_directory_and_a_socket_are_refused_in_one_line(recording, tmp_path, capsys):
    """export and record refuse before any work (record: before the engine starts); --plot
    is refused as a usage error before the curve is computed."""
    folder = tmp_path / "out.jsonl"
    folder.mkdir()
    sock_path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        assert run(["export", str(recording), "--out", str(folder)], capsys) == (
            1, "", f"error: {folder}: a directory; refusing to write over it\n")
        assert run(["export", str(recording), "--out", str(sock_path)], capsys) == (
            1, "", f"error: {sock_path}: a socket; refusing to write over it\n")
        assert stat.S_ISSOCK(os.stat(sock_path).st_mode)
        assert run(["record", "--requests", "2", "--out", str(folder)], capsys) == (
            1, "", f"error: {folder}: a directory; refusing to write over it\n")
        plot = tmp_path / "c.svg"
        plot.mkdir()
        code, out, err = run(["whatif", str(recording), "--plot", str(plot)], capsys)
        assert (code, out) == (2, "")
        assert err.startswith("radixcache whatif: error: Invalid value for --plot: "
                              f"{plot}: a directory; refusing to write over it")
    finally:
        sock.close()
    assert sorted(p.name for p in folder.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.svg", "out.jsonl", "s.sock"]


def test_a_link_is_followed_and_the_old_mode_and_owner_kept(recording, tmp_path, capsys):
    real = tmp_path / "real.jsonl"
    real.write_bytes(b"old\n")
    real.chmod(0o640)
    owner = (1234, 5678) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(real, *owner)
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    assert run(["export", str(recording), "--out", str(link)], capsys)[0] == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes() == expected_jsonl(recording)
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert (real.stat().st_uid, real.stat().st_gid) == owner  # root: kept another's owner
    fresh = tmp_path / "new.jsonl"
    umask = os.umask(0o027)
    try:
        write_whole(fresh, b"x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640  # 0666 less the umask, as open() does
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.jsonl", "new.jsonl",
                                                          "real.jsonl"]


def test_the_old_file_stays_whole_until_the_new_one_is(tmp_path):
    target = tmp_path / "t.json"
    target.write_bytes(b"old")
    with Output(target) as out:
        out.file.write(b"new, half")
        assert target.read_bytes() == b"old"  # a reader meanwhile sees the old file
        assert out.temp is not None and out.temp.parent == tmp_path
    assert target.read_bytes() == b"new, half"
    with pytest.raises(ValueError, match="boom"), Output(target) as out:
        out.file.write(b"never")
        raise ValueError("boom")
    assert target.read_bytes() == b"new, half"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "t.json"
    target.write_bytes(b"old")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
    try:
        with pytest.raises(WriteFailed) as exc:
            write_whole(target, b"x" * 5000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert str(exc.value) == (f"{target}: File too large (nothing written; the file there is "
                              f"unchanged)")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    with pytest.raises(WriteFailed, match="No space left on device"):
        write_whole("/dev/full", b"x")  # a device: written into, its error said as it is
    with pytest.raises(FileRefused, match="a directory; refusing to write over it"):
        Output(tmp_path)
    with pytest.raises(WriteFailed, match=r"No such file or directory \(nothing written\)"):
        write_whole(tmp_path / "missing" / "t.json", b"x")


def test_a_plot_on_a_full_disk_leaves_the_old_file_and_no_temporary_one(recording, tmp_path):
    """Was: the error said, and a truncated SVG left at the name."""
    # matplotlib writes its font cache on a machine's first plot: let that happen here, not
    # under the cap (where it says so on stderr, beside the one line this test is about)
    import matplotlib.font_manager  # noqa: F401

    plot = tmp_path / "curve.svg"
    plot.write_text("the chart of yesterday\n")
    r = run_capped(["whatif", str(recording), "--plot", str(plot)], 4096)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [f"error: --plot {plot}: File too large (nothing written; "
                                     "the file there is unchanged)"]
    assert plot.read_text() == "the chart of yesterday\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.svg"]
    r = run_capped(["whatif", str(recording), "--plot", str(plot)], 10**9)
    assert r.returncode == 0, r.stderr
    assert plot.read_text().rstrip().endswith("</svg>")


def _snapshot() -> ev.Snapshot:
    return ev.Snapshot(16, 8, [ev.NodeState(0, -1, 0, b"", [], 0, 0)], 0, 1, [], 0.9, 0.8)


def _batch(seq: int) -> ev.Batch:
    return ev.Batch(seq, 1, 0.0, "t", [ev.NodeCreated(seq, 0, 0, b"\x07\x00\x00\x00", [seq],
                                                      False)])


def test_a_recording_replaces_the_old_one_only_when_closed(tmp_path):
    path = tmp_path / "x.rcx"
    path.write_bytes(b"yesterday's recording")
    w = RecordingWriter(path, {})
    w.write_keyframe(0, 1, _snapshot())
    w.write_batch(_batch(1))
    assert path.read_bytes() == b"yesterday's recording"
    w.close()
    with RecordingReader(path) as reader:
        _, events = reader.play_all()
    assert (events, reader.damage) == (1, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.rcx"]


def test_a_recording_that_fails_before_its_first_keyframe_keeps_the_old_file(tmp_path):
    path = tmp_path / "x.rcx"
    path.write_bytes(b"yesterday's recording")
    w = RecordingWriter(path, {})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.fstat(w._f.fileno()).st_size + 10, hard))
    try:
        with pytest.raises(RecordingError) as exc:
            w.write_keyframe(0, 1, _snapshot())
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert str(exc.value) == f"{path}: File too large: nothing readable was written"
    assert path.read_bytes() == b"yesterday's recording"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.rcx"]


def test_a_recording_into_a_fifo_reads_back_from_what_its_reader_got(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    got = bytearray()
    w = RecordingWriter(fifo, {"source": "test"})
    t = threading.Thread(target=drain, args=(fd, got))
    t.start()
    w.write_keyframe(0, 1, _snapshot())
    for seq in (1, 2, 3):
        w.write_batch(_batch(seq))
    w.close()
    t.join(60)
    os.close(fd)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    copy = tmp_path / "copy.rcx"
    copy.write_bytes(bytes(got))
    with RecordingReader(copy) as reader:
        mirror, events = reader.play_all()
    assert (events, reader.damage, sorted(mirror.nodes)) == (3, None, [0, 1, 2, 3])


def test_record_into_a_character_device_keeps_it(tmp_path, capsys):
    device = null_device(tmp_path)
    before = os.stat(device)
    code, out, err = run(["record", "--requests", "3", "--blocks", "64", "--device", "cpu",
                          "--out", str(device)], capsys)
    assert (code, err) == (0, "") and out.startswith(f"wrote {device}: ")
    after = os.stat(device)
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == (["null"] if os.geteuid() == 0
                                                          else [])


def test_export_to_dev_stdout_writes_through_the_descriptor_the_shell_opened(recording,
                                                                           tmp_path):
    """`export --out /dev/stdout >> log`: appended to the log through descriptor 1 (the
    log is not replaced by the export), and "wrote" goes to stderr, off the data."""
    import subprocess
    import sys

    log = tmp_path / "all.jsonl"
    log.write_bytes(b"first line\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    with open(log, "ab") as out:
        r = subprocess.run([sys.executable, "-m", "cli.main", "export", str(recording),
                            "--out", "/dev/stdout"], stdout=out, stderr=subprocess.PIPE,
                           text=True, env=env, timeout=300, check=False)
    assert (r.returncode, r.stderr) == (0, "wrote /dev/stdout\n")
    assert log.read_bytes() == b"first line\n" + expected_jsonl(recording)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.jsonl"]


def test_screenshots_are_written_whole_and_refused_over_a_directory(tmp_path):
    from inspector.shots import svg_to_png

    svg = '<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect width="4" ' \
          'height="4"/></svg>'
    png = tmp_path / "shot.png"
    png.write_bytes(b"yesterday")
    svg_to_png(svg, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "dir.png").mkdir()
    with pytest.raises(FileRefused, match=r"dir\.png: a directory; refusing to write over it"):
        svg_to_png(svg, tmp_path / "dir.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.png", "shot.png"]


def test_keys_are_a_whole_set_or_none_and_never_written_through_a_link(tmp_path, capsys):
    """`radixcache keys DIR`: DIR a file is one line (was: a FileExistsError traceback); a
    dangling link at a key's name is refused, not followed; a full disk leaves no key."""
    from radixcache.wire.security import CurveError, create_keys

    afile = tmp_path / "afile"
    afile.write_bytes(b"")
    assert run(["keys", str(afile)], capsys) == (2, "", f"error: {afile}: not a directory\n")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "server.key").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CurveError, match="refusing to overwrite existing keys"):
        create_keys(linked)
    assert not (tmp_path / "elsewhere").exists()
    full = tmp_path / "full"
    full.mkdir()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, hard))
    try:
        with pytest.raises(CurveError) as exc:
            create_keys(full)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert str(exc.value) == f"cannot write keys in {full}: File too large (none written)"
    assert list(full.iterdir()) == []
    files = create_keys(full)
    assert [stat.S_IMODE(p.stat().st_mode) & 0o077 for p in (files.server_secret,
                                                            files.client_secret)] == [0, 0]
