"""The ecosystem's KV-event wire format (vLLM, SGLang), both ways.

vLLM and SGLang publish prefix-cache events over ZeroMQ (see docs/kv-events.md)::

    PUB frames       [topic, seq (8 bytes big-endian), payload]
    payload          msgpack [ts, [event, ...], data_parallel_rank]
    event (current)  {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h | nil,
                      "token_ids": [...], "block_size": 16, "lora_id": nil, "medium": "GPU",
                      "lora_name": nil}
                     {"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU"}
                     {"type": "AllBlocksCleared"}
    event (older)    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
                      lora_id(, medium)]  ["BlockRemoved", block_hashes(, medium)]
                     ["AllBlocksCleared"]
    replay           DEALER sends [b"", start_seq]; gets [b"", topic, seq, payload] ...
                     ended by [b"", b"", 0xFF x 8, b""]
                     (older: [b"", seq, payload] ... ended by [b"", 0xFF x 8, b""])

A block hash is bytes, an int64 or a uint64. This module has:
- ``KVTranslator``: our tree events -> BlockStored/BlockRemoved over the *full* blocks of
  each path (hash chain: h(block) = H(h(previous block), its tokens));
- ``KVEventPublisher``: PUB + replay ROUTER in that format (``radixcache serve --kv-events vllm``);
- ``decode_payload``: either encoding -> typed ``Stored``/``Removed``/``Cleared``;
- ``BlockTree`` and ``KVEventsClient``: a block-hash tree from a vLLM/SGLang publisher.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec
import zmq

from radixcache.core import events as ev
from radixcache.wire.endpoints import (
    MAX_BATCH_BYTES,
    MAX_CONTROL_BYTES,
    BindPolicy,
    bind,
    from_u64,
    u64,
)
from radixcache.wire.mirror import Mirror, MirrorNode

TOPIC = b"kv-events"
END_SEQ = b"\xff" * 8
MEDIUM_GPU = "GPU"
BlockHash = int | bytes


# -- the wire structs (what we publish: the current map form) --------------------------------
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
    """Blocks evicted."""

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


# -- decoding (both encodings, any hash form) ------------------------------------------------
class KVEventsError(ValueError):
    """A payload that is not a KV-event batch."""


class Stored(NamedTuple):
    """A decoded BlockStored."""

    hashes: list[BlockHash]
    parent: BlockHash | None
    token_ids: list[int]
    block_size: int
    medium: str | None


class Removed(NamedTuple):
    """A decoded BlockRemoved."""

    hashes: list[BlockHash]
    medium: str | None


class Cleared(NamedTuple):
    """A decoded AllBlocksCleared."""


Decoded = Stored | Removed | Cleared
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium")
_REMOVED_FIELDS = ("block_hashes", "medium")
_Obj = dict[str, object]


def _hash(value: object) -> BlockHash:
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise KVEventsError(f"a block hash must be bytes or an integer, got {type(value).__name__}")
    return value


def _hashes(value: object) -> list[BlockHash]:
    if not isinstance(value, list):
        raise KVEventsError("block_hashes must be a list")
    return [_hash(h) for h in value]


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


def decode_event(raw: object) -> Decoded:
    """One event in either encoding; raises ``KVEventsError``."""
    kind, f = _as_fields(raw)
    medium = f.get("medium")
    medium = medium if isinstance(medium, str) else None
    if kind == "BlockStored":
        parent = f.get("parent_block_hash")
        tokens = f.get("token_ids", [])
        size = f.get("block_size", 0)
        if not isinstance(tokens, list) or not isinstance(size, int):
            raise KVEventsError("BlockStored needs token_ids (list) and block_size (int)")
        return Stored(_hashes(f.get("block_hashes")), None if parent is None else _hash(parent),
                      [int(t) for t in tokens], size, medium)
    if kind == "BlockRemoved":
        return Removed(_hashes(f.get("block_hashes")), medium)
    if kind == "AllBlocksCleared":
        return Cleared()
    raise KVEventsError(f"unknown event type {kind!r}")


def decode_payload(payload: bytes) -> tuple[float, list[Decoded]]:
    """A batch payload (array or map batch, either event form) -> (ts, events)."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise KVEventsError(f"not msgpack: {exc}") from None
    if isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
    elif isinstance(raw, dict):
        ts, events = raw.get("ts"), raw.get("events")
    else:
        raise KVEventsError("a batch must be [ts, events, ...] or {ts, events}")
    if not isinstance(ts, int | float) or not isinstance(events, list):
        raise KVEventsError("a batch needs a numeric ts and a list of events")
    return float(ts), [decode_event(e) for e in events]


