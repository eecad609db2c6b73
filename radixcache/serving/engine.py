"""The request engine: prompts in, prefix reuse through the radix tree, tokens out.

Life of one request (``_Request``)::

    submit ─> waiting (FIFO) ─admit─> running: prefill chunks ─> decodes ─> finish
                │                     match_and_lock(prompt[:-1])     insert(prompt + out[:-1])
                │                     allocate(m, len(prompt) + max_new - 1)    unlock(m.node)
                └── PromptTooLarge: failed at once (RequestRejected on its handle)

The match is capped at ``len(prompt) - 1`` (the model needs at least one new token to produce
the first output's logits), so a full hit recomputes the last prompt token only. The last
generated token's K/V are never written: the request holds ``len(prompt) + max_new - 1``
positions and inserts exactly those tokens.

Scheduling (``step``): decodes first, one token per running request, then prefill chunks of
the requests still prefilling, in admission order, up to ``max_step_tokens`` in all. All of
them go through one model forward (continuous batching), unless the padded attention layout
would waste more than half of its work (decodes padded to a long prefill chunk): then the
step runs two forwards, decodes and prefills. Admission is FIFO: when the head of the queue
cannot get blocks (``PoolExhausted``, the pool full of locked blocks) it unlocks its match,
stays at the head and retries next step; running requests finish and unlock meanwhile. With
nothing running, the head retries without its match, so every request that fits the pool
is admitted eventually (no deadlock).

Threads: ``submit`` and the commands may be called from any thread. ``step`` runs under the
engine's step lock (the scheduler thread calls it, or a test does); tree and pool mutations
happen under the tree's lock (inside the tree), model compute outside it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from array import array
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from radixcache.core import events as ev
from radixcache.core import tokens as tk
from radixcache.core.pool import KVPool, PoolExhausted
from radixcache.core.tree import EvictResult, Lease, MatchResult, PromptTooLarge, RadixTree
from radixcache.serving.memory import MemorySource
from radixcache.serving.model import ModelConfig, SeqInput, TinyTransformer
from radixcache.serving.service import MAX_WAITING, QueueFull, Submitted
from radixcache.traffic.workloads import Workload, WorkloadRequest

TokenArray = npt.NDArray[np.uint32]


class EngineError(Exception):
    """Base class of the errors a request's handle can carry."""


class RequestRejected(EngineError):
    """The request can never be served (it needs more blocks than the whole pool holds)."""


class RequestCancelled(EngineError):
    """The request was dropped by ``reset()`` or ``close()`` before it finished."""


class Answers(Enum):
    """How forced answers (trace outputs) are computed.

    DECODE: token by token, as a server decodes (requests stay running, pinned).
    PREFILL: teacher forcing in one pass -- the request's prompt becomes prompt + answer[:-1]
    and it decodes one token. The engine inserts the same sequence, so the tree ends the same;
    ``RequestStart.prompt_tokens`` then counts the answer. Tens of times faster on a CPU.
    """

    DECODE = "decode"
    PREFILL = "prefill"


