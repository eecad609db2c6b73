"""Export a recording as JSON lines or as a Perfetto/Chrome trace (JSON trace-event format).

jsonl: one object per event, ``{"seq", "epoch", "ts", "kind", ...fields}`` (token runs as
lists of ids), plus one ``{"kind": "keyframe", "seq", "nodes"}`` per keyframe.

Perfetto: ``{"traceEvents": [...]}`` with time in microseconds since the first batch:
requests as async slices (start -> finish) on the "requests" track, splits, merges,
evictions, COW copies and resets as instant events on the "tree" track (named by kind, so
they group; node ids and sizes in their args), and the pool's
used blocks as a counter. Open it at https://ui.perfetto.dev (or chrome://tracing).
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Iterable, Iterator
from typing import assert_never

import msgspec

from radixcache.core import events as ev
from radixcache.core.kinds import tag
from radixcache.wire.recording import Keyframe

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
JsonObj = dict[str, JsonValue]
_PID = 1
_TREE_TID, _REQ_TID = 1, 2


def _value(v: object) -> JsonValue:
    if isinstance(v, bytes):
        return [int(t) for t in memoryview(v).cast("I")]
    if isinstance(v, msgspec.Struct):
        return {f: _value(getattr(v, f)) for f in v.__struct_fields__}
    if isinstance(v, list | array):
        return [_value(x) for x in v]
    if v is None or isinstance(v, str | int | float | bool):
        return v
    if isinstance(v, enum.Enum):
        return _value(v.value)
    return str(v)


def event_json(batch: ev.Batch, e: ev.AnyEvent) -> JsonObj:
    """One event as a JSON object with its batch's seq, epoch and ts."""
    out: JsonObj = {"seq": batch.seq, "epoch": batch.epoch, "ts": batch.ts, "kind": tag(e)}
    for f in e.__struct_fields__:
        out[f] = _value(getattr(e, f))
    return out


def jsonl_lines(items: Iterable[ev.Batch | Keyframe]) -> Iterator[str]:
    """JSON lines (without newlines) for batches and keyframes in order."""
    enc = msgspec.json.Encoder()
    for item in items:
        if isinstance(item, Keyframe):
            yield enc.encode({"kind": "keyframe", "seq": item.seq, "epoch": item.epoch,
                              "nodes": len(item.snapshot.nodes)}).decode()
            continue
        for e in item.events:
            yield enc.encode(event_json(item, e)).decode()


def perfetto_events(items: Iterable[ev.Batch | Keyframe]) -> Iterator[JsonObj]:
    """Chrome trace events for batches in order (keyframes are skipped)."""
    t0: float | None = None
    yield {"ph": "M", "pid": _PID, "name": "process_name", "args": {"name": "radixcache"}}
    yield {"ph": "M", "pid": _PID, "tid": _TREE_TID, "name": "thread_name",
           "args": {"name": "tree"}}
    yield {"ph": "M", "pid": _PID, "tid": _REQ_TID, "name": "thread_name",
           "args": {"name": "requests"}}
    for batch in items:
        if isinstance(batch, Keyframe):
            continue
        t0 = batch.ts if t0 is None else t0
        ts = round((batch.ts - t0) * 1e6, 3)
        for e in batch.events:
            yield from _trace_event(e, ts)


def _request_note(e: ev.RequestCached | ev.Retract) -> JsonObj:
    """The name and args of a note inside a request's span."""
    if isinstance(e, ev.RequestCached):
        return {"name": "prompt cached", "args": {"prompt_tokens": e.prompt_tokens}}
    return {"name": "retracted", "args": {"kept_tokens": e.kept_tokens, "blocks": e.blocks}}


def _trace_event(e: ev.AnyEvent, ts: float) -> Iterator[JsonObj]:
    base: JsonObj = {"pid": _PID, "ts": ts}
    req: JsonObj = {**base, "tid": _REQ_TID}
    match e:
        case ev.RequestStart():
            yield {**req, "ph": "b", "cat": "request", "id": e.req, "name": f"req {e.req}",
                   "args": {"prompt_tokens": e.prompt_tokens, "hit_tokens": e.hit_tokens}}
        case ev.RequestFinish():
            yield {**req, "ph": "e", "cat": "request", "id": e.req, "name": f"req {e.req}",
                   "args": {"output_tokens": e.output_tokens, "ttft_ms": e.ttft_ms}}
        case ev.Watermark():
            yield {**base, "ph": "C", "name": "pool",
                   "args": {"used_blocks": e.used_blocks, "total_blocks": e.total_blocks}}
        case ev.Split():
            yield _instant(e, base, {"node": e.node, "offset": e.offset, "prefix": e.prefix})
        case ev.Merge():
            yield _instant(e, base, {"parent": e.parent, "child": e.child})
        case ev.Evict():
            yield _instant(e, base, {"node": e.node, "tokens": e.tokens,
                                     "blocks_freed": len(e.freed)})
        case ev.Cow():
            yield _instant(e, base, {"src": e.src, "dst": e.dst, "slots": e.slots})
        case ev.Reset():
            yield _instant(e, base, {})
        case ev.RequestCached() | ev.Retract():  # inside its request's span
            yield {**req, "ph": "n", "cat": "request", "id": e.req, **_request_note(e)}
        case ev.Queue():  # a counter track: how many wait, and why
            yield {**base, "ph": "C", "name": "queue",
                   "args": {r.value: n for r, n in e.counts().items()}}
        case (ev.NodeCreated() | ev.Extend() | ev.Pin() | ev.Access() | ev.BlockAlloc()
              | ev.BlockFree() | ev.Snapshot() | ev.Digest() | ev.Counters() | ev.Fault()):
            pass  # not drawn: the jsonl export has them
        case _:
            assert_never(e)


def _instant(e: ev.AnyEvent, base: JsonObj, args: JsonObj) -> JsonObj:
    """An instant on the tree track, named by kind so Perfetto groups them ("split", "cow");
    the details are in ``args``."""
    return {**base, "tid": _TREE_TID, "ph": "i", "s": "t", "cat": tag(e), "name": tag(e),
            "args": args}


def perfetto_json(items: Iterable[ev.Batch | Keyframe]) -> bytes:
    """The whole trace as one JSON document."""
    return msgspec.json.encode({"traceEvents": list(perfetto_events(items)),
                                "displayTimeUnit": "ms"})
