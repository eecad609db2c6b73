"""Why a request missed: the history of what the engine's tree held while we followed it.

A ghost trie holds every token sequence the tree held since the follower joined (or since
the last snapshot that went back in the stream: a replay seeking back, a new engine): the
snapshots' paths, then every ``NodeCreated`` and ``Extend``. Each ghost span keeps its
in/out history, one entry per change: in at the event that inserted it, out at the
``Evict`` (or ``Reset``) that removed it. The history is stamped with the mirror's event
counter (``Mirror.version``, which orders events inside a batch) and the batch seq (what
the person sees).

A request is explained once it finishes (the stream names a prompt's tokens only then, as
the path its insert touched: ``RequestTracker``), against the history at the moment of its
match (the ``Pin`` right before its ``RequestStart``). Its prompt splits into:

- the hit: the matched path, node by node;
- each missed span with its cause:

  ========================  ==============================================================
  ``evicted``               in the tree before, out at its match: evicted at seq S
  ``never seen``            not in the tree at any time before its match (compulsory)
  ``diverged inside a       the match ended inside a block where the cached sequence went
  block``                   on with other tokens: the rest of that block (the matched part
                            of it was reused by copying the block, COW)
  ``capacity``              in the tree at its match, but the pool could not hold the match
                            and the request: the engine admitted it without the match
  ``in flight``             not in the tree at its match, but another request running beside
                            it was computing them (inserted before its own insert): a
                            sequential engine would have hit (batching's cost)
  ``last prompt token``     in the tree, but the engine computes the last prompt token
                            always (its logits start the output)
  ``not followed``          in the tree at its match and not matched: the history missed
                            a change (the follower was resyncing)
  ========================  ==============================================================
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MethodType
from typing import TYPE_CHECKING, Any, NamedTuple

from radixcache.analysis.ghosts import MAX_TOKENS, Ghosts, W
from radixcache.core import events as ev
from radixcache.core.kinds import exhaustive
from radixcache.core.tokens import common_units
from radixcache.traffic.traces import path_tokens

if TYPE_CHECKING:
    from radixcache.wire.mirror import Mirror, MirrorNode

KEEP_REQUESTS = 4_096  # explained requests kept (the event log scrolls back 2,000 events)
FORGOTTEN_KEPT = 65_536  # requests dropped from the history that it still says so of
MAX_LINES = 40  # spans ``describe`` lists (a long prompt evicted piece by piece has many)


class Cause(enum.Enum):
    """Why a span of a prompt was not served from the cache."""

    EVICTED = "evicted"
    NEVER_SEEN = "never seen"
    DIVERGED = "diverged inside a block"
    CAPACITY = "capacity"
    IN_FLIGHT = "in flight"
    LAST_TOKEN = "last prompt token"
    NOT_FOLLOWED = "not followed"


class Span(NamedTuple):
    """Prompt tokens ``[start, end)`` missed for ``cause``; ``seq`` is the batch of the
    eviction (evicted) or of the other request's insert (in flight), None for the others."""

    start: int
    end: int
    cause: Cause
    seq: int | None = None

    def line(self, resets: frozenset[int] = frozenset()) -> str:
        """``tokens 40-96 (56): evicted at seq 812``."""
        what = self.cause.value
        if self.cause is Cause.EVICTED:
            what += f" at seq {self.seq}" + (" (engine reset)" if self.seq in resets else "")
        elif self.cause is Cause.IN_FLIGHT:
            what += f": another running request was computing them (inserted at seq {self.seq})"
        return f"tokens {self.start}-{self.end} ({self.end - self.start}): {what}"


class Line(NamedTuple):
    """One line of ``describe``: its text, and the cause of the span it shows (None: a line
    that is not a span), so a screen colours by cause without reading the words."""

    text: str
    cause: Cause | None = None


@dataclass(slots=True)
class Why:
    """One request, as far as the stream tells. ``spans`` is None until it finishes."""

    req: int
    seq: int  # the batch of its RequestStart
    prompt_tokens: int
    hit_tokens: int
    path: list[tuple[int, int, int]]  # the matched nodes: (node, start, end), root first
    dropped: int = 0  # tokens of a match given up for room (capacity), once finished
    dropped_path: bytes = b""  # the path of that match's node (the match is a prefix of it)
    spans: list[Span] | None = None
    version: int = 0  # the mirror's event counter at its match
    finished: bool = False
    prompt: bytes = b""  # once finished, until explained
    insert_from: int = 0  # event counter before its own insert (later ones are its own)
    cached: bool = False  # its prompt was inserted before its finish (``RequestCached``)

    @property
    def missed(self) -> int:
        """Prompt tokens computed rather than read from the cache."""
        return self.prompt_tokens - self.hit_tokens