# -- our tree events -> full-block hash chains -------------------------------------------------
def chain_hash(parent: int | None, tokens: bytes) -> int:
    """The hash of a full block after ``parent``: 63-bit blake2b of (parent, LE uint32 tokens)."""
    h = hashlib.blake2b(digest_size=8)
    h.update((parent if parent is not None else -1).to_bytes(8, "little", signed=True))
    h.update(tokens)
    return int.from_bytes(h.digest(), "little") & (2**63 - 1)


class KVTranslator:
    """Turns our events into BlockStored/BlockRemoved for the full blocks of every path.

    A full block ``[k*B, (k+1)*B)`` of a path is kept on the node whose span holds its last
    position; splits and merges move these hashes between nodes without any wire event, an
    eviction removes the evicted leaf's. Start it on the tree's state (empty or a snapshot).
    """

    def __init__(self, block_size: int, num_blocks: int) -> None:
        self.B = block_size
        self.mirror = Mirror(block_size, num_blocks)
        self.node_hashes: dict[int, list[int]] = {}

    @property
    def live_blocks(self) -> int:
        """Full blocks currently stored."""
        return sum(len(h) for h in self.node_hashes.values())

    def translate(self, events: list[ev.AnyEvent]) -> list[WireEvent]:
        """The wire events for ``events`` (applied in order to the translator's mirror)."""
        out: list[WireEvent] = []
        for e in events:
            match e:
                case ev.NodeCreated():
                    self.mirror.apply(e)
                    self._stored(self.mirror.nodes[e.node], out)
                case ev.Extend():
                    had = len(self.node_hashes.get(e.node, ()))
                    self.mirror.apply(e)
                    self._stored(self.mirror.nodes[e.node], out, skip=had)
                case ev.Split():
                    self._split(e)
                case ev.Merge():
                    hashes = self.node_hashes.pop(e.parent, []) + self.node_hashes.pop(e.child, [])
                    self.mirror.apply(e)
                    self._keep(e.child, hashes)
                case ev.Evict():
                    self.mirror.apply(e)
                    if removed := self.node_hashes.pop(e.node, []):
                        out.append(BlockRemoved(removed))
                case ev.Reset() | ev.Snapshot():
                    self._restart(e, out)
                case ev.Digest():
                    pass  # the mirror's digest check is not needed here
                case _:
                    self.mirror.apply(e)
        return out

    def _keep(self, node: int, hashes: list[int]) -> None:
        if hashes:
            self.node_hashes[node] = hashes

    def _split(self, e: ev.Split) -> None:
        node = self.mirror.nodes[e.node]
        cut = (node.start + e.offset) // self.B - node.start // self.B
        hashes = self.node_hashes.pop(e.node, [])
        self.mirror.apply(e)
        self._keep(e.prefix, hashes[:cut])
        self._keep(e.node, hashes[cut:])

    def _restart(self, e: ev.Reset | ev.Snapshot, out: list[WireEvent]) -> None:
        self.mirror.apply(e)
        self.node_hashes.clear()
        out.append(AllBlocksCleared())
        stack = list(self.mirror.root.children.values())
        while stack:
            n = stack.pop()
            self._stored(n, out)
            stack.extend(n.children.values())

    def _stored(self, node: MirrorNode, out: list[WireEvent], skip: int = 0) -> None:
        """Hash the full blocks of ``node``; announce all but the first ``skip`` (those it
        already had before it was extended)."""
        B = self.B
        base = node.start // B * B
        first_end = base + B
        if first_end > node.end:
            return
        first_parent, lead = self._before(node, base)
        parent_hash = first_parent
        seq = lead + node.tokens
        hashes: list[int] = []
        for end in range(first_end, node.end + 1, B):
            parent_hash = chain_hash(parent_hash, seq[(end - B - base) * 4:(end - base) * 4])
            hashes.append(parent_hash)
        self.node_hashes[node.id] = hashes
        if len(hashes) <= skip:
            return
        tokens = memoryview(seq)[skip * B * 4 : len(hashes) * B * 4].cast("I").tolist()
        parent = hashes[skip - 1] if skip else first_parent
        out.append(BlockStored(hashes[skip:], parent, tokens, B))

    def _before(self, node: MirrorNode, base: int) -> tuple[int | None, bytes]:
        """The hash of the last full block ending at or before ``base`` and the ancestors'
        tokens of positions ``[base, node.start)``."""
        parts: list[bytes] = []
        parent_hash: int | None = None
        n = node.parent
        while n is not None and n.parent is not None:
            if n.end > base:
                lo = max(base, n.start) - n.start
                parts.append(n.tokens[lo * 4:])
            hashes = self.node_hashes.get(n.id)
            if hashes and parent_hash is None:
                parent_hash = hashes[-1]
            if n.start <= base and parent_hash is not None:
                break
            n = n.parent
        return parent_hash, b"".join(reversed(parts))


