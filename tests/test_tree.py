"""RadixTree: the design's worked example, in-place continuation, eviction and bad input,
with exact block ids, refcounts, stats, events and K/V contents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import pytest
from conftest import read_kv, toks, write_kv

from radixcache.core import events as ev
from radixcache.core.invariants import InvariantError
from radixcache.core.pool import KVPool, KVShape, PoolExhausted
from radixcache.core.tree import (
    EvictResult,
    InsertResult,
    InvalidTokens,
    Lease,
    MatchResult,
    NotPinned,
    PromptTooLarge,
    RadixNode,
    RadixTree,
    TreeError,
    UnknownNode,
)
from radixcache.wire.mirror import Mirror, next_victims

B = 16


class Served(NamedTuple):
    match: MatchResult
    lease: Lease
    result: InsertResult


def make(num_blocks: int = 32, **kw: float) -> tuple[KVPool, RadixTree, Mirror]:
    pool = KVPool(num_blocks, B, KVShape(2, 1, 2), device="cpu")
    tree = RadixTree(pool, **kw)  # type: ignore[arg-type]
    mirror = Mirror(B, num_blocks)
    mirror.load_snapshot(tree.snapshot())
    return pool, tree, mirror


def serve(tree: RadixTree, seq: Sequence[int], total: int | None = None) -> Served:
    """One request: match_and_pin, allocate, write the uncached K/V, insert, unpin."""
    m = tree.match_and_pin(toks(seq))
    lease = tree.allocate(m, total or len(seq))
    write_kv(tree.pool, lease.table, m.length, seq)
    r = tree.insert(toks(seq), lease)
    tree.unpin(m.node)
    return Served(m, lease, r)


def sync(tree: RadixTree, mirror: Mirror) -> list[ev.AnyEvent]:
    """Feed the tree's new events to the mirror; assert both agree and the invariants hold."""
    events = tree.take_events()
    for e in events:
        mirror.apply(e)
    assert mirror.digest() == tree.digest()
    assert mirror.ref == tree.alloc.refcounts()
    tree.check()
    return events


def cached_kv(tree: RadixTree, seq: Sequence[int]) -> list[int]:
    m = tree.match(toks(seq))
    return read_kv(tree.pool, m.block_table, m.length)[0]


def span(node: RadixNode) -> tuple[int, int, list[int]]:
    return node.start, node.end, list(node.blocks)


def kinds(events: list[ev.AnyEvent], kind: type) -> list[ev.AnyEvent]:
    """The events of one kind, as a subscriber decodes them (block ids as lists)."""
    return [ev.plain(e) for e in events if isinstance(e, kind)]


UNRELATED = list(range(1000, 1016))
A = list(range(1, 101))  # 100 tokens: blocks 1..7 after UNRELATED took block 0
FORK = A[:40] + list(range(500, 530))  # shares 40 tokens, diverges at the 41st


# -- the worked example ------------------------------------------------------------------------
def test_worked_example_split_and_cow() -> None:
    pool, tree, mirror = make(32)
    serve(tree, UNRELATED)
    s = serve(tree, A)
    assert s.lease.table.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert [tree.alloc.claim(b) for b in range(1, 8)] == [16] * 6 + [4]
    sync(tree, mirror)
    a_id = s.result.node.id

    m = tree.match_and_pin(toks(FORK))
    # the match ends inside A: A is split there, and the pin holds just the matched prefix
    assert (m.length, m.block_table.tolist()) == (40, [1, 2, 3])
    assert span(m.node) == (0, 40, [1, 2, 3]) and tree.node(a_id).parent is m.node
    assert (m.node.pins, tree.node(a_id).pins) == (1, 0)
    lease = tree.allocate(m, len(FORK))
    assert lease.table.tolist() == [1, 2, 8, 9, 10]
    assert (lease.private_from, lease.inplace, lease.matched, lease.total) == (2, None, 40, 70)
    # the copy holds block 3's first 8 slots (positions 32..39 = tokens 33..40)
    assert read_kv(pool, [8], 8)[0] == A[32:40]
    assert read_kv(pool, [8], 8)[1] == A[32:40]
    assert tree.stats.cow_copies == 1 and tree.stats.slots_copied == 8
    write_kv(pool, lease.table, 40, FORK)
    assert read_kv(pool, lease.table, 70)[0] == FORK
    r = tree.insert(toks(FORK), lease)
    tree.unpin(m.node)
    events = sync(tree, mirror)

    assert r.new_tokens == 30 and r.freed == 0
    leaf = r.node
    assert leaf is not None and list(leaf.blocks) == [8, 9, 10] and leaf.start == 40
    suffix = tree.node(a_id)
    prefix = suffix.parent
    assert prefix is not None and prefix is leaf.parent
    assert span(prefix) == (0, 40, [1, 2, 3])
    assert span(suffix) == (40, 100, [3, 4, 5, 6, 7])
    assert [tree.alloc.refcount(b) for b in range(11)] == [1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1]
    assert tree.alloc.claim(3) == 16 and tree.alloc.claim(8) == 16 and tree.alloc.claim(10) == 6
    st = tree.stats
    assert (st.splits, st.merges, st.cow_copies, st.slots_copied) == (1, 0, 1, 8)
    assert (st.evicted_nodes, st.evicted_tokens, st.inserted_tokens) == (0, 0, 16 + 100 + 30)
    assert kinds(events, ev.Cow) == [ev.Cow(3, 8, 8)]
    assert kinds(events, ev.BlockAlloc) == [ev.BlockAlloc([8, 9, 10])]
    assert kinds(events, ev.Split) == [ev.Split(a_id, 40, prefix.id, [1, 2, 3], [3, 4, 5, 6, 7])]
    assert kinds(events, ev.NodeCreated) == [
        ev.NodeCreated(leaf.id, prefix.id, 40, toks(FORK[40:]).tobytes(), [8, 9, 10], False)
    ]
    assert len(tree) == 4
    assert cached_kv(tree, A) == A
    assert cached_kv(tree, FORK) == FORK


