"""Record files: the batches of a stream with snapshot keyframes, readable up to any damage.

Layout (integers little-endian)::

    prelude   b"RADIXREC"  u16 format version  u16 reserved           12 bytes
    frame     u32 length | u8 kind | u32 crc32(kind byte + payload) | payload (length bytes)
              kind 1 header    RecordHeader (format, schema, engine, config, created)
              kind 2 batch     the Batch msgpack, exactly as on the wire
              kind 3 keyframe  Keyframe(seq, epoch, events_before, Snapshot)
              kind 4 index     [KeyframeRef(offset, seq, events_before), ...]
    tail      u64 offset of the index frame | b"RCXTAIL\\0"               16 bytes (on close)

The first frame after the header is a keyframe; another follows every ``keyframe_every``
events, so a reader seeks by loading the nearest keyframe and applying the batches after
it. A file without a tail (the writer died) is scanned instead. A reader stops at the first
frame that is cut short, fails its checksum, exceeds the size limit, does not decode or does
not fit the state before it, and reports that frame's byte offset and the reason in
``damage``. It reads frame by frame (``os.pread``, never more than one frame in memory, never
more than the file holds), refuses anything but a regular file (a FIFO would block, a device
never ends) and files over ``MAX_FILE_BYTES``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

from radixcache.core import events as ev
from radixcache.wire.mirror import Mirror, MirrorError
from radixcache.wire.recording_format import (
    FORMAT_VERSION,
    FRAME,
    MAGIC,
    MAX_FILE_BYTES,
    MAX_FRAME_BYTES,
    PRELUDE,
    TAIL,
    TAIL_MAGIC,
    Damage,
    Keyframe,
    KeyframeRef,
    Kind,
    Record,
    RecordHeader,
    RecordingError,
    RecordingWriteError,
)
from radixcache.wire.validate import Malformed, decode_batch

__all__ = [  # the format is recording_format's; its names are importable from here too
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_FILE_BYTES",
    "MAX_FRAME_BYTES",
    "TAIL_MAGIC",
    "Damage",
    "Keyframe",
    "KeyframeRef",
    "Kind",
    "Record",
    "RecordHeader",
    "RecordingError",
    "RecordingReader",
    "RecordingWriteError",
    "RecordingWriter",
    "mirror_snapshot",
]

_ENC = msgspec.msgpack.Encoder(enc_hook=ev.enc_hook)
_HEADER = msgspec.msgpack.Decoder(RecordHeader)
_KEYFRAME = msgspec.msgpack.Decoder(Keyframe)
_INDEX = msgspec.msgpack.Decoder(list[KeyframeRef])


def mirror_snapshot(mirror: Mirror) -> ev.Snapshot:
    """A ``Snapshot`` of a mirror's state (parents before children)."""
    nodes: list[ev.NodeState] = []
    stack = [mirror.root]
    while stack:
        n = stack.pop()
        nodes.append(ev.NodeState(n.id, n.parent.id if n.parent else -1, n.start, n.tokens,
                                  list(n.blocks), n.pins, n.clock))
        stack.extend(n.children.values())
    return ev.Snapshot(mirror.block_size, mirror.num_blocks, nodes, mirror.clock,
                       max(mirror.nodes) + 1, sorted(mirror.request_blocks),
                       mirror.high, mirror.low)


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
        self._frame(Kind.HEADER, _ENC.encode(header))

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
        offset = self._frame(Kind.KEYFRAME, _ENC.encode(frame))
        self._index.append(KeyframeRef(offset, seq, self.events))
        self._since_keyframe = 0

    def close(self) -> None:
        """Write the keyframe index and the tail, and close the file. Raises
        ``RecordingWriteError`` when they cannot be written (the batches stay readable)."""
        if self._f.closed:
            return
        index = self._size
        try:
            self._frame(Kind.INDEX, _ENC.encode(self._index), " (no index)")
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


