"""Every usage error of every command is one line on stderr naming the command and the
problem, exit 2, through the real console entry point (``python -m cli.main`` in a fresh
process), never Typer's boxed multi-line panel."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer import _click as click
from typer._click.exceptions import NoSuchOption
from typer.core import TyperGroup

from cli.app import app
from cli.lazy import load_all
from cli.usage import one_line

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    (["whatif", "x.jsonl", "--pool-blocks", "9223372036854775807"],
     "radixcache whatif: error: Invalid value for '--pool-blocks': Input should be less than "
     "or equal to 1099511627776 (see radixcache whatif --help)"),
    (["nosuch"], "radixcache: error: No such command 'nosuch'. (see radixcache --help)"),
    (["whatif"], "radixcache whatif: error: Missing argument 'SOURCE'. "
     "(see radixcache whatif --help)"),
    (["tree", "x.rcx", "--bogus"],
     "radixcache tree: error: No such option: --bogus (see radixcache tree --help)"),
    (["record", "--requests", "many"],
     "radixcache record: error: Invalid value for '--requests': Input should be a valid "
     "integer, unable to parse string as an integer (see radixcache record --help)"),
    (["bench", "tree", "--capacity", "0"],
     "radixcache bench tree: error: Invalid value for '--capacity': Input should be greater "
     "than or equal to 1 (see radixcache bench tree --help)"),
    (["bench", "nosuch"],
     "radixcache bench: error: No such command 'nosuch'. (see radixcache bench --help)"),
    (["export", "x.rcx", "--format", "nope"],
     "radixcache export: error: Invalid value for --format: jsonl or perfetto "
     "(see radixcache export --help)"),
    (["record", "--out", "x.rcx", "--from", "tcp://127.0.0.1:9", "--seconds", "nan"],
     "radixcache record: error: Invalid value for '--seconds': Input should be less than or "
     "equal to 604800 (see radixcache record --help)"),
    (["record", "--out", "x.rcx", "--blocks", "9223372036854775807"],
     "radixcache record: error: Invalid value for '--blocks': Input should be less than or "
     "equal to 4194304 (see radixcache record --help)"),  # was: ran on, 420 MB in 15 s
    (["record", "--out", "x.rcx", "--keyframe-every", "-5"],
     "radixcache record: error: Invalid value for '--keyframe-every': Input should be greater "
     "than or equal to 1 (see radixcache record --help)"),  # was: accepted
    (["soak", "--seconds", "nan"],
     "radixcache soak: error: Invalid value for '--seconds': Input should be less than or "
     "equal to 604800 (see radixcache soak --help)"),  # was: a soak of nan seconds, exit 0
    (["tree", "x.rcx", "--limit", "-1"],
     "radixcache tree: error: Invalid value for '--limit': Input should be greater than or "
     "equal to 0 (see radixcache tree --help)"),
    (["bench", "events", "--requests", "0"],
     "radixcache bench events: error: Invalid value for '--requests': Input should be greater "
     "than or equal to 1 (see radixcache bench events --help)"),  # was: no end in 20 s
    (["load", "--url", "http://127.0.0.1:9", "--rate", "nan"],
     "radixcache load: error: Invalid value for '--rate': Input should be greater than or "
     "equal to 0.01 (see radixcache load --help)"),  # was: no end in 20 s
    (["bench", "engine", "--requests", "-3"],
     "radixcache bench engine: error: Invalid value for '--requests': Input should be greater "
     "than or equal to 1 (see radixcache bench engine --help)"),  # was: accepted, exit 0
    (["bench", "engine", "--workload", "nope"],
     "radixcache bench engine: error: Invalid value for --workload: unknown workload 'nope' "
     "(known: chat, system, tot, fork, flood) (see radixcache bench engine --help)"),
    (["serve", "--http", "70000"],
     "radixcache serve: error: Invalid value for '--http': port 70000 is outside 0-65535 "
     "(see radixcache serve --help)"),
    (["serve", "--http", "::1:8000"],  # an IPv6 host needs its brackets
     "radixcache serve: error: Invalid value for '--http': expected PORT, HOST:PORT or "
     "[IPv6]:PORT, got '::1:8000' (see radixcache serve --help)"),
]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "cli.main", *argv], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("argv", "line"), CASES, ids=[" ".join(c[0][:2]) for c in CASES])
def test_a_usage_error_is_one_line_and_exit_2(argv: list[str], line: str) -> None:
    p = _run(argv)
    assert (p.returncode, p.stdout, p.stderr) == (2, "", line + "\n")


def test_help_and_no_command_still_print_the_help() -> None:
    help_ = _run(["whatif", "--help"])
    assert help_.returncode == 0 and help_.stderr == ""
    assert "Usage: radixcache whatif [OPTIONS] {SOURCE}" in help_.stdout
    bare = _run(["bench"])
    assert bare.returncode == 2 and "Usage: radixcache bench [OPTIONS] COMMAND" in bare.stdout


def test_every_command_answers_an_unknown_option_in_one_line() -> None:
    """Each command's own context names it (the path and the hint), whichever it is."""
    load_all()
    group = app_command()
    root = click.Context(group, info_name="radixcache")
    for name in group.list_commands(root):
        cmd = group.get_command(root, name)
        assert cmd is not None
        ctx = click.Context(cmd, info_name=name, parent=root)
        err = NoSuchOption("--bogus", ctx=ctx)
        assert one_line(err) == (f"radixcache {name}: error: No such option: --bogus "
                                 f"(see radixcache {name} --help)")