def test_inplace_continuation_extends_the_leaf_only_it_holds() -> None:
    """A follow-up turn continues, in place, the leaf only it has pinned: the leaf grows and
    keeps its id (one Extend event), where a child would have been merged into it at unpin."""
    pool, tree, mirror = make(32)
    first = serve(tree, list(range(1, 21)))  # [0, 20): blocks [0, 1], block 1 claimed to slot 4
    n0 = first.result.node
    assert n0 is not None and list(n0.blocks) == [0, 1] and tree.alloc.claim(1) == 4
    sync(tree, mirror)

    seq = list(range(1, 31))
    m = tree.match_and_pin(toks(seq))
    assert (m.length, m.node, m.block_table.tolist()) == (20, n0, [0, 1])
    lease = tree.allocate(m, 30)
    assert lease.table.tolist() == [0, 1]
    assert (lease.inplace, lease.prev_claim, lease.private_from) == (1, 4, 2)
    assert tree.alloc.claim(1) == 14 and tree.alloc.refcount(1) == 1
    write_kv(pool, lease.table, 20, seq)
    r = tree.insert(toks(seq), lease)
    events = sync(tree, mirror)
    assert r == (n0, 10, 0) and span(n0) == (0, 30, [0, 1]) and len(tree) == 1
    assert kinds(events, ev.Extend) == [ev.Extend(n0.id, toks(seq[20:]).tobytes(), [])]
    assert kinds(events, ev.NodeCreated) == kinds(events, ev.BlockAlloc) == []
    assert tree.alloc.refcount(1) == 1 and tree.alloc.claim(1) == 14
    assert tree.stats.extends == 1 and mirror.stats.extends == 1

    tree.unpin(m.node)
    events = sync(tree, mirror)
    assert kinds(events, ev.Merge) == [] and n0.alive and n0.path_pins == 0
    assert tree.stats.merges == 0 and tree.stats.cow_copies == 0 and tree.stats.slots_copied == 0
    assert cached_kv(tree, seq) == seq


def test_block_aligned_continuation_extends_with_the_new_blocks() -> None:
    _, tree, mirror = make(32)
    n0 = serve(tree, list(range(1, 17))).result.node  # exactly block 0
    assert n0 is not None and tree.alloc.claim(0) == 16
    sync(tree, mirror)
    seq = list(range(1, 41))
    s = serve(tree, seq)  # pins n0, allocates blocks 1 and 2, inserts, unpins
    events = sync(tree, mirror)
    assert s.result == (n0, 24, 0) and span(n0) == (0, 40, [0, 1, 2])
    assert kinds(events, ev.Extend) == [ev.Extend(n0.id, toks(seq[16:]).tobytes(), [1, 2])]
    assert kinds(events, ev.BlockAlloc) == [ev.BlockAlloc([1, 2])]
    assert tree.alloc.refcounts()[:4] == [1, 1, 1, 0] and tree.alloc.claim(2) == 8
    assert cached_kv(tree, seq) == seq


def test_a_leaf_pinned_by_two_requests_gets_a_child_then_merges() -> None:
    """With a second pin on the leaf, the continuation becomes a child (the other request
    may still continue the leaf itself); the unpins then compress the chain."""
    _, tree, mirror = make(32)
    n0 = serve(tree, list(range(1, 21))).result.node
    assert n0 is not None
    other = tree.match_and_pin(toks(list(range(1, 21))))
    assert other.node is n0 and n0.path_pins == 1  # serve below takes a second pin
    seq = list(range(1, 31))
    s = serve(tree, seq)  # match, pin, allocate, insert, unpin
    leaf = s.result.node
    assert leaf is not None and leaf.parent is n0 and list(leaf.blocks) == [1]
    assert tree.alloc.refcount(1) == 2 and tree.stats.extends == 0
    tree.unpin(other.node)  # n0 and the leaf now hold the same path pins: path compression
    events = sync(tree, mirror)
    assert kinds(events, ev.Merge) == [ev.Merge(n0.id, leaf.id, 1, keeps_times=True)]
    assert len(tree) == 1 and not n0.alive
    assert span(leaf) == (0, 30, [0, 1])
    assert tree.alloc.refcount(1) == 1 and tree.alloc.claim(1) == 14
    assert cached_kv(tree, seq) == seq