class RecordingReader:
    """Reads a recording; raises ``RecordingError`` at once when it is not one.

    Iterating ``records()`` stops at the first damaged frame; ``damage`` then says where.
    """

    def __init__(self, path: str | os.PathLike[str], *,
                 max_bytes: int = MAX_FILE_BYTES) -> None:
        self.path = Path(path)
        self.damage: Damage | None = None
        self._fd = -1
        self._fd, self.size = _open_regular(self.path, max_bytes)
        try:
            self.header, self._first = self._read_prelude()
        except RecordingError:
            self.close()
            raise

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RecordingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _pread(self, n: int, offset: int) -> bytes:
        return os.pread(self._fd, n, offset)

    def _read_prelude(self) -> tuple[RecordHeader, int]:
        prelude = self._pread(PRELUDE.size, 0)
        if not prelude:
            raise RecordingError(f"{self.path}: empty file")
        if len(prelude) < PRELUDE.size or prelude[:8] != MAGIC:
            raise RecordingError(f"{self.path}: not a radixcache recording (bad magic)")
        _, version, _ = PRELUDE.unpack(prelude)
        if version > FORMAT_VERSION:
            raise RecordingError(
                f"{self.path}: format version {version} is newer than this reader "
                f"(reads up to {FORMAT_VERSION}); upgrade radixcache")
        frame = self._read_frame(PRELUDE.size)
        if isinstance(frame, Damage) or frame[0] != Kind.HEADER:
            raise RecordingError(f"{self.path}: unreadable header")
        try:
            return _HEADER.decode(frame[1]), frame[2]
        except msgspec.DecodeError as exc:
            raise RecordingError(f"{self.path}: bad header: {exc}") from None

    def _read_frame(self, offset: int) -> tuple[Kind, bytes, int] | Damage:
        """(kind, payload, next offset) or the damage at ``offset``."""
        head = self._pread(FRAME.size, offset)
        if len(head) < FRAME.size:
            return Damage(offset, "truncated frame header")
        length, kind, crc = FRAME.unpack(head)
        if length > MAX_FRAME_BYTES:
            return Damage(offset, f"frame length {length} exceeds the {MAX_FRAME_BYTES} limit")
        start = offset + FRAME.size
        if start + length > self.size:  # checked before reading: no allocation of `length`
            return Damage(offset, f"truncated frame: {length} bytes announced, "
                                  f"{self.size - start} present")
        payload = self._pread(length, start)
        if len(payload) != length:
            return Damage(offset, "file shrank while reading")
        if zlib.crc32(payload, zlib.crc32(bytes([kind]))) != crc:
            return Damage(offset, "checksum mismatch")
        if kind not in Kind.__members__.values():
            return Damage(offset, f"unknown frame kind {kind}")
        return Kind(kind), payload, start + length

    def records(self, start: int | None = None) -> Iterator[Record]:
        """Batches and keyframes in file order from byte ``start`` (default: the first)."""
        offset = self._first if start is None else start
        self.damage = None
        while offset < self.size:
            frame = self._read_frame(offset)
            if isinstance(frame, Damage):
                self.damage = frame
                return
            kind, payload, nxt = frame
            if kind == Kind.INDEX:
                return
            try:
                item = decode_batch(payload) if kind == Kind.BATCH else _KEYFRAME.decode(payload)
            except (msgspec.DecodeError, Malformed) as exc:
                self.damage = Damage(offset, f"undecodable {kind.name.lower()}: {exc}")
                return
            yield Record(offset, item)
            offset = nxt

    def keyframes(self) -> list[KeyframeRef]:
        """The keyframe index: from the tail when the file was closed, else by scanning."""
        if self.size >= TAIL.size + self._first:
            offset, magic = TAIL.unpack(self._pread(TAIL.size, self.size - TAIL.size))
            if magic == TAIL_MAGIC and offset < self.size:
                frame = self._read_frame(offset)
                if not isinstance(frame, Damage) and frame[0] == Kind.INDEX:
                    with contextlib.suppress(msgspec.DecodeError):
                        return _INDEX.decode(frame[1])
        return [KeyframeRef(r.offset, r.item.seq, r.item.events_before)
                for r in self.records() if isinstance(r.item, Keyframe)]

    def mirror_at(self, events: int) -> tuple[Mirror, int]:
        """A mirror after the first batch boundary at or past ``events`` recorded events (or
        the end, or the first damage: ``damage`` says where), starting from the nearest
        keyframe before it. A keyframe that does not continue the batches before it (the
        recorder resynced: an engine restart, a gap) is loaded, not skipped. Raises
        ``RecordingError`` when no keyframe before ``events`` can be read."""
        refs = [k for k in self.keyframes() if k.events_before <= events]
        mirror = Mirror()
        loaded = next((k for ref in reversed(refs)
                       if (k := self._load_keyframe(mirror, ref.offset)) is not None), None)
        if loaded is None:
            where = f" ({self.damage.reason} at byte {self.damage.offset})" if self.damage else ""
            raise RecordingError(f"{self.path}: no readable keyframe at or before event "
                                 f"{events}{where}")
        return mirror, self._play(mirror, refs[-1].offset, *loaded, events)

    def play_all(self) -> tuple[Mirror, int]:
        """A mirror after every batch of the file, played from the first keyframe (every
        Digest event checked on the way; ``damage`` says where a batch did not fit). Returns
        (mirror, events applied); raises ``RecordingError`` when the first keyframe is bad."""
        mirror = Mirror()
        loaded = self._load_keyframe(mirror, self._first)
        if loaded is None:
            raise RecordingError(f"{self.path}: first keyframe unreadable "
                                 f"({self.damage.reason if self.damage else ''})")
        return mirror, self._play(mirror, self._first, *loaded, 2**62)

    def _load_keyframe(self, mirror: Mirror, offset: int) -> tuple[int, tuple[int, int]] | None:
        """Load the keyframe at ``offset``: (events before it, (epoch, seq)); None, and
        ``damage`` set, when it cannot be read or loaded."""
        frame = self._read_frame(offset)
        try:
            if isinstance(frame, Damage):
                raise RecordingError(frame.reason)
            if frame[0] != Kind.KEYFRAME:
                raise RecordingError("not a keyframe")
            k = _KEYFRAME.decode(frame[1])
            mirror.load_snapshot(k.snapshot)
        except (RecordingError, msgspec.DecodeError, Malformed) as exc:
            self.damage = Damage(offset, f"bad keyframe: {exc}")
            return None
        return k.events_before, (k.epoch, k.seq)

    def _play(self, mirror: Mirror, start: int, count: int, at: tuple[int, int],
              events: int) -> int:
        """Apply the batches after the keyframe at ``start`` until ``events``; returns the
        events applied in all. Stops with ``damage`` at a batch that does not fit."""
        damage: Damage | None = None
        for rec in self.records(start):
            item = rec.item
            if isinstance(item, Keyframe):
                if (item.epoch, item.seq) != at and rec.offset != start:
                    mirror.load_snapshot(item.snapshot)  # a resync: the state jumps here
                    at = (item.epoch, item.seq)
                continue
            if count >= events:
                break
            try:
                mirror.apply_batch(item)
            except MirrorError as exc:
                damage = Damage(rec.offset, f"batch seq {item.seq} does not fit: {exc}")
                break
            count += len(item.events)
            at = (item.epoch, item.seq)
        self.damage = damage or self.damage
        return count


def _open_regular(path: Path, max_bytes: int) -> tuple[int, int]:
    """An fd of a regular file of at most ``max_bytes``, and its size; ``RecordingError``
    otherwise (checked before opening: opening a FIFO blocks until a writer comes)."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise RecordingError(f"{path}: not a regular file")
        if st.st_size > max_bytes:
            raise RecordingError(f"{path}: {st.st_size:,} bytes exceeds the "
                                 f"{max_bytes:,}-byte limit")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise RecordingError(f"{path}: {exc.strerror or exc}") from None
    return fd, os.fstat(fd).st_size