def fold_answers(workload: Workload) -> Workload:
    """``workload`` with each forced answer moved into its prompt (see ``Answers.PREFILL``);
    requests without a forced answer, or with a one-token answer, are kept as they are."""
    out = []
    for r in workload.requests:
        f = r.forced_output
        if f is not None and len(f) > 1:
            r = r._replace(prompt=np.concatenate([r.prompt, f[:-1]]).astype(np.uint32),
                           max_new_tokens=1, forced_output=f[-1:])
        out.append(r)
    return dataclasses.replace(workload, requests=out)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What an engine runs with. ``cache=False`` serves without reuse (match forced to 0,
    nothing inserted, blocks freed at finish) for on/off comparisons."""

    num_blocks: int = 4096
    block_size: int = 16
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: bool = True
    max_step_tokens: int = 512
    max_running: int = 64
    high: float = 0.92
    low: float = 0.85
    record_events: bool = True
    answers: Answers = Answers.DECODE  # how workloads' forced answers are computed
    device: str | None = None


class RequestMetrics(NamedTuple):
    """One finished request. Times in ms since ``submit``; token counts exact."""

    request: int
    prompt_tokens: int
    hit_tokens: int  # served from the cache (never more than prompt_tokens - 1)
    prefill_tokens: int  # computed by the model: prompt_tokens - hit_tokens
    output_tokens: int
    queue_ms: float  # submit -> admitted
    ttft_ms: float  # submit -> first output token
    latency_ms: float  # submit -> last output token
    decode_tokens_per_s: float  # (output_tokens - 1) / (last - first token time); 0 if one


class RequestResult(NamedTuple):
    """What ``RequestHandle.result`` returns. ``logits`` is ``(output_tokens, vocab)`` on the
    CPU when submitted with ``keep_logits=True``: row i is the distribution of token i."""

    tokens: list[int]
    metrics: RequestMetrics
    logits: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """Running totals since the engine started (or since ``reset``)."""

    submitted: int
    finished: int
    rejected: int
    cancelled: int
    waiting: int  # queue depth
    running: int
    steps: int
    prompt_tokens: int  # of admitted requests
    hit_tokens: int
    prefill_tokens: int  # computed by the model
    output_tokens: int
    busy_s: float  # wall time of steps that ran the model
    hit_rate: float  # hit_tokens / prompt_tokens (0 when none)
    decode_tokens_per_s: float  # output_tokens / busy_s (0 when idle)


class StepReport(NamedTuple):
    """What one ``step`` did."""

    admitted: int
    sequences: int
    prefill_tokens: int
    decode_tokens: int
    forwards: int
    finished: int


class RequestHandle(Future[RequestResult]):
    """A ``concurrent.futures.Future`` of one request's ``RequestResult``; it fails with the
    request's ``EngineError`` (rejected, cancelled). It cannot be cancelled by the caller
    (the engine owns the request once submitted: ``reset()`` cancels). ``id`` is the engine's
    request id, ``None`` until a workload's dependent request is submitted."""

    def __init__(self, request_id: int | None = None) -> None:
        super().__init__()
        self.id = request_id
        self.set_running_or_notify_cancel()  # from now on ``cancel()`` is refused

    def settle(self, result: RequestResult | None, error: EngineError | None) -> None:
        """Finish the future with ``result``, or fail it with ``error`` (the engine's side)."""
        if error is not None:
            self.set_exception(error)
        else:
            assert result is not None
            self.set_result(result)


@dataclass(slots=True, eq=False)
class _Request:
    id: int
    prompt: TokenArray
    max_new: int
    forced: TokenArray | None
    keep_logits: bool
    handle: RequestHandle
    submitted: float
    admitted: float = 0.0
    match: MatchResult | None = None
    lease: Lease | None = None
    computed: int = 0  # positions whose K/V are in the pool
    output: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    first_token_at: float = 0.0

    @property
    def total(self) -> int:
        """Positions whose K/V the request writes or reuses."""
        return len(self.prompt) + self.max_new - 1

    def next_input(self) -> SeqInput:
        """The tokens of this request's next forward (a decode: its last output token)."""
        assert self.lease is not None
        pos = len(self.prompt) + len(self.output) - 1
        return SeqInput([self.output[-1]], pos, self.lease.table)


class _Admit(Enum):
    ADMITTED = 1
    REJECTED = 2
    BLOCKED = 3


@dataclass(slots=True)
class _Totals:
    submitted: int = 0
    finished: int = 0
    rejected: int = 0
    cancelled: int = 0
    steps: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    prefill_tokens: int = 0
    output_tokens: int = 0
    busy_s: float = 0.0


