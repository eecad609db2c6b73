"""The event schema: one event per change of the tree or the pool, in the order it happened.

Events are msgspec Structs tagged by ``kind`` (msgpack on the wire and in files). A
``Batch`` envelope carries the events of one engine step with a strictly increasing
``seq`` inside one ``epoch`` (a new epoch at every engine start).

Node ids are the tree's ids; a split keeps the old id on the *suffix* (the node that
running requests locked stays the deepest node of their path) and gives the prefix a
new id. Token runs travel as little-endian uint32 bytes.

Block-id fields are ``Sequence[int]``: the tree hands them over as the ``array('i')`` it
already holds (never mutated afterwards: the tree replaces a node's block array rather than
growing it), so an event costs no Python int per block; ``enc_hook`` writes them as msgpack
arrays of ints, and a decoded event holds lists.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Sequence

import msgspec

SCHEMA_VERSION = 6  # 2: Extend; 3: Counters, Fault; 4: tail eviction, Access.end,
# NodeState.older, Merge.keeps_times; 5: Queue, RequestCached, Counters.schedule;
# 6: RequestCached may come before the prompt's forward, for its whole blocks, and twice
# per request, Retract (docs/wire-format.md). Readers read every version from 1 up to this one.


class Event(msgspec.Struct, tag_field="kind", array_like=True, frozen=True):
    """Base of every event."""


class NodeCreated(Event, tag="create", frozen=True):
    """A new leaf ``node`` under ``parent`` spanning ``[start, start + len(tokens)/4)``.

    ``blocks`` cover its span; ``shared_first`` is true when its first block is its
    parent's last block (continuation in place), so that block's refcount went up.
    """

    node: int
    parent: int
    start: int
    tokens: bytes
    blocks: Sequence[int]
    shared_first: bool


class Extend(Event, tag="extend", frozen=True):
    """Leaf ``node`` grew in place by ``tokens`` (from its old end): a request that held the
    only lock on it continued it (a multi-turn follow-up). ``blocks`` are appended to its
    block list; the first new token may continue in its last block, which stays as it was.
    """

    node: int
    tokens: bytes
    blocks: Sequence[int]


class Split(Event, tag="split", frozen=True):
    """``node`` split ``offset`` tokens in; the new node ``prefix`` takes the first part.

    ``prefix_blocks`` and ``suffix_blocks`` are the two sides; when the split falls inside
    a block, that block appears on both sides (refcount +1).
    """

    node: int
    offset: int
    prefix: int
    prefix_blocks: Sequence[int]
    suffix_blocks: Sequence[int]


class Merge(Event, tag="merge", frozen=True):
    """``child`` absorbed its only-child ``parent`` (path compression); ``dropped`` is the
    boundary block reference the parent held that the joined node no longer holds, or None
    (schema 3; streams of schema 2 said -1, which is read as None right here).
    ``keeps_times`` (schema 4, always true from this engine): the joined node keeps each
    token's access time (``radixcache.core.recency.join``); false (older streams): it takes
    the parent's clock for all of them."""

    parent: int
    child: int
    dropped: int | None
    keeps_times: bool = False

    def __post_init__(self) -> None:
        if self.dropped == -1:  # schema 2's "none": no reader sees the sentinel
            msgspec.structs.force_setattr(self, "dropped", None)


class Evict(Event, tag="evict", frozen=True):
    """Leaf ``node`` gave up its last ``tokens`` tokens; ``freed`` are the blocks that went
    back to the free list. ``tokens`` equal to the node's length: the node is removed;
    fewer (schema 4, tail eviction): it stays, ending ``tokens`` earlier, and its blocks past
    the new end are the ones freed (the new end is on a block boundary)."""

    node: int
    tokens: int
    freed: Sequence[int]


class Pin(Event, tag="lock", frozen=True):
    """Every node on the path from ``node`` to the root changed its pin count by ``delta``
    (a request pinned its path: +1, or unpinned it: -1). The wire tag is still ``lock``, the
    word of schema 1, so every recording reads as it did."""

    node: int
    delta: int


