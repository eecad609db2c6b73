"""``radixcache --help`` is printed from the command table without Typer (``cli.tophelp``):
the same bytes as Typer's own rendering of the app, plain and in colour, at several widths."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

# Typer's rendering of the root help, in a process that imported no command module (as the
# user's `radixcache --help` would be without the table's shortcut)
TYPER = "from cli.app import app; app(['--help'], prog_name='radixcache')"
FAST = "from cli.main import main; main(['--help'])"
IMPORTS = ("import sys; from cli.main import main\n"
           "try: main(['-h'])\n"
           "except SystemExit as e: code = e.code\n"
           "print(code, sorted(m for m in ('typer', 'click', 'rich.markdown', 'rich.traceback', "
           "'numpy', 'zmq') if m in sys.modules), file=sys.stderr)")


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "PY_COLORS",
                          "TERMINAL_WIDTH", "GITHUB_ACTIONS", "_TYPER_FORCE_DISABLE_TERMINAL")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                          timeout=120, env={**clean, **env})


@pytest.mark.parametrize("env", [
    {"COLUMNS": "80"},
    {"COLUMNS": "57"},
    {"COLUMNS": "200"},
    {"COLUMNS": "120", "FORCE_COLOR": "1"},
    {"TERMINAL_WIDTH": "100", "FORCE_COLOR": "1", "NO_COLOR": "1"},
], ids=lambda e: " ".join(f"{k}={v}" for k, v in e.items()))
def test_root_help_is_the_bytes_typer_prints(env: dict[str, str]) -> None:
    fast = _run(FAST, env)
    typer = _run(TYPER, env)
    assert fast.stdout == typer.stdout
    assert fast.stderr == typer.stderr == b""
    plain = re.sub(rb"\x1b\[[0-9;]*m", b"", fast.stdout)
    assert b" Usage: radixcache [OPTIONS] COMMAND [ARGS]..." in plain
    assert b"screenshot" in plain


def test_colour_is_really_compared() -> None:
    """The colour case above compares escape codes, not two plain texts."""
    out = _run(FAST, {"COLUMNS": "120", "FORCE_COLOR": "1"}).stdout
    assert b"\x1b[1;36mscreenshot" in out


def test_short_flag_exits_0_without_typer_or_heavy_rich() -> None:
    done = _run(IMPORTS, {"COLUMNS": "80"})
    assert done.stderr.decode().strip().splitlines()[-1] == "0 []"
    assert done.stdout.splitlines()[1].rstrip() == b" Usage: radixcache [OPTIONS] COMMAND [ARGS]..."
