"""`q` in the demo: the engine gets SIGTERM when the inspector starts to close
(``EngineProcess.terminate``) and SIGKILL once the grace since that signal is spent; however
it ends, the process is gone and its folder removed (``radixcache bench cli`` times quit_s)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from radixcache.tools.demo import EngineProcess


class _Sleeper(EngineProcess):
    """An engine stand-in: a real child process that prints ``up`` and waits."""

    ignore_term = False

    def command(self) -> list[str]:
        ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if self.ignore_term else ""
        return [sys.executable, "-c", f"import signal, time; {ignore}print('up', flush=True); "
                "time.sleep(60)"]


class _Stubborn(_Sleeper):
    ignore_term = True


def _up(engine: EngineProcess) -> None:
    assert engine.proc is not None
    while engine.log.read_text() != "up\n":
        assert engine.proc.poll() is None


def test_terminate_sends_sigterm_once_and_stop_reaps_it() -> None:
    engine = _Sleeper(16, grace_s=30).start()
    _up(engine)
    engine.terminate()
    engine.terminate()  # the inspector's close and the demo's exit may both ask
    assert engine.proc is not None
    assert engine.proc.wait(30) == -signal.SIGTERM
    assert engine.stop() == -signal.SIGTERM
    assert not engine.dir.exists()
    kept = engine.dir.parent / f"{engine.dir.name}-engine.log"
    assert not kept.exists()  # told to stop: not a crash, no log kept


def test_an_engine_ignoring_sigterm_is_killed_after_the_grace_since_terminate() -> None:
    engine = _Stubborn(16, grace_s=0.2).start()
    _up(engine)
    engine.terminate()
    assert engine.proc is not None and engine.proc.poll() is None
    assert engine.stop() == -signal.SIGKILL
    assert engine.proc.poll() == -signal.SIGKILL
    assert not engine.dir.exists()


def test_an_engine_dead_before_terminate_keeps_its_log() -> None:
    engine = _Sleeper(16).start()
    _up(engine)
    assert engine.proc is not None
    engine.proc.kill()  # died on its own, before anyone told it to stop
    engine.proc.wait()
    engine.terminate()
    kept = Path(engine.dir.parent / f"{engine.dir.name}-engine.log")
    try:
        assert engine.stop() == -signal.SIGKILL
        assert kept.read_text() == "up\n"
        assert not engine.dir.exists()
    finally:
        kept.unlink(missing_ok=True)


def test_q_in_the_demo_ends_it_and_its_engine() -> None:
    """The real demo in a pseudo-terminal: ``q`` once the tree is drawn ends the demo with
    status 0 and leaves no process of its group (the engine is in it) and no temp folder."""
    import fcntl
    import os
    import pty
    import select
    import shutil
    import struct
    import subprocess
    import tempfile
    import termios
    import time

    tmp = Path(tempfile.mkdtemp(prefix="rcq-", dir="/tmp"))  # short: ipc paths stay in it
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "demo"], stdin=slave,
                            stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    out, typed, during = b"", False, []
    deadline = time.monotonic() + 300  # a stuck demo fails the test, it does not hang it
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.05)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    continue
            if not typed and "● live".encode() in out:
                during = [p.name[:8] for p in tmp.iterdir()]
                os.write(master, b"q")
                typed = True
        assert typed, out[-2000:]
        assert proc.wait(60) == 0
        assert during == ["rc-demo-"]  # the engine's folder was there, in this TMPDIR
        try:
            os.killpg(proc.pid, 0)
            left = True
        except ProcessLookupError:
            left = False
        assert not left, "a process of the demo's group outlived it"
        assert list(tmp.iterdir()) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
        shutil.rmtree(tmp, ignore_errors=True)
