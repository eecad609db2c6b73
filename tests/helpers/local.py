"""An embedded tree-driver source for the inspector's tests: the same ``ServiceLoop`` and command
handler as ``serve``, sampled every step so a command sequence always gives the same batches."""

from __future__ import annotations

import time
from collections.abc import Callable

from inspector.embedded import EmbeddedSource
from inspector.replay import Recording
from radixcache.serving.driver import TreeDriver
from radixcache.serving.loop import LoopConfig, Sampling
from radixcache.serving.memory import MemorySource


def LocalSource(  # stands where the tests' former source class stood
    num_blocks: int = 1024, *, clock: Callable[[], float] = time.time,
    recording: Recording | None = None, memory: MemorySource | None = None,
    step_requests: int = 4,
) -> EmbeddedSource:
    """A tree driver of ``num_blocks`` blocks in an ``EmbeddedSource``: one batch per step of
    ``step_requests`` requests, each with a memory and counter sample."""
    driver = TreeDriver(num_blocks, step_requests=step_requests, memory=memory)
    # settle=False: the suite starts hundreds of these; tests/test_embedded_settle.py checks
    # what a real session's start does to the collector
    return EmbeddedSource(driver, LoopConfig(sampling=Sampling.EVERY_BATCH), clock=clock,
                          recording=recording, settle=False)
