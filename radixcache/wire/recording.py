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
frame that is cut short, fails its checksum, exceeds the size limit or does not decode,
and reports that frame's byte offset and the reason in ``damage``.
"""

from __future__ import annotations

import enum
import os
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

import msgspec

from radixcache.core import events as ev
from radixcache.wire.mirror import Mirror

MAGIC = b"RADIXREC"
FORMAT_VERSION = 1
TAIL_MAGIC = b"RCXTAIL\0"
MAX_FRAME_BYTES = 256 * 1024 * 1024
_PRELUDE = struct.Struct("<8sHH")
_FRAME = struct.Struct("<IBI")
_TAIL = struct.Struct("<Q8s")


class Kind(enum.IntEnum):
    """Frame kinds."""

    HEADER = 1
    BATCH = 2
    KEYFRAME = 3
    INDEX = 4


class RecordHeader(msgspec.Struct, array_like=True, frozen=True):
    """Who recorded what: format and schema versions, engine name and config."""

    format_version: int
    schema_version: int
    engine: str
    config: dict[str, str | int | float]
    created: float


class Keyframe(msgspec.Struct, array_like=True, frozen=True):
    """The whole state after ``events_before`` recorded events (at ``seq`` of ``epoch``)."""

    seq: int
    epoch: int
    events_before: int
    snapshot: ev.Snapshot


class KeyframeRef(msgspec.Struct, array_like=True, frozen=True):
    """Where a keyframe lies in the file."""

    offset: int
    seq: int
    events_before: int


class RecordingError(Exception):
    """The file is not a readable recording at all (empty, wrong magic, future version)."""


class Damage(NamedTuple):
    """Where reading stopped and why."""

    offset: int
    reason: str


class Record(NamedTuple):
    """One batch or keyframe and the byte offset of its frame."""

    offset: int
    item: ev.Batch | Keyframe


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
                                  list(n.blocks), n.lock, n.clock))
        stack.extend(n.children.values())
    return ev.Snapshot(mirror.block_size, mirror.num_blocks, nodes, mirror.clock,
                       max(mirror.nodes) + 1, sorted(mirror.request_blocks),
                       mirror.high, mirror.low)


class RecordingWriter:
    """Appends frames to a new file. Call ``write_keyframe`` first and whenever
    ``needs_keyframe``; ``close()`` writes the index and tail."""

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
        self._f: BinaryIO = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._f.write(_PRELUDE.pack(MAGIC, FORMAT_VERSION, 0))
        header = RecordHeader(FORMAT_VERSION, ev.SCHEMA_VERSION, engine, config, time.time())
        self._frame(Kind.HEADER, _ENC.encode(header))

    def _frame(self, kind: Kind, payload: bytes) -> int:
        if len(payload) > MAX_FRAME_BYTES:
            raise ValueError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME_BYTES}")
        offset = self._f.tell()
        crc = zlib.crc32(payload, zlib.crc32(bytes([kind])))
        self._f.write(_FRAME.pack(len(payload), kind, crc))
        self._f.write(payload)
        return offset

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
        """Write the keyframe index and the tail, and close the file."""
        if self._f.closed:
            return
        offset = self._frame(Kind.INDEX, _ENC.encode(self._index))
        self._f.write(_TAIL.pack(offset, TAIL_MAGIC))
        self._f.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordingReader:
    """Reads a recording; raises ``RecordingError`` at once when it is not one.

    Iterating ``records()`` stops at the first damaged frame; ``damage`` then says where.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.data = self.path.read_bytes()
        self.damage: Damage | None = None
        if not self.data:
            raise RecordingError(f"{self.path}: empty file")
        if len(self.data) < _PRELUDE.size or self.data[:8] != MAGIC:
            raise RecordingError(f"{self.path}: not a radixcache recording (bad magic)")
        _, version, _ = _PRELUDE.unpack_from(self.data)
        if version > FORMAT_VERSION:
            raise RecordingError(
                f"{self.path}: format version {version} is newer than this reader "
                f"(reads up to {FORMAT_VERSION}); upgrade radixcache")
        frame = self._read_frame(_PRELUDE.size)
        if isinstance(frame, Damage) or frame[0] != Kind.HEADER:
            raise RecordingError(f"{self.path}: unreadable header")
        try:
            self.header = _HEADER.decode(frame[1])
        except msgspec.DecodeError as exc:
            raise RecordingError(f"{self.path}: bad header: {exc}") from None
        self._first = frame[2]

    def _read_frame(self, offset: int) -> tuple[Kind, bytes, int] | Damage:
        """(kind, payload, next offset) or the damage at ``offset``."""
        data = self.data
        if offset + _FRAME.size > len(data):
            return Damage(offset, "truncated frame header")
        length, kind, crc = _FRAME.unpack_from(data, offset)
        if length > MAX_FRAME_BYTES:
            return Damage(offset, f"frame length {length} exceeds the {MAX_FRAME_BYTES} limit")
        start = offset + _FRAME.size
        if start + length > len(data):
            return Damage(offset, f"truncated frame: {length} bytes announced, "
                                  f"{len(data) - start} present")
        payload = data[start:start + length]
        if zlib.crc32(payload, zlib.crc32(bytes([kind]))) != crc:
            return Damage(offset, "checksum mismatch")
        if kind not in Kind.__members__.values():
            return Damage(offset, f"unknown frame kind {kind}")
        return Kind(kind), payload, start + length

    def records(self, start: int | None = None) -> Iterator[Record]:
        """Batches and keyframes in file order from byte ``start`` (default: the first)."""
        offset = self._first if start is None else start
        self.damage = None
        while offset < len(self.data):
            frame = self._read_frame(offset)
            if isinstance(frame, Damage):
                self.damage = frame
                return
            kind, payload, nxt = frame
            if kind == Kind.INDEX:
                return
            try:
                item = ev.decode_batch(payload) if kind == Kind.BATCH else _KEYFRAME.decode(payload)
            except (msgspec.DecodeError, ValueError) as exc:
                self.damage = Damage(offset, f"undecodable {kind.name.lower()}: {exc}")
                return
            yield Record(offset, item)
            offset = nxt

    def keyframes(self) -> list[KeyframeRef]:
        """The keyframe index: from the tail when the file was closed, else by scanning."""
        if len(self.data) >= _TAIL.size:
            offset, magic = _TAIL.unpack_from(self.data, len(self.data) - _TAIL.size)
            if magic == TAIL_MAGIC:
                frame = self._read_frame(offset)
                if not isinstance(frame, Damage) and frame[0] == Kind.INDEX:
                    return _INDEX.decode(frame[1])
        return [KeyframeRef(r.offset, r.item.seq, r.item.events_before)
                for r in self.records() if isinstance(r.item, Keyframe)]

    def mirror_at(self, events: int) -> tuple[Mirror, int]:
        """A mirror after the first batch boundary at or past ``events`` recorded events (or
        the end), starting from the nearest keyframe before it. Returns (mirror, events)."""
        refs = [k for k in self.keyframes() if k.events_before <= events]
        if not refs:
            raise RecordingError(f"{self.path}: no keyframe at or before event {events}")
        ref = refs[-1]
        mirror = Mirror()
        count = ref.events_before
        for rec in self.records(ref.offset):
            if isinstance(rec.item, Keyframe):
                if rec.offset == ref.offset:
                    mirror.load_snapshot(rec.item.snapshot)
                continue
            if count >= events:
                break
            mirror.apply_batch(rec.item)
            count += len(rec.item.events)
        return mirror, count
