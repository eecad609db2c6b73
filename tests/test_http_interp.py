"""``serving.http_interp.settle``: the collector frozen and its young threshold raised, the
switch interval from the environment, a bad value refused in one line."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from radixcache.serving.http_interp import GEN0_THRESHOLD, Settled, settle


@pytest.fixture(autouse=True)
def _restored() -> Iterator[None]:
    threshold, switch = gc.get_threshold(), sys.getswitchinterval()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    sys.setswitchinterval(switch)


def test_freezes_what_exists_and_raises_the_young_threshold() -> None:
    gc.unfreeze()
    second, third = gc.get_threshold()[1:]
    s = settle({})
    assert s.frozen == gc.get_freeze_count() > 0
    assert gc.get_threshold() == (GEN0_THRESHOLD, second, third)
    assert s.switch_ms == pytest.approx(sys.getswitchinterval() * 1e3)


def test_the_environment_turns_freezing_off_and_sets_the_switch_interval() -> None:
    gc.unfreeze()
    threshold = gc.get_threshold()
    assert settle({"RADIXCACHE_GC_FREEZE": "0", "RADIXCACHE_SWITCH_MS": "2"}) == \
        Settled(0, pytest.approx(2.0))
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == threshold
    assert sys.getswitchinterval() == pytest.approx(0.002)


@pytest.mark.parametrize(("value", "message"), [
    ("fast", "RADIXCACHE_SWITCH_MS must be a number of ms, got 'fast'"),
    ("0", "RADIXCACHE_SWITCH_MS must be in [0.01, 1000], got 0"),
    ("5000", "RADIXCACHE_SWITCH_MS must be in [0.01, 1000], got 5000"),
])
def test_a_bad_switch_interval_is_refused(value: str, message: str) -> None:
    switch = sys.getswitchinterval()
    with pytest.raises(ValueError) as info:
        settle({"RADIXCACHE_GC_FREEZE": "0", "RADIXCACHE_SWITCH_MS": value})
    assert str(info.value) == message
    assert sys.getswitchinterval() == switch