class Access(Event, tag="access", frozen=True):
    """The path from ``node`` to the root was used at logical time ``clock``; ``end`` (schema
    4): the use ended at that absolute position inside ``node``, whose tokens from there on
    keep their older time (``radixcache.core.recency``); None: all of ``node`` was used."""

    node: int
    clock: int
    end: int | None = None


class BlockAlloc(Event, tag="alloc", frozen=True):
    """Blocks taken off the free list for a running request (not yet in the tree)."""

    blocks: Sequence[int]


class BlockFree(Event, tag="free", frozen=True):
    """Blocks of a request returned to the free list (duplicates after insert, or abort)."""

    blocks: Sequence[int]


class Cow(Event, tag="cow", frozen=True):
    """Copy-on-write of a boundary block: the first ``slots`` slots of ``src`` copied to ``dst``."""

    src: int
    dst: int
    slots: int


class Watermark(Event, tag="wm", frozen=True):
    """A memory sample: pool blocks used/total, the high/low marks, and device memory if known."""

    used_blocks: int
    total_blocks: int
    high: float
    low: float
    device_used: int | None = None
    device_total: int | None = None
    note: str | None = None  # why device figures are missing, e.g. "NVML unavailable: <reason>"


class RequestStart(Event, tag="rstart", frozen=True):
    """Request ``req`` admitted: its prompt length and the tokens served from the cache."""

    req: int
    prompt_tokens: int
    hit_tokens: int


class Retract(Event, tag="retract", frozen=True):
    """Request ``req`` was retracted (schema 6): a step found no block for the running
    requests' growing leases (``--reserve grow``), so it left the running batch. Its first
    ``kept_tokens`` computed tokens went into the tree (the tree events right before it are
    that insert; 0 with the cache off), its ``blocks`` private blocks were let go (into the
    tree or back on the free list) and its pin moved to a hold on what it kept (a ``Pin``
    before it; the hold's ``Unpin`` comes when it runs again, or when a step needs those
    blocks, which then become evictable). It waits at the head of
    the queue and resumes with no new ``RequestStart``, matching what the tree kept."""

    req: int
    kept_tokens: int
    blocks: int


class RequestFinish(Event, tag="rfinish", frozen=True):
    """Request ``req`` done: tokens generated and its time to first token (ms)."""

    req: int
    output_tokens: int
    ttft_ms: float


class RequestCached(Event, tag="rcached", frozen=True):
    """The first ``prompt_tokens`` tokens of request ``req``'s prompt are in the tree (schema
    5), so waiting requests can read them now: its whole prompt once its prefill ended (it
    goes on decoding), or (schema 6), when requests sharing it are admitted beside it, the
    prompt's whole blocks before the forward that ends its prefill writes them (the batch is
    published after that forward; its whole prompt follows in the same batch, so a request
    emits one or two, ``prompt_tokens`` growing). The tree events right before it are that
    insert; the rest of its sequence is inserted at its ``RequestFinish``."""

    req: int
    prompt_tokens: int


class NodeState(msgspec.Struct, array_like=True, frozen=True):
    """One node in a snapshot (root has id 0 and parent -1)."""

    node: int
    parent: int
    start: int
    tokens: bytes
    blocks: list[int]
    pins: int  # pins on the paths through this node (the tree's path_pins)
    clock: int
    older: tuple[tuple[int, int], ...] = ()  # schema 4: see ``radixcache.core.recency``


class Snapshot(Event, tag="snapshot", frozen=True):
    """The whole tree and pool state; a mirror replaces everything it had."""

    block_size: int
    num_blocks: int
    nodes: list[NodeState]
    clock: int
    next_id: int
    request_blocks: list[int]
    high: float
    low: float


class Reset(Event, tag="reset", frozen=True):
    """The tree was emptied: every block is free."""