def test_second_continuation_of_same_node_copies() -> None:
    """Two running requests continue the same node: the first in place, the second copies."""
    pool, tree, mirror = make(32)
    serve(tree, list(range(1, 21)))
    x, y = [*range(1, 21), 50, 51, 52], [*range(1, 21), 60, 61]
    mx, my = tree.match_and_pin(toks(x)), tree.match_and_pin(toks(y))
    lx, ly = tree.allocate(mx, 23), tree.allocate(my, 22)
    assert (lx.table.tolist(), lx.inplace) == ([0, 1], 1)
    assert (ly.table.tolist(), ly.inplace) == ([0, 2], None)
    assert tree.stats.cow_copies == 1 and tree.stats.slots_copied == 4
    assert read_kv(pool, [2], 4)[0] == list(range(17, 21))
    write_kv(pool, lx.table, 20, x)
    write_kv(pool, ly.table, 20, y)
    assert read_kv(pool, lx.table, 23)[0] == x and read_kv(pool, ly.table, 22)[0] == y
    tree.insert(toks(y), ly)
    tree.insert(toks(x), lx)
    tree.unpin(mx.node)
    tree.unpin(my.node)
    sync(tree, mirror)
    assert cached_kv(tree, x) == x and cached_kv(tree, y) == y
    assert tree.alloc.refcount(1) == 2 and tree.alloc.claim(1) == 7 and tree.alloc.claim(2) == 6


def test_release_restores_inplace_claim_and_frees_private_blocks() -> None:
    _pool, tree, mirror = make(32)
    serve(tree, list(range(1, 21)))
    sync(tree, mirror)
    digest = tree.digest()
    seq = list(range(1, 61))
    m = tree.match_and_pin(toks(seq))
    lease = tree.allocate(m, 60)
    assert (lease.table.tolist(), lease.inplace) == ([0, 1, 2, 3], 1)
    assert tree.alloc.claim(1) == 16 and tree.alloc.free_count == 28
    tree.release(lease)
    tree.release(lease)  # a second release is a no-op
    tree.unpin(m.node)
    events = sync(tree, mirror)
    assert kinds(events, ev.BlockFree) == [ev.BlockFree([2, 3])]
    assert tree.alloc.claim(1) == 4 and tree.alloc.free_count == 30
    assert tree.alloc.free_blocks()[-2:] == [2, 3]
    assert len(tree) == 1 and tree.digest() != digest  # only the access clock moved
    with pytest.raises(TreeError, match="consumed"):
        tree.insert(toks(seq), lease)


def test_insert_of_already_cached_sequence_frees_duplicates() -> None:
    pool, tree, mirror = make(32)
    seq = list(range(1, 41))
    m1, m2 = tree.match_and_pin(toks(seq)), tree.match_and_pin(toks(seq))
    l1, l2 = tree.allocate(m1, 40), tree.allocate(m2, 40)
    assert (l1.table.tolist(), l2.table.tolist()) == ([0, 1, 2], [3, 4, 5])
    write_kv(pool, l1.table, 0, seq)
    write_kv(pool, l2.table, 0, seq)
    assert tree.insert(toks(seq), l1).new_tokens == 40
    r2 = tree.insert(toks(seq), l2)
    assert (r2.node, r2.new_tokens, r2.freed) == (None, 0, 3)
    tree.unpin(m1.node)
    tree.unpin(m2.node)
    sync(tree, mirror)
    assert tree.alloc.free_blocks()[-3:] == [3, 4, 5] and tree.alloc.used_count == 3
    assert cached_kv(tree, seq) == seq


# -- eviction ----------------------------------------------------------------------------------
def one_block(i: int) -> list[int]:
    return [100 * (i + 1) + k for k in range(B)]


def test_eviction_order_is_last_access() -> None:
    _, tree, mirror = make(32)
    ids = [serve(tree, one_block(i)).result.node.id for i in range(5)]  # type: ignore[union-attr]
    tree.match(toks(one_block(2)))
    tree.match(toks(one_block(0)[:3]))  # a partial match also counts as use
    tree.match(toks(one_block(3)))
    sync(tree, mirror)
    want = [ids[1], ids[4], ids[2], ids[0], ids[3]]
    assert [n.id for n in tree.lru_order(10)] == want
    assert [n.id for n, _ in next_victims(mirror, 10)] == want
    res = tree.evict(5 * B)
    events = sync(tree, mirror)
    assert res == EvictResult(5, 5 * B, 5)
    assert [e.node for e in kinds(events, ev.Evict)] == want
    assert len(tree) == 0 and tree.alloc.free_count == 32
    assert tree.stats.evicted_nodes == 5 and tree.stats.evicted_tokens == 80