def app_command() -> TyperGroup:
    from typer.main import get_command
    group = get_command(app)
    assert isinstance(group, TyperGroup)
    return group


def test_serve_says_why_it_cannot_bind_in_one_line_on_stderr() -> None:
    """A taken port, an address beyond loopback: one line on stderr, exit 2 (was: on stdout,
    wrapped at 80 columns, with the --allow-remote hint on a taken port too)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = _run(["serve", "--port", str(port), "--blocks", "64"])
    assert (p.returncode, p.stdout, p.stderr) == (
        2, "", f"error: cannot bind: Address already in use (addr='tcp://127.0.0.1:{port}')\n")
    p = _run(["serve", "--endpoint-host", "192.0.2.1", "--blocks", "64"])
    assert (p.returncode, p.stdout, p.stderr) == (
        2, "", "error: refusing to bind tcp://192.0.2.1:5557: only 127.0.0.1 or ipc:// unless "
               "explicitly allowed (pass --allow-remote to bind a non-loopback address)\n")


def test_the_block_bound_is_the_streams():
    """An engine with more blocks than subscribers accept would publish snapshots that every
    inspector refuses: the CLI's bound is the stream's."""
    from cli.bounds import MAX_BLOCKS
    from radixcache.wire.validate import MAX_NUM_BLOCKS

    assert MAX_BLOCKS == MAX_NUM_BLOCKS


def test_keys_over_existing_keys_is_one_line_on_stderr(tmp_path: Path) -> None:
    """Was: the refusal on stdout, wrapped at 80 columns."""
    assert _run(["keys", str(tmp_path)]).returncode == 0
    p = _run(["keys", str(tmp_path)])
    names = ", ".join(str(tmp_path / n) for n in ("server.key", "server.key_secret",
                                                   "client.key", "client.key_secret"))
    assert (p.returncode, p.stdout, p.stderr) == (
        2, "", f"error: refusing to overwrite existing keys: {names}\n")


def test_the_error_consoles_never_wrap_a_line() -> None:
    """serve's fault line and the cluster commands' errors: one line however long (Rich
    wrapped them at 80 columns when stderr was not a terminal)."""
    from cli import cmd_cluster, cmd_stream

    for console in (cmd_cluster.err_console, cmd_stream.err_console):
        with console.capture() as out:
            console.print("error: " + "word " * 40)
        assert out.get().count("\n") == 1
