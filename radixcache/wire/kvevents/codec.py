"""The vLLM/SGLang KV-event payload: what we publish, and a validating decoder of both encodings.

A payload is msgpack ``[ts, [event, ...], data_parallel_rank]`` (older vLLM: ``[ts, events]``;
a map ``{ts, events, data_parallel_rank}`` is accepted too). Each event is a map tagged by
``type`` (vLLM and SGLang today) or a positional array (older vLLM)::

    {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h | nil,
     "token_ids": [...], "block_size": 16, "lora_id": nil, "medium": "GPU", ...}
    {"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU"}
    {"type": "AllBlocksCleared"}
    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id(, medium)]

A block hash is bytes, an int64 (SGLang) or a uint64. Everything received is checked here, in
one place: a batch that cannot be read raises ``KVEventsError``; an event that cannot be read is
reported in ``DecodedBatch.errors`` and left out, so one bad event never costs its neighbours.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import msgspec

from radixcache.core.tokens import InvalidSpan, check_full_blocks, check_hash_id

MEDIUM_GPU = "GPU"
BlockHash = int | bytes
_MAX_HASH_BYTES = 64
_TOKEN_LIMIT = 2**32


# -- the wire structs (what we publish: the current tagged-map form) -------------------------
class BlockStored(msgspec.Struct, tag=True):
    """Full blocks stored, in path order; ``parent_block_hash`` precedes the first one."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, tag=True):
    """Blocks evicted from ``medium``."""

    block_hashes: list[int]
    medium: str | None = MEDIUM_GPU


class AllBlocksCleared(msgspec.Struct, tag=True):
    """The whole cache was emptied."""


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True):
    """``[ts, events, data_parallel_rank]``."""

    ts: float
    events: list[WireEvent]
    data_parallel_rank: int | None = 0


_ENCODER = msgspec.msgpack.Encoder()


def encode_payload(batch: KVEventBatch) -> bytes:
    """msgpack payload of one batch (current map-per-event form)."""
    return _ENCODER.encode(batch)


# -- decoding --------------------------------------------------------------------------------
class KVEventsError(ValueError):
    """A payload or event that is not a valid KV event; the message is one line."""


class Engine(enum.Enum):
    """Which engine's dialect a stream speaks (see docs/kv-events.md for the differences)."""

    VLLM = "vLLM"
    SGLANG = "SGLang"
    UNKNOWN = "vLLM/SGLang"


class Encoding(enum.Enum):
    """How events are encoded: tagged maps (current) or positional arrays (older vLLM)."""

    MAP = "map"
    ARRAY = "array"


class WireFormat(NamedTuple):
    """The dialect detected from one batch."""

    engine: Engine
    encoding: Encoding

    def label(self) -> str:
        """E.g. ``SGLang format, map encoding``."""
        return f"{self.engine.value} format, {self.encoding.value} encoding"


class Stored(NamedTuple):
    """A decoded BlockStored: hashes distinct, none equal to ``parent``, tokens in uint32."""

    hashes: list[BlockHash]
    parent: BlockHash | None
    token_ids: list[int]
    block_size: int
    medium: str


class Removed(NamedTuple):
    """A decoded BlockRemoved."""

    hashes: list[BlockHash]
    medium: str


class Cleared(NamedTuple):
    """A decoded AllBlocksCleared."""


Decoded = Stored | Removed | Cleared


class DecodedBatch(NamedTuple):
    """One payload: its events that could be read, and one line per event that could not."""

    ts: float
    events: list[Decoded]
    rank: int
    fmt: WireFormat
    errors: list[str]


_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium")
_REMOVED_FIELDS = ("block_hashes", "medium")
_SGLANG_KEYS = frozenset({"cache_salt", "session_id"})
_VLLM_KEYS = frozenset({"lora_name", "extra_keys", "group_idx"})
_Obj = dict[str, object]


def _hash(value: object) -> BlockHash:
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise KVEventsError(f"a block hash must be bytes or an integer, got {type(value).__name__}")
    if isinstance(value, bytes) and not 0 < len(value) <= _MAX_HASH_BYTES:
        raise KVEventsError(f"a bytes block hash must have 1-{_MAX_HASH_BYTES} bytes")
    if isinstance(value, int):
        try:
            check_hash_id(value)
        except InvalidSpan as exc:
            raise KVEventsError(str(exc)) from None
    return value


def _hashes(value: object) -> list[BlockHash]:
    if not isinstance(value, list):
        raise KVEventsError("block_hashes must be a list")
    return [_hash(h) for h in value]


