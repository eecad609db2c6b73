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

import numpy as np
import numpy.typing as npt

from radixcache.core import events as ev
from radixcache.core.pool import KVPool, PoolExhausted
from radixcache.core.tokens import TokenArray
from radixcache.core.tree import PromptTooLarge, RadixTree
from radixcache.serving.memory import MemorySource
from radixcache.serving.policy import SchedulePolicy
from radixcache.serving.service import ServiceError, Submitted, check_room
from radixcache.serving.tree_service import TreeService
from radixcache.traffic.workloads import Vocabulary, Workload, WorkloadRequest


def serve_request(tree: RadixTree, tokens: Sequence[int] | npt.NDArray[np.uint32]) -> int:
    """Run one sequence through ``tree`` as an engine would (match and pin, allocate, insert,
    unpin) with no model; evicts as needed. Returns the matched length. Raises
    ``PromptTooLarge``/``PoolExhausted`` with the tree unchanged but for evictions."""
    m = tree.match_and_pin(tokens)
    try:
        lease = tree.allocate(m, len(tokens))
        tree.insert(tokens, lease)
    finally:
        tree.unpin(m.node)
    return m.length


class TreeDriver(TreeService):
    """A ``RadixTree`` of ``num_blocks`` blocks served without a model, ``step_requests``
    requests a step. Not thread-safe by itself: ``ServiceLoop`` calls it under its lock."""

    def __init__(self, num_blocks: int = 1024, *, block_size: int = 16, step_requests: int = 4,
                 memory: MemorySource | None = None) -> None:
        super().__init__(RadixTree(KVPool(num_blocks, block_size)),
                         memory if memory is not None else MemorySource(),
                         model="none (tree driver)", device="none")
        self.step_requests = step_requests
        self._waiting: deque[WorkloadRequest] = deque()
        self._next_id = 0
        self._words = Vocabulary().ids

    # -- the protocol ------------------------------------------------------------------------
    def submit_workload(self, workload: Workload) -> Submitted:
        """Queue the workload's requests in order (a dependent request follows the one it
        waits for, so serving in order respects ``after``)."""
        n = len(workload.requests)
        check_room(len(self._waiting), n)
        self._waiting.extend(workload.requests)
        self.totals.submitted += n
        return Submitted(n, self.paused)

    def set_schedule(self, policy: SchedulePolicy) -> None:
        """Refused: the driver serves its queue in order, one request at a time, so there is
        nothing to reorder or share (``ServiceError``)."""
        raise ServiceError(f"schedule {policy.value}: the tree driver has no scheduler (it "
                           "serves requests one at a time, in order)")

    def reset(self) -> int:
        """Drop the waiting requests, empty the tree, start a new counter generation."""
        dropped = len(self._waiting)
        self._waiting.clear()
        self.new_generation()
        return dropped

    def depths(self) -> tuple[int, int]:
        """(waiting, 0): a request is served within the step that takes it."""
        return len(self._waiting), 0

    def busy(self) -> bool:
        """True while requests wait and the driver is not paused."""
        return bool(self._waiting) and not self.paused

    def step(self) -> None:
        """Serve up to ``step_requests`` waiting requests."""
        t0 = time.perf_counter()
        for _ in range(min(self.step_requests, len(self._waiting))):
            self._serve(self._waiting.popleft())
        self.totals.steps += 1
        self.totals.busy_s += time.perf_counter() - t0

    def take_events(self) -> list[ev.AnyEvent]:
        """The tree's events since the last call (request events are emitted into it)."""
        return self.tree.take_events()

    def serve_now(self, tokens: TokenArray) -> None:
        """Serve one sequence at once, outside the queue and with no output (a benchmark
        driving the tree request by request); counted like a queued request."""
        self.totals.submitted += 1
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
        m = tree.match_and_pin(request.prompt)
        tree.emit(ev.RequestStart(rid, len(request.prompt), m.length))
        try:
            lease = tree.allocate(m, len(full))
            tree.insert(full, lease)
            produced = len(output)
            t = self.totals
            t.finished += 1
            t.prompt_tokens += len(request.prompt)
            t.hit_tokens += m.length
            t.prefill_tokens += len(request.prompt) - m.length
            t.output_tokens += produced
        except (PoolExhausted, PromptTooLarge):
            produced = 0
            self.totals.rejected += 1
        finally:
            tree.unpin(m.node)
        tree.emit(ev.RequestFinish(rid, produced, (time.perf_counter() - t0) * 1000))
