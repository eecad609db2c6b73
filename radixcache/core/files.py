"""Opening an input file that a user named: a regular file of a bounded size, or a clear refusal.

The one rule behind recordings (``wire.recording``) and traces (``traffic.traces``): the file is
opened with ``O_NONBLOCK`` (so a FIFO with no writer does not block the open) and then checked
on the open descriptor (so nothing can be swapped in between the check and the read); a FIFO,
a device such as /dev/zero (which never ends) or a directory is refused, and so is a file over
the caller's limit.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class FileRefused(Exception):
    """A file that is not a regular file, or is over the limit; the message names it."""


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
