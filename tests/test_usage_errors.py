"""Every usage error of every command is one line on stderr naming the command and the
problem, exit 2, through the real console entry point (``python -m cli.main`` in a fresh
process), never Typer's boxed multi-line panel."""

from __future__ import annotations

import os
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
    (["serve", "--http", "70000"],
     "radixcache serve: error: Invalid value for '--http': Input should be less than or equal "
     "to 65535 (see radixcache serve --help)"),
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