def test_evict_on_demand_frees_the_lru_leafs_tail_blocks_first() -> None:
    """Per-block tail eviction: the LRU leaf gives up its last blocks, as few as needed, and
    stays cached with the rest; it goes whole once all of it is wanted."""
    _, tree, mirror = make(32)
    x = serve(tree, list(range(1, 41))).result.node  # [0, 40): blocks 0 1 2 (2 holds 8)
    y = serve(tree, list(range(200, 220))).result.node  # blocks 3 4
    z = serve(tree, list(range(300, 316))).result.node  # block 5
    assert x is not None and y is not None and z is not None
    sync(tree, mirror)
    assert tree.evict(0) == EvictResult(0, 0, 0)
    assert tree.evict(1) == EvictResult(0, 8, 1)  # one block: x's last, its 8 tokens
    events = sync(tree, mirror)
    assert kinds(events, ev.Evict) == [ev.Evict(x.id, 8, [2])]
    assert x.alive and span(x) == (0, 32, [0, 1]) and tree.alloc.claim(1) == 16
    assert [n.id for n in tree.lru_order(3)] == [x.id, y.id, z.id]  # x keeps its access time
    assert tree.evict(17) == EvictResult(1, 32, 2)  # two blocks: the rest of x, whole
    assert tree.evict(10_000) == EvictResult(2, 36, 3, exhausted=True)
    assert tree.evict(10_000) == EvictResult(0, 0, 0, exhausted=True)
    with pytest.raises(ValueError):
        tree.evict(-1)
    events = sync(tree, mirror)
    assert kinds(events, ev.Evict) == [ev.Evict(x.id, 32, [0, 1]), ev.Evict(y.id, 20, [3, 4]),
                                       ev.Evict(z.id, 16, [5])]
    assert tree.alloc.free_blocks() == [*range(6, 32), 2, 0, 1, 3, 4, 5]


def test_tail_eviction_never_frees_the_boundary_block_shared_with_the_parent() -> None:
    """A leaf that continues in its parent's last block holds that block too: cutting the
    leaf's tail frees its own blocks only, and the last cut gives the shared one back to the
    parent (its claim falls back to where the parent ends)."""
    _, tree, mirror = make(32)
    n0 = serve(tree, list(range(1, 21))).result.node  # [0, 20): blocks 0 1, claim(1) = 4
    assert n0 is not None
    other = tree.match_and_pin(toks(list(range(1, 21))))  # a second pin: the next is a child
    leaf = serve(tree, list(range(1, 61))).result.node
    assert leaf is not None and leaf.parent is n0 and span(leaf) == (20, 60, [1, 2, 3])
    assert tree.alloc.refcount(1) == 2 and tree.alloc.claim(3) == 12
    sync(tree, mirror)
    assert tree.evict(1) == EvictResult(0, 12, 1)  # block 3: positions 48..59
    assert span(leaf) == (20, 48, [1, 2])
    assert tree.evict(1) == EvictResult(1, 28, 1)  # block 2 freed; block 1 stays n0's
    events = sync(tree, mirror)
    assert kinds(events, ev.Evict) == [ev.Evict(leaf.id, 12, [3]), ev.Evict(leaf.id, 28, [2])]
    assert not leaf.alive and not n0.children
    assert tree.alloc.refcount(1) == 1 and tree.alloc.claim(1) == 4
    assert tree.evict(1) == EvictResult(0, 0, 0, exhausted=True)  # n0 is pinned
    tree.unpin(other.node)
    sync(tree, mirror)


def test_watermark_band() -> None:
    _, tree, mirror = make(16, high=0.5, low=0.25)
    for i in range(8):
        serve(tree, one_block(i))
    assert tree.alloc.used_count == 8 and tree.stats.evicted_nodes == 0  # at high, not past it
    sync(tree, mirror)
    serve(tree, one_block(8))  # would cross high: evict down to low, then take one block
    events = sync(tree, mirror)
    assert tree.alloc.used_count == 4 == round(0.25 * 16)
    assert tree.stats.evicted_nodes == 5
    assert [e.node for e in kinds(events, ev.Evict)] == [1, 2, 3, 4, 5]
    assert sorted(n.id for n in tree.lru_order(10)) == [6, 7, 8, 9]
    tree.set_watermarks(1.0, 1.0)
    for i in range(9, 21):
        serve(tree, one_block(i))
    assert tree.alloc.used_count == 16 and tree.stats.evicted_nodes == 5
    serve(tree, one_block(21))
    assert tree.alloc.used_count == 16 and tree.stats.evicted_nodes == 6
    with pytest.raises(ValueError):
        tree.set_watermarks(0.5, 0.6)
    with pytest.raises(ValueError):
        tree.set_watermarks(1.1, 0.5)
    sync(tree, mirror)


def test_pinned_paths_never_evicted_and_pool_exhausted() -> None:
    pool, tree, mirror = make(8)
    seqs = [list(range(10 * i + 1, 10 * i + 33)) for i in range(4)]  # 4 x 2 blocks fill the pool
    held = []
    for s in seqs:
        m = tree.match_and_pin(toks(s))
        lease = tree.allocate(m, 32)
        write_kv(pool, lease.table, 0, s)
        tree.insert(toks(s), lease)
        held.append(tree.match_and_pin(toks(s)))  # keep a lock on the cached path
        tree.unpin(m.node)
    sync(tree, mirror)
    assert tree.alloc.free_count == 0
    m = tree.match_and_pin(toks([7, 7, 7]))
    sync(tree, mirror)
    digest = tree.digest()
    with pytest.raises(PoolExhausted):
        tree.allocate(m, 3)
    assert tree.evict(10_000) == EvictResult(0, 0, 0, exhausted=True)
    unchanged(tree, mirror, digest)
    tree.unpin(m.node)
    tree.unpin(held[1].node)  # now exactly one leaf (seqs[1], blocks 2 and 3) is evictable
    sync(tree, mirror)
    s = serve(tree, [7, 7, 7])
    assert s.lease.table.tolist() == [2] and tree.alloc.free_blocks() == [3]
    assert tree.stats.evicted_nodes == 1
    for i in (0, 2, 3):
        assert cached_kv(tree, seqs[i]) == seqs[i]
        tree.unpin(held[i].node)
    sync(tree, mirror)