# -- the publisher ---------------------------------------------------------------------------
class KVEventPublisher:
    """PUB of KV-event batches (topic ``kv-events``) and its replay ROUTER, in one thread."""

    def __init__(
        self, events: str, replay: str, *, ring: int = 4096, hwm: int = 10_000,
        policy: BindPolicy = BindPolicy.LOCAL_ONLY, topic: bytes = TOPIC,
    ) -> None:
        self.topic = topic
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub: zmq.Socket[bytes] = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
        self._replay.setsockopt(zmq.MAXMSGSIZE, MAX_CONTROL_BYTES)
        self._replay.setsockopt(zmq.LINGER, 0)
        self.endpoints = (bind(self._pub, events, policy), bind(self._replay, replay, policy))
        self._ring: deque[tuple[int, bytes]] = deque(maxlen=ring)
        self._queue: queue.SimpleQueue[tuple[float, list[WireEvent]] | None] = queue.SimpleQueue()
        self.seq = -1  # vLLM numbers its first batch 0
        self._thread = threading.Thread(target=self._run, name="rc-kvevents", daemon=True)
        self._thread.start()

    def publish(self, events: list[WireEvent]) -> None:
        """Queue one batch (nothing is sent for an empty list)."""
        if events:
            self._queue.put((time.time(), events))

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, stop and close."""
        self._queue.put(None)
        self._thread.join(timeout)
        self._pub.close(linger=0)
        self._replay.close(linger=0)

    def _run(self) -> None:
        while True:
            if self._replay.poll(0):
                self._serve_replay()
            try:
                item = self._queue.get(timeout=0.005)
            except queue.Empty:
                continue
            if item is None:
                return
            self.seq += 1
            payload = encode_payload(KVEventBatch(item[0], item[1]))
            self._pub.send_multipart([self.topic, u64(self.seq), payload])
            self._ring.append((self.seq, payload))

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            return
        ident, _, start = frames
        first = from_u64(start)
        for seq, payload in self._ring:
            if seq >= first:
                self._replay.send_multipart([ident, b"", self.topic, u64(seq), payload])
        self._replay.send_multipart([ident, b"", b"", END_SEQ, b""])


# -- the consumer: a block-hash tree -------------------------------------------------------------
@dataclass(slots=True)
class Block:
    """One stored block as the consumer knows it."""

    hash: BlockHash
    parent: BlockHash | None
    tokens: list[int]
    medium: str | None
    children: set[BlockHash] = field(default_factory=set)


@dataclass(slots=True)
class BlockTreeStats:
    """Counters of a ``BlockTree``/``KVEventsClient``."""

    batches: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    malformed: int = 0
    gaps: int = 0
    replayed: int = 0
    unknown_removed: int = 0


class BlockTree:
    """Blocks by hash linked by ``parent_block_hash``. ``version`` grows on every change."""

    def __init__(self) -> None:
        self.blocks: dict[BlockHash, Block] = {}
        self.stats = BlockTreeStats()
        self.version = 0

    def children(self, h: BlockHash) -> list[Block]:
        """The stored children of block ``h`` (insertion order)."""
        b = self.blocks.get(h)
        return [self.blocks[c] for c in b.children if c in self.blocks] if b else []

    def roots(self) -> list[Block]:
        """Blocks whose parent is none or not stored."""
        return [b for b in self.blocks.values() if b.parent is None or b.parent not in self.blocks]

    def apply(self, event: Decoded) -> None:
        """Apply one decoded event."""
        self.version += 1
        if isinstance(event, Stored):
            self._store(event)
        elif isinstance(event, Removed):
            self.stats.removed += len(event.hashes)
            for h in event.hashes:
                self._remove(h)
        else:
            self.stats.cleared += 1
            self.blocks.clear()

    def _store(self, e: Stored) -> None:
        parent = e.parent
        size = e.block_size or 1
        for i, h in enumerate(e.hashes):
            self.blocks[h] = Block(h, parent, e.token_ids[i * size:(i + 1) * size], e.medium)
            if parent is not None and parent in self.blocks:
                self.blocks[parent].children.add(h)
            parent = h
        self.stats.stored += len(e.hashes)

    def _remove(self, h: BlockHash) -> None:
        b = self.blocks.pop(h, None)
        if b is None:
            self.stats.unknown_removed += 1
        elif b.parent is not None and b.parent in self.blocks:
            self.blocks[b.parent].children.discard(h)

    def walk(self) -> Iterator[tuple[int, Block]]:
        """(depth, block) in depth-first order from the roots."""
        stack = [(0, b) for b in reversed(self.roots())]
        while stack:
            depth, b = stack.pop()
            yield depth, b
            stack.extend((depth + 1, c) for c in reversed(self.children(b.hash)))


class KVEventsClient:
    """Follows a vLLM/SGLang KV-event publisher into a ``BlockTree``.

    With a replay endpoint it first replays from seq ``start_seq`` (both replay framings),
    buffering live batches meanwhile, and replays again on a seq gap. ``poll(timeout_s)``
    processes what arrived; ``run_for(seconds)`` loops; ``close()`` closes the sockets.
    """

    def __init__(
        self, endpoint: str, replay: str | None = None, *, start_seq: int = 0, topic: bytes = b""
    ) -> None:
        self.tree = BlockTree()
        self.last_seq = start_seq - 1
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sub: zmq.Socket[bytes] = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic)
        self._sub.connect(endpoint)
        self._dealer: zmq.Socket[bytes] | None = None
        self._pending: list[tuple[int, bytes]] = []
        self._replaying = False
        if replay is not None:
            self._dealer = ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES)
            self._dealer.connect(replay)
            self._ask_replay(start_seq)

    @property
    def blocks(self) -> dict[BlockHash, Block]:
        """Stored blocks by hash."""
        return self.tree.blocks

    @property
    def version(self) -> int:
        """Grows on every applied event."""
        return self.tree.version

    def _ask_replay(self, start: int) -> None:
        assert self._dealer is not None
        self._replaying = True
        self._dealer.send_multipart([b"", u64(start)])

    def run_for(self, seconds: float) -> None:
        """Process batches for ``seconds``."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.poll(min(left, 0.05))

    def poll(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` and process every frame that arrived."""
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        if self._dealer is not None:
            poller.register(self._dealer, zmq.POLLIN)
        ready = dict(poller.poll(int(timeout_s * 1000)))
        if self._dealer is not None and self._dealer in ready:
            self._on_replay()
        if self._sub in ready:
            self._on_live()

    def _on_live(self) -> None:
        while True:
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or len(frames[1]) != 8:
                self.tree.stats.malformed += 1
                continue
            item = (from_u64(frames[1]), frames[2])
            if self._replaying:
                self._pending.append(item)
            else:
                self._take(*item)

    def _on_replay(self) -> None:
        assert self._dealer is not None
        while True:
            try:
                frames = self._dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            body = frames[1:] if frames and frames[0] == b"" else frames
            if len(body) not in (2, 3):  # [seq, payload] (older) or [topic, seq, payload]
                self.tree.stats.malformed += 1
                continue
            seq_bytes, payload = body[-2], body[-1]
            if seq_bytes == END_SEQ:
                self._replaying = False
                pending, self._pending = self._pending, []
                for seq, data in sorted(pending):
                    self._take(seq, data)
            elif len(seq_bytes) == 8:
                self.tree.stats.replayed += 1
                self._take(from_u64(seq_bytes), payload)

    def _take(self, seq: int, payload: bytes) -> None:
        if seq <= self.last_seq:
            return
        if seq > self.last_seq + 1 and self._dealer is not None and not self._replaying:
            self.tree.stats.gaps += 1
            self._pending.append((seq, payload))
            self._ask_replay(self.last_seq + 1)
            return
        self.last_seq = seq
        try:
            _, events = decode_payload(payload)
        except KVEventsError:
            self.tree.stats.malformed += 1
            return
        self.tree.stats.batches += 1
        for e in events:
            self.tree.apply(e)

    def close(self) -> None:
        """Close the sockets."""
        self._sub.close(linger=0)
        if self._dealer is not None:
            self._dealer.close(linger=0)
