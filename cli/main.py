"""Entry point of the `radixcache` console script. A command's module is imported when the
command runs (``cli.lazy``): `radixcache --help` imports none of them.

Exit codes: 0 ok; 1 a runtime error, printed as one line ``error: <reason>`` on stderr
(``RADIXCACHE_DEBUG=1`` re-raises it with its traceback); 2 a usage error, one line
``radixcache CMD: error: <problem>`` (``cli.usage``).

Importing this must not import torch (tests/test_cli_version.py checks it), and the command
modules import the engine, model and pool inside the commands that use them, so a command's
own ``--help`` starts fast too. ``radixcache --help`` does not even import Typer: it is
printed from the command table (``cli.tophelp``).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cli.app import app as app


def __getattr__(name: str) -> object:
    """``cli.main.app``, the Typer app, imported on first use (``radixcache --help`` prints
    without Typer, so this module does not import it)."""
    if name == "app":
        from cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def runtime_errors() -> tuple[type[BaseException], ...]:
    """Failures a user can cause (a bad file, a busy port, a dataset not installed, a bad
    value): reported in one line. Anything else is a bug and keeps its traceback. Only the
    project's own error types: a ValueError or OSError that reaches here was not expected by
    the command that raised it, so it is a bug and shows its traceback. Imported only when
    something failed (the command that raised one has imported its module already)."""
    from cli.app import CliError
    from radixcache.core.blocks import PoolError
    from radixcache.core.tokens import InvalidTokens
    from radixcache.core.tree import TreeError
    from radixcache.serving.service import ServiceError
    from radixcache.tools.demo import DemoError
    from radixcache.traffic.sharegpt import DatasetUnavailable
    from radixcache.traffic.workloads import WorkloadError
    from radixcache.wire.endpoints import EndpointError
    from radixcache.wire.mirror import MirrorError
    from radixcache.wire.recording import RecordingError
    from radixcache.wire.security import CurveError

    return (CliError, TreeError, PoolError, DatasetUnavailable, RecordingError, MirrorError,
            ServiceError, WorkloadError, CurveError, EndpointError, DemoError, InvalidTokens)


def reason(exc: BaseException) -> str:
    """One line saying what went wrong: the message's first line, else the error's type."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def main(argv: list[str] | None = None) -> None:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``); always ends in ``SystemExit``."""
    if (sys.argv[1:] if argv is None else argv) in (["--help"], ["-h"]):
        from cli.tophelp import print_root_help

        print_root_help()
        sys.exit(0)
    from cli.app import app
    from cli.usage import run_command_line

    try:
        code = run_command_line(app, argv)
    except Exception as exc:
        if not isinstance(exc, runtime_errors()) or os.environ.get("RADIXCACHE_DEBUG") == "1":
            raise
        print(f"error: {reason(exc)}", file=sys.stderr)
        sys.exit(1)
    sys.exit(code)


if __name__ == "__main__":
    main()
