"""The engine's scheduler: admission (FIFO, match and lock, blocks for the lease), planning
of one step's decodes and prefill chunks, the model forward, and finishing requests.

A mixin: ``Engine`` owns the state declared below; ``step`` calls these under its step lock.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import deque
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np
import torch

from radixcache.core import events as ev
from radixcache.core.pool import KVPool, PoolExhausted
from radixcache.core.tree import Lease, MatchResult, PromptTooLarge, RadixTree
from radixcache.serving.model import SeqInput, TinyTransformer
from radixcache.serving.requests import (
    EngineConfig,
    EngineError,
    Request,
    RequestCancelled,
    RequestMetrics,
    RequestRejected,
    RequestResult,
)
from radixcache.serving.stats import Totals


class _Admit(Enum):
    ADMITTED = 1
    REJECTED = 2
    BLOCKED = 3



def _choose(r: Request, logits: torch.Tensor, greedy: int) -> int:
    """The request's next token: forced (a trace's answer), its policy's, else greedy."""
    if r.forced is not None:
        return int(r.forced[len(r.output)])
    return r.policy.choose(logits) if r.policy is not None else int(greedy)


class Scheduler:
    """Admission, planning, the forward and finishing of ``Engine``'s requests."""

    config: EngineConfig
    model: TinyTransformer
    pool: KVPool
    tree: RadixTree
    _queue: threading.Lock
    _waiting: deque[Request]
    _running: list[Request]
    totals: Totals

    if TYPE_CHECKING:

        @property
        def paused(self) -> bool: ...

        def _emit(self, event: ev.AnyEvent) -> None: ...


    # -- admission -----------------------------------------------------------------------------
    def _admit(self) -> int:
        admitted = 0
        while not self.paused and len(self._running) < self.config.max_running:
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

    def _lock_prefix(self, req: Request) -> MatchResult:
        if not self.config.cache or len(req.prompt) < 2:
            return self._lock_root()
        return self.tree.match_and_pin(req.prompt[:-1])

    def _lock_root(self) -> MatchResult:
        self.tree.pin(self.tree.root)
        return MatchResult(0, self.tree.root, array("i"))

    def _try_admit(self, req: Request) -> _Admit:
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
        t = self.totals
        t.prompt_tokens += len(req.prompt)
        t.hit_tokens += req.computed
        self._emit(ev.RequestStart(req.id, len(req.prompt), req.computed))
        return _Admit.ADMITTED

    def _allocate(self, m: MatchResult, req: Request) -> tuple[MatchResult, Lease] | None:
        """Blocks for ``req`` after its locked match ``m``; None (and unlocked) when blocked.

        With nothing running, a blocked request retries without its match: a boundary copy
        or the matched path may be what keeps it from fitting, and nothing else will unlock.
        """
        try:
            return m, self.tree.allocate(m, req.total)
        except PoolExhausted:
            self.tree.unpin(m.node)
        except PromptTooLarge:
            self.tree.unpin(m.node)
            raise
        if self._running or m.length == 0:
            return None
        m = self._lock_root()
        try:
            return m, self.tree.allocate(m, req.total)
        except PoolExhausted:
            self.tree.unpin(m.node)
            return None

    # -- planning and the model ----------------------------------------------------------------
    def _plan(self) -> tuple[list[tuple[Request, SeqInput]], list[tuple[Request, SeqInput]]]:
        decodes = [(r, r.next_input()) for r in self._running if r.output]
        budget = self.config.max_step_tokens - len(decodes)
        prefills: list[tuple[Request, SeqInput]] = []
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
        decodes: list[tuple[Request, SeqInput]],
        prefills: list[tuple[Request, SeqInput]],
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

    def _advance(self, group: list[tuple[Request, SeqInput]], logits: torch.Tensor) -> None:
        now = time.perf_counter()
        # one argmax and one device sync per forward, skipped when every token is forced
        free = any(r.forced is None for r, _ in group)
        greedy = logits.argmax(-1).tolist() if free else []
        for i, (r, s) in enumerate(group):
            n = len(s.tokens)
            r.computed = s.start + n
            if not r.output:
                self.totals.prefill_tokens += n
                if r.computed < len(r.prompt):
                    continue  # an inner prefill chunk: no token yet
                r.first_token_at = now
            r.output.append(_choose(r, logits[i], greedy[i] if free else 0))
            if r.on_token is not None:
                r.on_token(r.output[-1])
            if r.policy is not None and r.policy.stops_at(r.output[-1]):
                r.max_new = len(r.output)  # finishes this step, cached as if it had run out
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
            self.totals.finished += 1
            self.totals.output_tokens += len(r.output)
            metrics = self._metrics_of(r, now)
            self._emit(ev.RequestFinish(r.id, len(r.output), metrics.ttft_ms))
            logits = torch.stack(r.logits) if r.keep_logits else None
            r.handle.settle(RequestResult(list(r.output), metrics, logits), None)
        return len(done)

    def _settle_blocks(self, r: Request) -> None:
        """Insert the request's sequence (cache on) or free its blocks; then unlock."""
        assert r.lease is not None and r.match is not None
        if self.config.cache:
            seq = np.concatenate([r.prompt, np.asarray(r.output[:-1], dtype=np.uint32)])
            self.tree.insert(seq, r.lease)
        else:
            self.tree.release(r.lease)
        self.tree.unpin(r.match.node)
        r.lease = None

    @staticmethod
    def _metrics_of(r: Request, now: float) -> RequestMetrics:
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

    def _fail(self, req: Request, error: EngineError) -> None:
        if isinstance(error, RequestRejected):
            self.totals.rejected += 1
        else:
            self.totals.cancelled += 1
        req.handle.settle(None, error)

    def _cancel_all(self) -> None:
        """Fail every waiting and running request with ``RequestCancelled`` (step lock held)."""
        for r in self._running:
            assert r.lease is not None and r.match is not None
            self.tree.release(r.lease)
            self.tree.unpin(r.match.node)
            self._fail(r, RequestCancelled(f"request {r.id} cancelled"))
        self._running = []
        with self._queue:
            waiting, self._waiting = list(self._waiting), deque()
        for r in waiting:
            self._fail(r, RequestCancelled(f"request {r.id} cancelled before admission"))