class WorkloadRun(NamedTuple):
    """Handles of a workload's requests, in the workload's order (a dependent request's
    handle exists at once; it is submitted when the request it waits for is done)."""

    handles: list[RequestHandle]

    def wait(self, timeout: float | None = None) -> list[RequestResult | EngineError]:
        """Wait for every request; each entry is its result or its error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[RequestResult | EngineError] = []
        for h in self.handles:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            err = h.exception(left)
            if err is None:
                out.append(h.result(0))
            else:
                assert isinstance(err, EngineError)  # the engine fails handles with no other
                out.append(err)
        return out


Tokens = Sequence[int] | npt.NDArray[np.integer]


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0


class Engine:
    """Serves requests on a ``TinyTransformer`` whose K/V live in a ``KVPool`` indexed by a
    ``RadixTree`` (``engine.tree``). ``start()`` runs the scheduler thread; ``step()`` runs
    one scheduling step synchronously (tests). ``close()`` when done."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        memory: MemorySource | None = None,
    ) -> None:
        self.config = cfg = config or EngineConfig()
        self.model = TinyTransformer(cfg.model, cfg.device)
        self.pool = KVPool(cfg.num_blocks, cfg.block_size, cfg.model.kv_shape(), self.model.device)
        self.tree = RadixTree(
            self.pool, high=cfg.high, low=cfg.low, record_events=cfg.record_events
        )
        self._memory = memory if memory is not None else MemorySource(device=self.model.device)
        self._step_lock = threading.Lock()
        self._queue = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._events: list[ev.AnyEvent] = []
        self._events_lock = threading.Lock()
        self._totals = _Totals()
        self._next_id = 0
        self._paused = False
        self._generation = 0
        self._evicted_base = (0, 0, 0)  # tree counters (nodes, tokens, COW) at the last reset

    # -- submitting --------------------------------------------------------------------------
    def submit(
        self,
        prompt_tokens: Sequence[int] | npt.NDArray[np.integer],
        max_new_tokens: int,
        forced_output: Sequence[int] | npt.NDArray[np.integer] | None = None,
        *,
        keep_logits: bool = False,
    ) -> RequestHandle:
        """Queue a request (thread-safe) and return its handle at once.

        ``forced_output`` (teacher forcing) replaces the greedy choice of each step and must
        hold ``max_new_tokens`` tokens. Raises ``ValueError`` for an empty prompt, token ids
        outside the vocabulary or ``max_new_tokens < 1``. A request that needs more blocks than
        the pool holds is not queued: its handle is already failed with ``RequestRejected``.
        """
        vocab = self.config.model.vocab_size
        prompt = tk.validated_array(prompt_tokens, vocab, "prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        forced = None
        if forced_output is not None:
            forced = tk.validated_array(forced_output, vocab, "forced_output")
            if forced.size != max_new_tokens:
                raise ValueError(f"forced_output holds {forced.size} tokens, not {max_new_tokens}")
        with self._queue:
            rid = self._next_id
            self._next_id += 1
            req = _Request(rid, prompt, max_new_tokens, forced, keep_logits,
                           RequestHandle(rid), time.perf_counter())
            self._totals.submitted += 1
            need = -(-req.total // self.config.block_size)
            if need > self.config.num_blocks:
                self._totals.rejected += 1
            else:
                self._waiting.append(req)
                self._queue.notify()
        if need > self.config.num_blocks:
            req.handle.settle(None, RequestRejected(
                f"request {rid}: {req.total} positions need {need} blocks;"
                f" the pool has {self.config.num_blocks}"))
        return req.handle

    def run_workload(self, workload: Workload, limit: int | None = None) -> WorkloadRun:
        """Submit the first ``limit`` (default all) requests of ``workload``; a request with
        ``after = i`` is submitted when request ``i`` is done (from the thread finishing it).
        Returns at once; ``run.wait()`` waits for all."""
        reqs = workload.requests[:limit] if limit is not None else workload.requests
        proxies = [RequestHandle() for _ in reqs]
        for r, proxy in zip(reqs, proxies, strict=True):
            feed = _Feed(self, r, proxy)
            if r.after is None:
                feed.submit()
            else:
                proxies[r.after].add_done_callback(feed.after_done)
        return WorkloadRun(proxies)

    def close(self) -> None:
        """Cancel every unfinished request and close the memory source."""
        with self._step_lock:
            self._cancel_all()
        self._memory.close()

    def busy(self) -> bool:
        """True when ``step`` has work: running requests, or waiting ones while not paused."""
        return bool(self._running) or (bool(self._waiting) and not self._paused)

    # -- one step ------------------------------------------------------------------------------
    def step(self) -> StepReport:
        """Admit what fits, run one batched forward (or two, see the module doc), advance
        every request in it, finish the done ones. Thread-safe (serialized with other steps
        and ``reset``); ``ServiceLoop`` calls it and publishes the events it recorded."""
        with self._step_lock:
            t0 = time.perf_counter()
            admitted = self._admit()
            decodes, prefills = self._plan()
            forwards = self._forward(decodes, prefills)
            finished = self._finish_done()
            self._totals.steps += 1
            if forwards:
                self._totals.busy_s += time.perf_counter() - t0
            report = StepReport(
                admitted,
                len(decodes) + len(prefills),
                sum(len(s.tokens) for _, s in prefills),
                len(decodes),
                forwards,
                finished,
            )
        return report

    # -- admission -----------------------------------------------------------------------------
    def _admit(self) -> int:
        admitted = 0
        while not self._paused and len(self._running) < self.config.max_running:
            with self._queue:
                if not self._waiting:
                    break
                req = self._waiting[0]
            outcome = self._try_admit(req)
            if outcome is _Admit.BLOCKED:
                break
            with self._queue:
                self._waiting.popleft()
            if outcome is _Admit.ADMITTED:
                self._running.append(req)
                admitted += 1
        return admitted

    def _lock_prefix(self, req: _Request) -> MatchResult:
        if not self.config.cache or len(req.prompt) < 2:
            return self._lock_root()
        return self.tree.match_and_lock(req.prompt[:-1])

    def _lock_root(self) -> MatchResult:
        self.tree.lock(self.tree.root)
        return MatchResult(0, self.tree.root, array("i"))

    def _try_admit(self, req: _Request) -> _Admit:
        m = self._lock_prefix(req)
        try:
            lease = self._allocate(m, req)
        except PromptTooLarge as err:
            self._fail(req, RequestRejected(f"request {req.id}: {err}"))
            return _Admit.REJECTED
        if lease is None:
            return _Admit.BLOCKED
        req.match, req.lease = lease[0], lease[1]
        req.computed = req.match.length
        req.admitted = time.perf_counter()
        t = self._totals
        t.prompt_tokens += len(req.prompt)
        t.hit_tokens += req.computed
        self._emit(ev.RequestStart(req.id, len(req.prompt), req.computed))
        return _Admit.ADMITTED

    def _allocate(self, m: MatchResult, req: _Request) -> tuple[MatchResult, Lease] | None:
        """Blocks for ``req`` after its locked match ``m``; None (and unlocked) when blocked.

        With nothing running, a blocked request retries without its match: a boundary copy
        or the matched path may be what keeps it from fitting, and nothing else will unlock.
        """
        try:
            return m, self.tree.allocate(m, req.total)
        except PoolExhausted:
            self.tree.unlock(m.node)
        except PromptTooLarge:
            self.tree.unlock(m.node)
            raise
        if self._running or m.length == 0:
            return None
        m = self._lock_root()
        try:
            return m, self.tree.allocate(m, req.total)
        except PoolExhausted:
            self.tree.unlock(m.node)
            return None

    # -- planning and the model ----------------------------------------------------------------
    def _plan(self) -> tuple[list[tuple[_Request, SeqInput]], list[tuple[_Request, SeqInput]]]:
        decodes = [(r, r.next_input()) for r in self._running if r.output]
        budget = self.config.max_step_tokens - len(decodes)
        prefills: list[tuple[_Request, SeqInput]] = []
        for r in self._running:
            if budget <= 0:
                break
            if r.output:
                continue
            assert r.lease is not None
            n = min(len(r.prompt) - r.computed, budget)
            chunk = r.prompt[r.computed : r.computed + n]
            prefills.append((r, SeqInput(chunk, r.computed, r.lease.table)))
            budget -= n
        return decodes, prefills

    def _forward(
        self,
        decodes: list[tuple[_Request, SeqInput]],
        prefills: list[tuple[_Request, SeqInput]],
    ) -> int:
        """Run the model over the planned sequences; returns the number of forwards."""
        work = decodes + prefills
        if not work:
            return 0
        total = sum(len(s.tokens) for _, s in work)
        longest = max(len(s.tokens) for _, s in work)
        groups = [work]
        if decodes and prefills and len(work) * longest > 2 * total:
            groups = [decodes, prefills]  # padding decodes to a long chunk would dominate
        for group in groups:
            logits = self.model.forward([s for _, s in group], self.pool.kv)
            self._advance(group, logits)
        return len(groups)

    def _advance(self, group: list[tuple[_Request, SeqInput]], logits: torch.Tensor) -> None:
        now = time.perf_counter()
        # one argmax and one device sync per forward, skipped when every token is forced
        free = any(r.forced is None for r, _ in group)
        greedy = logits.argmax(-1).tolist() if free else []
        for i, (r, s) in enumerate(group):
            n = len(s.tokens)
            r.computed = s.start + n
            if not r.output:
                self._totals.prefill_tokens += n
                if r.computed < len(r.prompt):
                    continue  # an inner prefill chunk: no token yet
                r.first_token_at = now
            k = len(r.output)
            r.output.append(int(r.forced[k]) if r.forced is not None else int(greedy[i]))
            if r.keep_logits:
                r.logits.append(logits[i].detach().to("cpu", copy=True))

    # -- finishing -----------------------------------------------------------------------------
    def _finish_done(self) -> int:
        done = [r for r in self._running if len(r.output) == r.max_new]
        if not done:
            return 0
        self._running = [r for r in self._running if len(r.output) < r.max_new]
        now = time.perf_counter()
        for r in done:
            self._settle_blocks(r)
            self._totals.finished += 1
            self._totals.output_tokens += len(r.output)
            metrics = self._metrics_of(r, now)
            self._emit(ev.RequestFinish(r.id, len(r.output), metrics.ttft_ms))
            logits = torch.stack(r.logits) if r.keep_logits else None
            r.handle.settle(RequestResult(list(r.output), metrics, logits), None)
        return len(done)

    def _settle_blocks(self, r: _Request) -> None:
        """Insert the request's sequence (cache on) or free its blocks; then unlock."""
        assert r.lease is not None and r.match is not None
        if self.config.cache:
            seq = np.concatenate([r.prompt, np.asarray(r.output[:-1], dtype=np.uint32)])
            self.tree.insert(seq, r.lease)
        else:
            self.tree.release(r.lease)
        self.tree.unlock(r.match.node)
        r.lease = None

    @staticmethod
    def _metrics_of(r: _Request, now: float) -> RequestMetrics:
        hit = r.match.length if r.match is not None else 0
        span = now - r.first_token_at
        rate = (len(r.output) - 1) / span if len(r.output) > 1 and span > 0 else 0.0
        return RequestMetrics(
            r.id,
            len(r.prompt),
            hit,
            len(r.prompt) - hit,
            len(r.output),
            (r.admitted - r.submitted) * 1e3,
            (r.first_token_at - r.submitted) * 1e3,
            (now - r.submitted) * 1e3,
            rate,
        )

    def _fail(self, req: _Request, error: EngineError) -> None:
        if isinstance(error, RequestRejected):
            self._totals.rejected += 1
        else:
            self._totals.cancelled += 1
        req.handle.settle(None, error)

    def _cancel_all(self) -> None:
        """Fail every waiting and running request with ``RequestCancelled`` (step lock held)."""
        for r in self._running:
            assert r.lease is not None and r.match is not None
            self.tree.release(r.lease)
            self.tree.unlock(r.match.node)
            self._fail(r, RequestCancelled(f"request {r.id} cancelled"))
        self._running = []
        with self._queue:
            waiting, self._waiting = list(self._waiting), deque()
        for r in waiting:
            self._fail(r, RequestCancelled(f"request {r.id} cancelled before admission"))

    # -- events --------------------------------------------------------------------------------
    def _emit(self, event: ev.AnyEvent) -> None:
        """Append an engine event after the tree events recorded so far (keeps their order)."""
        if not self.config.record_events:
            return
        with self._events_lock:
            self._events.extend(self.tree.take_events())
            self._events.append(event)

    def take_events(self) -> list[ev.AnyEvent]:
        """Drain every event since the last call, in order: the tree's, ``RequestStart`` /
        ``RequestFinish``. Thread-safe."""
        with self._events_lock:
            out = self._events
            out.extend(self.tree.take_events())
            self._events = []
            return out

    def watermark(self) -> ev.Watermark:
        """A memory sample now: pool blocks used/total, the marks, NVML device memory if any."""
        a = self.pool.allocator
        nbytes = self.pool.kv.numel() * self.pool.kv.element_size()
        s = self._memory.sample(a.used_count, a.num_blocks, nbytes)
        return ev.Watermark(a.used_count, a.num_blocks, self.tree.high, self.tree.low,
                            s.device_used_bytes, s.device_total_bytes, s.nvml_error)

    # -- commands ------------------------------------------------------------------------------
    def pause(self) -> None:
        """Stop admitting requests; running ones go on to finish."""
        with self._queue:
            self._paused = True

    def resume(self) -> None:
        """Admit requests again."""
        with self._queue:
            self._paused = False
            self._queue.notify_all()

    @property
    def paused(self) -> bool:
        """True between ``pause()`` and ``resume()``."""
        return self._paused

    def set_watermarks(self, high: float, low: float) -> None:
        """Set the eviction band (fractions of used blocks); ``ValueError`` unless
        0 < low <= high <= 1."""
        self.tree.set_watermarks(high, low)

    def evict(self, tokens: int) -> EvictResult:
        """Evict at least ``tokens`` tokens of unlocked LRU leaves (or as many as can go)."""
        return self.tree.evict(tokens)

    def reset(self) -> int:
        """Cancel every waiting and running request (their handles fail with
        ``RequestCancelled``), then empty the tree, zero the metrics and start a new counter
        generation; returns how many requests were cancelled. Waits for the step in
        progress; the pool is entirely free afterwards."""
        with self._step_lock:
            cancelled = len(self._running) + len(self._waiting)
            self._cancel_all()
            self.tree.reset()
            self._totals = _Totals()
            self._generation += 1
            s = self.tree.stats
            self._evicted_base = (s.evicted_nodes, s.evicted_tokens, s.cow_copies)
        return cancelled

    # -- the rest of the cache service (``serving.service.CacheService``) -----------------------
    def submit_workload(self, workload: Workload) -> Submitted:
        """Submit a workload's requests (dependent ones follow their predecessors), its
        answers folded into prompts under ``Answers.PREFILL``. Raises ``QueueFull`` and
        submits nothing when the waiting queue would pass ``MAX_WAITING``."""
        if self.config.answers is Answers.PREFILL:
            workload = fold_answers(workload)
        n = len(workload.requests)
        if len(self._waiting) + n > MAX_WAITING:
            raise QueueFull(f"queue full: {len(self._waiting)} requests waiting, {n} more would "
                            f"pass the limit of {MAX_WAITING}")
        self.run_workload(workload)
        return Submitted(n, self._paused)

    def snapshot(self) -> ev.Snapshot:
        """The tree's snapshot (running requests' blocks included)."""
        return self.tree.snapshot()

    def digest(self) -> str:
        """The tree's digest."""
        return self.tree.digest()

    def counters(self) -> ev.Counters:
        """Counters since start or the last reset (``generation`` counts resets)."""
        t, s, (nodes0, tokens0, cows0) = self._totals, self.tree.stats, self._evicted_base
        return ev.Counters(self._generation, t.submitted, t.finished, t.rejected,
                           t.prompt_tokens, t.hit_tokens, s.evicted_nodes - nodes0,
                           s.evicted_tokens - tokens0, s.cow_copies - cows0,
                           len(self._waiting), len(self._running), self._paused)

    def metrics(self) -> EngineMetrics:
        """Running totals and the queue depth now."""
        t = self._totals
        return EngineMetrics(
            t.submitted, t.finished, t.rejected, t.cancelled, len(self._waiting),
            len(self._running), t.steps, t.prompt_tokens, t.hit_tokens, t.prefill_tokens,
            t.output_tokens, t.busy_s,
            t.hit_tokens / t.prompt_tokens if t.prompt_tokens else 0.0,
            t.output_tokens / t.busy_s if t.busy_s else 0.0,
        )

    def stats(self) -> dict[str, float | int | str]:
        """Flat counters for a ``stats`` command reply: metrics, tree and pool figures."""
        out: dict[str, float | int | str] = {}
        m = self.metrics()
        for name in m.__dataclass_fields__:
            out[name] = getattr(m, name)
        s = self.tree.stats
        out.update(
            nodes=len(self.tree), used_blocks=self.pool.allocator.used_count,
            num_blocks=self.pool.num_blocks, splits=s.splits, merges=s.merges,
            cow_copies=s.cow_copies, evicted_nodes=s.evicted_nodes,
            evicted_tokens=s.evicted_tokens, paused=int(self._paused),
            cache="on" if self.config.cache else "off", device=str(self.model.device),
        )
        return out


class _Feed(NamedTuple):
    """Submits one workload request and reports its outcome on the workload's proxy handle."""

    engine: Engine
    request: WorkloadRequest
    proxy: RequestHandle

    def submit(self) -> None:
        r = self.request
        handle = self.engine.submit(r.prompt, r.max_new_tokens, r.forced_output)
        self.proxy.id = handle.id
        handle.add_done_callback(self.copy_outcome)

    def after_done(self, done: Future[RequestResult]) -> None:
        if isinstance(done.exception(), RequestCancelled):  # a reset or close ends the workload
            self.proxy.settle(None, RequestCancelled("an earlier request was cancelled"))
            return
        self.submit()

    def copy_outcome(self, done: Future[RequestResult]) -> None:
        error = done.exception()
        if error is not None:
            assert isinstance(error, EngineError)
            self.proxy.settle(None, error)
        else:
            self.proxy.settle(done.result(), None)


def percentiles(values: Sequence[float]) -> tuple[float, float]:
    """(p50, p99) of ``values``; (0, 0) for none."""
    return _percentile(values, 50), _percentile(values, 99)
