"""The curve of a hash-id trace at every capacity from a bounded memory: exact where a sample
cannot see, the sample above it, and an error bound on every estimated point.

A SHARDS sample at rate R (``hashstack``) resolves a curve only from about 100/R blocks up:
below, it has too few blocks, and a few hot ones (shared system prompts) carry much of the
reuse and are in the sample or not. So three passes share one read of the trace:

- ``boundstack.BoundedStack``: the exact LRU pass over the top ``depth`` blocks of the stack
  (default 4 x 100/R, at least 65,536): exact hits at every capacity up to ``depth``,
  memory O(depth);
- the sample at rate R (SHARDS-adj, Waldspurger et al., FAST'15 §4.3) above ``depth``, shifted
  by what the exact pass says at ``depth`` (its increments above ``depth`` are what it
  estimates; its error at ``depth`` is gone);
- ``SUBSAMPLES`` disjoint sub-samples of it (by the next bits of each block's mixed id), each
  at R / SUBSAMPLES, whose increments above ``depth`` spread as the estimate's do: the bound of
  a point is Student's t (95%, two-sided) times their standard deviation over
  sqrt(SUBSAMPLES) (batch means), and no less than 3 sampled references' worth (the rule of
  three: where no sub-sample saw any, their spread says nothing).

With ``sample_max`` the sample is of fixed size (``fixedsample``: at most that many blocks,
its rate lowered as the trace grows, from ``rate``, 1 by default) and its sub-samples are its
eight parts, lowered with it; the join and the bounds are the same, at the final rate.

With no block evicted past ``depth`` (a trace of fewer distinct blocks) the curve is exact at
every size, whatever R. ::

    hits |                 ______....------  sample + (exact(depth) - sample(depth)) +- bound
         |            __---
         |       _.--'   <- exact up to depth
         |___.--'
         +-------------|-------------------> capacity (log)
                     depth
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from radixcache.analysis.boundstack import BoundedStack
from radixcache.analysis.fixedsample import PARTS, FixedSample, mixed
from radixcache.analysis.hashstack import HashStack, HashStackError
from radixcache.analysis.stackdist import Curve
from radixcache.traffic.mooncake_scan import SAMPLE_BITS, sample_keep, sample_runs

SUBSAMPLES = 8
T95 = 2.365  # Student's t, 7 degrees of freedom, 97.5th percentile
DEPTH_FACTOR = 4  # exact up to this many times the 100/R blocks a sample needs
MIN_DEPTH = 1 << 16  # ... and up to this many blocks at least (32M tokens of 512)
# a sub-sample of fewer blocks gives no bound: on Mooncake's conversation trace at R = 0.01
# (~220 blocks each) the spread covered 9% of the errors; at ~2,300 each, and on seeded
# traces at 375, 96-100%
MIN_SUB_BLOCKS = 300


def default_depth(rate: float) -> int:
    """Blocks the exact pass keeps for a sample at ``rate``: ``DEPTH_FACTOR`` x 100/R, and at
    least ``MIN_DEPTH`` (a few MB: no reason to estimate what so little memory answers)."""
    return max(MIN_DEPTH, int(np.ceil(DEPTH_FACTOR * 100 / rate)))


_POOL: list[ThreadPoolExecutor] = []


def _pool() -> ThreadPoolExecutor:
    """The one thread every hybrid pass runs its samples in (made when first needed)."""
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(1, thread_name_prefix="rc-whatif-sample"))
    return _POOL[0]


class HybridPass:
    """Feed ``HashRuns`` (every id) in order with ``add``; ``curve()`` joins the passes."""

    def __init__(self, block_tokens: int, rate: float, depth: int | None = None,
                 sample_max: int | None = None) -> None:
        self.keep = sample_keep(rate)
        if not self.keep and sample_max is None:
            raise ValueError("a hybrid pass needs a sample rate below 1")
        self.block_tokens = block_tokens
        self.depth = default_depth(rate) if depth is None else depth
        self.exact = BoundedStack(block_tokens, self.depth)
        self.sample: HashStack | FixedSample
        self.subs: list[HashStack] | list[FixedSample]
        if sample_max is not None:
            self.sample = FixedSample(block_tokens, sample_max, rate)
            self.subs = [FixedSample(block_tokens, sample_max, rate, part=k)
                         for k in range(PARTS)]
            return
        self.sample = HashStack(block_tokens, rate)
        self.sub_keep = self.keep // SUBSAMPLES
        sub_rate = self.sub_keep / 2**SAMPLE_BITS
        subs = [HashStack(block_tokens, sub_rate) for _ in range(SUBSAMPLES)]
        self.subs = subs if self.sub_keep else []

    def add(self, ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray) -> None:
        """Account consecutive requests (every id of each); ``HashStackError`` as the
        stacks raise it (the exact pass's first). The samples take them in a thread of their
        own (``rc-whatif-sample``) while the exact pass does: both are compiled loops that
        hold no GIL, and neither reads the other's state."""
        fut = _pool().submit(self._sampled, ids, ends, tokens)
        try:
            self.exact.add(ids, ends, tokens)
        except HashStackError:
            fut.exception()  # done with the arrays before the error goes up
            raise
        fut.result()

    def _sampled(self, ids: np.ndarray, ends: np.ndarray, tokens: np.ndarray) -> None:
        """The sample's and the sub-samples' share of ``add``."""
        if isinstance(self.sample, FixedSample):
            keep = self.sample.keep  # it only falls: what is above now is out for good
            sids, sends, wants = sample_runs(ids, ends, tokens, keep, self.block_tokens)
            self.sample.add(sids, sends, tokens, wants)
            for fsub in self.subs:
                assert isinstance(fsub, FixedSample)
                fsub.add(sids, sends, tokens, wants, drops=self.sample.drops)
            return
        sids, sends, wants = sample_runs(ids, ends, tokens, self.keep, self.block_tokens)
        self.sample.add(sids, sends, tokens, wants)
        if not self.subs:
            return
        which = (mixed(sids) >> np.uint64(64 - SAMPLE_BITS)) // np.uint64(self.sub_keep)
        for k, sub in enumerate(self.subs):
            assert isinstance(sub, HashStack)
            mine = which == k
            cut = np.concatenate(([0], np.cumsum(mine)))[sends]
            sub.add(sids[mine], cut, tokens, wants[mine])

    def curve(self) -> Curve:
        """Exact up to ``depth`` (every size when nothing was evicted past it), the shifted
        sample above with its bounds (module docstring)."""
        low = self.exact.curve()
        if not self.exact.evicted:
            return low
        est = self.sample.curve()
        d = np.asarray([self.depth])
        exact_cum = low.cum[: self.depth + 1]
        shift = int(exact_cum[-1]) - int(est.hits(d)[0])
        cum = np.maximum(est.cum + shift, exact_cum[-1])
        k = np.arange(len(cum), dtype=np.int64)
        units = np.where(k > 0, np.floor((k - 1) * est.unit_step).astype(np.int64) + 1, 0)
        return est._replace(cum=cum, exact_cum=exact_cum, bound=self._bound(units))

    def _bound(self, units: np.ndarray) -> np.ndarray | None:
        """The bound (tokens) of the estimate at each capacity in ``units`` (module
        docstring); ``None`` without sub-samples (a rate too small to split) or with one of
        fewer than ``MIN_SUB_BLOCKS`` blocks (their spread is then no measure)."""
        if not self.subs or min(sub.distinct for sub in self.subs) < MIN_SUB_BLOCKS:
            return None
        d = np.asarray([self.depth])
        inc = []
        for sub in self.subs:
            c = sub.curve()
            inc.append(c.hits(np.maximum(units, self.depth)) - c.hits(d)[0])
        spread = np.std(np.asarray(inc, np.float64), axis=0, ddof=1)
        # no less than the rule of three: where no sub-sample saw a reference, up to 3 sampled
        # ones (each standing for 1/R references of a block) stay likely (95%)
        floor = 3 * self.block_tokens / self.sample.rate
        out: np.ndarray = np.ceil(np.maximum(T95 * spread / np.sqrt(len(self.subs)), floor)
                                  ).astype(np.int64)
        return out
