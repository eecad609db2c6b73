"""Shared helpers of the stream tests: a tree driven without a model, published over loopback."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from radixcache.core.pool import KVPool
from radixcache.core.tree import RadixTree
from radixcache.wire.stream import Endpoints, Publisher, TreeSource, serve_request
from radixcache.wire.subscriber import Subscriber

LOCAL = Endpoints.tcp("127.0.0.1", 0)


def prompts(n: int, seed: int = 0) -> list[np.ndarray]:
    """Requests that share prefixes: 8 system prompts, each continued by 1-3 turns."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 1000, int(rng.integers(5, 40)), dtype=np.uint32) for _ in range(8)]
    out = []
    for _ in range(n):
        base = systems[int(rng.integers(0, 8))]
        tail = rng.integers(0, 1000, int(rng.integers(1, 60)), dtype=np.uint32)
        out.append(np.concatenate([base, tail]))
    return out


def make_source(num_blocks: int = 256, digest_every: int = 4) -> TreeSource:
    """A fresh tree over a small pool (it evicts under load)."""
    return TreeSource(RadixTree(KVPool(num_blocks, 16)), digest_every=digest_every)


@contextmanager
def serving(
    source: TreeSource, endpoints: Endpoints = LOCAL, *, epoch: int | None = None, ring: int = 4096
) -> Iterator[Publisher]:
    """A started publisher over ``source`` (closed on exit)."""
    pub = Publisher(endpoints, source.snapshot_at, ring=ring, heartbeat_s=0.05, epoch=epoch)
    source.publisher = pub
    with pub:
        yield pub
    source.publisher = None


def drive(source: TreeSource, requests: list[np.ndarray], per_step: int = 1) -> None:
    """Serve the requests, publishing one batch per ``per_step`` requests."""
    for i in range(0, len(requests), per_step):
        with source.step() as tree:
            for tokens in requests[i:i + per_step]:
                serve_request(tree, tokens)


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``cond`` every 10 ms until true or ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def caught_up(sub: Subscriber, pub: Publisher) -> Callable[[], bool]:
    """True once the subscriber applied every batch the publisher has assigned."""
    return lambda: sub.epoch == pub.epoch and sub.seq >= pub.seq
