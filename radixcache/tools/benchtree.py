"""`radixcache bench tree`: the ShareGPT multi-turn trace replayed through the tree.

Replay protocol (identical for every policy, so hit rates compare): batches of 8
consecutive requests; for each request of a batch: match, lock, allocate the uncached
part (evicting as needed); then for each: insert ``prompt + output[:-1]``, unlock.

Policies: the tree itself (token-granular), the same tree with matches cut to a block
boundary (what caches with page size > 1 reuse), and full-block hashing
(``radixcache.tools.baselines``).
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import NamedTuple

import msgspec
import numpy as np

from radixcache.core.pool import KVPool, KVShape
from radixcache.core.tree import MatchResult, RadixTree

BATCH = 8
Request = tuple[np.ndarray, np.ndarray]  # (prompt, output) uint32 arrays
Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class TreeBenchConfig:
    """One replay's settings (``high = low = 1.0`` evicts on demand only)."""

    block_size: int = 16
    capacity: int = 200_000
    high: float = 1.0
    low: float = 1.0
    record_events: bool = True
    page_aligned: bool = False
    measure_memory: bool = False
    clock_evictions: bool = False  # time each eviction pass (two clock reads inside allocate)


@dataclass(slots=True)
class OpTimes:
    """Per-operation samples in nanoseconds."""

    match: list[int] = field(default_factory=list)
    lock: list[int] = field(default_factory=list)
    alloc: list[int] = field(default_factory=list)
    evict: list[int] = field(default_factory=list)
    insert: list[int] = field(default_factory=list)
    unlock: list[int] = field(default_factory=list)
    drain: int = 0

    def total_seconds(self) -> float:
        """All tree-operation time, event draining included."""
        parts = (self.match, self.lock, self.alloc, self.insert, self.unlock)
        return (sum(sum(p) for p in parts) + self.drain) / 1e9


