"""KVPool and BlockAllocator: exact free-list order, refcount and claim errors, slot copies."""

from __future__ import annotations

from array import array

import pytest
import torch

from radixcache.core.pool import BlockAllocator, BlockStateError, KVPool, KVShape, PoolExhausted


def test_free_list_order_is_exact() -> None:
    a = BlockAllocator(10, 16)
    assert a.alloc(3) == array("i", [0, 1, 2])  # int32 ids: no Python int per block
    assert a.free_blocks() == [3, 4, 5, 6, 7, 8, 9]
    assert a.decref(1) is True
    assert a.decref(0) is True
    assert a.free_blocks() == [3, 4, 5, 6, 7, 8, 9, 1, 0]  # freed go to the back
    assert a.alloc(8).tolist() == [3, 4, 5, 6, 7, 8, 9, 1]
    a.incref(2)
    assert a.decref(2) is False  # still referenced: not freed
    assert a.free_blocks() == [0]
    assert a.decref(2) is True
    assert a.free_blocks() == [0, 2]
    assert (a.free_count, a.used_count, a.used_fraction) == (2, 8, 0.8)


def test_alloc_takes_nothing_when_short() -> None:
    a = BlockAllocator(4, 16)
    a.alloc(3)
    with pytest.raises(PoolExhausted):
        a.alloc(2)
    assert a.free_blocks() == [3]
    assert a.alloc(0).tolist() == []
    assert a.alloc(1).tolist() == [3]
    with pytest.raises(PoolExhausted):
        a.alloc(1)


def test_refcounts_and_errors() -> None:
    a = BlockAllocator(4, 16)
    (b,) = a.alloc(1)
    assert a.refcount(b) == 1
    a.incref(b)
    a.incref(b)
    assert a.refcount(b) == 3 and a.shared() == {b: 2}
    assert a.refcount(3) == 0 and a.free_blocks() == [1, 2, 3]
    assert [a.decref(b) for _ in range(3)] == [False, False, True]
    assert a.free_blocks() == [1, 2, 3, 0] and a.refcount(b) == 0 and a.shared() == {}
    assert a.refcounts() == [0, 0, 0, 0] and a.check() == []
    for bad in (-1, 4):
        with pytest.raises(BlockStateError, match=r"outside 0\.\.3"):
            a.incref(bad)
        with pytest.raises(BlockStateError, match=r"outside 0\.\.3"):
            a.decref(bad)
    assert a.free_blocks() == [1, 2, 3, 0]


def test_a_double_free_is_reported_by_check() -> None:
    """The allocator keeps no per-block state, so a block freed twice is found by ``check()``
    (the tree runs it after every test step) and shows in ``refcounts()`` as -1."""
    a = BlockAllocator(4, 16)
    a.alloc(2)
    assert a.decref(1) is True
    assert a.decref(1) is True  # the bug: freed again
    assert a.refcounts() == [1, -1, 0, 0]
    assert a.check() == ["free list holds a block twice"]


def test_a_free_block_left_shared_or_claimed_is_reported_by_check() -> None:
    a = BlockAllocator(4, 16)
    a.incref(2)  # the bug: a reference on a free block
    a.set_claim(3, 4)
    assert a.check() == ["free blocks [2, 3] still shared or claimed"]
    assert a.refcounts() == [0, 0, 1, 0]


def test_claims() -> None:
    a = BlockAllocator(4, 16)
    (b,) = a.alloc(1)
    assert a.claim(b) == 16  # a fresh block is fully claimed by whoever took it
    a.set_claim(b, 0)
    assert a.claim(b) == 0
    a.set_claim(b, 5)
    assert a.claim(b) == 5
    for bad in (-1, 17):
        with pytest.raises(BlockStateError, match=r"outside 0\.\.16"):
            a.set_claim(b, bad)
    with pytest.raises(BlockStateError, match="block 4 outside"):
        a.set_claim(4, 1)
    assert a.claim(b) == 5 and a.claims() == [5, 0, 0, 0]
    a.decref(b)
    assert a.claims() == [0, 0, 0, 0] and a.check() == []  # freeing clears the claim
    (again,) = a.alloc(4)[-1:]
    assert again == b and a.claim(b) == 16 and a.claims() == [16] * 4


def test_decref_many_frees_in_order() -> None:
    a = BlockAllocator(6, 16)
    a.alloc(6)
    a.incref(2)
    a.incref(1)
    a.incref(1)
    a.set_claim(4, 3)
    a.set_claim(2, 7)
    assert a.decref_many([4, 2, 1, 5]) == [4, 5]
    assert a.free_blocks() == [4, 5] and a.refcounts() == [1, 2, 1, 1, 0, 0]
    assert a.shared() == {1: 1} and a.claims() == [16, 16, 7, 16, 0, 0]
    assert a.decref_many([]) == [] and a.decref_many([2, 1]) == [2]
    assert a.refcounts() == [1, 1, 0, 1, 0, 0] and a.claims() == [16, 16, 0, 16, 0, 0]
    assert a.check() == []


def test_reset_and_bad_sizes() -> None:
    a = BlockAllocator(5, 4)
    a.alloc(4)
    a.set_claim(2, 3)
    a.reset()
    assert a.free_blocks() == [0, 1, 2, 3, 4]
    assert a.refcounts() == [0] * 5 and a.claims() == [0] * 5 and a.shared() == {}
    for n, bs in ((0, 16), (4, 0), (-1, 16)):
        with pytest.raises(ValueError):
            BlockAllocator(n, bs)