def test_merge_after_eviction_drops_boundary_reference() -> None:
    _pool, tree, mirror = make(32)
    serve(tree, UNRELATED)
    a = serve(tree, A).result.node
    f = serve(tree, FORK).result.node
    assert a is not None and f is not None
    prefix = f.parent
    assert prefix is not None
    sync(tree, mirror)
    assert tree.alloc.refcount(3) == 2
    res = tree.evict(1)  # UNRELATED is least recently used: its one block goes
    assert res == EvictResult(1, 16, 1)
    sync(tree, mirror)
    free_before = tree.alloc.free_count
    # FORK's match used A up to 40, so block 3 (shared with the prefix) too: the suffix's
    # least recent part is [48, 100), blocks 4-7; then [40, 48) goes, and the merge frees 3
    assert tree.evict(4 * B) == EvictResult(0, 52, 4)
    res = tree.evict(1)
    events = sync(tree, mirror)
    assert res == EvictResult(1, 8, 1)
    assert kinds(events, ev.Evict) == [ev.Evict(a.id, 52, [4, 5, 6, 7]), ev.Evict(a.id, 8, [])]
    assert kinds(events, ev.Merge) == [ev.Merge(prefix.id, f.id, 3, keeps_times=True)]
    assert not prefix.alive and f.parent is tree.root
    assert span(f) == (0, 70, [1, 2, 8, 9, 10])
    assert tree.alloc.refcount(3) == 0 and 3 in tree.alloc.free_blocks()
    assert [tree.alloc.refcount(b) for b in (1, 2, 8, 9, 10)] == [1] * 5
    assert tree.stats.merges == 1
    assert cached_kv(tree, FORK) == FORK
    assert tree.alloc.free_count - free_before == 5  # 4 by the eviction, block 3 by the merge


def test_merge_after_eviction_counts_dropped_block_in_result() -> None:
    _, tree, _ = make(32)
    serve(tree, UNRELATED)
    serve(tree, A)
    serve(tree, FORK)
    tree.evict(1)
    free_before = tree.alloc.free_count
    res = tree.evict(1)
    assert res.blocks == tree.alloc.free_count - free_before


def test_split_inside_block_then_evict_prefix_sibling_keeps_claims() -> None:
    """Evicting the shorter fork leaves the split pair mergeable; claims stay exact."""
    _pool, tree, mirror = make(32)
    a = list(range(1, 51))
    b = [*a[:37], 900, 901, 902]
    serve(tree, a)
    serve(tree, b)
    sync(tree, mirror)
    tree.match(toks(a))  # b's leaf is now the LRU
    res = tree.evict(1)
    sync(tree, mirror)
    assert res.nodes == 1 and res.tokens == 3
    assert len(tree) == 1 and tree.stats.merges == 1
    (node,) = tree.root.children.values()
    assert span(node) == (0, 50, [0, 1, 2, 3])
    assert [tree.alloc.claim(x) for x in node.blocks] == [16, 16, 16, 2]
    assert tree.alloc.refcount(2) == 1
    assert cached_kv(tree, a) == a


# -- bad input ---------------------------------------------------------------------------------
@pytest.fixture
def busy() -> tuple[RadixTree, Mirror]:
    """A tree with a split and a COW copy (so nothing is trivial), vocabulary 5000."""
    _, tree, mirror = make(32, vocab_limit=5000)  # type: ignore[arg-type]
    serve(tree, UNRELATED)
    serve(tree, A)
    serve(tree, FORK)
    sync(tree, mirror)
    return tree, mirror


def unchanged(tree: RadixTree, mirror: Mirror, digest: str) -> None:
    assert tree.digest() == digest
    assert tree.take_events() == []
    assert mirror.digest() == digest
    tree.check()


@pytest.mark.parametrize(
    "bad",
    [[], b"", b"\x01\x00\x00", [-1], [5000], [1, 2, 5000], [2**32], [[1, 2]], [1.5, 2.0]],
    ids=["empty", "empty-bytes", "ragged-bytes", "negative", "vocab", "vocab-last", "u32-overflow",
         "2d", "float"],
)
def test_invalid_tokens(busy: tuple[RadixTree, Mirror], bad: object) -> None:
    tree, mirror = busy
    digest = tree.digest()
    with pytest.raises(InvalidTokens):
        tree.match(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidTokens):
        tree.match_and_pin(bad)  # type: ignore[arg-type]
    m = tree.match_and_pin(toks([1]))
    lease = tree.allocate(m, 4)
    digest = tree.digest()
    tree.take_events()
    mirror.load_snapshot(tree.snapshot())
    with pytest.raises(InvalidTokens):
        tree.insert(bad, lease)  # type: ignore[arg-type]
    unchanged(tree, mirror, digest)
    tree.release(lease)
    tree.unpin(m.node)
    sync(tree, mirror)


