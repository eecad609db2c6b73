"""Entry point of the `radixcache` console script. A command's module is imported when the
command runs (``cli.lazy``): `radixcache --help` imports none of them.

Exit codes: 0 ok; 1 a runtime error, printed as one line ``error: <reason>`` on stderr
(``RADIXCACHE_DEBUG=1`` re-raises it with its traceback); 2 a usage error, one line
``radixcache CMD: error: <problem>`` (``cli.usage``).

Standard output that cannot be written (a full disk, ``> /dev/full``, a pipe whose reader has
gone, a closed descriptor) is a runtime error of every command alike: while a command runs,
``sys.stdout`` is a ``GuardedStdout`` that raises ``StdoutLost`` for any failed write or flush,
whoever writes (``print``, ``typer.echo``, Rich); ``main`` flushes it before it exits, prints
``error: cannot write to standard output: <reason>`` and exits 1. ``StdoutLost`` is not an
``OSError``, so neither Click's silent exit on ``EPIPE`` nor a command's handler for the files
it writes takes it for something else. Then, as the Python documentation's note on SIGPIPE
does, /dev/null is put on descriptor 1, so the interpreter's own flush at exit of what stayed
in the buffer neither fails nor prints a second traceback.

Importing this must not import torch (tests/test_cli_version.py checks it), and the command
modules import the engine, model and pool inside the commands that use them, so a command's
own ``--help`` starts fast too. ``radixcache --help`` does not even import Typer: it is
printed from the command table (``cli.tophelp``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO, cast

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
    from radixcache.core.files import FileRefused, WriteFailed
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
            ServiceError, WorkloadError, CurveError, EndpointError, DemoError, InvalidTokens,
            FileRefused, WriteFailed)


def reason(exc: BaseException) -> str:
    """One line saying what went wrong: the message's first line, else the error's type."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class StdoutLost(Exception):
    """Standard output could not be written; ``reason`` says why (``strerror``)."""

    def __init__(self, reason: str, *, to_process_stdout: bool) -> None:
        super().__init__(f"cannot write to standard output: {reason}")
        self.to_process_stdout = to_process_stdout  # fd 1 itself, not a test's capture


class GuardedStdout:
    """``sys.stdout`` while a command runs: the real stream's writes and flushes, an
    ``OSError`` of either raised as ``StdoutLost`` (and ``None``, a descriptor 1 closed when
    the process started, as one that fails every write of something). Everything else is
    the real stream's."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self._process = stream is not None and stream is sys.__stdout__

    def _lost(self, exc: OSError | None) -> StdoutLost:
        why = "the descriptor is closed" if exc is None else (exc.strerror or str(exc))
        if exc is not None and exc.errno == errno.EPIPE:
            why += " (its reader has gone)"
        return StdoutLost(why, to_process_stdout=self._process)

    def write(self, text: str) -> int:
        if self.stream is None:
            if text:
                raise self._lost(None)
            return 0
        try:
            return self.stream.write(text)
        except OSError as exc:
            raise self._lost(exc) from None

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.stream is not None:
            try:
                self.stream.flush()
            except OSError as exc:
                raise self._lost(exc) from None

    def isatty(self) -> bool:
        return self.stream is not None and self.stream.isatty()

    @property
    def encoding(self) -> str:
        return "utf-8" if self.stream is None else self.stream.encoding

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


def _stdout_lost(exc: StdoutLost, *, said: bool = False) -> int:
    """Exit status 1 for a standard output that failed, said in one line on stderr (unless
    an error line was printed already); /dev/null goes on descriptor 1 so that the
    interpreter's exit flush of the rest of the buffer succeeds."""
    if not said:
        # stderr gone too: the status says it
        with contextlib.suppress(OSError, ValueError, AttributeError):
            print(f"error: {exc}", file=sys.stderr)
    if exc.to_process_stdout:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
            os.close(devnull)
        except OSError:
            pass
    return 1


def _flushed(code: int, *, said: bool = False) -> int:
    """``code`` after standard output is flushed; 1 if the flush fails (``_stdout_lost``)."""
    try:
        sys.stdout.flush()
    except StdoutLost as exc:
        return _stdout_lost(exc, said=said)
    return code


def _run(argv: list[str] | None) -> int:
    """The command's exit status, every output flushed; a runtime error or a failed
    standard output printed as one line on stderr (status 1)."""
    try:
        if (sys.argv[1:] if argv is None else argv) in (["--help"], ["-h"]):
            from cli.tophelp import print_root_help

            print_root_help()
            return _flushed(0)
        from cli.app import app
        from cli.usage import run_command_line

        return _flushed(run_command_line(app, argv))
    except StdoutLost as exc:
        return _stdout_lost(exc)
    except SystemExit as exc:  # a command that exits itself: its output is flushed too
        if exc.code is not None and not isinstance(exc.code, int):
            raise
        return _flushed(exc.code or 0)
    except Exception as exc:
        if not isinstance(exc, runtime_errors()) or os.environ.get("RADIXCACHE_DEBUG") == "1":
            raise
        print(f"error: {reason(exc)}", file=sys.stderr)
        return _flushed(1, said=True)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``); always ends in ``SystemExit``."""
    real = sys.stdout
    sys.stdout = cast(TextIO, GuardedStdout(real))
    try:
        code = _run(argv)
    finally:
        sys.stdout = real
    sys.exit(code)


if __name__ == "__main__":
    main()
