"""Follower: what the inspector learns from the stream it follows, event by event.

Attached to a mirror (``Mirror.watch``: one watcher among any others), it sees every event
right after the mirror applied it, whoever applies it (an embedded loop's feed, a live
subscriber, a replay), and keeps:

- ``curve``: the what-if curve of the requests finished since it began (``RunningCurve``,
  token-granular LRU), beside the engine's measured hits over the same requests;
- ``misses``: why each request missed (``MissHistory``).

It runs under whatever lock guards the mirror (the feed's), so readers take that lock too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixcache.analysis.ghosts import MAX_TOKENS
from radixcache.analysis.misses import MissHistory
from radixcache.analysis.whatif import RunningCurve
from radixcache.core import events as ev
from radixcache.core.kinds import exhaustive
from radixcache.traffic.traces import Access, replay_recording

if TYPE_CHECKING:
    from radixcache.wire.mirror import Mirror


class Follower:
    """The curve and the miss history of one mirror's stream (see the module doc).

    One table (``_on``) says what each kind of event means to the curve and to the history
    together, so an event costs one lookup and at most one call: most of a stream (accesses,
    pins, block frees) needs a line or two, and a finished request the curve's one pass and
    the history's prompt, from one read of its path."""

    def __init__(self, mirror: Mirror, *, max_tokens: int = MAX_TOKENS) -> None:
        self.mirror = mirror
        self.max_tokens = max_tokens  # distinct tokens kept by the curve and by the history
        self.curve = RunningCurve(mirror)
        self.misses = MissHistory(mirror, max_tokens=max_tokens)
        self.since = mirror.seq  # the curve covers the requests finished after this seq
        self.joined_nodes = 0  # nodes the tree held at ``since`` (> 0: the curve starts cold)
        self.curve_full = max_tokens <= 0  # MAX_TOKENS distinct tokens: later requests not
        # counted
        self._last_seq = mirror.seq
        self._followed = False  # any event but a snapshot seen yet
        self.error: str | None = None  # why following stopped, if it did
        self._on = self._table()
        mirror.watch(self.observe)

    def _table(self) -> Mapping[type[ev.Event], Callable[[Any], None] | None]:
        m = self.misses.handlers()
        table = exhaustive("analysis.follow", {
            ev.Access: self._access, ev.Pin: m[ev.Pin], ev.RequestStart: self._start,
            ev.RequestFinish: self._finish, ev.NodeCreated: m[ev.NodeCreated],
            ev.Extend: m[ev.Extend], ev.Evict: m[ev.Evict], ev.RequestCached: m[ev.RequestCached],
            ev.Retract: m[ev.Retract],
            ev.Reset: m[ev.Reset], ev.Snapshot: self._snapshot,
            **dict.fromkeys((ev.Split, ev.Merge, ev.BlockAlloc, ev.BlockFree, ev.Cow,
                             ev.Watermark, ev.Counters, ev.Fault, ev.Digest, ev.Queue)),
        })  # (the None rows: kinds that change nothing either keeps)
        return table

    def detach(self) -> None:
        """Stop following (the mirror's other watchers go on)."""
        self.mirror.unwatch(self.observe)

    def observe(self, e: ev.AnyEvent) -> None:
        """Account one event the mirror has just applied. A failure here must not cost the
        stream the mirror follows: the follower detaches itself and keeps the reason in
        ``error`` (the screens show it)."""
        try:
            handler = self._on[type(e)]
            if handler is not None:
                handler(e)
            if type(e) is not ev.Snapshot:
                self._followed = True
            self._last_seq = self.misses.last_seq = self.mirror.seq
        except Exception as exc:  # any bug: stop following, say why
            self.error = f"{type(exc).__name__}: {exc} (at seq {self.mirror.seq})"
            self.detach()

    def _access(self, e: ev.Access) -> None:
        self.curve.tracker.after(e)

    def _start(self, e: ev.RequestStart) -> None:
        if self.curve_full:
            self.curve.tracker.after(e)
        else:
            self.curve.observe(e)  # (its prompt length, the engine's measured hits)
        self.misses.start(e)

    def _finish(self, e: ev.RequestFinish) -> None:
        curve = self.curve
        got = curve.tracker.finished(e)
        self.misses.finish(e)
        if got is None:
            return
        seq, p = got
        if not self.curve_full:
            curve.stack.add(Access(seq, p, p))  # block 1: every token is a unit
            self.curve_full = curve.stack.distinct_units >= self.max_tokens
        self.misses.keep_prompt(e.req, seq[: 4 * p])

    def _snapshot(self, e: ev.Snapshot) -> None:
        m = self.mirror
        if m.seq < self._last_seq:  # a replay went back, a new engine: start over
            self.curve = RunningCurve(m)
            self.curve_full = self.max_tokens <= 0
        if m.seq < self._last_seq or not self._followed:
            self.since = m.seq  # (the join: the seq the inspector's first snapshot is at)
            self.joined_nodes = len(e.nodes) - 1  # (the root is one of them)
        self.misses.restart(e)


def follow_recording(path: Path) -> tuple[Follower, str | None]:
    """A ``Follower`` over a recording's stream, from its first keyframe to its end (or to
    its damage, which the second item describes): ``radixcache whatif FILE --why REQ``."""
    from radixcache.wire.mirror import Mirror

    mirror = Mirror()
    follower = Follower(mirror)
    notes: list[str] = []
    for _ in replay_recording(path, mirror, notes):
        pass
    return follower, notes[0] if notes else None


def why_record(follower: Follower, req: int) -> dict[str, object]:
    """Request ``req`` as ``--json`` prints it (stable keys)."""
    why = follower.misses.why(req)
    if why is None:
        return {"req": req, "seen": False}
    return {
        "req": req, "seen": True, "seq": why.seq, "prompt_tokens": why.prompt_tokens,
        "hit_tokens": why.hit_tokens, "finished": why.finished,
        "path": [list(p) for p in why.path],
        "spans": None if why.spans is None else [
            {"start": s.start, "end": s.end, "cause": s.cause.value,
             "seq": s.seq} for s in why.spans],
    }