def test_default_vocab_is_uint32() -> None:
    _, tree, mirror = make(8)
    digest = tree.digest()
    for bad in ([-1], [2**32], [0, 2**40], toks([]), b""):
        with pytest.raises(InvalidTokens):
            tree.match(bad)  # type: ignore[arg-type]
    unchanged(tree, mirror, digest)
    top = [0, 2**32 - 1, 2**31]
    s = serve(tree, top)
    assert s.result.new_tokens == 3
    assert tree.match(toks(top).astype("<u4").tobytes()).length == 3
    assert tree.match(top).length == 3


def test_bytes_and_list_tokens_are_equivalent(busy: tuple[RadixTree, Mirror]) -> None:
    tree, _ = busy
    as_bytes = toks(FORK).tobytes()
    assert tree.match(as_bytes).length == tree.match(FORK).length == tree.match(toks(FORK)).length
    assert tree.match(as_bytes).length == 70


def test_prompt_too_large(busy: tuple[RadixTree, Mirror]) -> None:
    tree, mirror = busy
    m = tree.match_and_pin(toks(A))
    digest = tree.digest()
    tree.take_events()
    mirror.load_snapshot(tree.snapshot())
    with pytest.raises(PromptTooLarge):
        tree.allocate(m, 32 * B + 1)
    unchanged(tree, mirror, digest)
    with pytest.raises(InvalidTokens):
        tree.allocate(m, 99)  # fewer than the matched 100
    with pytest.raises(InvalidTokens):
        tree.allocate(m, 0)
    unchanged(tree, mirror, digest)
    lease = tree.allocate(m, 32 * B)  # exactly the whole pool fits (after evicting)
    assert len(lease.table) == 32
    tree.release(lease)
    tree.unpin(m.node)
    sync(tree, mirror)


def test_insert_longer_than_lease(busy: tuple[RadixTree, Mirror]) -> None:
    tree, mirror = busy
    seq = list(range(2000, 2020))
    m = tree.match_and_pin(toks(seq))
    lease = tree.allocate(m, 19)
    digest = tree.digest()
    tree.take_events()
    mirror.load_snapshot(tree.snapshot())
    with pytest.raises(InvalidTokens):
        tree.insert(toks(seq), lease)
    unchanged(tree, mirror, digest)
    assert not lease.done
    tree.release(lease)
    tree.unpin(m.node)
    sync(tree, mirror)


def test_unpin_errors(busy: tuple[RadixTree, Mirror]) -> None:
    tree, mirror = busy
    node = tree.match(toks(A)).node
    digest = tree.digest()
    tree.take_events()
    mirror.load_snapshot(tree.snapshot())
    with pytest.raises(NotPinned):
        tree.unpin(node)
    with pytest.raises(NotPinned):
        tree.unpin(tree.root)
    unchanged(tree, mirror, digest)
    with pytest.raises(UnknownNode):
        tree.node(12345)
    gone = tree.lru_order(1)[0]
    tree.evict(1)
    assert not gone.alive
    sync(tree, mirror)
    digest = tree.digest()
    with pytest.raises(UnknownNode):
        tree.unpin(gone)
    with pytest.raises(UnknownNode):
        tree.pin(gone)
    with pytest.raises(UnknownNode):
        tree.node(gone.id)
    other = RadixTree(KVPool(4, B, KVShape(), device="cpu"))
    stranger = serve(other, [1, 2, 3]).result.node
    assert stranger is not None
    with pytest.raises(UnknownNode):
        tree.unpin(stranger)
    unchanged(tree, mirror, digest)


def test_insert_with_consumed_lease(busy: tuple[RadixTree, Mirror]) -> None:
    tree, mirror = busy
    seq = list(range(3000, 3010))
    m = tree.match_and_pin(toks(seq))
    lease = tree.allocate(m, 10)
    write_kv(tree.pool, lease.table, 0, seq)
    tree.insert(toks(seq), lease)
    tree.unpin(m.node)
    sync(tree, mirror)
    digest = tree.digest()
    with pytest.raises(TreeError) as info:
        tree.insert(toks(seq), lease)
    assert type(info.value) is TreeError
    unchanged(tree, mirror, digest)


def test_reset_refused_while_pinned_then_empties(busy: tuple[RadixTree, Mirror]) -> None:
    tree, mirror = busy
    m = tree.match_and_pin(toks(A))
    digest = tree.digest()
    tree.take_events()
    mirror.load_snapshot(tree.snapshot())
    with pytest.raises(TreeError):
        tree.reset()
    unchanged(tree, mirror, digest)
    tree.unpin(m.node)
    tree.reset()
    events = sync(tree, mirror)
    assert events[-1] == ev.Reset()
    assert len(tree) == 0 and tree.alloc.free_count == 32
    assert tree.alloc.free_blocks() == list(range(32))


def test_check_detects_a_corrupted_refcount(busy: tuple[RadixTree, Mirror]) -> None:
    tree, _ = busy
    tree.alloc.incref(3)  # a reference nobody holds
    with pytest.raises(InvariantError, match="block 3: refcount 3 but 2 references"):
        tree.check()
    tree.alloc.decref(3)
    tree.check()