class MissHistory:
    """Follows a mirror's events (its ``handlers()``, called after each is applied; the
    caller then sets ``last_seq``, as ``analysis.follow.Follower`` does) and explains each
    finished request's misses (``why``)."""

    def __init__(self, mirror: Mirror, *, max_tokens: int = MAX_TOKENS) -> None:
        self.mirror = mirror
        self.max_tokens = max_tokens
        self.ghosts = Ghosts(max_tokens)
        self.whys: OrderedDict[int, Why] = OrderedDict()
        # the newest requests dropped for room (req -> the seq it was admitted in), so `why`
        # of one says it fell out of the history, not that it was never seen
        self.forgotten: OrderedDict[int, int] = OrderedDict()
        self.resets: set[int] = set()
        self.since = 0  # the seq of the snapshot the history starts from
        self._match: tuple[int, int] | None = None  # (node, version) of a match in progress
        self._dropped = b""  # the path of a match given up for room, until its RequestStart
        self._edge = 0  # event counter at the last RequestStart or RequestFinish
        self.last_seq: int | None = None  # the batch of the last event seen (a snapshot
        # before it: a seek back); None before the first

    def why(self, req: int) -> Why | None:
        """What is known of request ``req`` (None: not seen since the history began); its
        spans are worked out on the first ask after it finished."""
        why = self.whys.get(req)
        if why is not None and why.prompt:
            why.spans, why.prompt = self.explain(why, why.prompt), b""
        return why

    def all(self) -> list[Why]:
        """Every request kept, oldest first, each finished one explained."""
        return [w for r in list(self.whys) if (w := self.why(r)) is not None]

    def totals(self) -> dict[str, int]:
        """Missed tokens by cause over every request kept (each explained if it was not)."""
        out = {c.value: 0 for c in Cause}
        for w in self.all():
            for span in w.spans or ():
                out[span.cause.value] += span.end - span.start
        return out

    def handlers(self) -> dict[type[ev.Event], Callable[[Any], None]]:
        """What each kind of event means to the history, bound to it (kinds it ignores are
        absent). The caller dispatches once for several followers (``Follower``), then sets
        ``last_seq`` (a snapshot's handler compares it first) and hands a finished request's
        prompt (little-endian uint32 ids) to ``keep_prompt``."""
        return {kind: MethodType(f, self) for kind, f in _HANDLERS.items()}

    def keep_prompt(self, req: int, prompt: bytes) -> None:
        """The finished request ``req``'s prompt, explained when asked (``why``): most never
        are."""
        why = self.whys.get(req)
        if why is not None and why.spans is None:
            why.prompt = prompt

    def _held(self, e: ev.NodeCreated | ev.Extend) -> None:
        m = self.mirror
        n = m.nodes.get(e.node)
        if n is not None:
            seq = path_tokens(n)
            self.ghosts.insert(seq, len(seq) - len(e.tokens), m.version, m.seq)

    def _evicted(self, _: ev.Evict) -> None:
        m = self.mirror
        n = m.last_evicted
        if n is not None:
            seq = path_tokens(n)
            self.ghosts.evict(seq, len(seq) - len(n.tokens), m.version, m.seq)

    def finish(self, e: ev.RequestFinish) -> None:
        """Request ``e.req`` finished: its insert is every event since the last start or
        finish (or its ``RequestCached``)."""
        why = self.whys.get(e.req)
        if why is not None:  # its insert is every event since the last start or finish
            why.finished = True
            if not why.cached:
                why.insert_from = self._edge
        self._edge = self.mirror.version

    def _cached(self, e: ev.RequestCached) -> None:
        why = self.whys.get(e.req)
        if why is not None and not why.cached:  # its prompt's insert: every event since the
            why.cached, why.insert_from = True, self._edge  # last edge (the first, when its
            # prompt went in before its prefill and the rest after: ``serving.scheduler``)
        self._edge = self.mirror.version
        self._match, self._dropped = None, b""  # its re-pin after the insert is no match

    def _retracted(self, _: ev.Retract) -> None:
        """A running request was retracted into the tree: the events before it are its
        insert, no other request's (its resumption's re-pin is no match either)."""
        self._edge = self.mirror.version
        self._match, self._dropped = None, b""

    def _reset(self, _: ev.Reset) -> None:
        self.ghosts.evict_all(self.mirror.version, self.mirror.seq)
        self.resets.add(self.mirror.seq)

    def _pin(self, e: ev.Pin) -> None:
        m = self.mirror
        if e.delta > 0:
            if not (e.node == m.root.id and self._dropped and self._match is None):
                self._dropped = b""  # (a root lock right after a drop: the retry without it)
            self._match = (e.node, m.version)
        elif self._match is not None and e.node == self._match[0] != m.root.id:
            n = m.nodes.get(e.node)  # the match given up: the request waits or goes on
            self._dropped, self._match = (path_tokens(n) if n is not None else b""), None

    def start(self, e: ev.RequestStart) -> None:
        """Request ``e.req`` started: keep its matched path and the moment of its match."""
        m = self.mirror
        node_id, version = self._match if self._match is not None else (m.root.id, m.version)
        path: list[tuple[int, int, int]] = []
        n: MirrorNode | None = m.nodes.get(node_id)
        while n is not None and n.parent is not None:  # (the match may end inside its node)
            if n.start < e.hit_tokens:
                path.append((n.id, n.start, min(n.end, e.hit_tokens)))
            n = n.parent
        path.reverse()
        self.whys[e.req] = Why(e.req, m.seq, e.prompt_tokens, e.hit_tokens, path,
                               dropped_path=self._dropped, version=version)
        self.whys.move_to_end(e.req)
        while len(self.whys) > KEEP_REQUESTS:
            old, why = self.whys.popitem(last=False)
            self.forgotten[old] = why.seq
            if len(self.forgotten) > FORGOTTEN_KEPT:
                self.forgotten.popitem(last=False)
        self._match, self._dropped, self._edge = None, b"", m.version

    def restart(self, _: ev.Snapshot) -> None:
        """A snapshot was loaded. Forward in the same stream (a resync, a replay's keyframe),
        the history goes on: what the snapshot holds is marked held, and a span the history
        holds that the snapshot lacks left during the gap ("not followed" if asked). Back
        (a replay seek, a new engine), the history starts again from what it holds; the
        finished requests are explained first, against the history they were matched in."""
        m = self.mirror
        if self.last_seq is None or self.last_seq > m.seq:  # the join, or back: start again
            self.all()
            self.ghosts = Ghosts(self.max_tokens)
            self.since = m.seq
            self.forgotten.clear()
            for req in [r for r, w in self.whys.items() if w.spans is None]:
                del self.whys[req]  # matched against a history that is gone
            self._edge = m.version
        for n in m.nodes.values():  # what the snapshot holds is held from here on
            if n.parent is not None and not n.children:
                self.ghosts.insert(path_tokens(n), 0, m.version, m.seq)
        self._match, self._dropped = None, b""

    def explain(self, why: Why, prompt: bytes) -> list[Span]:
        """The missed spans of ``prompt`` (``why``'s request), in order."""
        p, v = why.prompt_tokens, why.version
        if why.dropped_path:  # the engine matched prompt[:-1], then gave it up
            why.dropped = min(common_units(prompt, 0, why.dropped_path), p - 1)
        held, others = self.ghosts.along(prompt[: p * W])
        spans: list[Span] = []
        first_new = why.hit_tokens
        at = held[-1][1] if held else 0  # where ``others`` go on with other tokens
        for lo, hi, g, parent in held:
            if hi <= why.hit_tokens:
                continue
            state = g.state_at(v)
            lo = max(lo, why.hit_tokens)
            if state is None and g.history[0] <= why.insert_from:  # another's insert: in flight
                spans.append(Span(lo, hi, Cause.IN_FLIGHT, g.history[1]))
                first_new = hi
                continue
            if state is None:  # first held after the match, by its own insert: new to it
                others, at = [c for c in parent.children.values() if c is not g], lo
                break
            if state[0]:
                spans += _held_unmatched(lo, hi, p, why.dropped)
            else:
                spans.append(Span(lo, hi, Cause.EVICTED, state[1]))
            first_new = hi
        b = self.mirror.block_size
        if at == first_new < p and first_new % b and any(o.state_at(v) is not None for o in others):
            edge = min(p, first_new + b - first_new % b)
            spans.append(Span(first_new, edge, Cause.DIVERGED))
            first_new = edge
        if first_new < p:
            spans.append(Span(first_new, p, Cause.NEVER_SEEN))
        return _merged(spans)



