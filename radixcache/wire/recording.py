"""Record files: the batches of a stream with snapshot keyframes, readable up to any damage.

Layout (integers little-endian)::

    prelude   b"RADIXREC"  u16 format version  u16 reserved           12 bytes
    frame     u32 length | u8 kind | u32 crc32(kind byte + payload) | payload (length bytes)
              kind 1 header    RecordHeader (format, schema, engine, config, created)
              kind 2 batch     the Batch msgpack, exactly as on the wire
              kind 3 keyframe  Keyframe(seq, epoch, events_before, Snapshot)
              kind 4 index     [KeyframeRef(offset, seq, events_before), ...]
              kind 5 note      CaptureNote: what a live capture got and could not (format 2)
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
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import msgspec

from radixcache.core import events as ev
from radixcache.core.files import FileRefused, open_regular
from radixcache.wire.mirror import Mirror, MirrorError
from radixcache.wire.recformat import (
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
    RecordingError,
    RecordingWriteError,
)
from radixcache.wire.recwriter import RecordingWriter
from radixcache.wire.validate import Malformed, decode_batch

MAX_FILE_BYTES = 64 * 1024**3  # the reader refuses larger files (it streams; this bounds a scan)


class Damage(NamedTuple):
    """Where reading stopped and why."""

    offset: int
    reason: str


class Record(NamedTuple):
    """One batch or keyframe and the byte offset of its frame."""

    offset: int
    item: ev.Batch | Keyframe


_HEADER = msgspec.msgpack.Decoder(RecordHeader)
_KEYFRAME = msgspec.msgpack.Decoder(Keyframe)
_INDEX = msgspec.msgpack.Decoder(list[KeyframeRef])
_NOTE = msgspec.msgpack.Decoder(CaptureNote)


def mirror_snapshot(mirror: Mirror) -> ev.Snapshot:
    """A ``Snapshot`` of a mirror's state (parents before children)."""
    nodes: list[ev.NodeState] = []
    stack = [mirror.root]
    while stack:
        n = stack.pop()
        nodes.append(ev.NodeState(n.id, n.parent.id if n.parent else -1, n.start, n.tokens,
                                  list(n.blocks), n.pins, n.clock, n.older))
        stack.extend(n.children.values())
    return ev.Snapshot(mirror.block_size, mirror.num_blocks, nodes, mirror.clock,
                       max(mirror.nodes) + 1, sorted(mirror.request_blocks),
                       mirror.high, mirror.low)


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
        if version < 1:
            raise RecordingError(f"{self.path}: format version {version} is not one this reader "
                                 f"knows (1 to {FORMAT_VERSION})")
        if version > FORMAT_VERSION:
            raise RecordingError(
                f"{self.path}: format version {version} is newer than this reader "
                f"(reads up to {FORMAT_VERSION}); upgrade radixcache")
        frame = self._read_frame(PRELUDE.size)
        if isinstance(frame, Damage) or frame[0] != Kind.HEADER:
            raise RecordingError(f"{self.path}: unreadable header")
        try:
            header = _HEADER.decode(frame[1])
        except msgspec.DecodeError as exc:
            raise RecordingError(f"{self.path}: bad header: {exc}") from None
        if not 1 <= header.schema_version <= ev.SCHEMA_VERSION:
            newer = header.schema_version > ev.SCHEMA_VERSION
            raise RecordingError(
                f"{self.path}: event schema {header.schema_version} is "
                + (f"newer than this reader (reads 1 to {ev.SCHEMA_VERSION}); upgrade radixcache"
                   if newer else f"not one this reader knows (1 to {ev.SCHEMA_VERSION})"))
        return header, frame[2]

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
            if kind == Kind.NOTE:
                offset = nxt
                continue
            try:
                item = decode_batch(payload) if kind == Kind.BATCH else _KEYFRAME.decode(payload)
            except (msgspec.DecodeError, Malformed) as exc:
                self.damage = Damage(offset, f"undecodable {kind.name.lower()}: {exc}")
                return
            yield Record(offset, item)
            offset = nxt

    def capture_note(self) -> CaptureNote | None:
        """The note a live capture wrote before its index (None: none, or not readable)."""
        offset = self._first
        while offset < self.size:
            frame = self._read_frame(offset)
            if isinstance(frame, Damage) or frame[0] == Kind.INDEX:
                return None
            if frame[0] == Kind.NOTE:
                with contextlib.suppress(msgspec.DecodeError):
                    return _NOTE.decode(frame[1])
                return None
            offset = frame[2]
        return None

    def fitting_records(self) -> Iterator[Record]:
        """``records()`` that also fit the state before them, as ``tree`` and replay read
        them: each keyframe loads and each batch applies to a mirror; stops with ``damage`` at
        the first that does not (what an export may write)."""
        mirror = Mirror()
        for rec in self.records():
            try:
                if isinstance(rec.item, Keyframe):
                    mirror.load_snapshot(rec.item.snapshot)
                else:
                    mirror.apply_batch(rec.item)
            except MirrorError as exc:
                what = ("bad keyframe" if isinstance(rec.item, Keyframe)
                        else f"batch seq {rec.item.seq} does not fit")
                self.damage = Damage(rec.offset, f"{what}: {exc}")
                return
            yield rec

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
    """``core.files.open_regular`` with its refusals and errors as ``RecordingError``."""
    try:
        return open_regular(path, max_bytes)
    except FileRefused as exc:
        raise RecordingError(str(exc)) from None
    except OSError as exc:
        raise RecordingError(f"{path}: {exc.strerror or exc}") from None


__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_FILE_BYTES",
    "MAX_FRAME_BYTES",
    "TAIL_MAGIC",
    "CaptureNote",
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
