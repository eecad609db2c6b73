"""The knee on curves of each shape (hit rate against log capacity): concave, convex,
S-shaped, and flat up to a large capacity. Each curve is built from a function of
x = log(capacity) / log(saturation) in [0, 1], so the expected knee is worked out by hand."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from radixcache.analysis.answers import capacity_for, knee_tokens
from radixcache.analysis.stackdist import Curve

TOP = 2**20  # saturation, in blocks
BLOCK = 16


def curve_of(f: Callable[[np.ndarray], np.ndarray]) -> Curve:
    c = np.arange(TOP + 1)
    y = f(np.log(np.maximum(c, 1)) / np.log(TOP))
    y[0] = 0.0
    cum = np.maximum.accumulate(np.rint(1_000_000 * y).astype(np.int64))
    return Curve(BLOCK, 1000, 2_000_000, cum)


def knee_x(curve: Curve) -> float:
    return float(np.log(knee_tokens(curve) / BLOCK) / np.log(TOP))


def test_concave_is_plain_kneedle():
    # 1 - (1 - x)^3 lies above its chord from (0, 0) to (1, 1); farthest where the slope is 1:
    # 3 (1 - x)^2 = 1, x = 1 - 1/sqrt(3)
    assert abs(knee_x(curve_of(lambda x: 1 - (1 - x) ** 3)) - (1 - 3**-0.5)) < 0.01


def test_convex_has_its_knee_at_the_top_where_it_stops_rising():
    # x^3 lies below every chord from the first block: plain Kneedle said "one block"
    curve = curve_of(lambda x: x**3)
    assert knee_x(curve) > 0.95
    assert knee_tokens(curve) >= capacity_for(curve, 0.9)


def test_s_shaped_has_its_knee_at_the_upper_bend():
    # a logistic centred at x = 0.5: steepest there; above it the chord to (1, 1) has slope
    # ~1, and f' = 20 f (1 - f) = 1 at f = 0.947, x = 0.5 + ln(0.947 / 0.053) / 20 = 0.644
    def s(x: np.ndarray) -> np.ndarray:
        lo, hi = 1 / (1 + np.exp(10)), 1 / (1 + np.exp(-10))
        return (1 / (1 + np.exp(-20 * (x - 0.5))) - lo) / (hi - lo)

    curve = curve_of(s)
    assert abs(knee_x(curve) - 0.644) < 0.01
    assert capacity_for(curve, 0.5) < knee_tokens(curve) < capacity_for(curve, 0.99)


def test_a_curve_flat_up_to_a_large_capacity_has_its_knee_where_it_rises():
    # nothing hits below x = 0.8 (2^16 blocks, 1M tokens), then a concave rise to saturation:
    # the knee is the rise's own, 0.8 + 0.2 (1 - 1/sqrt(3)) = 0.885 -- not the first block
    def flat_then_rise(x: np.ndarray) -> np.ndarray:
        t = np.clip((x - 0.8) / 0.2, 0, 1)
        return 1 - (1 - t) ** 3

    curve = curve_of(flat_then_rise)
    assert abs(knee_x(curve) - (0.8 + 0.2 * (1 - 3**-0.5))) < 0.01
    assert knee_tokens(curve) > 2**16 * BLOCK


def test_degenerate_curves():
    empty = Curve(BLOCK, 0, 0, np.zeros(2, np.int64))
    assert knee_tokens(empty) == 0
    one = Curve(BLOCK, 2, 32, np.asarray([0, 16, 16], np.int64))  # all hits at one block
    assert knee_tokens(one) == BLOCK


def test_capacity_labels_are_readable():
    """Chart and terminal ticks: "101M", not "101299712.0"."""
    from radixcache.analysis.chart import si

    assert [si(x) for x in (1, 512, 1536, 101299712.0, 2.5e9, 3e12)] == [
        "1", "512", "1.54K", "101M", "2.5G", "3T"]
