"""Concurrency: many threads serving requests with heavily shared prefixes on one tree.

Each request does match_and_pin / allocate (retrying on PoolExhausted) / write its K/V /
read its whole sequence back through its lease / insert (or abort) / unlock. A drainer
thread feeds the events to a Mirror meanwhile. At the end: no thread hung, every lock is
0, ``check()`` passes (refcounts equal references) and the mirror has the tree's digest.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import read_kv, toks, write_kv

from radixcache.core.pool import KVPool, KVShape, PoolExhausted
from radixcache.core.tree import RadixTree
from radixcache.wire.mirror import Mirror

THREADS = 8
REQUESTS_PER_THREAD = 400
NUM_BLOCKS = 32
B = 16


def family_prompts(rng: random.Random) -> list[list[int]]:
    """A few system prompts ending at odd offsets, each with a few shared follow-ups."""
    systems = [[1000 * (s + 1) + k for k in range(rng.randrange(5, 50))] for s in range(6)]
    return [sys_ + [7, 8, 9, u, u + 1][: rng.randrange(1, 6)] * (u % 3 + 1)
            for sys_ in systems for u in range(4)]


class Worker:
    def __init__(self, tree: RadixTree, seed: int, prompts: list[list[int]]) -> None:
        self.tree, self.rng, self.prompts = tree, random.Random(seed), prompts
        self.history: list[list[int]] = []
        self.errors: list[BaseException] = []
        self.retries = self.served = 0

    def next_prompt(self) -> list[int]:
        rng = self.rng
        if self.history and rng.random() < 0.4:  # continue or fork one of our own sequences
            base = rng.choice(self.history)
            base = base[: rng.randrange(1, len(base) + 1)]
        else:
            base = rng.choice(self.prompts)
        return base + [rng.randrange(64) for _ in range(rng.randrange(0, 12))]

    def one(self) -> None:
        tree, rng = self.tree, self.rng
        prompt = self.next_prompt()[:96]
        full = prompt + [rng.randrange(64) for _ in range(rng.randrange(0, 10))]
        while True:
            m = tree.match_and_pin(toks(prompt))
            try:
                lease = tree.allocate(m, len(full))
                break
            except PoolExhausted:
                tree.unpin(m.node)
                self.retries += 1
                time.sleep(0.0005)
        assert read_kv(tree.pool, m.block_table, m.length)[0] == prompt[: m.length]
        write_kv(tree.pool, lease.table, m.length, full)
        time.sleep(rng.random() * 0.0005)  # "model compute" outside the tree lock
        assert read_kv(tree.pool, lease.table, len(full)) == (full, full)
        if rng.random() < 0.05:
            tree.release(lease)
        else:
            tree.insert(toks(full), lease)
            self.history = ([*self.history, full])[-8:]
        tree.unpin(m.node)
        self.served += 1

    def run(self) -> None:
        try:
            for _ in range(REQUESTS_PER_THREAD):
                self.one()
        except BaseException as exc:  # reported by the main thread
            self.errors.append(exc)


@pytest.fixture
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the threads often
    yield
    sys.setswitchinterval(old)


def test_many_threads_shared_prefixes(fast_switching: None) -> None:
    pool = KVPool(NUM_BLOCKS, B, KVShape(1, 1, 1), device="cpu")
    tree = RadixTree(pool, high=0.9, low=0.7)
    mirror = Mirror(B, NUM_BLOCKS)
    mirror.load_snapshot(tree.snapshot())
    tree.take_events()
    prompts = family_prompts(random.Random(7))
    workers = [Worker(tree, seed, prompts) for seed in range(THREADS)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    stop = threading.Event()
    drain_errors: list[BaseException] = []

    def drain() -> None:
        try:
            while not stop.is_set():
                for e in tree.take_events():
                    mirror.apply(e)
                time.sleep(0.002)
        except BaseException as exc:
            drain_errors.append(exc)

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(timeout=max(deadline - time.monotonic(), 0.1))
    assert [t.is_alive() for t in threads] == [False] * THREADS, "deadlock or livelock"
    stop.set()
    drainer.join(timeout=10)
    assert not drainer.is_alive()
    for w in workers:
        if w.errors:
            raise w.errors[0]
    assert drain_errors == []
    assert sum(w.served for w in workers) == THREADS * REQUESTS_PER_THREAD

    for e in tree.take_events():
        mirror.apply(e)
    tree.check()
    snap = tree.snapshot()
    assert [n.pins for n in snap.nodes] == [0] * len(snap.nodes)
    assert snap.request_blocks == []
    assert mirror.digest() == tree.digest()
    assert mirror.ref == [pool.allocator.refcount(b) for b in range(NUM_BLOCKS)]
    s = tree.stats
    # the run exercised every structural path (counts vary with the interleaving)
    assert min(s.splits, s.merges, s.cow_copies, s.evicted_nodes) >= 1, s
    # everything still cached reads back its own tokens
    for node in snap.nodes[1:]:
        n = tree.node(node.node)
        if not n.children:
            path = []
            x = n
            while x.parent is not None:
                path[:0] = [int(t) for t in memoryview(x.tokens).cast("I")]
                x = x.parent
            m = tree.match(toks(path))
            assert m.length == len(path)
            assert read_kv(pool, m.block_table, m.length)[0] == path
