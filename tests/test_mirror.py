"""Mirror: rebuilt from a snapshot or from events it equals the tree; it refuses events that
do not fit; its digest notices any difference."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest
from conftest import toks, write_kv

from radixcache.core import events as ev
from radixcache.core.pool import KVPool, KVShape
from radixcache.core.tree import Lease, MatchResult, RadixTree
from radixcache.wire.mirror import Mirror, MirrorError, next_victims

B = 16
A = list(range(1, 101))
FORK = A[:40] + list(range(500, 530))


def serve(tree: RadixTree, seq: Sequence[int]) -> None:
    m = tree.match_and_pin(toks(seq))
    lease = tree.allocate(m, len(seq))
    write_kv(tree.pool, lease.table, m.length, seq)
    tree.insert(toks(seq), lease)
    tree.unpin(m.node)


def busy_tree() -> tuple[RadixTree, Mirror, MatchResult, Lease]:
    """Split, COW, a merge after an eviction, and one request still running (locked, leased)."""
    tree = RadixTree(KVPool(32, B, KVShape(), device="cpu"))
    from_start = Mirror(B, 32)
    from_start.load_snapshot(tree.snapshot())
    serve(tree, list(range(1000, 1016)))
    serve(tree, A)
    serve(tree, FORK)
    serve(tree, [*A[:20], 7, 7])
    tree.evict(1)
    running = tree.match_and_pin(toks([*FORK, 1, 2, 3]))
    lease = tree.allocate(running, 80)
    for e in tree.take_events():
        from_start.apply(e)
    return tree, from_start, running, lease


def shape(m: Mirror) -> list[tuple[int, int, int, bytes, list[int], int, int]]:
    return sorted(
        (n.id, n.parent.id if n.parent else -1, n.start, n.tokens, list(n.blocks), n.pins, n.clock)
        for n in m.nodes.values()
    )


def test_snapshot_mirror_equals_tree_and_event_mirror() -> None:
    tree, from_start, running, lease = busy_tree()
    assert tree.stats.splits == 2 and tree.stats.cow_copies == 2 and tree.stats.merges == 0
    snap = Mirror()
    snap.load_snapshot(tree.snapshot())
    assert snap.digest() == tree.digest() == from_start.digest()
    assert shape(snap) == shape(from_start)
    assert snap.ref == from_start.ref == [tree.alloc.refcount(b) for b in range(32)]
    assert snap.request_blocks == from_start.request_blocks == set(lease.table[lease.private_from:])
    assert (snap.block_size, snap.num_blocks, snap.clock) == (B, 32, from_start.clock)
    want_lru = [n.id for n in tree.lru_order(10)]
    assert [n.id for n, _ in next_victims(snap, 10)] == [
        n.id for n, _ in next_victims(from_start, 10)] == want_lru
    assert snap.node(running.node.id).pins == 1 and snap.root.pins == 1
    # both keep following the stream
    tree.release(lease)
    tree.unpin(running.node)
    serve(tree, [*FORK[:45], 3])
    events = tree.take_events()
    for m in (snap, from_start):
        for e in events:
            m.apply(e)
        assert m.digest() == tree.digest()
        assert m.ref == [tree.alloc.refcount(b) for b in range(32)]


def test_snapshot_through_msgpack_batch() -> None:
    tree, _from_start, _, _ = busy_tree()
    batch = ev.Batch(1, 3, 12.5, "engine-0", [tree.snapshot(), ev.Digest(tree.digest())])
    decoded = ev.decode_batch(ev.encode_batch(batch))
    assert decoded == batch
    m = Mirror(4, 2)  # wrong geometry until the snapshot says otherwise
    m.apply_batch(decoded)
    assert (m.block_size, m.num_blocks) == (B, 32)
    assert m.digest() == tree.digest()
    assert (m.stats.digest_checks, m.stats.digest_mismatches) == (1, 0)
    assert m.stats.events == 2


def test_version_only_grows() -> None:
    """The inspector redraws when ``version`` changes: a snapshot or reset must not rewind it."""
    tree, m, _, _ = busy_tree()
    seen = [m.version]
    for e in (tree.snapshot(), ev.Access(0, 10**6), ev.Reset(), ev.Access(0, 10**6 + 1)):
        m.apply(e)
        seen.append(m.version)
    assert seen == sorted(set(seen)), seen


def test_stats_follow_the_events() -> None:
    tree, from_start, _, _ = busy_tree()
    s = from_start.stats
    assert (s.splits, s.merges, s.cow_copies, s.slots_copied) == (
        tree.stats.splits, tree.stats.merges, tree.stats.cow_copies, tree.stats.slots_copied
    )
    assert (s.evictions, s.evicted_tokens) == (tree.stats.evicted_nodes, tree.stats.evicted_tokens)
    assert (s.evictions, s.evicted_tokens) == (1, 16)
    assert from_start.evicted_blocks == {0}
    m = Mirror(B, 32)
    m.apply(ev.RequestStart(1, 100, 40))
    m.apply(ev.RequestStart(2, 100, 80))
    m.apply(ev.RequestFinish(1, 5, 1.5))
    assert (m.stats.requests, m.stats.finished, m.stats.hit_rate) == (2, 1, 0.6)
    m.apply(ev.Watermark(10, 32, 0.8, 0.6))
    assert (m.high, m.low, m.watermark) == (0.8, 0.6, ev.Watermark(10, 32, 0.8, 0.6))


@pytest.mark.parametrize(
    "event",
    [
        ev.Access(999, 5),
        ev.Pin(999, 1),
        ev.NodeCreated(1000, 999, 0, toks([1]).tobytes(), [5], False),
        ev.Split(999, 3, 1000, [1], [1]),
        ev.Merge(999, 1, None),
        ev.Evict(999, 4, []),
        ev.BlockAlloc([32]),
    ],
    ids=["access", "pin", "create", "split", "merge", "evict", "alloc-out-of-range"],
)
def test_event_that_does_not_fit_raises(event: ev.AnyEvent) -> None:
    _tree, m, _, _ = busy_tree()
    with pytest.raises(MirrorError):
        m.apply(event)


def test_structurally_wrong_events_raise() -> None:
    tree, m, running, _ = busy_tree()
    parent = running.node.parent
    assert parent is not None and parent is not tree.root
    with pytest.raises(MirrorError):
        m.apply(ev.Evict(parent.id, parent.num_tokens, []))  # not a leaf
    with pytest.raises(MirrorError):
        m.apply(ev.Split(running.node.id, 0, 777, [], []))  # offset 0
    with pytest.raises(MirrorError):
        m.apply(ev.Split(running.node.id, running.node.num_tokens, 777, [], []))
    with pytest.raises(MirrorError):
        m.apply(ev.Merge(running.node.id, parent.id, None))  # child/parent swapped
    with pytest.raises(MirrorError, match="digest mismatch"):
        m.apply(ev.Digest("0" * 32))
    assert (m.stats.digest_checks, m.stats.digest_mismatches) == (1, 1)


def test_digest_detects_any_difference() -> None:
    tree, m, running, _ = busy_tree()
    base = tree.digest()
    assert m.digest() == base
    node = m.node(running.node.id)
    for attr, value in (("pins", 7), ("clock", 10**6), ("start", node.start + 1),
                        ("tokens", node.tokens[:-4] + b"\xff\xff\x00\x00"),
                        ("blocks", [*node.blocks[:-1], 31])):
        old = getattr(node, attr)
        setattr(node, attr, value)
        assert m.digest() != base, attr
        setattr(node, attr, old)
        assert m.digest() == base
    m.request_blocks.add(31)
    assert m.digest() != base
    m.request_blocks.discard(31)
    # a missed event leaves the mirror behind
    tree.match(toks(A))
    assert m.digest() == base != tree.digest()
    (access,) = tree.take_events()
    m.apply(access)
    assert m.digest() == tree.digest()


def test_reset_event_empties_the_mirror() -> None:
    tree, m, running, lease = busy_tree()
    tree.release(lease)
    tree.unpin(running.node)
    tree.reset()
    for e in tree.take_events():
        m.apply(e)
    assert m.digest() == tree.digest()
    assert list(m.nodes) == [0] and m.ref == [0] * 32 and m.request_blocks == set()
    assert (m.block_size, m.num_blocks) == (B, 32)


def test_a_schema_2_stream_with_merge_dropped_minus_one_still_reads() -> None:
    """Schema 3 made ``Merge.dropped`` nil for "no boundary block"; streams and recordings of
    schema 2 wrote -1, and must rebuild the same tree."""
    from radixcache.serving.driver import serve_request
    from tests.helpers.stream import prompts

    tree = RadixTree(KVPool(64, 16))
    mirror = Mirror(16, 64)
    mirror.load_snapshot(tree.snapshot())
    merges = 0
    for tokens in prompts(300, seed=0):
        serve_request(tree, tokens)
        events = tree.take_events()
        # the events as schema 2 wrote them
        old = [msgspec.to_builtins(ev.plain(e), builtin_types=(bytes,)) for e in events]
        for e in old:
            if e[0] == "merge" and e[3] is None:
                e[3] = -1  # ["merge", parent, child, -1]
                merges += 1
        raw = msgspec.msgpack.encode({"seq": 1, "epoch": 1, "ts": 0.0, "engine": "schema-2",
                                      "events": old})
        batch = ev.decode_batch(raw)
        assert all(e.dropped is None or e.dropped >= 0 for e in batch.events
                   if isinstance(e, ev.Merge))
        mirror.apply_batch(batch)
    assert merges > 0
    assert mirror.digest() == tree.digest()


def test_a_schema_3_stream_without_the_schema_4_trailing_fields_still_reads() -> None:
    """Schema 4 appended ``Access.end``, ``Merge.keeps_times`` and ``NodeState.older``; a
    schema 3 stream or recording has none of them: they read as nil, false and empty, and a
    merge takes the parent's clock for the whole joined node, as schema 3 engines did."""
    import msgspec

    def t(lo: int, hi: int) -> bytes:
        return toks(list(range(lo, hi))).tobytes()

    snapshot = ["snapshot", B, 8, [[0, -1, 0, b"", [], 0, 1]], 1, 1, [], 0.92, 0.85]
    events = [
        ["create", 1, 0, 0, t(1, 33), [0, 1], False],
        ["create", 2, 1, 32, t(33, 49), [2], False],
        ["access", 2, 5],  # the path root..2 used at 5
        ["access", 1, 7],  # then root..1 at 7: node 2 stays at 5
        ["merge", 1, 2, None],  # schema 3: no keeps_times
    ]
    raw = msgspec.msgpack.encode({"seq": 1, "epoch": 1, "ts": 0.0, "engine": "v3",
                                  "events": [snapshot, *events]})
    batch = ev.decode_batch(raw)
    assert batch.events[3] == ev.Access(2, 5, None)
    assert batch.events[5] == ev.Merge(1, 2, None, keeps_times=False)
    assert isinstance(batch.events[0], ev.Snapshot) and batch.events[0].nodes[0].older == ()
    m = Mirror(B, 8)
    m.apply_batch(batch)
    (node,) = m.root.children.values()
    assert (node.id, node.start, node.end, node.blocks) == (2, 0, 48, [0, 1, 2])
    assert (node.clock, node.older) == (7, ())
    # the same merge from a schema 4 engine keeps node 2's older time for its own tokens
    m4 = Mirror(B, 8)
    m4.apply_batch(ev.Batch(1, 1, 0.0, "v4", [*batch.events[:5],
                                             ev.Merge(1, 2, None, keeps_times=True)]))
    (node,) = m4.root.children.values()
    assert (node.clock, node.older) == (7, ((32, 5),))


def test_every_watcher_sees_every_event_in_order_until_it_unwatches() -> None:
    tree = RadixTree(KVPool(32, B, KVShape(), device="cpu"))
    mirror = Mirror(B, 32)
    first: list[str] = []
    second: list[str] = []

    def one(e: ev.AnyEvent) -> None:
        first.append(type(e).__name__)

    def two(e: ev.AnyEvent) -> None:
        second.append(type(e).__name__)

    mirror.watch(one)
    mirror.watch(two)  # a second watcher joins the first (a single slot replaced it)
    mirror.load_snapshot(tree.snapshot())
    serve(tree, list(range(1000, 1016)))
    events = tree.take_events()
    for e in events:
        mirror.apply(e)
    names = ["Snapshot", *(type(e).__name__ for e in events)]
    assert first == second == names
    mirror.unwatch(one)
    assert (mirror.watching(one), mirror.watching(two)) == (False, True)
    mirror.apply(ev.Reset())
    assert (first[-1], second[-1]) == (names[-1], "Reset")
