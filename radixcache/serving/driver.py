"""TreeDriver: the cache service with no model (a ``CacheService``).

A request runs through the tree as an engine would run it -- match and pin the prompt,
allocate, insert prompt + output, unpin -- in one step, with no attention computed: its
output is its forced output, or seeded word ids. ``bench events``, the inspector's benches and
screenshots, and ``inspect`` without an engine use it; a given command sequence always gives
the same events, so its streams are reproducible.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from radixcache.core import events as ev
from radixcache.core.pool import KVPool, PoolExhausted
from radixcache.core.tokens import TokenArray
from radixcache.core.tree import EvictResult, PromptTooLarge, RadixTree
from radixcache.serving.memory import MemorySource
from radixcache.serving.policy import Policy
from radixcache.serving.service import Figures, ServiceError, Submitted, check_room
from radixcache.traffic.workloads import Vocabulary, Workload, WorkloadRequest


def serve_request(tree: RadixTree, tokens: Sequence[int] | npt.NDArray[np.uint32]) -> int:
    """Run one sequence through ``tree`` as an engine would (match and pin, allocate, insert,
    unpin) with no model; evicts as needed. Returns the matched length. Raises
    ``PromptTooLarge``/``PoolExhausted`` with the tree unchanged but for evictions."""
    m = tree.match_and_lock(tokens)
    try:
        lease = tree.allocate(m, len(tokens))
        tree.insert(tokens, lease)
    finally:
        tree.unlock(m.node)
    return m.length


@dataclass(slots=True)
class _Counts:
    submitted: int = 0
    finished: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0


class TreeDriver:
    """A ``RadixTree`` of ``num_blocks`` blocks served without a model, ``step_requests``
    requests a step. Not thread-safe by itself: ``ServiceLoop`` calls it under its lock."""

    def __init__(self, num_blocks: int = 1024, *, block_size: int = 16, step_requests: int = 4,
                 memory: MemorySource | None = None) -> None:
        self.tree = RadixTree(KVPool(num_blocks, block_size))
        self.step_requests = step_requests
        self._memory = memory if memory is not None else MemorySource()
        self._waiting: deque[WorkloadRequest] = deque()
        self._paused = False
        self._next_id = 0
        self._counts = _Counts()
        self._generation = 0
        self._evicted_base = (0, 0, 0)  # tree counters at the last reset
        self._words = Vocabulary().ids

    # -- the protocol ------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        """True between ``pause()`` and ``resume()``."""
        return self._paused

    def submit_workload(self, workload: Workload) -> Submitted:
        """Queue the workload's requests in order (a dependent request follows the one it
        waits for, so serving in order respects ``after``)."""
        n = len(workload.requests)
        check_room(len(self._waiting), n)
        self._waiting.extend(workload.requests)
        self._counts.submitted += n
        return Submitted(n, self._paused)

    def pause(self) -> None:
        """Stop serving waiting requests."""
        self._paused = True

    def resume(self) -> None:
        """Serve waiting requests again."""
        self._paused = False

    def evict(self, tokens: int) -> EvictResult:
        """Evict LRU leaves (nothing is pinned between steps: every leaf may go)."""
        return self.tree.evict(tokens)

    def set_watermarks(self, high: float, low: float) -> None:
        """Set the tree's eviction band."""
        self.tree.set_watermarks(high, low)

    def set_schedule(self, policy: Policy) -> None:
        """Refused: the driver serves its queue in order, one request at a time, so there is
        nothing to reorder or share (``ServiceError``)."""
        raise ServiceError(f"schedule {policy.value}: the tree driver has no scheduler (it "
                           "serves requests one at a time, in order)")

    def reset(self) -> int:
        """Drop the waiting requests, empty the tree, start a new counter generation."""
        dropped = len(self._waiting)
        self._waiting.clear()
        self.tree.reset()
        self._counts = _Counts()
        self._generation += 1
        s = self.tree.stats
        self._evicted_base = (s.evicted_nodes, s.evicted_tokens, s.cow_copies)
        return dropped

    def busy(self) -> bool:
        """True while requests wait and the driver is not paused."""
        return bool(self._waiting) and not self._paused

    def step(self) -> None:
        """Serve up to ``step_requests`` waiting requests."""
        for _ in range(min(self.step_requests, len(self._waiting))):
            self._serve(self._waiting.popleft())

    def take_events(self) -> list[ev.AnyEvent]:
        """The tree's events since the last call (request events are emitted into it)."""
        return self.tree.take_events()

    def snapshot(self) -> ev.Snapshot:
        """The tree's snapshot."""
        return self.tree.snapshot()

    def digest(self) -> str:
        """The tree's digest."""
        return self.tree.digest()

    def watermark(self) -> ev.Watermark:
        """Pool use and device memory (NVML when a driver is there, else why not)."""
        a = self.tree.alloc
        s = self._memory.sample(a.used_count, a.num_blocks, self.tree.pool.kv.nbytes)
        return ev.Watermark(a.used_count, a.num_blocks, self.tree.high, self.tree.low,
                            s.device_used_bytes, s.device_total_bytes, s.nvml_error)

    def counters(self) -> ev.Counters:
        """Counters since start or the last reset."""
        c, s, (nodes0, tokens0, cows0) = self._counts, self.tree.stats, self._evicted_base
        waiting = len(self._waiting)
        return ev.Counters(self._generation, c.submitted, c.finished, c.rejected,
                           c.prompt_tokens, c.hit_tokens, s.evicted_nodes - nodes0,
                           s.evicted_tokens - tokens0, s.cow_copies - cows0, waiting, 0,
                           self._paused)

    def stats(self) -> Figures:
        """Counters and tree figures for the ``stats`` reply."""
        c, s = self.counters(), self.tree.stats
        hit = c.hit_tokens / c.prompt_tokens if c.prompt_tokens else 0.0
        return {"submitted": c.submitted, "finished": c.finished, "rejected": c.rejected,
                "waiting": c.waiting, "running": 0, "prompt_tokens": c.prompt_tokens,
                "hit_tokens": c.hit_tokens, "hit_rate": hit, "generation": c.generation,
                "nodes": len(self.tree), "used_blocks": self.tree.alloc.used_count,
                "num_blocks": self.tree.alloc.num_blocks, "splits": s.splits,
                "merges": s.merges, "cow_copies": c.cow_copies,
                "evicted_nodes": c.evicted_nodes, "evicted_tokens": c.evicted_tokens,
                "paused": int(self._paused), "model": "none (tree driver)"}

    def close(self) -> None:
        """Release the memory source."""
        self._memory.close()

    def serve_now(self, tokens: TokenArray) -> None:
        """Serve one sequence at once, outside the queue and with no output (a benchmark
        driving the tree request by request); counted like a queued request."""
        self._counts.submitted += 1
        self._serve(WorkloadRequest(tokens, 0, np.zeros(0, np.uint32), "direct", None))

    def __len__(self) -> int:
        """Nodes in the tree, the root excluded."""
        return len(self.tree)

    # -- one request -------------------------------------------------------------------------
    def _serve(self, request: WorkloadRequest) -> None:
        t0 = time.perf_counter()
        rid, self._next_id = self._next_id, self._next_id + 1
        output = request.forced_output
        if output is None:
            rng = np.random.default_rng(rid)
            output = self._words[rng.integers(0, len(self._words), request.max_new_tokens)]
        full = np.concatenate([request.prompt, output]).astype(np.uint32)
        tree = self.tree
        m = tree.match_and_lock(request.prompt)
        tree.emit(ev.RequestStart(rid, len(request.prompt), m.length))
        try:
            lease = tree.allocate(m, len(full))
            tree.insert(full, lease)
            produced = len(output)
            self._counts.finished += 1
            self._counts.prompt_tokens += len(request.prompt)
            self._counts.hit_tokens += m.length
        except (PoolExhausted, PromptTooLarge):
            produced = 0
            self._counts.rejected += 1
        finally:
            tree.unlock(m.node)
        tree.emit(ev.RequestFinish(rid, produced, (time.perf_counter() - t0) * 1000))