@dataclass(slots=True)
class TreeRun:
    """What one replay measured."""

    requests: int
    prompt_tokens: int
    hit_tokens: int
    times: OpTimes
    events: int
    splits: int
    merges: int
    extends: int
    cow_copies: int
    slots_copied: int
    evicted_tokens: int
    cached_tokens: int
    nodes: int
    metadata_bytes: int | None

    @property
    def hit_rate(self) -> float:
        """Matched prompt tokens over all prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _serve_batch(
    tree: RadixTree, batch: Sequence[Request], cfg: TreeBenchConfig, t: OpTimes
) -> int:
    """One batch through the replay protocol; returns the hit tokens."""
    clock = time.perf_counter_ns
    B = cfg.block_size
    held = []
    hits = 0
    for prompt, output in batch:
        pb = prompt.tobytes()
        t0 = clock()
        m = tree.match(pb)
        t1 = clock()
        tree.pin(m.node)
        calls = tree.stats.evict_calls
        t2 = clock()
        if cfg.page_aligned and m.length % B:
            cut = m.length - m.length % B
            m = MatchResult(cut, m.node, m.block_table[: cut // B])
        lease = tree.allocate(m, len(prompt) + len(output) - 1)
        t3 = clock()
        if cfg.clock_evictions and tree.stats.evict_calls != calls:
            t.evict.append(tree.stats.last_evict_ns)
        t.match.append(t1 - t0)
        t.lock.append(t2 - t1)
        t.alloc.append(t3 - t2)
        hits += m.length
        held.append((pb + output[:-1].tobytes(), m.node, lease))
    for seq, node, lease in held:
        t0 = clock()
        tree.insert(seq, lease)
        t1 = clock()
        tree.unpin(node)
        t2 = clock()
        t.insert.append(t1 - t0)
        t.unlock.append(t2 - t1)
    return hits


def replay_tree(
    requests: Sequence[Request], cfg: TreeBenchConfig, progress: Progress | None = None
) -> TreeRun:
    """Replay ``requests`` through a fresh tree; drains events after every batch."""
    if cfg.measure_memory:
        tracemalloc.start()
    # The trace is static input: keep the cyclic GC from rescanning its 61k arrays during the
    # replay (the tree's own objects are still collected as usual).
    gc.collect()  # the previous replay's tree (parent/child cycles) goes first
    gc.freeze()
    num_blocks = cfg.capacity // cfg.block_size
    pool = KVPool(num_blocks, cfg.block_size, KVShape(1, 1, 1), device="cpu")
    tree = RadixTree(pool, high=cfg.high, low=cfg.low, record_events=cfg.record_events)
    tree.evictor.clocked = cfg.clock_evictions
    t = OpTimes()
    hits = prompt_tokens = events = 0
    clock = time.perf_counter_ns
    for i in range(0, len(requests), BATCH):
        batch = requests[i : i + BATCH]
        hits += _serve_batch(tree, batch, cfg, t)
        prompt_tokens += sum(len(p) for p, _ in batch)
        t0 = clock()
        events += len(tree.take_events())
        t.drain += clock() - t0
        if progress is not None:
            progress(len(batch))
    run = _tree_run(tree, len(requests), prompt_tokens, hits, t, events)
    if cfg.measure_memory:
        # what the tree retains: the traced memory that goes away with it (collect first, so
        # other garbage made meanwhile -- progress-bar renders, say -- is not counted)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        del tree, pool
        gc.collect()
        run.metadata_bytes = held - tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    return run


def _tree_run(tree: RadixTree, requests: int, prompt_tokens: int, hits: int, t: OpTimes,
              events: int) -> TreeRun:
    s = tree.stats
    return TreeRun(requests, prompt_tokens, hits, t, events, s.splits, s.merges, s.extends,
                   s.cow_copies, s.slots_copied, s.evicted_tokens, tree.cached_tokens,
                   len(tree), None)


def _us(samples: list[int]) -> tuple[float, float]:
    if not samples:
        return 0.0, 0.0
    a = np.asarray(samples, dtype=np.float64) / 1e3
    return float(a.mean()), float(np.percentile(a, 99))


class TreeFigures(msgspec.Struct, kw_only=True):
    """The benchmark's figures, field by field: its ``--json`` keys (a stable contract) are
    these names, in this order. ``None``: not measured (``--no-block1``, no ``--memory``)."""

    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float
    hit_rate_page_aligned: float
    hit_rate_block_hash: float
    hit_rate_block_size_1: float | None
    match_us_mean: float
    match_us_p99: float
    lock_us_mean: float
    lock_us_p99: float
    alloc_us_mean: float
    alloc_us_p99: float
    evict_us_mean: float
    evict_us_p99: float
    insert_us_mean: float
    insert_us_p99: float
    unlock_us_mean: float
    unlock_us_p99: float
    tree_op_seconds: float
    tree_op_seconds_events_off: float
    event_overhead: float
    events: int
    tokens_evicted: int
    splits: int
    merges: int
    extends: int
    cow_copies: int
    slots_copied: int
    nodes: int
    cached_tokens: int
    bytes_per_cached_token: float | None

    def op_us(self) -> dict[str, tuple[float, float]]:
        """Each tree operation's mean and p99 microseconds, in ``OPS`` order."""
        return {"match": (self.match_us_mean, self.match_us_p99),
                "lock": (self.lock_us_mean, self.lock_us_p99),
                "alloc": (self.alloc_us_mean, self.alloc_us_p99),
                "evict": (self.evict_us_mean, self.evict_us_p99),
                "insert": (self.insert_us_mean, self.insert_us_p99),
                "unlock": (self.unlock_us_mean, self.unlock_us_p99)}


OPS = ("match", "lock", "alloc", "evict", "insert", "unlock")  # the timed tree operations


