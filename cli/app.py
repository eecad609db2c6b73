"""The Typer application objects that every command module registers on, and the help layout.

A command module registers with ``@app.command()`` / ``@bench_app.command("name")`` and is
imported by one line in ``cli/main.py``; ``main.py`` then calls ``finish_help()``, which puts
every command in its help panel (``PANELS``) and gives an example to any command whose own
help lacks one (``EXAMPLES``). Write "Example:" in your command's docstring to own it.

Exit codes: 0 ok, 1 runtime error (one line ``error: <reason>`` on stderr, see ``cli.main``),
2 usage error (Click's default).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import typer
from typer.models import DefaultPlaceholder

from cli.lazy import BenchCommands, LazyGroup, RootCommands, command_name
from cli.table import BENCH_HELP, BENCH_PANEL, ROOT_EPILOG, ROOT_HELP, VERSION_HELP
from radixcache import __version__

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    name="radixcache",
    help=ROOT_HELP,
    epilog=ROOT_EPILOG,
    context_settings=HELP_OPTIONS,
    rich_markup_mode="rich",
    no_args_is_help=True,
    cls=RootCommands,
)
bench_app = typer.Typer(
    help=BENCH_HELP,
    epilog="[bold]Example:[/]  radixcache bench cli --json",
    context_settings=HELP_OPTIONS,
    no_args_is_help=True,
    rich_markup_mode="rich",
    cls=BenchCommands,
)
RootCommands.typer_app, BenchCommands.typer_app = app, bench_app
app.add_typer(bench_app, name="bench", rich_help_panel=BENCH_PANEL)

RUN, INSPECT, DATA, BENCH, DIAG = "Run", "Inspect", "Data", BENCH_PANEL, "Diagnostics"
PANEL_ORDER = (RUN, INSPECT, DATA, DIAG)  # command panels; the bench group's panel comes last

PANELS: Mapping[str, str] = MappingProxyType({
    "demo": RUN, "serve": RUN,
    "inspect": INSPECT, "replay": INSPECT, "tree": INSPECT, "screenshot": INSPECT,
    "record": DATA, "export": DATA,
    "doctor": DIAG, "soak": DIAG,
})
"""Help panel of each top-level command, by name; a command not listed goes to "Commands"."""

EXAMPLES: Mapping[str, str] = MappingProxyType({
    "serve": "radixcache serve --workload chat   (then: radixcache inspect tcp://127.0.0.1:5557)",
    "record": "radixcache record --workload chat --requests 200 --out chat.rcx",
    "export": "radixcache export chat.rcx --format perfetto --out chat.json",
    "tree": "radixcache tree chat.rcx --limit 50",
    "doctor": "radixcache doctor --json",
    "bench events": "radixcache bench events --requests 2000 --late-join-nodes 10000",
    "bench engine": "radixcache bench engine --workload system --requests 200",
    "bench tree": "radixcache bench tree --limit 5000 --capacity 50000",
    "soak": "radixcache soak --seconds 30",
})
"""Fallback examples for commands whose own help has none, by command path."""


class CliError(Exception):
    """A runtime failure to report to the user as one line ``error: <message>``, exit code 1."""


def _version(value: bool) -> None:
    if value:
        typer.echo(f"radixcache {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help=VERSION_HELP
    ),
) -> None:
    """radixcache: see and steer a radix KV cache."""


def _given(value: str | DefaultPlaceholder | None) -> str | None:
    """A setting as given to ``app.command(...)``; None when left at Typer's default."""
    return None if isinstance(value, DefaultPlaceholder) else value


def help_text(info: typer.models.CommandInfo) -> str:
    """Everything ``--help`` shows of a command besides its options: help and epilog."""
    doc = _given(info.help) or (info.callback.__doc__ if info.callback is not None else None)
    return (doc or "") + "\n" + (_given(info.epilog) or "")


def _finish(commands: list[typer.models.CommandInfo], prefix: str) -> None:
    for info in commands:
        name = command_name(info)
        if not prefix and _given(info.rich_help_panel) is None and name in PANELS:
            info.rich_help_panel = PANELS[name]
        example = EXAMPLES.get(prefix + name)
        if example is not None and "Example" not in help_text(info):
            epilog = _given(info.epilog)
            info.epilog = f"[bold]Example:[/]  {example}" + (f"\n\n{epilog}" if epilog else "")


def _panel_rank(info: typer.models.CommandInfo) -> int:
    panel = _given(info.rich_help_panel)
    return PANEL_ORDER.index(panel) if panel in PANEL_ORDER else len(PANEL_ORDER)


def finish_help() -> None:
    """Put every registered command in its panel (unless it chose one) and add the fallback
    example to each command whose help has no "Example". Call once all modules are imported;
    calling it again changes nothing."""
    _finish(app.registered_commands, "")
    app.registered_commands.sort(key=_panel_rank)  # stable: keeps registration order in a panel
    _finish(bench_app.registered_commands, "bench ")


LazyGroup.finish = staticmethod(finish_help)