# What each kind means to the history; the rest change no path it keeps.
_HANDLERS: Mapping[type, Callable[[MissHistory, Any], None]] = exhaustive(
    "analysis.misses",
    {ev.NodeCreated: MissHistory._held, ev.Extend: MissHistory._held,
     ev.Evict: MissHistory._evicted, ev.Pin: MissHistory._pin,
     ev.RequestStart: MissHistory.start, ev.RequestFinish: MissHistory.finish,
     ev.RequestCached: MissHistory._cached, ev.Retract: MissHistory._retracted,
     ev.Reset: MissHistory._reset, ev.Snapshot: MissHistory.restart},
    ignored=(ev.Split, ev.Merge, ev.Access, ev.BlockAlloc, ev.BlockFree, ev.Cow, ev.Watermark,
             ev.Counters, ev.Fault, ev.Digest, ev.Queue),
)

def _held_unmatched(lo: int, hi: int, p: int, dropped: int) -> list[Span]:
    """Tokens the tree held at the match but the request did not read from it."""
    out = []
    if lo < dropped:
        out.append(Span(lo, min(hi, dropped), Cause.CAPACITY))
        lo = min(hi, dropped)
    if lo < hi and hi == p:
        if lo < p - 1:
            out.append(Span(lo, p - 1, Cause.NOT_FOLLOWED))
        out.append(Span(max(lo, p - 1), p, Cause.LAST_TOKEN))
    elif lo < hi:
        out.append(Span(lo, hi, Cause.NOT_FOLLOWED))
    return out