def figures(
    run: TreeRun,
    quiet: TreeRun,
    aligned: TreeRun,
    block_hash_rate: float,
    block1: TreeRun | None,
) -> TreeFigures:
    """The benchmark's figures. ``run`` has events on; ``quiet`` is the same replay with
    events off (for the overhead)."""
    t = run.times
    us = {name: _us(getattr(t, name)) for name in OPS}
    on, off = t.total_seconds(), quiet.times.total_seconds()
    return TreeFigures(
        requests=run.requests, prompt_tokens=run.prompt_tokens, hit_tokens=run.hit_tokens,
        hit_rate=run.hit_rate, hit_rate_page_aligned=aligned.hit_rate,
        hit_rate_block_hash=block_hash_rate,
        hit_rate_block_size_1=block1.hit_rate if block1 else None,
        match_us_mean=us["match"][0], match_us_p99=us["match"][1],
        lock_us_mean=us["lock"][0], lock_us_p99=us["lock"][1],
        alloc_us_mean=us["alloc"][0], alloc_us_p99=us["alloc"][1],
        evict_us_mean=us["evict"][0], evict_us_p99=us["evict"][1],
        insert_us_mean=us["insert"][0], insert_us_p99=us["insert"][1],
        unlock_us_mean=us["unlock"][0], unlock_us_p99=us["unlock"][1],
        tree_op_seconds=on,
        tree_op_seconds_events_off=off,
        event_overhead=max(0.0, (on - off) / on) if on else 0.0,
        events=run.events,
        tokens_evicted=run.evicted_tokens,
        splits=run.splits,
        merges=run.merges,
        extends=run.extends,
        cow_copies=run.cow_copies,
        slots_copied=run.slots_copied,
        nodes=run.nodes,
        cached_tokens=run.cached_tokens,
        bytes_per_cached_token=(
            run.metadata_bytes / run.cached_tokens
            if run.metadata_bytes is not None and run.cached_tokens
            else None
        ),
    )


class BlockOne(Enum):
    """Whether ``bench tree`` also replays the tree at block size 1."""

    ALSO = "also"
    SKIP = "skip"


class Memory(Enum):
    """Whether ``bench tree`` makes a traced replay for metadata bytes."""

    MEASURE = "measure"
    SKIP = "skip"


class BenchRuns(NamedTuple):
    """Every replay ``bench tree`` makes: the fastest of the events-on and events-off runs,
    all of them, the page-aligned tree, the tree at block size 1, full-block hashing."""

    on: TreeRun
    off: TreeRun
    ons: list[TreeRun]
    offs: list[TreeRun]
    aligned: TreeRun
    block1: TreeRun | None
    block_hash_rate: float


Replay = Callable[[str, TreeBenchConfig], TreeRun]


def bench_runs(reqs: list[Request], cfg: TreeBenchConfig, replay: Replay, *, repeat: int,
               block1: BlockOne, memory: Memory,
               block_hash: Callable[[], float]) -> BenchRuns:
    """The replays of ``bench tree`` through ``replay(label, cfg)`` (the caller's progress
    bar): events on and off ``repeat`` times each, interleaved so the machine's drift hits
    both alike, then one replay that times each eviction pass (the clock reads stay out of
    the runs above: a full pool evicts on nearly every allocation), the page-aligned tree,
    block size 1, the block-hash baseline and (with ``memory``) one traced replay; the timed
    passes and the traced figures go onto the fastest run."""
    ons: list[TreeRun] = []
    offs: list[TreeRun] = []
    quiet_cfg = replace(cfg, record_events=False)
    for i in range(repeat):
        ons.append(replay(f"tree (events on) {i + 1}/{repeat}", cfg))
        offs.append(replay(f"tree (events off) {i + 1}/{repeat}", quiet_cfg))
    run = min(ons, key=lambda r: r.times.total_seconds())
    quiet = min(offs, key=lambda r: r.times.total_seconds())
    timed = replay("eviction passes (timed)", replace(cfg, clock_evictions=True))
    run.times.evict = timed.times.evict
    aligned = replay("page-aligned", replace(cfg, page_aligned=True))
    one = (replay("tree at block size 1", replace(cfg, block_size=1))
           if block1 is BlockOne.ALSO else None)
    rate = block_hash()
    if memory is Memory.MEASURE:
        mem = replay("tree (tracemalloc)", replace(cfg, measure_memory=True))
        run.metadata_bytes, run.cached_tokens = mem.metadata_bytes, mem.cached_tokens
    return BenchRuns(run, quiet, ons, offs, aligned, one, rate)
