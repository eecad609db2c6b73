"""The recording format's pieces shared by the reader (``recording``) and the writer
(``recwriter``): magic, versions, frame structs and kinds, the header and keyframe structs,
and the errors. The layout is drawn in ``recording``'s docstring."""

from __future__ import annotations

import enum
import struct

import msgspec

from radixcache.core import events as ev

MAGIC = b"RADIXREC"
FORMAT_VERSION = 2  # 2 added the capture note (kind 5); version 1 files are read as ever
TAIL_MAGIC = b"RCXTAIL\0"
MAX_FRAME_BYTES = 256 * 1024 * 1024
PRELUDE = struct.Struct("<8sHH")
FRAME = struct.Struct("<IBI")
TAIL = struct.Struct("<Q8s")


class Kind(enum.IntEnum):
    """Frame kinds."""

    HEADER = 1
    BATCH = 2
    KEYFRAME = 3
    INDEX = 4
    NOTE = 5  # format 2: what a live capture got and what it could not (before the index)


class CaptureNote(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """What a live capture (``record --from``) got of the stream and what it could not: the
    events and batches written, the seqs they span, and the losses its subscriber counted.
    ``complete`` is True when it ended in sync with nothing lost."""

    seconds: float
    events: int
    batches: int
    keyframes: int
    first_seq: int
    last_seq: int
    state: str  # live | snapshot | replay: where the subscriber was at the end
    out_of_sync_s: float
    gaps: int
    too_old: int
    malformed: int
    resyncs: int
    seq_backwards: int
    buffer_dropped: int
    last_error: str
    complete: bool


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


class RecordingWriteError(RecordingError):
    """The file could not be written (a full disk, a size limit): it was cut back to its last
    whole frame, so what it holds stays readable; the message says how much that is."""


ENC = msgspec.msgpack.Encoder(enc_hook=ev.enc_hook)