class Counters(Event, tag="counters", frozen=True):
    """The engine's own cumulative counters, sent with every watermark sample (the heartbeat).

    They count since the engine started, or since its ``generation``-th reset (0: never reset),
    so a late joiner shows the engine's figures, not what it happened to see. ``hit_tokens``
    of ``prompt_tokens`` is the engine's token hit rate; ``waiting``/``running`` are gauges.
    """

    generation: int
    submitted: int
    finished: int
    rejected: int
    prompt_tokens: int
    hit_tokens: int
    evicted_nodes: int
    evicted_tokens: int
    cow_copies: int
    waiting: int
    running: int
    paused: bool
    schedule: str | None = None  # the scheduling policy (schema 5; None: none, or older)


class Fault(Event, tag="fault", frozen=True):
    """A worker thread of the engine died: ``thread`` and the exception as one line. The
    engine stops serving after it; a subscriber shows it as a banner. With ``req`` set, an
    exception inside a step failed that request only, and the engine stepped on."""

    thread: str
    error: str
    req: int | None = None


class WaitReason(enum.Enum):
    """Why a waiting request was not admitted at the last scheduling step."""

    ORDER = "order"  # others come first in the scheduling policy's order
    SHARING = "sharing"  # a running request is computing its prefix: it waits for that insert
    POOL = "pool full"  # the pool cannot hold it now (pinned blocks); those behind it wait too
    BATCH = "batch full"  # the most running requests are running
    PAUSED = "paused"  # the engine admits nothing until ``resume``


class Waiting(msgspec.Struct, array_like=True, frozen=True):
    """One waiting request: why it waits and since which scheduling step (``Queue.step``).
    ``SHARING`` names the running request ``on_req`` whose insert it waits for, the cached
    node ``node`` its prefix continues now, and the ``shared`` tokens it will read then."""

    req: int
    reason: WaitReason
    queued: int
    on_req: int | None = None
    node: int | None = None
    shared: int = 0


class Queue(Event, tag="queue", frozen=True):
    """The waiting queue, sent when a step changed it (schema 5): the scheduling ``policy``
    (``fcfs``, ``lpm``, ``dfs-weight``), the scheduler's ``step`` count, how many requests
    wait, and the first ``len(entries)`` of them in the order they would be admitted."""

    policy: str
    step: int
    waiting: int
    entries: list[Waiting]

    def counts(self) -> dict[WaitReason, int]:
        """Waiting requests by reason; the ones past ``entries`` count as ``ORDER``."""
        out = dict.fromkeys(WaitReason, 0)
        for w in self.entries:
            out[w.reason] += 1
        out[WaitReason.ORDER] += max(0, self.waiting - len(self.entries))
        return out


class Digest(Event, tag="digest", frozen=True):
    """The engine's ``digest()`` at this point of the stream, for subscribers to verify."""

    value: str


# In the order the inspector's event log lists the kinds (``core/kinds.py``: ``KINDS``).
AnyEvent = (
    NodeCreated
    | Extend
    | Split
    | Merge
    | Evict
    | Cow
    | Pin
    | Access
    | BlockAlloc
    | BlockFree
    | Watermark
    | RequestStart
    | RequestCached
    | RequestFinish
    | Retract
    | Snapshot
    | Reset
    | Digest
    | Counters
    | Fault
    | Queue
)


class Batch(msgspec.Struct, frozen=True):
    """The events of one engine step. ``seq`` strictly increases within an ``epoch``."""

    seq: int
    epoch: int
    ts: float
    engine: str
    events: list[AnyEvent]


def enc_hook(obj: object) -> object:
    """msgspec encoder hook: block-id arrays travel as lists of ints."""
    if isinstance(obj, array):
        return obj.tolist()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_BATCH_DECODER = msgspec.msgpack.Decoder(Batch)
_EVENT_DECODER = msgspec.msgpack.Decoder(AnyEvent)


def plain(e: AnyEvent) -> AnyEvent:
    """``e`` as a decoder would give it (block ids as lists), for comparing events."""
    return _EVENT_DECODER.decode(_ENCODER.encode(e))


def encode_batch(batch: Batch) -> bytes:
    """msgpack bytes of ``batch``."""
    return _ENCODER.encode(batch)


def decode_batch(data: bytes) -> Batch:
    """Decode one batch; raises ``msgspec.DecodeError`` (a ``ValueError``) on malformed input."""
    return _BATCH_DECODER.decode(data)
