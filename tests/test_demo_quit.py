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
