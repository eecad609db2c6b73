"""Eviction policies other than LRU, from libCacheSim (PyPI ``libcachesim``, the optional
extra ``radixcache[policies]``): each replayed over the same requests at a few capacities, so
that their points sit on the LRU curve's plot.

LRU is this project's exact one-pass curve (``stackdist``, ``hashstack``); libCacheSim's LRU
through this same replay equals it at every capacity (``tests/test_whatif_policies.py``),
which is what makes the other policies' points comparable. The model, one request at a time,
as the curve's::

    request [a, b, c] (root first)
      1. the hit: the longest prefix of the prompt's blocks the cache holds, looked up
         without touching (``find(update_cache=False)``); its tokens count
      2. touch the whole sequence deepest-first (``get``: a hit moves, a miss is inserted,
         evicting what the policy says), so that under LRU a parent is always at least as
         recent as its children

A block is one object of size 1, so a capacity is in blocks. Token sources name a block by its
prefix (the same units under the same parent are the same block): a dict from (parent id,
units) to a number, as a radix tree would key them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from radixcache.traffic.traces import Access


class EvictionPolicy(enum.Enum):
    """A cache eviction policy by its name on the command line (``--policy``)."""

    LRU = "lru"
    FIFO = "fifo"
    LFU = "lfu"
    ARC = "arc"
    LIRS = "lirs"
    S3FIFO = "s3fifo"
    SIEVE = "sieve"
    TINYLFU = "tinylfu"
    CLOCK = "clock"
    TWOQ = "twoq"
    SLRU = "slru"
    CLOCKPRO = "clockpro"


# libCacheSim's class of each, and the smallest cache (blocks) it runs at: below, S3-FIFO's
# small queue has no room and it aborts the process, W-TinyLFU's window likewise, and LIRS
# warns that a block does not fit. LeCaR, Cacheus and LHD are left out: they draw at random
# (from state the library shares between caches: two runs of one size differ)
LIBCACHESIM = {
    EvictionPolicy.LRU: ("LRU", 1), EvictionPolicy.FIFO: ("FIFO", 1),
    EvictionPolicy.LFU: ("LFU", 1), EvictionPolicy.ARC: ("ARC", 1),
    EvictionPolicy.LIRS: ("LIRS", 2), EvictionPolicy.S3FIFO: ("S3FIFO", 10),
    EvictionPolicy.SIEVE: ("Sieve", 1), EvictionPolicy.TINYLFU: ("WTinyLFU", 5),
    EvictionPolicy.CLOCK: ("Clock", 1), EvictionPolicy.TWOQ: ("TwoQ", 1),
    EvictionPolicy.SLRU: ("SLRU", 1), EvictionPolicy.CLOCKPRO: ("ClockPro", 1),
}


class PolicyError(ValueError):
    """A policy that cannot be replayed here (libCacheSim missing)."""


class _Request(Protocol):
    obj_id: int
    obj_size: int


class _Cache(Protocol):
    def get(self, req: _Request) -> bool: ...
    def find(self, req: _Request, *, update_cache: bool) -> object: ...


def new_cache(policy: EvictionPolicy, capacity_blocks: int
              ) -> tuple[_Cache, Callable[[int], _Request]]:
    """libCacheSim's cache of ``policy`` holding ``capacity_blocks`` blocks, and a maker of a
    request for a block (a fresh one each time: the library writes into a request it is given,
    and LHD, for one, reads that back; ``PolicyError`` without the library)."""
    try:
        import libcachesim
    except ImportError:
        raise PolicyError("--policy needs libCacheSim: pip install 'radixcache[policies]'"
                          ) from None
    name, _ = LIBCACHESIM[policy]
    cache: _Cache = getattr(libcachesim, name)(cache_size=capacity_blocks)
    make = libcachesim.Request

    def request(x: int) -> _Request:
        r: _Request = make(obj_size=1, obj_id=x)
        return r

    return cache, request


@dataclass(slots=True)
class BlockIds:
    """Numbers for the blocks of a token source, keyed by (parent, units) as a radix tree is;
    a hash-id source's ids are its own (``width`` 8)."""

    width: int
    ids: dict[tuple[int, bytes], int] = field(default_factory=dict)

    def path(self, a: Access) -> list[int]:
        """The block numbers of ``a``'s sequence, root first."""
        w, u = self.width, a.units
        if w == 8:
            return list(memoryview(u).cast("Q"))
        out, parent = [], -1
        for k in range(0, len(u), w):
            key = (parent, u[k : k + w])
            parent = self.ids.setdefault(key, len(self.ids))
            out.append(parent)
        return out


def replay_hits(paths: Iterable[tuple[list[int], Access]], policy: EvictionPolicy,
                capacity_blocks: int, block_tokens: int) -> int:
    """The prompt hit tokens of the requests under ``policy`` at ``capacity_blocks`` (the
    module docstring's model)."""
    cache, request = new_cache(policy, capacity_blocks)
    find, get = cache.find, cache.get
    hits = 0
    for path, a in paths:
        matched = 0
        for x in path[: a.prompt_units]:
            if find(request(x), update_cache=False) is None:
                break
            matched += 1
        hits += min(matched * block_tokens, a.prompt_tokens)
        for x in reversed(path):
            get(request(x))
    return hits


def with_paths(accesses: Iterable[Access], width: int) -> Iterator[tuple[list[int], Access]]:
    """Each access with its block numbers (``BlockIds``)."""
    ids = BlockIds(width)
    for a in accesses:
        yield ids.path(a), a


def min_blocks(policy: EvictionPolicy) -> int:
    """The smallest capacity ``policy`` is replayed at (``LIBCACHESIM``)."""
    return LIBCACHESIM[policy][1]