def _tokens(value: object) -> list[int]:
    if not isinstance(value, list):
        raise KVEventsError("token_ids must be a list")
    if not all(type(t) is int for t in value):
        raise KVEventsError("token_ids must be integers")
    if value and not (min(value) >= 0 and max(value) < _TOKEN_LIMIT):
        raise KVEventsError("token_ids must lie in [0, 2^32)")
    return value


def _medium(value: object) -> str:
    # Older vLLM sends no medium (or nil): those blocks live in GPU memory.
    return value if isinstance(value, str) and value else MEDIUM_GPU


def _as_fields(raw: object) -> tuple[str, _Obj]:
    """Either event encoding -> (type name, field map)."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields: _Obj = {str(k): v for k, v in raw.items()}
    elif isinstance(raw, list) and raw:
        kind = raw[0]
        names = {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS}.get(str(kind), ())
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise KVEventsError("an event must be a map or a non-empty array")
    if not isinstance(kind, str):
        raise KVEventsError("event without a type name")
    return kind, fields


def _stored(f: _Obj) -> Stored:
    hashes = _hashes(f.get("block_hashes"))
    parent_raw = f.get("parent_block_hash")
    parent = None if parent_raw is None else _hash(parent_raw)
    size = f.get("block_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise KVEventsError("BlockStored needs a positive integer block_size")
    if len(set(hashes)) != len(hashes) or (parent is not None and parent in hashes):
        # [200, 200] or a block that is its own parent: a loop, not a path
        raise KVEventsError("BlockStored repeats a hash along its own path")
    token_ids = _tokens(f.get("token_ids", []))
    try:  # full blocks only: a 0-token block would be a node with no tokens
        check_full_blocks(len(token_ids), len(hashes), size)
    except InvalidSpan as exc:
        raise KVEventsError(f"BlockStored: {exc}") from None
    return Stored(hashes, parent, token_ids, size, _medium(f.get("medium")))


def decode_event(raw: object) -> Decoded:
    """One event in either encoding; raises ``KVEventsError`` (one line) if it is not valid."""
    kind, f = _as_fields(raw)
    if kind == "BlockStored":
        return _stored(f)
    if kind == "BlockRemoved":
        return Removed(_hashes(f.get("block_hashes")), _medium(f.get("medium")))
    if kind == "AllBlocksCleared":
        return Cleared()
    raise KVEventsError(f"unknown event type {kind[:40]!r}")


def _unpack(payload: bytes) -> tuple[object, object, object]:
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise KVEventsError(f"not msgpack: {exc}") from None
    except RecursionError:
        raise KVEventsError("msgpack nested too deep") from None
    if isinstance(raw, list) and len(raw) >= 2:
        return raw[0], raw[1], raw[2] if len(raw) > 2 else 0
    if isinstance(raw, dict):
        return raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank", 0)
    raise KVEventsError("a batch must be [ts, events, ...] or {ts, events}")


def detect_format(events: list[object]) -> WireFormat:
    """The dialect of a batch's raw events: SGLang adds ``cache_salt``/``session_id`` and signs
    its int64 hashes; vLLM sends bytes hashes or ``lora_name``; either, when nothing tells."""
    encoding = Encoding.ARRAY if events and isinstance(events[0], list) else Encoding.MAP
    engine = Engine.UNKNOWN
    for raw in events:
        if isinstance(raw, dict):
            keys = {str(k) for k in raw}
            hashes = raw.get("block_hashes")
        elif isinstance(raw, list) and len(raw) > 1:
            keys, hashes = set(), raw[1]
        else:
            continue
        hashes = hashes if isinstance(hashes, list) else []
        if keys & _SGLANG_KEYS or any(isinstance(h, int) and h < 0 for h in hashes[:4]):
            return WireFormat(Engine.SGLANG, encoding)
        if keys & _VLLM_KEYS or any(isinstance(h, bytes) for h in hashes[:4]):
            engine = Engine.VLLM
    return WireFormat(engine, encoding)


def decode_batch(payload: bytes) -> DecodedBatch:
    """A batch payload (array or map batch, either event form). Raises ``KVEventsError`` when
    the batch as a whole cannot be read; events that cannot be read are left out and named in
    ``errors``, the others kept in order."""
    ts, raw_events, rank = _unpack(payload)
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not isinstance(raw_events, list):
        raise KVEventsError("a batch needs a numeric ts and a list of events")
    rank = rank if type(rank) is int and rank >= 0 else 0
    events: list[Decoded] = []
    errors: list[str] = []
    for raw in raw_events:
        try:
            events.append(decode_event(raw))
        except KVEventsError as exc:
            errors.append(str(exc))
    return DecodedBatch(float(ts), events, rank, detect_format(raw_events), errors)
