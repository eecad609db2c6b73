"""Admission: a waiting request becoming a running one, and the one plan a step executes.

``Scheduler.plan`` (``serving.scheduler``) decides once per step who is admitted, held or left
waiting, and returns a ``StepPlan``; ``Running.step`` (``serving.running``) executes it. Nothing
calls back into the scheduler during the step::

    Scheduler.plan(running) ─▶ StepPlan ─────────────────────────▶ Running.step(plan)
      admitted   pinned and leased now, in order         forward 1: every prefill chunk
      rejected   never fit the pool                                 (+ the decodes), and
      failed     the tree refused them                              plan.copies after each
      published  sharers' prompts put in the tree now,              layer's writes
                 before forward 1 computes them             │
      copies     slot copies forward 1 makes again          ▼ prefills that ended
      releases   sharer id ─▶ requests held for it       Admission.release: cache their
                                                          prompts, admit what plan.releases
                                                          names for them
                                                            │
                                                            ▼
                                                         forward 2..: the decodes, and the
                                                          released requests' chunks

``Admission`` is the tree side of admitting, the same code before the forward (the scheduler's
choices) and after it (the releases): match and pin the cached prefix, lease blocks, take the
request off the waiting queue (``Waiting``), say it started. Publishing happens while planning,
not after it, because a request admitted beside its sharer matches the published blocks.

Threads: ``Waiting.add`` and ``Waiting.take`` may be called from any thread (its own lock, a
leaf); everything else runs on the stepping thread (the engine's step lock held).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from types import MappingProxyType

from radixcache.core import events as ev
from radixcache.core.lease import ForwardCopies
from radixcache.core.pool import KVPool, PoolExhausted
from radixcache.core.tokens import TOKEN_BYTES, common_units
from radixcache.core.tree import Lease, MatchResult, PromptTooLarge, RadixTree
from radixcache.serving.policy import Candidate, SchedulePolicy, ordered
from radixcache.serving.requests import (
    EngineConfig,
    EngineError,
    Request,
    RequestFailed,
    RequestRejected,
)
from radixcache.serving.reserve import Hold, NeedEstimate, Reserve

Started = Callable[[Request], None]
Emit = Callable[[ev.AnyEvent], None]
Copies = tuple[tuple[int, ...], tuple[int, ...]]  # (from slots, to slots): ``model.SlotCopy``


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one step does, decided once by ``Scheduler.plan`` (see the module doc).
    ``admitted`` are running already (matched, pinned, leased); ``published`` were put in the
    tree while planning, ``(request id, tokens)``; ``copies`` (None: none) are made by the
    step's first forward after each layer's writes; ``releases[r]``: the requests held for
    request ``r``'s insert, in arrival order, admitted in this step once its prefill ends."""

    policy: SchedulePolicy
    admitted: tuple[Request, ...] = ()
    rejected: tuple[tuple[Request, EngineError], ...] = ()
    published: tuple[tuple[int, int], ...] = ()
    copies: Copies | None = None
    releases: Mapping[int, tuple[Request, ...]] = field(
        default_factory=lambda: MappingProxyType({}))

    def releasing(self, ids: set[int]) -> bool:
        """Whether a request is held for the insert of one of ``ids``."""
        return not ids.isdisjoint(self.releases)


@dataclass(frozen=True, slots=True)
class Released:
    """What a release admitted (running already) and refused (to fail with their error)."""

    admitted: tuple[Request, ...] = ()
    rejected: tuple[tuple[Request, EngineError], ...] = ()


