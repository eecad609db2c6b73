"""The recording writer: frames appended to a new file (the layout is in ``recording``)."""

from __future__ import annotations

import contextlib
import os
import time
import zlib
from pathlib import Path
from typing import BinaryIO

from radixcache.core import events as ev
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
    ``needs_keyframe``; ``close()`` writes the index and tail.

    Each frame goes to the file in one unbuffered write, so a write that fails (``ENOSPC``,
    ``EFBIG``) is known at the frame it hit: the file is cut back to the frame before, closed,
    and ``RecordingWriteError`` says how many events it holds (a reader scans a file without
    an index). Every write after that raises the same error."""

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
            self._f: BinaryIO = open(self.path, "wb", buffering=0)  # noqa: SIM115 - close()
        except OSError as exc:
            raise RecordingWriteError(f"{self.path}: {exc.strerror or exc}") from None
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

    def _write(self, data: bytes, lost: str) -> None:
        """All of ``data`` at the end of the file, or cut back and ``RecordingWriteError``."""
        if self.failed is not None:
            raise self.failed
        view = memoryview(data)
        try:
            while view:
                written = self._f.write(view)
                view = view[written or 0:]
        except OSError as exc:
            self._cut(exc, lost)
            assert self.failed is not None
            raise self.failed from None
        self._size += len(data)

    def _cut(self, exc: OSError, lost: str) -> None:
        """Cut the file back to its last whole frame and close it (best effort: on a full disk
        a truncate frees space, it needs none)."""
        with contextlib.suppress(OSError):
            self._f.truncate(self._size)
        with contextlib.suppress(OSError):
            self._f.close()
        holds = (f"the file holds the first {self.events:,} events{lost}"
                 if self._index else "nothing readable was written")
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
        """Write the keyframe index and the tail, and close the file. Raises
        ``RecordingWriteError`` when they cannot be written (the batches stay readable)."""
        if self._f.closed:
            return
        index = self._size
        try:
            self._frame(Kind.INDEX, ENC.encode(self._index), " (no index)")
            self._write(TAIL.pack(index, TAIL_MAGIC), " (no index)")
        except RecordingWriteError:
            if self._size > index:  # the index went in, its tail did not: drop both
                with contextlib.suppress(OSError):
                    os.truncate(self.path, index)
            raise
        self._f.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.failed is None:
            self.close()
