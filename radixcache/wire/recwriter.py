"""The recording writer: frames appended to a new file (the layout is in ``recording``).

The file is an ``Output`` (``core.files``): written beside its name and renamed into place when
it is closed, so a recording over an old one leaves the old one whole until the new one is;
a device or FIFO named by the user (``/dev/null``, a pipe) is written into and never replaced.
A process killed before the close leaves its frames in the hidden temporary file beside the
name (``.NAME.XXXXXXXX.tmp``), readable as a recording without an index."""

from __future__ import annotations

import contextlib
import os
import time
import zlib
from pathlib import Path
from typing import BinaryIO

from radixcache.core import events as ev
from radixcache.core.files import FileRefused, Output, WriteFailed
from radixcache.wire.recformat import (
    ENC,
    FORMAT_VERSION,
    FRAME,
    MAGIC,
    MAX_FRAME_BYTES,
    PRELUDE,
    TAIL,
    TAIL_MAGIC,
    CaptureNote,
    Keyframe,
    KeyframeRef,
    Kind,
    RecordHeader,
    RecordingWriteError,
)


class RecordingWriter:
    """Appends frames to a new file. Call ``write_keyframe`` first and whenever
    ``needs_keyframe``; ``close()`` writes the index and tail and puts the file in place.

    Each frame goes to the file in one unbuffered write, so a write that fails (``ENOSPC``,
    ``EFBIG``) is known at the frame it hit: the file is cut back to the frame before, put in
    place (or dropped, the old file kept, when no keyframe made it), and
    ``RecordingWriteError`` says how many events it holds (a reader scans a file without an
    index). Every write after that raises the same error."""

    def __init__(
        self, path: str | os.PathLike[str], config: dict[str, str | int | float], *,
        engine: str = "radixcache", keyframe_every: int = 50_000,
    ) -> None:
        self.path = Path(path)
        self.keyframe_every = keyframe_every
        self.events = 0
        self.batches = 0
        self._since_keyframe = 0
        self._index: list[KeyframeRef] = []
        self.failed: RecordingWriteError | None = None
        self._size = 0  # bytes of whole frames written
        try:
            self._out = Output(self.path, buffered=False)
        except (FileRefused, WriteFailed) as exc:
            raise RecordingWriteError(str(exc)) from None
        self._f: BinaryIO = self._out.file
        self._write(PRELUDE.pack(MAGIC, FORMAT_VERSION, 0), "")
        header = RecordHeader(FORMAT_VERSION, ev.SCHEMA_VERSION, engine, config, time.time())
        self._frame(Kind.HEADER, ENC.encode(header))

    def _frame(self, kind: Kind, payload: bytes, lost: str = "") -> int:
        if len(payload) > MAX_FRAME_BYTES:
            raise ValueError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME_BYTES}")
        offset = self._size
        crc = zlib.crc32(payload, zlib.crc32(bytes([kind])))
        self._write(FRAME.pack(len(payload), kind, crc) + payload, lost)
        return offset

    def _write(self, data: bytes, lost: str, cut_to: int | None = None) -> None:
        """All of ``data`` at the end of the file, or cut back (to ``cut_to``, default the
        whole frames written) and ``RecordingWriteError``."""
        if self.failed is not None:
            raise self.failed
        view = memoryview(data)
        try:
            while view:
                written = self._f.write(view)
                view = view[written or 0:]
        except OSError as exc:
            self._cut(exc, lost, self._size if cut_to is None else cut_to)
            assert self.failed is not None
            raise self.failed from None
        self._size += len(data)

    def _cut(self, exc: OSError, lost: str, size: int) -> None:
        """Cut the file back to ``size`` (its last whole frame; best effort: on a full disk a
        truncate frees space, it needs none) and put it in place when a keyframe made it,
        else drop it."""
        with contextlib.suppress(OSError):
            self._f.truncate(size)
        holds = (f"the file holds the first {self.events:,} events{lost}"
                 if self._index else "nothing readable was written")
        if self._index:
            try:
                self._out.commit()
            except (FileRefused, WriteFailed) as why:
                holds = f"nothing was kept ({why})"
        else:
            self._out.discard()
        self.failed = RecordingWriteError(f"{self.path}: {exc.strerror or exc}: {holds}")

    @property
    def needs_keyframe(self) -> bool:
        """True when ``keyframe_every`` events were written since the last keyframe."""
        return not self._index or self._since_keyframe >= self.keyframe_every

    def write_batch(self, batch: ev.Batch, encoded: bytes | None = None) -> None:
        """Append one batch (``encoded``: its wire bytes when the caller has them)."""
        self._frame(Kind.BATCH, encoded if encoded is not None else ev.encode_batch(batch))
        self.events += len(batch.events)
        self.batches += 1
        self._since_keyframe += len(batch.events)

    def write_keyframe(self, seq: int, epoch: int, snapshot: ev.Snapshot) -> None:
        """Append the full state valid after the batches written so far."""
        frame = Keyframe(seq, epoch, self.events, snapshot)
        offset = self._frame(Kind.KEYFRAME, ENC.encode(frame))
        self._index.append(KeyframeRef(offset, seq, self.events))
        self._since_keyframe = 0

    def write_note(self, note: CaptureNote) -> None:
        """Append what a live capture got and could not (read back by ``capture_note``)."""
        self._frame(Kind.NOTE, ENC.encode(note))

    def close(self) -> None:
        """Write the keyframe index and the tail, close the file and put it in place. Raises
        ``RecordingWriteError`` when they cannot be written (the batches stay readable) or
        the file cannot be put in place (nothing is kept)."""
        if self._f.closed:
            return
        index = self._size
        self._frame(Kind.INDEX, ENC.encode(self._index), " (no index)")
        # the index went in and its tail did not: both are cut
        self._write(TAIL.pack(index, TAIL_MAGIC), " (no index)", cut_to=index)
        try:
            self._out.commit()
        except (FileRefused, WriteFailed) as exc:
            self.failed = RecordingWriteError(str(exc))
            raise self.failed from None

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.failed is None:
            self.close()
