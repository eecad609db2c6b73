"""The block map's pinned set (``Feed.pinned``) is exactly the nodes with pins, however the
batch that unpinned them ended: a live inspector notes a batch after the subscriber applied
all of it (``Feed.observe``), so a request that unpins its path and whose leaf is then evicted
or merged away in the same engine step left the rest of its path "pinned" in the map (a
paused, drained demo drew block 1408 pinned with every node r0)."""

from __future__ import annotations

from collections.abc import Sequence

from inspector.feed import Feed
from radixcache.core import events as ev
from radixcache.wire.mirror import Mirror
from tests.helpers.pilot import T0, tokens

ROOT = ev.NodeState(0, -1, 0, b"", [], 0, 0)


def _feeds() -> tuple[Feed, Feed]:
    """A feed that applies batches itself (embedded, replay) and one that observes batches a
    subscriber applied to its mirror (live)."""
    feeds = (Feed(), Feed(Mirror()))
    for feed in feeds:
        feed.load(ev.Snapshot(16, 64, [ROOT], 0, 1, [], 0.92, 0.85), 0, T0)
    return feeds


def _deliver(feeds: tuple[Feed, Feed], seq: int, events: Sequence[ev.AnyEvent]) -> None:
    batch = ev.Batch(seq, 7, T0 + seq, "test", list(events))
    applying, observing = feeds
    assert applying.apply(batch)
    with observing.lock:
        for e in batch.events:
            observing.mirror.apply(e)
    observing.observe(batch)


def _node(node: int, parent: int, start: int, first: int, blocks: list[int]) -> ev.NodeCreated:
    return ev.NodeCreated(node, parent, start, tokens(*range(first, first + 16 * len(blocks))),
                          blocks, shared_first=False)


def _truth(feed: Feed) -> set[int]:
    return {n.id for n in feed.mirror.nodes.values() if n.pins > 0}


def _check(feeds: tuple[Feed, Feed], pinned: set[int], blocks: set[int]) -> None:
    for feed in feeds:
        assert _truth(feed) == pinned
        assert feed.pinned == pinned
        assert feed.pinned_blocks() == blocks


def test_an_unpinned_leaf_evicted_in_the_same_batch_leaves_no_pinned_parent() -> None:
    """root -> p1 (blocks 0-1) -> p2 (block 2); a request pins p2, then finishes, and p2 is
    evicted in that same step."""
    feeds = _feeds()
    _deliver(feeds, 1, [ev.BlockAlloc([0, 1, 2]), _node(1, 0, 0, 1000, [0, 1]),
                        _node(2, 1, 32, 2000, [2]), ev.Pin(2, 1)])
    _check(feeds, {0, 1, 2}, {0, 1, 2})
    _deliver(feeds, 2, [ev.Pin(2, -1), ev.Evict(2, 16, [2])])
    _check(feeds, set(), set())


def test_an_unpinned_node_merged_away_in_the_same_batch_leaves_no_pinned_parent() -> None:
    """root -> p1 (blocks 0-1) -> a (block 2) -> {b (block 3), c (block 4)}; a request pins
    a, then finishes; c is evicted and a merges into b (a's id is gone) in that same step."""
    feeds = _feeds()
    _deliver(feeds, 1, [ev.BlockAlloc([0, 1, 2, 3, 4]), _node(1, 0, 0, 1000, [0, 1]),
                        _node(2, 1, 32, 2000, [2]), _node(3, 2, 48, 3000, [3]),
                        _node(4, 2, 48, 4000, [4]), ev.Pin(2, 1)])
    _check(feeds, {0, 1, 2}, {0, 1, 2})
    _deliver(feeds, 2, [ev.Pin(2, -1), ev.Evict(4, 16, [4]),
                        ev.Merge(2, 3, None, keeps_times=True)])
    _check(feeds, set(), set())


def test_a_pin_on_a_node_merged_away_in_the_same_batch_pins_its_heir() -> None:
    """The other way round: a pinned pair of equal pins merges in the batch that pinned it;
    the joined node (the child's id) and its path are pinned."""
    feeds = _feeds()
    _deliver(feeds, 1, [ev.BlockAlloc([0, 1, 2, 3, 4]), _node(1, 0, 0, 1000, [0, 1]),
                        _node(2, 1, 32, 2000, [2]), _node(3, 2, 48, 3000, [3]),
                        _node(4, 2, 48, 4000, [4]), ev.Pin(3, 1)])
    _check(feeds, {0, 1, 2, 3}, {0, 1, 2, 3})
    _deliver(feeds, 2, [ev.Evict(4, 16, [4]), ev.Pin(2, 1), ev.Pin(3, -1), ev.Pin(3, 1),
                        ev.Pin(2, -1), ev.Merge(2, 3, None, keeps_times=True)])
    _check(feeds, {0, 1, 3}, {0, 1, 2, 3})