@pytest.mark.parametrize("n", [1, 20, 32])
def test_fully_cached_request_with_nothing_to_write(n: int) -> None:
    """total == matched (ends inside a block or on a boundary): no block taken, none freed."""
    _pool, tree, mirror = make(8)
    seq = list(range(1, n + 1))
    serve(tree, seq)
    sync(tree, mirror)
    refs = [tree.alloc.refcount(b) for b in range(8)]
    m = tree.match_and_pin(toks(seq))
    lease = tree.allocate(m, n)
    assert lease.table.tolist() == m.block_table.tolist() == list(range((n + B - 1) // B))
    assert tree.alloc.free_count == 8 - len(lease.table)
    r = tree.insert(toks(seq), lease)
    tree.unpin(m.node)
    sync(tree, mirror)
    assert (r.node, r.new_tokens, r.freed) == (None, 0, 0)
    assert [tree.alloc.refcount(b) for b in range(8)] == refs
    assert cached_kv(tree, seq) == seq


def test_insert_after_a_racing_fork_copies_out_of_the_inplace_block() -> None:
    """R1 reserves X's block in place; R2 (COW) forks from R1's tokens and inserts first; R1's
    insert lands inside R2's leaf, so R1's boundary block is copied out of its in-place block."""
    pool, tree, mirror = make(32)
    x = list(range(1, 11))
    serve(tree, x)  # X [0, 10): block 0, claim 10
    r1 = [*x, *range(20, 40)]
    r2 = [*x, *range(20, 25), 90, 91, 92]
    m1 = tree.match_and_pin(toks(r1))
    l1 = tree.allocate(m1, 30)
    assert (l1.table.tolist(), l1.inplace) == ([0, 1], 0)
    write_kv(pool, l1.table, 10, r1)
    m2 = tree.match_and_pin(toks(r2))
    l2 = tree.allocate(m2, 18)
    # block 0 is reserved by R1: copy 10 slots
    assert (l2.table.tolist(), l2.inplace) == ([2, 3], None)
    write_kv(pool, l2.table, 10, r2)
    leaf2 = tree.insert(toks(r2), l2).node
    tree.unpin(m2.node)
    leaf1 = tree.insert(toks(r1), l1).node
    sync(tree, mirror)
    assert leaf1 is not None and leaf2 is not None
    assert list(leaf1.blocks) == [4, 1] and (leaf1.start, leaf1.end) == (15, 30)
    assert read_kv(pool, [4], 16)[0] == r1[:16]  # block 0 copied whole: X and R1's 6 tokens
    assert tree.stats.cow_copies == 2 and tree.stats.slots_copied == 10 + 16
    assert tree.alloc.claim(0) == 10  # R1's in-place reservation given back
    tree.unpin(m1.node)  # X merges into the split prefix; X's block 0 is dropped and freed
    events = sync(tree, mirror)
    assert len(kinds(events, ev.Merge)) == 1
    (top,) = tree.root.children.values()
    assert span(top) == (0, 15, [2])
    assert sorted(c.id for c in top.children.values()) == sorted([leaf1.id, leaf2.id])
    assert list(leaf2.blocks) == [2, 3] and (leaf2.start, leaf2.end) == (15, 18)
    assert [tree.alloc.refcount(b) for b in range(5)] == [0, 1, 2, 1, 1]
    for seq in (x, r1, r2):
        assert cached_kv(tree, seq) == seq


def test_evicting_an_inplace_leaf_gives_the_slots_back() -> None:
    pool, tree, mirror = make(32)
    x = list(range(1, 21))
    y, z = [*x, *range(30, 40)], [*x, *range(50, 55)]
    serve(tree, x)  # blocks [0, 1], block 1 claimed to slot 4
    my, mz = tree.match_and_pin(toks(y)), tree.match_and_pin(toks(z))
    ly, lz = tree.allocate(my, 30), tree.allocate(mz, 25)
    assert (ly.table.tolist(), ly.inplace, lz.table.tolist(), lz.inplace) == (
        [0, 1], 1, [0, 2], None)
    write_kv(pool, ly.table, 20, y)
    write_kv(pool, lz.table, 20, z)
    ny, nz = tree.insert(toks(y), ly).node, tree.insert(toks(z), lz).node
    tree.unpin(my.node)
    tree.unpin(mz.node)
    assert ny is not None and nz is not None and list(ny.blocks) == [1] and list(nz.blocks) == [2]
    assert tree.alloc.refcount(1) == 2 and tree.alloc.claim(1) == 14
    sync(tree, mirror)
    tree.match(toks(z))  # y becomes the LRU leaf
    x_id = nz.parent.id  # type: ignore[union-attr]
    # evicting y frees nothing itself, but x is left with one child and merges into z,
    # dropping x's boundary block 1: that one block satisfies the request, z stays cached
    assert tree.evict(1) == EvictResult(1, 10, 1)
    events = sync(tree, mirror)
    assert kinds(events, ev.Evict) == [ev.Evict(ny.id, 10, [])]
    assert kinds(events, ev.Merge) == [ev.Merge(x_id, nz.id, 1, keeps_times=True)]
    assert span(nz) == (0, 25, [0, 2])
    assert tree.alloc.refcount(1) == 0 and tree.alloc.claims()[1] == 0
    assert cached_kv(tree, z) == z


def test_pool_exhausted_reserves_nothing_but_may_evict_victims() -> None:
    """allocate's contract: on PoolExhausted no block is reserved; unpinned leaves evicted on
    the way stay evicted (they were the next victims); pinned paths are untouched."""
    _, tree, mirror = make(8)
    seqs = [list(range(100 * i + 1, 100 * i + 33)) for i in range(3)]
    held = []
    for s in seqs:
        serve(tree, s)
        held.append(tree.match_and_pin(toks(s)))
    serve(tree, [7] * 16)  # the only unpinned leaf (1 block); 7 of 8 blocks used
    m = tree.match_and_pin(toks([9] * 48))
    sync(tree, mirror)
    with pytest.raises(PoolExhausted):
        tree.allocate(m, 48)  # needs 3 blocks: 1 free + 1 evictable is not enough
    events = sync(tree, mirror)
    assert [type(e) for e in events] == [ev.Evict]
    assert tree.alloc.free_count == 2 and tree.snapshot().request_blocks == []
    assert tree.match(toks([7] * 16)).length == 0
    for s in seqs:
        assert cached_kv(tree, s) == s
    tree.unpin(m.node)
    for h in held:
        tree.unpin(h.node)
    sync(tree, mirror)


def test_fork_on_a_block_boundary_shares_no_block() -> None:
    _, tree, mirror = make(32)
    a = serve(tree, A).result.node  # blocks 0..6
    fork = [*A[:32], 700, 701]
    s = serve(tree, fork)
    events = sync(tree, mirror)
    assert a is not None and s.result.node is not None
    assert (s.match.length, s.match.block_table.tolist()) == (32, [0, 1])
    assert s.lease.table.tolist() == [0, 1, 7]
    assert (s.lease.private_from, s.lease.inplace) == (2, None)
    prefix = a.parent
    assert prefix is not None and list(prefix.blocks) == [0, 1]
    assert list(a.blocks) == [2, 3, 4, 5, 6]
    assert kinds(events, ev.Split) == [ev.Split(a.id, 32, prefix.id, [0, 1], [2, 3, 4, 5, 6])]
    assert list(s.result.node.blocks) == [7] and kinds(events, ev.Cow) == []
    assert [tree.alloc.refcount(b) for b in range(8)] == [1] * 8
    assert (tree.stats.splits, tree.stats.cow_copies) == (1, 0)
    assert cached_kv(tree, A) == A and cached_kv(tree, fork) == fork


def test_divergence_at_the_first_token_is_a_new_root_child() -> None:
    _, tree, mirror = make(32)
    serve(tree, [5, 6, 7])
    s = serve(tree, [6, 6, 7])
    sync(tree, mirror)
    assert s.match.length == 0 and s.match.node is tree.root
    assert sorted(tree.root.children) == [5, 6] and tree.stats.splits == 0
    assert s.lease.table.tolist() == [1] and tree.alloc.claim(1) == 3


def test_racing_fork_insert_on_a_full_pool_is_not_silently_dropped() -> None:
    """As the racing-fork case, but the pool is full when R1 inserts: R1 needs one block for
    its boundary copy. An evictable leaf exists, so R1's sequence must end up cached
    (``InsertResult.node is None`` is documented to mean "already cached")."""
    pool, tree, mirror = make(5, high=1.0, low=1.0)
    x = list(range(1, 11))
    serve(tree, x)
    r1 = [*x, *range(20, 40)]
    r2 = [*x, *range(20, 25), 90, 91, 92]
    m1 = tree.match_and_pin(toks(r1))
    l1 = tree.allocate(m1, 30)
    write_kv(pool, l1.table, 10, r1)
    m2 = tree.match_and_pin(toks(r2))
    l2 = tree.allocate(m2, 18)
    write_kv(pool, l2.table, 10, r2)
    tree.insert(toks(r2), l2)
    tree.unpin(m2.node)
    serve(tree, list(range(500, 516)))  # the last free block: the pool is full
    assert tree.alloc.free_count == 0
    r = tree.insert(toks(r1), l1)
    tree.unpin(m1.node)
    sync(tree, mirror)
    assert tree.match(toks(r1)).length == 30, r
    assert cached_kv(tree, r1) == r1


@pytest.mark.parametrize("tail", [[900, 901, 902], list(range(900, 920))], ids=["short", "long"])
def test_insert_after_the_matched_node_was_split_past_the_match(tail: list[int]) -> None:
    """R1 matches 20 tokens inside node N [0, 50); before R1 inserts, R2 splits N at 30, so
    R1's pinned node (the suffix keeps its id) now starts at 30, after R1's match. R1's insert
    must still cache exactly R1's tokens, and nothing else."""
    pool, tree, mirror = make(32)
    serve(tree, list(range(1, 51)))
    r1 = [*range(1, 21), *tail]
    m1 = tree.match_and_pin(toks(r1))
    l1 = tree.allocate(m1, len(r1))
    write_kv(pool, l1.table, 20, r1)
    serve(tree, [*range(1, 31), 800, 801])  # splits N at 30
    r = tree.insert(toks(r1), l1)
    tree.unpin(m1.node)
    sync(tree, mirror)
    assert r.new_tokens == len(tail)
    assert cached_kv(tree, r1) == r1
    phantom = [*range(1, 31), *tail[10:]]  # P's 30 tokens followed by R1's tail: never inserted
    assert tree.match(toks(phantom)).length == 30
