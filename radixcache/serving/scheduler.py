"""The scheduler: the waiting queue, the order it is admitted in, and why each request waits.

The engine calls ``admit`` once per step with the requests running now. A step considers the
first ``WINDOW`` waiting requests (in arrival order), puts them in the policy's order
(``serving.policy``) and admits them one by one (match and pin the cached prefix, then a lease
of blocks) until one does not fit::

    waiting (arrival order) ──window──▶ aged first, then policy order ──▶ for each:
        batch full?  ─▶ stop: it waits "batch full", the rest "order"
        shares ≥ 32 tokens a running request R is computing?
            R's prefill ends in this step's forward ─▶ publish R's blocks, admit beside it
            else ─▶ held: "sharing" (R, node N)
        match + pin + allocate ─▶ admitted (``started(req)``) | rejected | "pool full": stop

In-batch prefix sharing (cache-aware policies): a request whose prompt continues, for at least
``share_min_tokens`` (32, SGLang's threshold) past its cached match, the prompt of a running
request R does not compute the same tokens beside it: the first of 40 users of a new system
prompt computes it, the other 39 read it. Two ways, the first preferred:

- *In the same forward* (``share_in_forward``): when R's prefill ends in this step's first
  forward (every prefill before it and its own fit the step's token budget, which is exactly
  how ``Running`` plans it), R's prompt up to its last whole block goes in the tree now
  (``publish``), before it is computed, and the request is admitted at once, matching it. The
  model writes every new token's K/V of a layer before any sequence reads that layer, so in
  that forward the request reads what R writes. Nothing reads those blocks before it: the
  only early reader is the boundary copy of a match that ends inside one (made at allocation,
  of slots not written yet), and that forward makes it again after each layer's writes
  (``take_copy``). The request waits no longer than under ``fcfs``.
- *After it*: otherwise the request waits for R's insert. The engine inserts the prompt right
  after the forward that ends its prefill and calls ``admit(again=True)`` in the same step, and
  the released requests prefill in that step: the wait is one forward.

Aging bounds every reordering: a request waiting ``max_wait_steps`` steps (64) goes before
every policy choice, in arrival order, and is never held again. Holding or reordering a request
never changes what it computes (the model reads the same K/V, cached or not), only when.

Threads: ``add`` may be called from any thread; everything else runs on the stepping thread
(the engine's step lock held).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Sequence
from itertools import islice
from typing import NamedTuple

from radixcache.core import events as ev
from radixcache.core.pool import PoolExhausted
from radixcache.core.tokens import TOKEN_BYTES, common_units
from radixcache.core.tree import Lease, MatchResult, PromptTooLarge, RadixTree
from radixcache.serving.policy import Candidate, Policy, ordered
from radixcache.serving.requests import EngineConfig, Request, RequestRejected
from radixcache.serving.running import prefill_ends

WINDOW = 128  # waiting requests a step orders (SGLang stops sorting past 128 waiting)
SHOWN = 64  # waiting requests a ``Queue`` event lists

Started = Callable[[Request], None]
Emit = Callable[[ev.AnyEvent], None]


def publish(tree: RadixTree, r: Request, n: int) -> MatchResult:
    """Put ``r``'s first ``n`` prompt tokens in the tree with its lease's blocks; ``r`` then
    pins them (its hit stays the admission's) and takes a new lease for the rest of its
    positions. Returns the pinned match."""
    assert r.lease is not None and r.match is not None
    tokens = r.prompt if n == len(r.prompt) else r.prompt[:n]
    tree.insert(tokens, r.lease)
    m = tree.match_and_pin(tokens)
    tree.unpin(r.match.node)
    r.match = r.match._replace(node=m.node)
    r.lease = tree.allocate(m, r.total)
    return m


class Admission(NamedTuple):
    """What one ``admit`` did: requests admitted (already running: matched, pinned, leased) and
    requests rejected (they can never fit the pool) with their error."""

    admitted: list[Request]
    rejected: list[tuple[Request, RequestRejected]]


class Scheduler:
    """The engine's waiting queue and admission (see the module doc)."""

    def __init__(self, tree: RadixTree, config: EngineConfig, started: Started,
                 emit: Emit) -> None:
        self.tree, self.config = tree, config
        self.policy = config.schedule
        self._started = started  # called right after each admission (its RequestStart)
        self._emit = emit  # the engine's event log
        self._lock = threading.Lock()
        self._waiting: dict[int, Request] = {}  # arrival order
        self.steps = 0
        self.held = 0  # requests held for a running request's insert (each counted once)
        self.aged = 0  # requests that reached ``max_wait_steps`` waiting
        self.shared = 0  # requests admitted reading blocks their step's forward writes
        self._pending: set[int] = set()  # published blocks this step's forward writes
        self._copy: tuple[list[int], list[int]] = ([], [])  # slot copies for that forward
        self._origin: dict[int, int] = {}  # a copied slot's first source
        self._entries: list[ev.Waiting] = []
        self._shown: tuple[object, ...] = ()  # what the last ``Queue`` event said

    # -- the queue -------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """Queue ``req`` (thread-safe)."""
        with self._lock:
            req.queued = self.steps
            self._waiting[req.id] = req

    def __len__(self) -> int:
        return len(self._waiting)

    def take(self, request_id: int) -> Request | None:
        """Remove and return the waiting request ``request_id`` (None: not waiting)."""
        with self._lock:
            return self._waiting.pop(request_id, None)

    def drain(self) -> list[Request]:
        """Remove and return every waiting request, in arrival order."""
        with self._lock:
            out, self._waiting = list(self._waiting.values()), {}
        self._entries = []
        return out

    def set_policy(self, policy: Policy) -> None:
        """Order the queue by ``policy`` from the next step on."""
        self.policy = policy

    # -- why they wait ---------------------------------------------------------------------
    def entries(self) -> list[ev.Waiting]:
        """Why each considered waiting request waits after the last step, in admission order
        (the ones past the window wait "order" and are not listed)."""
        return self._entries

    def queue_event(self) -> ev.Queue | None:
        """A ``Queue`` event when the queue changed since the last one returned, else None."""
        q = self.queue()
        key = (q.waiting, tuple((w.req, w.reason, w.on_req, w.node) for w in q.entries))
        if key == self._shown:
            return None
        self._shown = key
        return q

    def queue(self) -> ev.Queue:
        """The queue now: policy, step, how many wait and why the first ``SHOWN`` wait."""
        return ev.Queue(self.policy.value, self.steps, len(self._waiting),
                        self._entries[:SHOWN])

    def held_for(self, ids: set[int]) -> bool:
        """Whether a request waits, after the last step, for the insert of one of ``ids``."""
        return any(w.reason is ev.WaitReason.SHARING and w.on_req in ids for w in self._entries)

    def note_paused(self) -> None:
        """Every considered request now waits ``PAUSED`` (until the next step)."""
        self._entries = [w if w.reason is ev.WaitReason.PAUSED else
                         ev.Waiting(w.req, ev.WaitReason.PAUSED, w.queued) for w in self._entries]

    # -- one step --------------------------------------------------------------------------
    def admit(self, running: Sequence[Request], *, paused: bool,
              again: bool = False) -> Admission:
        """Admit what fits now, in the policy's order (see the module doc); ``running`` are
        the requests running now. Records why every other considered request waits.
        ``again``: a second admission in the same step (requests a prefill just released),
        which does not count as a step."""
        self.steps += 0 if again else 1
        with self._lock:
            window = list(islice(self._waiting.values(), WINDOW))
        if paused:
            self._entries = [ev.Waiting(r.id, ev.WaitReason.PAUSED, r.queued) for r in window]
            return Admission([], [])
        out = Admission([], [])
        inflight = list(running)
        self._pending, self._origin = set(), {}  # (after a forward, they are written)
        entries: list[ev.Waiting] = []
        stop: ev.WaitReason | None = None
        for c in self._ordered(window, full=len(inflight) >= self.config.max_running):
            req = window[c.position]
            if stop is None and len(inflight) >= self.config.max_running:
                stop = ev.WaitReason.BATCH
            elif stop is None:
                if self._pending and c.node is not None:  # its peek predates a publish
                    c = self._peek(c.position, req)
                sharer = self._sharer(req, c, inflight)
                beside = sharer is not None and not again and self._share(sharer[0], inflight)
                if sharer is not None and not beside:
                    entries.append(self._hold(req, c, *sharer))
                    continue
                stop = self._try_admit(req, inflight, out)
                if stop is None:
                    continue
            else:
                entries.append(ev.Waiting(req.id, ev.WaitReason.ORDER, req.queued))
                continue
            entries.append(ev.Waiting(req.id, stop, req.queued))
        self._remove(out)
        self._entries = entries
        return out

    def _remove(self, out: Admission) -> None:
        with self._lock:
            for r in out.admitted:
                del self._waiting[r.id]
            for r, _ in out.rejected:
                del self._waiting[r.id]

    def _aged(self, req: Request) -> bool:
        return self.steps - req.queued >= self.config.max_wait_steps

    def _ordered(self, window: list[Request], *, full: bool) -> list[Candidate]:
        """The window's candidates: aged ones first in arrival order, then the policy's order
        (the cache-aware policies peek at each one's cached prefix, touching nothing). With
        the batch ``full`` nobody is admitted: arrival order, nothing peeked."""
        if not self.policy.cache_aware or full:
            return [Candidate(i, None, 0) for i in range(len(window))]
        cands = [self._peek(i, r) for i, r in enumerate(window)]
        aged = [c for c in cands if self._aged(window[c.position])]
        for c in aged:
            if window[c.position].aged_at is None:
                window[c.position].aged_at = self.steps
                self.aged += 1
        rest = [c for c in cands if window[c.position].aged_at is None]
        return aged + ordered(self.policy, rest)

    def _peek(self, i: int, req: Request) -> Candidate:
        if not self.config.cache or len(req.prompt) < 2:
            return Candidate(i, self.tree.root, 0)
        node, cached = self.tree.peek(req.key)
        return Candidate(i, node, cached)

    def _sharer(self, req: Request, c: Candidate,
                inflight: list[Request]) -> tuple[Request, int] | None:
        """The running request computing at least ``share_min_tokens`` of ``req``'s prompt
        past its cached match (the one that shares most) and how many tokens they share; None
        when there is none, ``req`` is aged or the policy is ``fcfs``."""
        if not self.policy.cache_aware or req.aged_at is not None or c.node is None:
            return None
        key = req.key  # prompt[:-1], the part a match may cover
        need = (c.cached + self.config.share_min_tokens) * TOKEN_BYTES
        if not self.config.cache or len(key) < need:
            return None
        head, best, on = key[:need], 0, None
        for r in inflight:
            if r.key.startswith(head):
                n = common_units(r.key, 0, key)
                if n > best:
                    best, on = n, r
        return None if on is None else (on, best)

    def _hold(self, req: Request, c: Candidate, on: Request, best: int) -> ev.Waiting:
        """``req`` waits for ``on``'s insert: its ``SHARING`` entry."""
        if not req.held:
            req.held = True
            self.held += 1
        assert c.node is not None
        return ev.Waiting(req.id, ev.WaitReason.SHARING, req.queued, on.id, c.node.id,
                          best - c.cached)

    def _share(self, on: Request, inflight: list[Request]) -> bool:
        """Publish ``on``'s prompt up to its last whole block now, when its prefill ends in
        this step's first forward (see the module doc); False when it cannot (then requests
        sharing it wait for its insert)."""
        if on.published:
            return True  # earlier in this admission
        B = self.config.block_size
        n = len(on.prompt) // B * B
        if not self.config.share_in_forward or on.output or on.match is None \
                or n <= on.computed \
                or not prefill_ends(inflight, on, self.config.max_step_tokens) \
                or self.tree.pool.allocator.free_count < 1 \
                or self.tree.peek(on.prompt[:n])[1] != on.match.length:
            return False  # (more of it cached since its match: it would rewrite those blocks)
        m = publish(self.tree, on, n)
        on.published = True
        self._pending.update(m.block_table[on.computed // B : n // B])
        self._emit(ev.RequestCached(on.id, n))
        return True

    def _copy_later(self, m: MatchResult, lease: Lease) -> None:
        """When ``m`` ends inside a published block this step's forward writes, the lease's
        boundary copy of it (made now, of slots not written yet) is made again by that
        forward, after each layer's writes (``take_copy``)."""
        B = self.config.block_size
        j, partial = divmod(m.length, B)
        if not partial or m.block_table[j] not in self._pending:
            return
        assert lease.inplace is None  # published blocks are claimed whole: it copied
        src, dst = m.block_table[j] * B, lease.table[j] * B
        for i in range(partial):  # a copy of a copy reads the first source
            origin = self._origin.get(src + i, src + i)
            self._copy[0].append(origin)
            self._copy[1].append(dst + i)
            self._origin[dst + i] = origin

    def take_copy(self) -> tuple[list[int], list[int]] | None:
        """The slot copies this step's first forward must run (None: none), taken."""
        copy, self._copy = self._copy, ([], [])
        return copy if copy[0] else None

    # -- admission of one request ----------------------------------------------------------
    def _try_admit(self, req: Request, inflight: list[Request],
                   out: Admission) -> ev.WaitReason | None:
        """Match, pin and lease ``req``: admitted (into ``out`` and ``inflight``), rejected
        (into ``out``), or ``POOL`` when the pool cannot hold it now."""
        m = self._pin_prefix(req)
        try:
            lease = self._allocate(m, req, has_running=bool(inflight))
        except PromptTooLarge as err:
            out.rejected.append((req, RequestRejected(f"request {req.id}: {err}")))
            return None
        if lease is None:
            return ev.WaitReason.POOL
        req.match, req.lease = lease
        req.computed = req.match.length
        if self._pending and not self._pending.isdisjoint(req.match.block_table):
            self.shared += 1  # it reads blocks this step's forward writes
            self._copy_later(*lease)
        self._started(req)
        out.admitted.append(req)
        inflight.append(req)
        return None

    def _pin_prefix(self, req: Request) -> MatchResult:
        if not self.config.cache or len(req.prompt) < 2:
            return self._pin_root()
        return self.tree.match_and_pin(req.prompt[:-1])

    def _pin_root(self) -> MatchResult:
        self.tree.pin(self.tree.root)
        return MatchResult(0, self.tree.root, array("i"))

    def _allocate(self, m: MatchResult, req: Request, *,
                  has_running: bool) -> tuple[MatchResult, Lease] | None:
        """Blocks for ``req`` after its pinned match ``m``; None (and unpinned) when blocked.

        With nothing running, a blocked request retries without its match: a boundary copy
        or the matched path may be what keeps it from fitting, and nothing else will unpin.
        """
        try:
            return m, self.tree.allocate(m, req.total)
        except PoolExhausted:
            self.tree.unpin(m.node)
        except PromptTooLarge:
            self.tree.unpin(m.node)
            raise
        if has_running or m.length == 0:
            return None
        m = self._pin_root()
        try:
            return m, self.tree.allocate(m, req.total)
        except PoolExhausted:
            self.tree.unpin(m.node)
            return None
