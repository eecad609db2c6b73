"""Process-level helpers: children started with ``parent_death_signal`` (the demo's engine,
the cluster's replicas and router) end when the process that started them is killed; the
screenshot command's font check."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.helpers.stream import wait_for

_PARENT = """
import subprocess, sys, time
from radixcache.core.procs import parent_death_signal
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         start_new_session=True, preexec_fn=parent_death_signal())
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for init to reap it is gone
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_in_its_own_session_dies_with_its_killed_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)  # no cleanup of its own: only the kernel's signal
        parent.wait(10)
        assert wait_for(lambda: not _alive(child), timeout=10)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_screenshot_font_check_says_what_is_missing(monkeypatch, tmp_path) -> None:
    """`radixcache screenshot` warns when PNGs would not be monospace: a real fc-match that
    knows no Fira Code (an empty font config), and no fc-match at all."""
    import shutil

    from inspector.shots import monospace_font_missing

    if shutil.which("fc-match") is not None:
        conf = tmp_path / "fonts.conf"
        conf.write_text("<?xml version='1.0'?><fontconfig><dir>" + str(tmp_path)
                        + "</dir><cachedir>" + str(tmp_path) + "</cachedir></fontconfig>")
        monkeypatch.setenv("FONTCONFIG_FILE", str(conf))
        missing = monospace_font_missing()
        assert missing is not None and "apt install fonts-firacode" in missing
    monkeypatch.setenv("PATH", str(tmp_path))
    assert monospace_font_missing() == ("fc-match not found: cannot tell whether the Fira Code "
                                        "font is installed")
