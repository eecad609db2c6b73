"""Retractions: each request's retractions as the stream told them, and their totals.

Under ``--reserve grow`` a step that finds no block retracts running requests (a ``Retract``
event, schema 6): the request's first ``kept_tokens`` computed tokens go into the tree, its
``blocks`` private blocks are let go and it waits at the queue's head to run again. The why
screen explains a request's wait by them and the stats pane counts them.

When it ran again is exact only when the engine says so with a second ``RequestStart`` for
the same request (its resumption's match, ``hit_tokens`` read back from the tree). A schema 6
engine resumes it silently; then its next event of its own (another ``Retract``, its
``RequestFinish``) bounds the wait from above, and the screen says "within". Both streams
read the same here, in either order of what follows the retraction.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

from radixcache.core import events as ev

REQUESTS_KEPT = 4_096  # retracted requests remembered (the newest), as the miss history keeps


@dataclass(slots=True)
class Retraction:
    """One retraction at batch ``seq`` (time ``ts``), and what came next for its request:
    ``resumed`` when a ``RequestStart`` said it ran again (``hit_tokens`` read back), else
    ``next_seq``/``next_ts`` of its next event, which it ran again before."""

    seq: int
    ts: float
    kept_tokens: int
    blocks: int
    resumed: bool = False
    hit_tokens: int = 0
    next_seq: int | None = None
    next_ts: float = 0.0

    @property
    def waited_s(self) -> float | None:
        """Seconds until it ran again (at most that when not ``resumed``); None: not yet."""
        return None if self.next_seq is None else self.next_ts - self.ts

    def line(self) -> str:
        """``retracted at seq 33: 112 tokens kept in the tree, 5 blocks freed; ran again at
        seq 40, 1.75 s later, 112 tokens read back from the tree``."""
        out = (f"retracted at seq {self.seq:,}: {self.kept_tokens:,} tokens kept in the tree, "
               f"{self.blocks:,} blocks freed; ")
        waited = self.waited_s
        if waited is None:
            return out + "not run again yet"
        if self.resumed:
            return out + (f"ran again at seq {self.next_seq:,}, {waited:.2f} s later, "
                          f"{self.hit_tokens:,} tokens read back from the tree")
        return out + (f"ran again within {waited:.2f} s (by its next event, seq "
                      f"{self.next_seq:,}; the engine does not say when)")


@dataclass(slots=True)
class RequestRetractions:
    """The retractions of request ``req``, oldest first."""

    req: int
    retractions: list[Retraction] = field(default_factory=list)

    def lines(self) -> list[str]:
        """A summary line, then one line per retraction (indented)."""
        rs = self.retractions
        times = {1: "once", 2: "twice"}.get(len(rs), f"{len(rs):,} times")
        kept = sum(r.kept_tokens for r in rs)
        waits = [r.waited_s for r in rs]
        if any(w is None for w in waits):
            wait = "waiting to run again"
        else:
            total = sum(w for w in waits if w is not None)
            exact = all(r.resumed for r in rs)
            wait = f"waited {'' if exact else 'at most '}{total:.2f} s to run again"
        out = [f"retracted {times}: {kept:,} tokens kept in the tree, {wait}"]
        return out + [f"  {r.line()}" for r in rs]


class RetractTotals(NamedTuple):
    """What the stream said of retractions since the inspector joined: how many, the tokens
    they kept in the tree and the blocks they let go."""

    retractions: int = 0
    kept_tokens: int = 0
    blocks: int = 0


NO_RETRACTIONS = RetractTotals()


class Retractions:
    """Every retracted request's retractions (the newest ``REQUESTS_KEPT`` requests) and the
    totals. Written by the feed under its lock, read under it (the why screen, the frame)."""

    def __init__(self) -> None:
        self._of: OrderedDict[int, RequestRetractions] = OrderedDict()
        self.totals = NO_RETRACTIONS

    def of(self, req: int) -> RequestRetractions | None:
        """Request ``req``'s retractions (None: none seen, or it fell out of the history)."""
        return self._of.get(req)

    def retracted(self, e: ev.Retract, seq: int, ts: float) -> None:
        """``e`` arrived in batch ``seq`` (time ``ts``)."""
        self._ran_again(e.req, seq, ts)
        rr = self._of.get(e.req)
        if rr is None:
            rr = self._of[e.req] = RequestRetractions(e.req)
            while len(self._of) > REQUESTS_KEPT:
                self._of.popitem(last=False)
        rr.retractions.append(Retraction(seq, ts, e.kept_tokens, e.blocks))
        t = self.totals
        self.totals = RetractTotals(t.retractions + 1, t.kept_tokens + e.kept_tokens,
                                    t.blocks + e.blocks)

    def started(self, e: ev.RequestStart, seq: int, ts: float) -> None:
        """A ``RequestStart``: for a request waiting after a retraction, its resumption."""
        rr = self._of.get(e.req)
        last = rr.retractions[-1] if rr is not None else None
        if last is not None and last.next_seq is None:
            last.resumed, last.hit_tokens = True, e.hit_tokens
            last.next_seq, last.next_ts = seq, ts

    def finished(self, e: ev.RequestFinish, seq: int, ts: float) -> None:
        """A ``RequestFinish``: a request retracted last ran again before it."""
        self._ran_again(e.req, seq, ts)

    def _ran_again(self, req: int, seq: int, ts: float) -> None:
        rr = self._of.get(req)
        last = rr.retractions[-1] if rr is not None else None
        if last is not None and last.next_seq is None:  # resumed silently (schema 6)
            last.next_seq, last.next_ts = seq, ts

    def clear(self) -> None:
        """Forget everything (a replay went back: its batches come again)."""
        self._of.clear()
        self.totals = NO_RETRACTIONS
