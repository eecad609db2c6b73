"""The inspector's follower on a real stream: what following costs, and that it is exact.

The ShareGPT trace (`bench tree`'s) is served by a ``TreeDriver`` in a ``ServiceLoop`` with
`bench tree`'s pool (evicting on demand), and its batches are kept. Then they are applied to
a bare ``Mirror`` and to a ``Mirror`` with a ``Follower`` (what the inspector's feed runs),
timed apart. The follower's curve must equal the one-pass curve of the same requests computed
offline, and every finished request's missed spans must add up to what it missed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from radixcache.analysis.follow import Follower
from radixcache.analysis.whatif import one_pass
from radixcache.core import events as ev
from radixcache.serving.driver import TreeDriver
from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
from radixcache.traffic.traces import TokenRequest, token_access
from radixcache.traffic.workload_types import Vocabulary, Workload, WorkloadRequest
from radixcache.wire.mirror import Mirror

Figures = dict[str, object]
CHUNK = 10_000
Pair = tuple[np.ndarray, np.ndarray]


def _serve(pairs: list[Pair], num_blocks: int) -> tuple[ev.Snapshot, list[ev.Batch]]:
    """The batches of serving ``pairs`` (prompt, forced output) in order, and the snapshot
    before them."""
    driver = TreeDriver(num_blocks, step_requests=8)
    driver.set_watermarks(1.0, 1.0)  # evict on demand, as `bench tree` does
    start = driver.snapshot()
    batches: list[ev.Batch] = []
    loop = ServiceLoop(driver, BatchSink(batches.append), LoopConfig(digest_every=0))
    for i in range(0, len(pairs), CHUNK):  # the queue holds MAX_WAITING requests at most
        requests = [WorkloadRequest(p, len(o), o, "sharegpt", None)
                    for p, o in pairs[i : i + CHUNK]]
        driver.submit_workload(Workload("sharegpt", {}, requests, "sharegpt", Vocabulary()))
        loop.run_until_idle()
    return start, batches


def _apply(
    start: ev.Snapshot, batches: list[ev.Batch], *, follow: bool
) -> tuple[float, Mirror, Follower | None]:
    mirror = Mirror()
    follower = Follower(mirror, max_tokens=2**62) if follow else None  # the whole trace
    mirror.load_snapshot(start)
    t0 = time.perf_counter()
    for b in batches:
        mirror.apply_batch(b)
    return time.perf_counter() - t0, mirror, follower


def follow(pairs: list[Pair], num_blocks: int, progress: Callable[[int], None]) -> Figures:
    """The ``follow`` figures (see the module doc)."""
    start, batches = _serve(pairs, num_blocks)
    progress(1)
    bare_s, _, _ = _apply(start, batches, follow=False)
    follow_s, mirror, follower = _apply(start, batches, follow=True)
    assert follower is not None
    progress(1)
    events = sum(len(b.events) for b in batches)
    reqs = [TokenRequest(p, np.concatenate((p, o[:-1]))) for p, o in pairs]
    offline = one_pass((token_access(r, 1) for r in reqs), 4, 1)
    live = follower.curve.curve()
    whys = follower.misses.all()
    by_cause = follower.misses.totals()
    return {
        "requests": len(pairs), "events": events, "num_blocks": num_blocks,
        "bare_events_per_s": events / bare_s, "follow_events_per_s": events / follow_s,
        "overhead": follow_s / bare_s,
        "curve_equal": bool(np.array_equal(live.cum, offline.cum))
        and live.prompt_tokens == offline.prompt_tokens,
        "predicted_hit_rate": live.hit_rate_at(num_blocks * mirror.block_size),
        "measured_hit_rate": follower.curve.measured_rate,
        "explained": sum(w.spans is not None for w in whys),
        "spans_cover_misses": all(sum(s.end - s.start for s in w.spans) == w.missed
                                  for w in whys if w.spans is not None),
        "missed_tokens_by_cause": by_cause, "ghost_tokens": follower.misses.ghosts.tokens,
    }