def _merged(spans: list[Span]) -> list[Span]:
    out: list[Span] = []
    for s in spans:
        if out and out[-1].end == s.start and (out[-1].cause, out[-1].seq) == (s.cause, s.seq):
            out[-1] = out[-1]._replace(end=s.end)
        else:
            out.append(s)
    return out


def describe(history: MissHistory, req: int, error: str | None = None) -> list[Line]:
    """What the inspector shows for request ``req``: its match, then each missed span;
    ``error``: why the history stopped following, if it did."""
    if error is not None:
        return [Line(f"request {req}: the miss history stopped following the stream ({error})")]
    why = history.why(req)
    if why is None and req in history.forgotten:
        return [Line(f"request {req}: admitted in batch {history.forgotten[req]:,}, it fell "
                     f"out of the history, which keeps the newest {KEEP_REQUESTS:,} requests")]
    if why is None:
        return [Line(f"request {req}: not seen since seq {history.since} (the history starts "
                     f"where the inspector joined, or last went back; it keeps "
                     f"{KEEP_REQUESTS:,} requests)")]
    p, h = why.prompt_tokens, why.hit_tokens
    out = [Line(f"request {req}, admitted in batch {why.seq}: prompt {p:,} tokens, {h:,} read "
                f"from the cache ({100 * h / max(p, 1):.1f}%), {why.missed:,} computed")]
    path = " → ".join(f"n{n} [{a}, {b})" for n, a, b in why.path) or "none (the root)"
    out.append(Line(f"matched path: {path}"))
    if why.spans is None:
        out.append(Line("running: the stream names a prompt's tokens when the request "
                        "finishes (the path its insert touches); look again then"
                        if not why.finished else
                        "not served: the pool could not hold it, so nothing was inserted and "
                        "the stream never named its tokens"))
        return out
    resets = frozenset(history.resets)
    shown = why.spans[:MAX_LINES]
    out += [Line(f"  {s.line(resets)}", s.cause) for s in shown] or [Line("  nothing missed")]
    if len(why.spans) > len(shown):
        rest = why.spans[len(shown):]
        out.append(Line(f"  ... {len(rest):,} more spans, tokens {rest[0].start}-{rest[-1].end}"))
    if history.ghosts.full:
        out.append(Line(f"(the history holds {history.max_tokens:,} tokens: later ones count "
                        "as never seen)"))
    return out
