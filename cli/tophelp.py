"""``radixcache --help`` printed from ``cli.table`` without importing Typer.

Typer renders a group's help through ``typer.rich_utils``, whose import pulls in Rich's
Markdown (markdown-it, Pygments) and traceback (attrs) modules that a help screen in "rich"
markup mode never uses: with Typer itself that was 0.3-0.5 s for the root help, against a
0.25 s target. This module builds the same Rich renderables (usage, help text, the options
panel, one panel per help panel of the table, the epilog) on a Console made as Typer makes
it, so the output is the same bytes; ``tests/test_tophelp.py`` compares the two outputs, plain
and in colour, at several widths. Only the root's ``--help``/``-h`` comes here: every other
help, and ``radixcache`` with no arguments, is Typer's.
"""

from __future__ import annotations

import inspect
import os

from rich.align import Align
from rich.columns import Columns
from rich.console import Console, Group
from rich.highlighter import RegexHighlighter
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.theme import Theme

from cli.table import BENCH_HELP, BENCH_PANEL, COMMANDS, ROOT_EPILOG, ROOT_HELP, VERSION_HELP

USAGE = "Usage: radixcache [OPTIONS] COMMAND [ARGS]..."
# the root's options as Typer lists them: (long, short, help); --install-completion and
# --show-completion are Typer's own, with its words
OPTIONS = (
    ("--version", "", VERSION_HELP),
    ("--install-completion", "", "Install completion for the current shell."),
    ("--show-completion", "",
     "Show completion for the current shell, to copy it or customize the installation."),
    ("--help", "-h", "Show this message and exit."),
)
THEME = {"option": "bold cyan", "switch": "bold green", "negative_option": "bold magenta",
         "negative_switch": "bold red", "types": "bold yellow", "types_sep": "dim",
         "usage": "yellow"}


class _Options(RegexHighlighter):
    """Typer's ``OptionHighlighter``."""

    highlights = [  # noqa: RUF012 (Rich's class attribute)
        r"(^|\W)(?P<switch>\-\w+)(?![a-zA-Z0-9])",
        r"(^|\W)(?P<option>\-\-[\w\-]+)(?![a-zA-Z0-9])",
        r"(?P<types>\<[^\>]+\>)",
        r"(?P<usage>Usage: )",
    ]


class _Types(RegexHighlighter):
    """Typer's ``TypesHighlighter``."""

    highlights = [  # noqa: RUF012 (Rich's class attribute)
        r"^(?P<types_sep>(\[|<))",
        r"(?P<types_sep>\|)",
        r"(?P<types_sep>(\]|>))(\.\.\.)?$",
    ]


OPTION_HL, TYPES_HL = _Options(), _Types()


def console() -> Console:
    """A Console made as Typer's help makes it (its environment variables included)."""
    force: bool | None = True if (os.getenv("GITHUB_ACTIONS") or os.getenv("FORCE_COLOR")
                                  or os.getenv("PY_COLORS")) else None
    if os.getenv("_TYPER_FORCE_DISABLE_TERMINAL"):
        force = False
    width = os.getenv("TERMINAL_WIDTH")
    return Console(theme=Theme(THEME), highlighter=OPTION_HL, color_system="auto",
                   force_terminal=force, width=int(width) if width else None)


def _markup(text: str, style: str = "") -> Text:
    return OPTION_HL(Text.from_markup(inspect.cleandoc(text), style=style))


def _help_text() -> Group:
    first, *rest = inspect.cleandoc(ROOT_HELP).split("\n\n")
    parts = [_markup(first.replace("\n", " ").strip())]
    if rest:
        parts += [Text(""), _markup("\n\n".join(rest), style="dim")]
    return Group(*parts)


def _options_panel() -> Panel:
    table = Table(highlight=True, show_header=False, expand=True, box=None, show_lines=False,
                  leading=0, border_style=None, row_styles=None, pad_edge=False,
                  padding=(0, 1))
    for long, short, text in OPTIONS:
        table.add_row(OPTION_HL(long), OPTION_HL(short), OPTION_HL(""), OPTION_HL(""),
                      TYPES_HL(Text("<bool>", style="bold yellow", overflow="fold")),
                      Columns([_markup(text)]))
    return Panel(table, border_style="dim", title="Options", title_align="left")


def _panels() -> dict[str, list[tuple[str, str]]]:
    """Each help panel's (command, summary) rows, panels in the order Typer prints them."""
    rows = [(path, panel, summary) for path, (_, panel, summary) in COMMANDS.items()
            if " " not in path]
    rows.append(("bench", BENCH_PANEL, BENCH_HELP))
    panels: dict[str, list[tuple[str, str]]] = {"Commands": []}
    for name, panel, summary in rows:
        panels.setdefault(panel or "Commands", []).append((name, summary))
    return panels


def _commands_panel(title: str, rows: list[tuple[str, str]], width: int) -> Panel:
    table = Table(highlight=False, show_header=False, expand=True, box=None, show_lines=False,
                  leading=0, border_style=None, row_styles=None, pad_edge=False,
                  padding=(0, 1))
    table.add_column(style="bold cyan", no_wrap=True, width=width)
    table.add_column("Description", justify="left", no_wrap=False, ratio=10)
    for name, summary in rows:
        table.add_row(Text(name), _markup(inspect.cleandoc(summary).split("\n\n")[0].strip()))
    return Panel(table, border_style="dim", title=title, title_align="left")


def print_root_help() -> None:
    """Print ``radixcache --help`` as Typer would, to standard output."""
    out = console()
    out.print(Padding(OPTION_HL(USAGE), 1), style="bold")
    out.print(Padding(Align(_help_text(), pad=False), (0, 1, 1, 1)))
    out.print(_options_panel())
    panels = _panels()
    width = max(len(name) for rows in panels.values() for name, _ in rows)
    for title, rows in panels.items():
        if rows:
            out.print(_commands_panel(title, rows, width))
    out.print(Padding(Align(_markup(ROOT_EPILOG), pad=False), 1))
    print()  # Click then echoes the (empty) help its formatter was given
