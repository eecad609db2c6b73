"""Files a user names: an input opened as a regular file of a bounded size, an output written
whole or not at all. Every file the project writes for a user (``export``, ``record``, ``whatif
--plot``, screenshots) goes through ``Output``; every input file it reads, through
``open_regular``.

Input: the file is opened with ``O_NONBLOCK`` (so a FIFO with no writer does not block the
open) and then checked on the open descriptor (so nothing can be swapped in between the check
and the read); a FIFO, a device such as /dev/zero (which never ends) or a directory is
refused, and so is a file over the caller's limit.

Output: a regular file (or a name not taken yet) is written beside itself in the same
directory, under a hidden temporary name, flushed to disk (``fsync``) and renamed over the
name: a reader sees the old file or the new one, never half of one, and a write that fails
(a full disk) removes the temporary file and leaves the old one as it was. A symbolic link is
followed: the file it points at is replaced and the link stays. A character device or a FIFO
(``/dev/null``, ``/dev/stdout``, a pipe another process reads) is a stream the user named on
purpose, as ``cp`` and ``tar -f`` take one: it is written into directly and never replaced
(a FIFO with no reader is refused rather than waited on). A name of one of this process's
descriptors (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``) is written
through that descriptor, whatever it is: ``--out /dev/stdout >> log`` appends to the log, as
the shell opened it, instead of the log being replaced. Anything else that exists (a
directory, a block device, a socket) is refused in one line.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO


class FileRefused(Exception):
    """A file that is not a regular file, or is over the limit; the message names it."""


class WriteFailed(Exception):
    """An output that could not be written whole; the message names it and says what was
    kept (nothing: the file there, if any, is unchanged)."""


def open_regular(path: Path, max_bytes: int) -> tuple[int, int]:
    """A read-only fd of ``path`` and its size. ``FileRefused`` if it is not a regular file or
    holds more than ``max_bytes``; an ``OSError`` of the open itself propagates (the caller
    words it)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path}: not a regular file")
        if st.st_size > max_bytes:
            raise FileRefused(f"{path}: {st.st_size:,} bytes exceeds the "
                              f"{max_bytes:,}-byte limit")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


class Kind(enum.Enum):
    """What an output's name is now: how it will be written."""

    NEW = "new"          # nothing there: created beside, renamed into place
    REGULAR = "regular"  # a regular file: replaced whole by the rename
    STREAM = "stream"    # a character device or a FIFO: written into, never replaced


