"""The key map: one table that the help screen shows and the README repeats (a test compares
the README's table, this table and the widgets' bindings)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from inspector.panes import PANES, Pane, help_row
from inspector.words import help_lines, main_words


class Key(NamedTuple):
    """One row of the key map: what to press (as shown), the binding keys, what it does."""

    shown: str
    keys: tuple[str, ...]
    does: str


_BEFORE: tuple[Key, ...] = (
    Key("`?`", ("question_mark",), "help (esc closes it)"),
    Key("`:` `/`", ("colon", "slash"), "focus the command line"),
    Key("`esc`", ("escape",), "back to the tree"),
    Key("`↑` `↓` `j` `k`", ("up", "down", "j", "k"), "move the selection in the tree"),
    Key("`pgup` `pgdn` `home` `end`", ("pageup", "pagedown", "home", "end"), "move by pages"),
    Key("`enter` `space`", ("enter", "space"), "fold or unfold the selected node"),
    Key("`←` `→` `h` `l`", ("left", "right", "h", "l"), "collapse / expand the selected node"),
)
_AFTER: tuple[Key, ...] = (
    Key("`ctrl+←` `ctrl+→`", ("ctrl+left", "ctrl+right"), "narrow / widen the tree pane"),
    Key("`z`", ("z",), "block map: whole pool at a glance / one cell per block"),
    Key("`w`", ("w",), "what-if: the hit-rate curve of all the engine did since the "
        "inspector joined (a replay: up to its position)"),
    Key("`e`", ("e",), "event log: focus it; `↑` `↓` select, `enter` on a request: why it "
        "missed, `end` follows again"),
    Key("`p`", ("p",), "replay: play / pause"),
    Key("`.` `,`", ("full_stop", "comma"), "replay: step forward / back one batch"),
    Key("`>` `<`", ("greater_than_sign", "less_than_sign"), "replay: next / previous keyframe"),
    Key("`]` `[`", ("right_square_bracket", "left_square_bracket"), "replay: faster / slower"),
    Key("`ctrl+p`", ("ctrl+p",), "command palette"),
    Key("`q`", ("q",), "quit (outside the command line)"),
)


def key_map(panes: Sequence[Pane] = PANES) -> tuple[Key, ...]:
    """The key map of a main screen with ``panes`` (their keys: one row)."""
    return (*_BEFORE, Key(*help_row(panes)), *_AFTER)


KEYS = key_map()


def key_table(keys: Sequence[Key] = KEYS) -> str:
    """The key map as the Markdown table the README carries."""
    lines = ["| key | what it does |", "| --- | --- |"]
    lines += [f"| {k.shown} | {k.does} |" for k in keys]
    return "\n".join(lines)


def _commands_text() -> str:
    return ("[b]Commands[/b] (after :): " + "\n  ".join(help_lines(main_words())) + "\n"
            "  tab completes, ↑ ↓ history; a wrong command is explained and not sent\n\n"
            "Press esc to close (↑ ↓ scroll when the screen is short).")


def help_text(keys: Sequence[Key] = KEYS) -> str:
    """The help screen's text: the key map, then the command line's words (the README's
    Markdown backticks left out: the screen shows them as they are)."""
    width = max(len(k.shown.replace("`", "")) for k in keys) + 2
    rows = "\n".join(f"  {k.shown.replace('`', ''):<{width}}{k.does.replace('`', '')}"
                     for k in keys)
    return ("[b]radixcache inspector[/b]\n\n" + rows.replace("[", r"\[") + "\n\n"
            + _commands_text())


def help_renderable(keys: Sequence[Key] = KEYS) -> Group:
    """``help_text`` as the screen draws it: the keys in a grid, so a long line wraps under
    its own column, not under the keys."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for k in keys:
        grid.add_row("  " + k.shown.replace("`", ""), k.does.replace("`", ""))
    return Group(Text.from_markup("[b]radixcache inspector[/b]\n"), grid, Text(),
                 Text.from_markup(_commands_text()))


class HelpScreen(ModalScreen[None]):
    """The key map over the main screen; it scrolls where the terminal is shorter than it
    (80x24 shows 18 of its 27 lines, the rest one key away)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, keys: Sequence[Key] = KEYS) -> None:
        super().__init__()
        self.key_rows = keys

    def compose(self) -> ComposeResult:
        """One framed, scrollable text."""
        with VerticalScroll(id="help"):
            yield Static(help_renderable(self.key_rows))

    def on_mount(self) -> None:
        """The arrows and page keys scroll it."""
        self.query_one("#help").focus()
