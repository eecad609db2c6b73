"""Commands imported only when they run: ``radixcache --help`` lists them from ``COMMANDS``.

Every command module imports what its commands need (numpy, ZeroMQ, the engine's modules,
Textual): importing all of them for ``--help`` took 0.55 s on a quiet machine. A
``LazyGroup`` lists the table's commands with their summaries and imports a command's module
when the command is resolved (run, or asked for its own ``--help``). ``tests/test_cli.py``
checks the table against what the modules register (``load_all``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import ClassVar

import typer
from typer import _click as click  # the Click that Typer vendors: its groups hold these
from typer.core import TyperCommand, TyperGroup

from cli.table import COMMANDS

__all__ = ["COMMANDS", "BenchCommands", "LazyGroup", "RootCommands", "command_name",
           "load_all"]


def load_all() -> None:
    """Import every command module (tests, and anything that walks the whole command tree)."""
    for module, _, _ in COMMANDS.values():
        importlib.import_module(module)
    LazyGroup.finish()


def command_name(info: typer.models.CommandInfo) -> str:
    """The name a registered command is invoked by (Typer derives it from the function)."""
    if info.name:
        return info.name
    assert info.callback is not None
    return info.callback.__name__.lower().replace("_", "-")


class LazyGroup(TyperGroup):
    """A Typer group whose commands come from ``COMMANDS`` (those under ``prefix``): listed
    from the table, imported when resolved. Commands already registered when the group was
    built are used as they are."""

    prefix: ClassVar[str] = ""
    # set by ``cli.app`` once the apps exist: the Typer app commands register on, and what
    # finishes a command's help once registered (its panel, its example)
    typer_app: ClassVar[typer.Typer | None] = None
    finish: ClassVar[Callable[[], None]] = staticmethod(lambda: None)

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command of the table under this group, and the registered ones."""
        names = [p[len(self.prefix):] for p in COMMANDS if p.startswith(self.prefix)]
        names = [n for n in names if " " not in n]
        return list(dict.fromkeys([*names, *super().list_commands(ctx)]))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """A registered command, else a stand-in with the table's summary (for listings)."""
        found = super().get_command(ctx, cmd_name)
        entry = COMMANDS.get(self.prefix + cmd_name)
        if found is not None or entry is None:
            return found
        return TyperCommand(cmd_name, help=entry[2], rich_help_panel=entry[1] or None)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[
            str | None, click.Command | None, list[str]]:
        """Import the command's module first, so the real command runs."""
        if args and self.prefix + args[0] in COMMANDS and args[0] not in self.commands:
            self._load(args[0])
        return super().resolve_command(ctx, args)

    def _load(self, name: str) -> None:
        importlib.import_module(COMMANDS[self.prefix + name][0])
        LazyGroup.finish()
        assert self.typer_app is not None
        for info in self.typer_app.registered_commands:
            if command_name(info) == name:
                self.commands[name] = typer.main.get_command_from_info(
                    info, pretty_exceptions_short=self.typer_app.pretty_exceptions_short,
                    rich_markup_mode=self.typer_app.rich_markup_mode)


class RootCommands(LazyGroup):
    """``radixcache``'s commands."""


class BenchCommands(LazyGroup):
    """``radixcache bench``'s commands."""

    prefix = "bench "