def _what(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


_FD_NAME = re.compile(r"/dev/fd/(\d+)|/proc/self/fd/(\d+)")


def descriptor_named(path: Path) -> int | None:
    """The descriptor of this process that ``path`` names (``/dev/stdout`` is 1), or None."""
    name = os.path.normpath(path)
    if name in ("/dev/stdout", "/dev/stderr"):
        return 1 if name == "/dev/stdout" else 2
    m = _FD_NAME.fullmatch(name)
    return None if m is None else int(m.group(1) or m.group(2))


def output_kind(path: Path) -> Kind:
    """How ``path`` would be written, checked before any work; ``FileRefused`` (one line) for
    a name that must not be written over (a directory, a block device, a socket)."""
    if descriptor_named(path) is not None:
        return Kind.STREAM
    try:
        st = os.stat(path)  # follows a link: /dev/stdout is what it points at
    except FileNotFoundError:
        return Kind.NEW
    except OSError as exc:
        raise FileRefused(f"{path}: {exc.strerror or exc}") from None
    if stat.S_ISREG(st.st_mode):
        return Kind.REGULAR
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return Kind.STREAM
    raise FileRefused(f"{path}: {_what(st.st_mode)}; refusing to write over it")


def _open_stream(path: Path) -> int:
    """A write-only fd of a character device or FIFO, in blocking mode; a FIFO that no one
    reads is refused at once (``O_NONBLOCK`` makes that open fail with ``ENXIO``). A name of
    one of this process's descriptors is a duplicate of it (its offset, its ``O_APPEND``)."""
    try:
        named = descriptor_named(path)
        if named is not None:
            return os.dup(named)
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO with no reader
            raise FileRefused(f"{path}: a FIFO with no reader (start its reader first)") \
                from None
        raise WriteFailed(f"{path}: {exc.strerror or exc} (nothing written)") from None
    os.set_blocking(fd, True)
    return fd


def _create_beside(target: Path) -> tuple[int, Path]:
    """A new file in ``target``'s directory under a hidden name no one else holds, created
    with mode 0666 less the umask (as ``open`` would create ``target`` itself)."""
    for _ in range(100):
        temp = target.with_name(f".{target.name[:200]}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        return fd, temp
    raise FileExistsError(f"no free temporary name beside {target}")


class Output:
    """An output file named by a user, written whole or not at all (the module says how).

    Write to ``file``; ``commit()`` makes it the file at ``path``, ``discard()`` drops it; as
    a context manager, a block that ends normally commits and one that raises discards. Every
    failure is ``WriteFailed`` (or ``FileRefused`` at the start) with a one-line message.
    ``buffered=False`` gives an unbuffered file, whose every ``write`` reaches the file at
    once (a recording knows which frame a full disk stopped)."""

    def __init__(self, path: str | os.PathLike[str], *, buffered: bool = True) -> None:
        self.path = Path(path)
        self.kind = output_kind(self.path)
        self.temp: Path | None = None
        self._target = self.path
        if self.kind is Kind.STREAM:
            fd = _open_stream(self.path)
        else:
            self._target = Path(os.path.realpath(self.path))
            try:
                fd, self.temp = _create_beside(self._target)
            except OSError as exc:
                raise WriteFailed(self.failure(exc)) from None
            if self.kind is Kind.REGULAR:  # the replacement keeps the old file's mode
                try:
                    old = os.stat(self._target)
                    with contextlib.suppress(OSError):  # and its owner, where that is allowed
                        os.fchown(fd, old.st_uid, old.st_gid)
                    os.fchmod(fd, stat.S_IMODE(old.st_mode))
                except OSError as exc:
                    os.close(fd)
                    self._drop_temp()
                    raise WriteFailed(self.failure(exc)) from None
        self.file: BinaryIO = os.fdopen(fd, "wb", buffering=-1 if buffered else 0)

    def failure(self, exc: OSError) -> str:
        """The one line saying that writing this output failed with ``exc``."""
        if self.kind is Kind.STREAM:
            return f"{self.path}: {exc.strerror or exc}"
        kept = "; the file there is unchanged" if self.kind is Kind.REGULAR else ""
        return f"{self.path}: {exc.strerror or exc} (nothing written{kept})"

    def _drop_temp(self) -> None:
        if self.temp is not None:
            with contextlib.suppress(OSError):
                self.temp.unlink()
            self.temp = None

    def commit(self) -> None:
        """Flush, ``fsync`` and rename the file into place (a stream: flush and close).
        ``WriteFailed`` if any of it fails: the temporary file is removed."""
        try:
            self.file.flush()
            if self.temp is None:
                self.file.close()
                return
            os.fsync(self.file.fileno())
            self.file.close()
            if output_kind(self._target) is Kind.STREAM:  # swapped in since the start
                raise FileRefused(f"{self.path}: now a device or FIFO; refusing to replace it")
            os.replace(self.temp, self._target)
            self.temp = None
        except OSError as exc:
            self.discard()
            raise WriteFailed(self.failure(exc)) from None
        except BaseException:  # refused, or interrupted (Ctrl-C): no temporary file left
            self.discard()
            raise
        _sync_directory(self._target.parent)

    def discard(self) -> None:
        """Close and remove the temporary file (a stream: close it); never raises."""
        with contextlib.suppress(OSError):
            self.file.close()  # a buffered file's last flush may fail: it closes anyway
        self._drop_temp()

    def __enter__(self) -> Output:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def _sync_directory(directory: Path) -> None:
    """``fsync`` the directory so the rename itself is on disk (best effort: some
    filesystems refuse a directory's fsync)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_whole(path: str | os.PathLike[str], data: bytes) -> None:
    """``data`` as the file at ``path``, all or nothing (``Output``); interrupted (Ctrl-C
    included), the temporary file is removed."""
    write_with(path, lambda file: file.write(data))


def write_with(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """What ``write`` writes into its file as the file at ``path``, all or nothing
    (``Output``): an ``OSError`` of ``write`` is ``WriteFailed``; any other exception (Ctrl-C
    included) removes the temporary file and propagates."""
    out = Output(path)
    try:
        write(out.file)
    except OSError as exc:
        out.discard()
        raise WriteFailed(out.failure(exc)) from None
    except BaseException:
        out.discard()
        raise
    out.commit()
