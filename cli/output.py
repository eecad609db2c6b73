"""What the recording commands (`record`, `export`, `tree`) print with, and how they report
damage and CURVE keys: shared by ``cli.cmd_recordings`` and ``cli.cmd_tree``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from cli.app import CliError

if TYPE_CHECKING:  # ZeroMQ and its asyncio parts: imported by the commands that connect
    from radixcache.wire.recording import Damage
    from radixcache.wire.security import ClientCurve

# piped (not a terminal), lines are never wrapped at Rich's default 80 columns: a node's line
# stays one line for grep and for whatever reads it
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 100_000)


def client_curve(directory: Path | None) -> ClientCurve | None:
    """The CURVE client keys in ``directory`` (None: no encryption); bad keys are one line."""
    if directory is None:
        return None
    from radixcache.wire.security import ClientCurve, CurveError

    try:
        return ClientCurve.load(directory)
    except CurveError as exc:
        raise CliError(str(exc)) from None


def warn(line: str) -> None:
    """One line on stderr (never wrapped: a path or an offset stays greppable)."""
    typer.echo(line, err=True)


def stopped(damage: Damage | None) -> None:
    """Say where a damaged file stopped being read (nothing when it was whole)."""
    if damage is not None:
        warn(f"warning: stopped at byte {damage.offset:,}: {damage.reason}")