class Waiting:
    """The waiting queue in arrival order (thread-safe: its own lock, a leaf)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, Request] = {}

    def add(self, req: Request) -> None:
        """Queue ``req`` last."""
        with self._lock:
            self._waiting[req.id] = req

    def add_first(self, req: Request) -> None:
        """Queue ``req`` first (a retracted request goes back to the head)."""
        with self._lock:
            self._waiting = {req.id: req, **self._waiting}

    def take(self, request_id: int) -> Request | None:
        """Remove and return the waiting request ``request_id`` (None: not waiting)."""
        with self._lock:
            return self._waiting.pop(request_id, None)

    def window(self, n: int) -> list[Request]:
        """The first ``n`` waiting requests, in arrival order."""
        with self._lock:
            return list(islice(self._waiting.values(), n))

    def drain(self) -> list[Request]:
        """Remove and return every waiting request, in arrival order."""
        with self._lock:
            out, self._waiting = list(self._waiting.values()), {}
        return out

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._waiting


def sharer(req: Request, cached: int, inflight: Sequence[Request],
           min_tokens: int) -> tuple[Request, int] | None:
    """The running request computing at least ``min_tokens`` of ``req``'s prompt past its
    ``cached`` match (the one that shares most) and how many tokens they share; None when
    there is none (the rule that holds a request, ``serving.scheduler``)."""
    key = req.key  # prompt[:-1], the part a match may cover
    need = (cached + min_tokens) * TOKEN_BYTES
    if len(key) < need:
        return None
    head, best, on = key[:need], 0, None
    for r in inflight:
        if r.key.startswith(head):
            n = common_units(r.key, 0, key)
            if n > best:
                best, on = n, r
    return None if on is None else (on, best)


POOL = ev.WaitReason.POOL


class Admission:
    """Admits requests into the running batch (see the module doc)."""

    def __init__(self, tree: RadixTree, pool: KVPool, config: EngineConfig,
                 waiting: Waiting, started: Started, emit: Emit) -> None:
        self.tree, self.pool, self.config, self.waiting = tree, pool, config, waiting
        self._started = started  # called right after each admission (its RequestStart)
        self._emit = emit  # the engine's event log
        self.shared = 0  # requests admitted reading blocks their step's forward writes
        self.estimate = NeedEstimate()  # what a growing request will still write
        self.room = 0  # blocks admission may still count on this step (``open``; grow)
        # retracted requests' holds on what they kept in the tree (``serving.reserve``):
        # request id -> the node pinned and the blocks of its path; set and dropped by the
        # engine, popped by any thread that fails a waiting request
        self.holds: dict[int, Hold] = {}

    def held_blocks(self) -> set[int]:
        """Blocks the holds keep from eviction (``serving.reserve``)."""
        out: set[int] = set()
        for hold in list(self.holds.values()):
            out.update(hold.blocks)
        return out

    def total(self, req: Request) -> int:
        """The positions ``req``'s lease covers now: its worst case (``full``) or what its
        next step writes (``grow``, ``serving.reserve``)."""
        return req.total if self.config.reserve is Reserve.FULL else req.need()

    def expected_blocks(self, req: Request) -> int:
        """Blocks ``req`` is expected to take from now on (``serving.reserve``)."""
        return -(-self.estimate.tokens(req) // self.config.block_size)

    def open(self, running: Sequence[Request]) -> None:
        """Start a step's admissions (``grow``): the room is the pool less the blocks the
        running requests hold and the blocks they are expected to take."""
        if self.config.reserve is Reserve.FULL:
            return
        held = self.held_blocks()  # retracted requests' K/V: not room until they resume
        future = 0
        for r in running:
            if r.lease is not None:
                held.update(r.lease.table)
            future += self.expected_blocks(r)
        self.room = self.pool.num_blocks - len(held) - future

    def _fits(self, req: Request, m: MatchResult, *, has_running: bool) -> bool:
        """Whether ``req`` fits the room (``grow``; with nothing running it always may, the
        lease decides); counts it in when it does."""
        if self.config.reserve is Reserve.FULL:
            return True
        B = self.config.block_size
        want = -(-len(req.fill) // B) - m.length // B + self.expected_blocks(req)
        if has_running and want > self.room:
            return False
        self.room -= want
        return True

    # -- one request -----------------------------------------------------------------------
    def admit(self, req: Request, inflight: list[Request],
              copies: ForwardCopies | None = None) -> ev.WaitReason | EngineError | None:
        """Match, pin and lease ``req`` and take it off the waiting queue: None when admitted
        (appended to ``inflight``), ``POOL`` when the pool cannot hold it now (it waits, nothing
        held), an error when it must fail (off the queue). A request aborted meanwhile (gone
        from the queue) is let go, nothing held: None, not in ``inflight``. ``copies``: the
        blocks this step's first forward writes, whose boundary copies it makes again."""
        try:
            m = self._pin_prefix(req)
            if not self._fits(req, m, has_running=bool(inflight)):
                self.tree.unpin(m.node)
                return POOL
            got = self._allocate(m, req, has_running=bool(inflight))
        except PromptTooLarge as err:
            return self._refuse(req, RequestRejected(f"request {req.id}: {err}"))
        except Exception as exc:  # the tree refused it (a bug): it fails, nothing pinned
            return self._refuse(req, RequestFailed(
                f"request {req.id} failed: its admission raised {type(exc).__name__}: {exc}"))
        if got is None:
            return POOL
        if self.waiting.take(req.id) is None:  # aborted while it was being admitted
            self.tree.release(got[1])
            self.tree.unpin(got[0].node)
            return None
        req.match, req.lease = got
        req.computed = req.match.length
        if copies and copies.reads(req.match):
            self.shared += 1  # it reads blocks this step's forward writes
            copies.redo(*got)
        self._started(req)
        inflight.append(req)
        return None

    def _refuse(self, req: Request, error: EngineError) -> EngineError | None:
        return error if self.waiting.take(req.id) is not None else None

    def _pin_prefix(self, req: Request) -> MatchResult:
        if not self.config.cache or len(req.fill) < 2:
            return self._pin_root()
        return self.tree.match_and_pin(req.fill[:-1])

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
            return m, self.tree.allocate(m, self.total(req))
        except PoolExhausted:
            self.tree.unpin(m.node)
        except Exception:  # PromptTooLarge, or a bug: unpinned either way
            self.tree.unpin(m.node)
            raise
        if has_running or m.length == 0:
            return None
        m = self._pin_root()
        try:
            return m, self.tree.allocate(m, self.total(req))
        except PoolExhausted:
            self.tree.unpin(m.node)
            return None
        except Exception:
            self.tree.unpin(m.node)
            raise

    # -- publishing ------------------------------------------------------------------------
    def publish(self, r: Request, n: int) -> MatchResult:
        """Put ``r``'s first ``n`` prompt tokens in the tree with its lease's blocks; ``r`` then
        pins them (its hit stays the admission's) and takes a new lease for the rest of its
        positions. Returns the pinned match."""
        assert r.lease is not None and r.match is not None
        tokens = r.prompt if n == len(r.prompt) else r.prompt[:n]
        self.tree.insert(tokens, r.lease)
        m = self.tree.match_and_pin(tokens)
        self.tree.unpin(r.match.node)
        r.match = r.match._replace(node=m.node)
        r.lease = self.tree.allocate(m, self.total(r))
        return m

    def cache_prompt(self, r: Request, policy: SchedulePolicy) -> None:
        """Insert ``r``'s prompt as soon as its prefill is done (SGLang's
        ``cache_unfinished_req``), so that waiting requests sharing it read it while ``r``
        decodes: they wait one prefill for it, not a whole answer (``serving.scheduler``).

        ``r`` then pins the prompt's node and takes a new lease for its decode positions; the
        decode blocks the insert freed are free again, so that lease always fits when one
        block is spare (a boundary copy, when another request cached the same prompt first
        and continued in its last block, takes one block more). Under ``fcfs`` (today's
        engine, the baseline), with none spare, with the cache off or nothing left to decode,
        the prompt is inserted with the answer at the finish. When the tree refuses it, ``r``
        fails (``r.error``)."""
        if not (self.config.cache and policy.cache_aware) or r.fill is not r.prompt \
                or len(r.output) >= r.max_new or self.pool.free_blocks < 1 \
                or (r.published and not len(r.prompt) % self.config.block_size):
            return  # (published whole before its prefill: ``serving.scheduler``)
        try:
            self.publish(r, len(r.prompt))
        except Exception as exc:  # the tree refused it: it fails (``Engine._fail_running``)
            r.error = f"caching its prompt raised {type(exc).__name__}: {exc}"
            return
        self._emit(ev.RequestCached(r.id, len(r.prompt)))

    # -- the release, after the step's first forward ----------------------------------------
    def release(self, plan: StepPlan, prefilled: list[Request],
                running: list[Request]) -> Released:
        """Cache the prompts of ``prefilled`` (their prefill ended in the step's first
        forward), then admit the requests ``plan.releases`` holds for them, in the policy's
        order over the tree as it is now, until the batch or the pool is full; a released
        request that now shares enough with another running request stays held. ``running``
        are the requests running now (in admission order; the admitted are not added)."""
        for r in prefilled:
            self.cache_prompt(r, plan.policy)
        held = sorted((h for r in prefilled for h in plan.releases.get(r.id, ())),
                      key=lambda h: h.id)  # ids go up in arrival order
        if not held:
            return Released()
        inflight = list(running)
        admitted: list[Request] = []
        rejected: list[tuple[Request, EngineError]] = []
        for c in ordered(plan.policy, [self.peek(i, h) for i, h in enumerate(held)]):
            req = held[c.position]
            if req.id not in self.waiting or sharer(
                    req, c.cached, inflight, self.config.share_min_tokens) is not None:
                continue  # aborted, or held again (for a request that shares more)
            if len(inflight) >= self.config.max_running:
                break
            out = self.admit(req, inflight)
            if out is POOL:
                break
            if isinstance(out, EngineError):
                rejected.append((req, out))
            elif req.lease is not None:
                admitted.append(req)
        return Released(tuple(admitted), tuple(rejected))

    def peek(self, i: int, req: Request) -> Candidate:
        """``req``'s candidate at position ``i``: where its cached match ends, touching
        nothing."""
        if not self.config.cache or len(req.fill) < 2:
            return Candidate(i, self.tree.root, 0)
        node, cached = self.tree.peek(req.key)
        return Candidate(i, node, cached)
