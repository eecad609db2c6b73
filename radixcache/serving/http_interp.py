"""The interpreter settings of a process that serves HTTP beside its step loop.

The HTTP front (uvicorn's event loop, its encoder thread), the publisher and the stepping
thread share one interpreter. Two of its defaults lengthen the step loop's tail there
(measured with the step timeline under ``bench serve``, docs/architecture.md):

- the garbage collector: a full collection walks every object the process holds (torch's,
  the tokenizer's, Starlette's: some millions), holding the GIL; one took 320 ms inside a step.
  ``gc.freeze()`` once serving has started moves what start-up made out of the collector's
  sight (it is never garbage), and a higher first threshold makes young collections rarer
  (what a request allocates is freed by reference counts, not by the collector);
- the switch interval (5 ms): a thread that wants the GIL waits that long before the holder
  is asked to drop it, so the stepping thread, back from a forward, can wait 5 ms behind the
  front's Python. ``RADIXCACHE_SWITCH_MS`` sets it (default: left as it is).

``RADIXCACHE_GC_FREEZE=0`` leaves the collector alone (to measure without it).
"""

from __future__ import annotations

import gc
import os
import sys
from typing import NamedTuple

GEN0_THRESHOLD = 50_000  # allocations between young collections (CPython's default: 700)


class Settled(NamedTuple):
    """What ``settle`` did."""

    frozen: int  # objects moved out of the collector's sight (0: left alone)
    switch_ms: float  # the switch interval now


def settle(env: dict[str, str] | None = None) -> Settled:
    """Freeze what start-up made and raise the young threshold (unless
    ``RADIXCACHE_GC_FREEZE=0``); set the switch interval from ``RADIXCACHE_SWITCH_MS``."""
    env = dict(os.environ) if env is None else env
    frozen = 0
    if env.get("RADIXCACHE_GC_FREEZE", "1") != "0":
        gc.collect()
        gc.freeze()
        frozen = gc.get_freeze_count()
        _, second, third = gc.get_threshold()
        gc.set_threshold(GEN0_THRESHOLD, second, third)
    switch = env.get("RADIXCACHE_SWITCH_MS")
    if switch:
        try:
            ms = float(switch)
        except ValueError:
            raise ValueError(f"RADIXCACHE_SWITCH_MS must be a number of ms, got {switch!r}") \
                from None
        if not 0.01 <= ms <= 1000:
            raise ValueError(f"RADIXCACHE_SWITCH_MS must be in [0.01, 1000], got {ms:g}")
        sys.setswitchinterval(ms / 1e3)
    return Settled(frozen, sys.getswitchinterval() * 1e3)
