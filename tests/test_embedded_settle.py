"""An embedded session settles its interpreter when it starts, as serve's HTTP front does
(``serving.http_interp.settle``): what start-up built is frozen out of the collector's sight
and young collections get rarer, so a full collection over the tree and its mirror no longer
holds the GIL for a frame or a command's reply (160-220 ms at 100k nodes in ``bench tui
--embedded`` before)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from inspector.embedded import EmbeddedSource
from inspector.feed import Feed
from radixcache.serving.driver import TreeDriver
from radixcache.serving.http_interp import GEN0_THRESHOLD
from radixcache.serving.loop import LoopConfig


@pytest.fixture
def fresh_collector() -> Iterator[None]:
    """CPython's defaults for the test; the suite's own state afterwards."""
    threshold = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.parametrize("settle", [True, False])
def test_starting_an_embedded_session_settles_the_collector(fresh_collector: None,
                                                             settle: bool) -> None:
    src = EmbeddedSource(TreeDriver(64), LoopConfig(), settle=settle)
    src.start(Feed())
    try:
        frozen, young = gc.get_freeze_count(), gc.get_threshold()[0]
    finally:
        src.stop()
    assert (frozen > 0, young) == ((True, GEN0_THRESHOLD) if settle else (False, 700))