def filled_pool() -> KVPool:
    pool = KVPool(6, 4, KVShape(2, 3, 2), device="cpu")
    pool.kv.copy_(torch.arange(pool.kv.numel(), dtype=torch.float32).reshape(pool.kv.shape))
    return pool


def test_pool_shape_and_figures() -> None:
    pool = KVPool(6, 4, KVShape(2, 3, 2, torch.float16), device="cpu")
    assert tuple(pool.kv.shape) == (2, 2, 6, 4, 3, 2) and pool.kv.dtype == torch.float16
    assert (pool.num_blocks, pool.block_size, pool.capacity_tokens) == (6, 4, 24)
    assert pool.bytes_per_block() == 2 * 2 * 4 * 3 * 2 * 2
    assert pool.device == torch.device("cpu")
    assert bool((pool.kv == 0).all())


def test_copy_slots_contents() -> None:
    pool = filled_pool()
    before = pool.kv.clone()
    pool.copy_slots(1, 4, 3)
    want = before.clone()
    want[:, :, 4, :3] = before[:, :, 1, :3]
    assert torch.equal(pool.kv, want)  # slot 3 of block 4 and every other block untouched
    pool.copy_slots(2, 0, 4)
    want[:, :, 0] = before[:, :, 2]
    assert torch.equal(pool.kv, want)
    for bad in (0, 5, -1):
        with pytest.raises(ValueError):
            pool.copy_slots(1, 4, bad)
    assert torch.equal(pool.kv, want)


def test_copy_slots_batch_contents() -> None:
    pool = filled_pool()
    before = pool.kv.clone()
    pool.copy_slots_batch([1, 2, 5], [3, 4, 0], [1, 3, 4])
    want = before.clone()
    want[:, :, 3, :1] = before[:, :, 1, :1]
    want[:, :, 4, :3] = before[:, :, 2, :3]
    want[:, :, 0, :4] = before[:, :, 5, :4]
    assert torch.equal(pool.kv, want)
    pool.copy_slots_batch([], [], [])
    assert torch.equal(pool.kv, want)


def test_copy_slots_batch_equals_single_copies() -> None:
    a, b = filled_pool(), filled_pool()
    plan = [(0, 1, 2), (3, 2, 4), (5, 4, 1)]
    for s, d, n in plan:
        a.copy_slots(s, d, n)
    b.copy_slots_batch([p[0] for p in plan], [p[1] for p in plan], [p[2] for p in plan])
    assert torch.equal(a.kv, b.kv)


def test_release_run_equals_releasing_one_block_at_a_time() -> None:
    """A node's blocks go back at once (only the ends may be shared or partly claimed): same
    freed blocks, refcounts, claims and free-list order as decref of each block."""
    for first_shared, last_shared in ((False, False), (True, False), (False, True), (True, True)):
        run_a, one = BlockAllocator(100, 16), BlockAllocator(100, 16)
        for a in (run_a, one):
            a.alloc(70)
            for b, shared in ((10, first_shared), (59, last_shared)):
                if shared:
                    a.incref(b)
            a.set_claim(10, 7)
            a.set_claim(59, 9)
        run = array("i", range(10, 60))
        freed = run_a.release_run(run)
        freed_one = one.decref_many(run)
        kept_ends = {(10, first_shared), (59, last_shared)}
        want = [b for b in range(10, 60) if (b, True) not in kept_ends]
        assert freed.tolist() == freed_one == want
        assert run_a.refcounts() == one.refcounts()
        assert run_a.claims() == one.claims()
        kept = {10: 7} if first_shared else {}
        kept |= {59: 9} if last_shared else {}
        assert {b: c for b, c in enumerate(run_a.claims()) if b in range(10, 60) and c} == kept
        assert run_a.free_blocks() == one.free_blocks() == [*range(70, 100), *want]
        assert run_a.check() == one.check() == []


def test_release_run_of_one_block_and_of_none() -> None:
    a = BlockAllocator(4, 16)
    a.alloc(2)
    a.incref(1)
    assert a.release_run(array("i", [1])).tolist() == [] and a.refcounts() == [1, 1, 0, 0]
    assert a.release_run(array("i", [1])).tolist() == [1] and a.refcounts() == [1, 0, 0, 0]
    assert a.release_run(array("i")).tolist() == [] and a.free_blocks() == [2, 3, 1]


def test_copy_slots_torch_path_equals_the_numpy_path() -> None:
    """On the CPU a float32 pool copies through a numpy view; bfloat16 (no numpy dtype) and
    GPUs go through torch. Both paths write the same slots."""
    shape32 = KVShape(2, 2, 3, torch.float32)
    shape16 = KVShape(2, 2, 3, torch.bfloat16)
    fast, slow = KVPool(6, 4, shape32, device="cpu"), KVPool(6, 4, shape16, device="cpu")
    assert fast._host is not None and slow._host is None
    values = torch.arange(fast.kv.numel(), dtype=torch.float32).view_as(fast.kv) % 97
    fast.kv.copy_(values)
    slow.kv.copy_(values.to(torch.bfloat16))
    for src, dst, n in ((1, 4, 3), (2, 0, 4), (5, 5, 1)):
        fast.copy_slots(src, dst, n)
        slow.copy_slots(src, dst, n)
    assert torch.equal(fast.kv.to(torch.bfloat16), slow.kv)
    assert torch.equal(fast.kv[:, :, 4, :3], values[:, :, 1, :3])
    assert torch.equal(fast.kv[:, :, 4, 3], values[:, :, 4, 3])
