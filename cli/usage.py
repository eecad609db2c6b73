"""How Click's own errors reach the user: one line on stderr, never Typer's boxed panel.

Typer prints a usage error as a usage line, a hint and a bordered multi-line box. A user (or
a script reading stderr) gets one line instead, naming the command and the problem::

    radixcache whatif: error: Invalid value for '--pool-blocks': ... (see radixcache whatif --help)

Exit 2 for a usage error (bad value, missing argument, unknown option or command), Click's
own code for its other errors (a file it could not open: 1). ``--help`` is untouched, and a
group called with no command still prints its help (exit 2, as Click does).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer
from typer import _click as click  # the Click that Typer vendors: its errors are these
from typer._click.exceptions import NoArgsIsHelpError


def one_line(exc: click.ClickException) -> str:
    """``<command path>: error: <message>``, with a hint to the command's help when it has one;
    the message's line breaks and runs of spaces become single spaces."""
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if isinstance(ctx, click.Context) else "radixcache"
    line = f"{path}: error: {' '.join(exc.format_message().split())}"
    if isinstance(ctx, click.Context) and ctx.command.get_help_option(ctx) is not None:
        names = ctx.help_option_names
        line += f" (see {path} {'--help' if '--help' in names else names[0]})"
    return line


def run_command_line(app: typer.Typer, argv: Sequence[str] | None) -> int:
    """Run ``app`` on ``argv`` and return the exit code; Click's errors are printed by
    ``one_line`` here, everything else propagates to the caller."""
    try:
        code = app(args=argv, prog_name="radixcache", standalone_mode=False)
    except NoArgsIsHelpError:
        return 2  # the help was printed when the error was made
    except click.ClickException as exc:
        print(one_line(exc), file=sys.stderr)
        return exc.exit_code
    except typer.Abort:  # a prompt ended by end of input
        print("Aborted!", file=sys.stderr)
        return 1
    # without standalone mode, Click returns the command's result, or the code of an Exit
    # (--help, --version, typer.Exit): commands return None
    return code if isinstance(code, int) else 0
