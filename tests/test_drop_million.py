"""`bench events --drop 0.01 --verify-every-batch` at ~20,000 events: the mirror digest equals
the tree's after every applied batch, with 1% of batches lost on the way to the subscriber
(``tools.lossy.LossyHop``)."""

from __future__ import annotations

from radixcache.tools.bench_events import verify_drops
from radixcache.tools.lossy import HashDrop


def test_hash_drop_is_deterministic_and_near_the_fraction() -> None:
    hook = HashDrop(0.01)
    picked = [seq for seq in range(1, 100_001) if hook(seq)]
    assert picked == [seq for seq in range(1, 100_001) if HashDrop(0.01)(seq)]
    assert sorted(hook.dropped) == picked
    assert 900 <= len(picked) <= 1100


def test_every_batch_digest_equal_with_one_percent_dropped() -> None:
    r = verify_drops(20_000, 0.01, per_step=4)
    assert r.events >= 20_000
    assert r.batches_checked == r.batches  # every batch applied (replayed, not skipped)
    assert r.batches_digest_equal == r.batches_checked
    expected = sum(HashDrop(0.01)(seq) for seq in range(1, r.batches + 1))
    assert r.dropped == expected and r.dropped > 0
    assert r.recovered == r.dropped
    assert r.snapshots == 1  # no gap was too old for the ring
