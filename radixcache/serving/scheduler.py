"""The scheduler: the waiting queue, the order it is admitted in, and why each request waits.

The engine calls ``plan`` once per step with the requests running now, and gets the step's
``StepPlan`` (``serving.admission``), which ``Running.step`` executes; nothing calls back into
the scheduler during the step. A step considers the first ``WINDOW`` waiting requests (in
arrival order), puts them in the policy's order (``serving.policy``) and admits them one by
one (``Admission.admit``: match and pin the cached prefix, then a lease of blocks) until one
does not fit::

    waiting (arrival order) ──window──▶ aged first, then policy order ──▶ for each:
        batch full?  ─▶ stop: it waits "batch full", the rest "order"
        shares ≥ 32 tokens a running request R is computing?
            R's prefill ends in this step's forward ─▶ publish R's blocks, admit beside it
                                                       (plan.published, plan.copies)
            else ─▶ held: "sharing" (R, node N)        (plan.releases[R])
        match + pin + allocate ─▶ plan.admitted | plan.rejected | "pool full": stop

In-batch prefix sharing (cache-aware policies): a request whose prompt continues, for at least
``share_min_tokens`` (32, SGLang's threshold) past its cached match, the prompt of a running
request R does not compute the same tokens beside it: the first of 40 users of a new system
prompt computes it, the other 39 read it. Two ways, the first preferred:

- *In the same forward* (``share_in_forward``): when R's prefill ends in this step's first
  forward (every prefill before it and its own fit the step's token budget, which is exactly
  how ``Running`` plans it), R's prompt up to its last whole block goes in the tree now
  (``Admission.publish``), before it is computed, and the request is admitted at once,
  matching it. The model writes every new token's K/V of a layer before any sequence reads
  that layer, so in that forward the request reads what R writes. Nothing reads those blocks
  before it: the only early reader is the boundary copy of a match that ends inside one (made
  at allocation, of slots not written yet), and that forward makes it again after each
  layer's writes (``plan.copies``, from ``core.lease.ForwardCopies``). The request waits no
  longer than under ``fcfs``.
- *After it*: otherwise the request waits for R's insert (``plan.releases[R]``). ``Running``
  inserts the prompt right after the forward that ends its prefill and admits the requests
  held for it (``Admission.release``) in the same step, and they prefill in that step: the
  wait is one forward.

Aging bounds every reordering: a request waiting ``max_wait_steps`` steps (64) goes before
every policy choice, in arrival order, and is never held again. Holding or reordering a request
never changes what it computes (the model reads the same K/V, cached or not), only when.

Threads: ``add`` and ``take`` may be called from any thread; everything else runs on the
stepping thread (the engine's step lock held).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from radixcache.core import events as ev
from radixcache.core.lease import ForwardCopies
from radixcache.core.pool import KVPool
from radixcache.core.tree import RadixTree
from radixcache.serving.admission import (
    Admission,
    Emit,
    Started,
    StepPlan,
    Waiting,
    sharer,
)
from radixcache.serving.policy import Candidate, SchedulePolicy, ordered
from radixcache.serving.requests import EngineConfig, EngineError, Request
from radixcache.serving.running import prefill_ends

WINDOW = 128  # waiting requests a step orders (SGLang stops sorting past 128 waiting)
SHOWN = 64  # waiting requests a ``Queue`` event lists


class _Plan:
    """One ``plan`` in the making: what becomes the ``StepPlan``, and who runs so far."""

    def __init__(self, running: Sequence[Request], block_size: int) -> None:
        self.inflight = list(running)
        self.rejected: list[tuple[Request, EngineError]] = []
        self.published: list[tuple[int, int]] = []
        self.copies = ForwardCopies(block_size)
        self.releases: dict[int, list[Request]] = {}
        self.entries: list[ev.Waiting] = []
        self.first = len(self.inflight)  # where the admitted start in ``inflight``

    def done(self, policy: SchedulePolicy) -> StepPlan:
        releases = {k: tuple(v) for k, v in self.releases.items()}
        return StepPlan(policy, tuple(self.inflight[self.first:]), tuple(self.rejected),
                        tuple(self.published), self.copies.slots(), MappingProxyType(releases))


class Scheduler:
    """The engine's waiting queue and admission (see the module doc)."""

    def __init__(self, tree: RadixTree, pool: KVPool, config: EngineConfig, started: Started,
                 emit: Emit) -> None:
        self.tree, self.pool, self.config = tree, pool, config
        self.policy = config.schedule
        self._emit = emit  # the engine's event log
        self._waiting = Waiting()
        self.admission = Admission(tree, pool, config, self._waiting, started, emit)
        self.steps = 0
        self.held = 0  # requests held for a running request's insert (each counted once)
        self.aged = 0  # requests that reached ``max_wait_steps`` waiting
        self._entries: list[ev.Waiting] = []
        self._shown: tuple[object, ...] = ()  # what the last ``Queue`` event said

    @property
    def shared(self) -> int:
        """Requests admitted reading blocks their step's forward writes, so far."""
        return self.admission.shared

    # -- the queue -------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """Queue ``req`` (thread-safe)."""
        req.queued = self.steps
        self._waiting.add(req)

    def requeue(self, req: Request) -> None:
        """Put a retracted ``req`` back at the head of the queue (thread-safe); its wait so far
        still counts towards aging."""
        self._waiting.add_first(req)

    def __len__(self) -> int:
        return len(self._waiting)

    def take(self, request_id: int) -> Request | None:
        """Remove and return the waiting request ``request_id`` (None: not waiting)."""
        return self._waiting.take(request_id)

    def drain(self) -> list[Request]:
        """Remove and return every waiting request, in arrival order."""
        self._entries = []
        return self._waiting.drain()

    def set_policy(self, policy: SchedulePolicy) -> None:
        """Order the queue by ``policy`` from the next step on."""
        self.policy = policy

    # -- why they wait ---------------------------------------------------------------------
    def entries(self) -> list[ev.Waiting]:
        """Why each considered waiting request waits after the last step, in admission order
        (the ones past the window wait "order" and are not listed; the ones a release
        admitted are not waiting any more)."""
        return [w for w in self._entries if w.req in self._waiting]

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
                        self.entries()[:SHOWN])

    def note_paused(self) -> None:
        """Every considered request now waits ``PAUSED`` (until the next step)."""
        self._entries = [w if w.reason is ev.WaitReason.PAUSED else
                         ev.Waiting(w.req, ev.WaitReason.PAUSED, w.queued) for w in self._entries]

    # -- one step --------------------------------------------------------------------------
    def plan(self, running: Sequence[Request], *, paused: bool) -> StepPlan:
        """This step's plan (see the module doc): admit what fits now, in the policy's order;
        ``running`` are the requests running now. Records why every other considered request
        waits."""
        self.steps += 1
        window = self._waiting.window(WINDOW)
        if paused:
            self._entries = [ev.Waiting(r.id, ev.WaitReason.PAUSED, r.queued) for r in window]
            return StepPlan(self.policy)
        p = _Plan(running, self.config.block_size)
        self.admission.open(running)
        stop: ev.WaitReason | None = None
        for c in self._ordered(window, full=len(p.inflight) >= self.config.max_running):
            req = window[c.position]
            if stop is None and len(p.inflight) >= self.config.max_running:
                stop = ev.WaitReason.BATCH
            elif stop is None:
                stop = self._consider(req, c, p)
                if stop is None:
                    continue
            else:
                p.entries.append(ev.Waiting(req.id, ev.WaitReason.ORDER, req.queued))
                continue
            p.entries.append(ev.Waiting(req.id, stop, req.queued))
        self._entries = p.entries
        return p.done(self.policy)

    def _consider(self, req: Request, c: Candidate, p: _Plan) -> ev.WaitReason | None:
        """Hold ``req`` for a sharer, admit it (beside its sharer, or alone) or say why it
        cannot be: ``POOL``, the reason to stop at."""
        if p.copies and c.node is not None:  # its peek predates a publish
            c = self.admission.peek(c.position, req)
        on = self._sharer(req, c, p.inflight)
        if on is not None and not self._share(on[0], p):
            p.entries.append(self._hold(req, c, *on))
            p.releases.setdefault(on[0].id, []).append(req)
            return None
        out = self.admission.admit(req, p.inflight, p.copies)
        if isinstance(out, EngineError):
            p.rejected.append((req, out))
            return None
        return out

    def _aged(self, req: Request) -> bool:
        return self.steps - req.queued >= self.config.max_wait_steps

    def _ordered(self, window: list[Request], *, full: bool) -> list[Candidate]:
        """The window's candidates: aged ones first in arrival order, then the policy's order
        (the cache-aware policies peek at each one's cached prefix, touching nothing). With
        the batch ``full`` nobody is admitted: arrival order, nothing peeked."""
        if not self.policy.cache_aware or full:
            return [Candidate(i, None, 0) for i in range(len(window))]
        cands = [self.admission.peek(i, r) for i, r in enumerate(window)]
        aged = [c for c in cands if self._aged(window[c.position])]
        for c in aged:
            if window[c.position].aged_at is None:
                window[c.position].aged_at = self.steps
                self.aged += 1
        rest = [c for c in cands if window[c.position].aged_at is None]
        return aged + ordered(self.policy, rest)

    def _sharer(self, req: Request, c: Candidate,
                inflight: list[Request]) -> tuple[Request, int] | None:
        """``admission.sharer``; None when ``req`` is aged, the policy is ``fcfs`` or the
        cache is off."""
        if not self.policy.cache_aware or req.aged_at is not None or c.node is None \
                or not self.config.cache:
            return None
        return sharer(req, c.cached, inflight, self.config.share_min_tokens)

    def _hold(self, req: Request, c: Candidate, on: Request, best: int) -> ev.Waiting:
        """``req`` waits for ``on``'s insert: its ``SHARING`` entry."""
        if not req.held:
            req.held = True
            self.held += 1
        assert c.node is not None
        return ev.Waiting(req.id, ev.WaitReason.SHARING, req.queued, on.id, c.node.id,
                          best - c.cached)

    def _share(self, on: Request, p: _Plan) -> bool:
        """Publish ``on``'s prompt up to its last whole block now, when its prefill ends in
        this step's first forward (see the module doc); False when it cannot (then requests
        sharing it wait for its insert). It cannot when in-forward sharing is off; when ``on``
        decodes already, or has no whole block left to compute; when its prefill does not end
        in the first forward; when no block is spare (its decode lease); or when more of its
        prompt was cached since its match (publishing would rewrite those blocks)."""
        if on.published:
            return True  # earlier in this plan
        n = p.copies.whole(len(on.prompt))
        if not self.config.share_in_forward or not on.prefilling or on.fill is not on.prompt \
                or on.match is None \
                or n <= on.computed \
                or not prefill_ends(p.inflight, on, self.config.max_step_tokens) \
                or self.pool.free_blocks < 1 \
                or self.tree.peek(on.prompt[:n])[1] != on.match.length:
            return False
        m = self.admission.publish(on, n)
        on.published = True
        p.copies.write(m, on.computed, n)
        p.published.append((on.id, n))
        self._emit(ev.RequestCached(on.id, n))
        return True
