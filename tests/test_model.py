"""The paged transformer: K/V written and read through block tables match a dense recompute.

Tolerance: float32 on CPU, ``rtol = atol = 1e-5`` on logits of standard deviation ~1
(the paged and dense paths differ only in the order of float reductions).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.core.pool import KVPool
from radixcache.serving.model import (
    ModelConfig,
    SeqInput,
    TinyTransformer,
    prefill_and_decode,
)

TOL = {"rtol": 1e-5, "atol": 1e-5}
B = 16


@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer(ModelConfig(), device="cpu")


def new_pool(model: TinyTransformer, num_blocks: int = 16) -> KVPool:
    return KVPool(num_blocks, B, model.config.kv_shape(), device="cpu")


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 100_014, n).tolist()


def test_kv_shape_matches_the_config() -> None:
    cfg = ModelConfig()
    shape = cfg.kv_shape()
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.dtype) == (
        2,
        2,
        16,
        torch.float32,
    )


def test_prefill_into_scattered_blocks_equals_dense(model: TinyTransformer) -> None:
    pool = new_pool(model)
    prompt = tokens(40, seed=1)
    paged = model.forward_all([SeqInput(prompt, 0, [5, 2, 7])], pool.kv)[0]
    torch.testing.assert_close(paged, model.reference_logits(prompt), **TOL)
    last = model.forward([SeqInput(prompt, 0, [5, 2, 7])], pool.kv)
    torch.testing.assert_close(last[0], paged[-1], **TOL)
    # Exactly blocks 5, 2 and slots 0..7 of block 7 were written; nothing else.
    written = pool.kv.abs().sum(dim=(0, 1, 4, 5)) != 0  # (blocks, slots)
    expect = torch.zeros(16, B, dtype=torch.bool)
    expect[5] = expect[2] = True
    expect[7, :8] = True
    assert torch.equal(written, expect)


def test_chunked_prefill_equals_dense(model: TinyTransformer) -> None:
    pool = new_pool(model)
    prompt = tokens(45, seed=2)
    table = [9, 0, 4]
    chunks = [(0, 7), (7, 16), (16, 17), (17, 45)]
    got = [model.forward_all([SeqInput(prompt[a:b], a, table)], pool.kv)[0] for a, b in chunks]
    torch.testing.assert_close(torch.cat(got), model.reference_logits(prompt), **TOL)


def test_reuse_with_cow_boundary_block_equals_recompute(model: TinyTransformer) -> None:
    pool = new_pool(model)
    prefix = tokens(40, seed=3)
    model.forward([SeqInput(prefix, 0, [5, 2, 7])], pool.kv)
    before = pool.kv.clone()
    # Block 7 holds positions 32..39 in slots 0..7; the new branch copies those slots.
    pool.copy_slots(7, 11, 8)
    seq = prefix + tokens(30, seed=4)
    suffix = model.forward_all([SeqInput(seq[40:], 40, [5, 2, 11, 3, 8])], pool.kv)[0]
    torch.testing.assert_close(suffix, model.reference_logits(seq)[40:], **TOL)
    # The shared blocks were only read.
    assert torch.equal(pool.kv[:, :, [5, 2, 7]], before[:, :, [5, 2, 7]])


def test_reuse_continuing_in_place_equals_recompute(model: TinyTransformer) -> None:
    pool = new_pool(model)
    prefix = tokens(40, seed=5)
    model.forward([SeqInput(prefix, 0, [5, 2, 7])], pool.kv)
    before = pool.kv.clone()
    seq = prefix + tokens(20, seed=6)
    last = model.forward([SeqInput(seq[40:], 40, [5, 2, 7, 1])], pool.kv)
    torch.testing.assert_close(last[0], model.reference_logits(seq)[-1], **TOL)
    # Slots 0..7 of block 7 (the prefix) are untouched; 8..15 now hold the continuation.
    assert torch.equal(pool.kv[:, :, 7, :8], before[:, :, 7, :8])
    assert torch.equal(pool.kv[:, :, [5, 2]], before[:, :, [5, 2]])
    assert bool((pool.kv[:, :, 7, 8:] != before[:, :, 7, 8:]).all())


def test_prefill_and_decode_equals_dense(model: TinyTransformer) -> None:
    pool = new_pool(model)
    prompt = tokens(20, seed=7)
    out = prefill_and_decode(model, pool.kv, prompt, [3, 12], start=0, n_new=12)
    none = prefill_and_decode(model, new_pool(model).kv, prompt, [3, 12], start=0, n_new=0)
    assert none.tokens == []
    assert none.step_logits.shape == (0, 4096)
    assert len(out.tokens) == 12
    assert out.step_logits.shape == (12, 4096)
    ref = model.reference_logits(prompt + out.tokens[:-1])[19:]
    torch.testing.assert_close(out.step_logits, ref, **TOL)
    assert out.tokens == ref.argmax(-1).tolist()


def _mixed_setup(model: TinyTransformer) -> tuple[KVPool, list[SeqInput], list[list[int]]]:
    """Three sequences: a fresh 30-token prefill, a 1-token decode at 25, a 10-token chunk at 16."""
    pool = new_pool(model)
    full = [tokens(30, 10), tokens(26, 11), tokens(26, 12)]
    tables = [[0, 1], [4, 6], [9, 3]]
    model.forward([SeqInput(full[1][:25], 0, tables[1])], pool.kv)
    model.forward([SeqInput(full[2][:16], 0, tables[2])], pool.kv)
    batch = [
        SeqInput(full[0], 0, tables[0]),
        SeqInput(full[1][25:], 25, tables[1]),
        SeqInput(full[2][16:], 16, tables[2]),
    ]
    return pool, batch, full


def test_batched_forward_equals_one_by_one(model: TinyTransformer) -> None:
    pool_a, batch, full = _mixed_setup(model)
    pool_b, _, _ = _mixed_setup(model)
    batched = model.forward_all(batch, pool_a.kv)
    single = [model.forward_all([seq], pool_b.kv)[0] for seq in batch]
    assert [t.shape[0] for t in batched] == [30, 1, 10]
    for got, want in zip(batched, single, strict=True):
        torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(pool_a.kv, pool_b.kv, **TOL)
    last = model.forward(batch, pool_a.kv)
    assert last.shape == (3, 4096)
    for i, seq in enumerate(full):
        torch.testing.assert_close(last[i], model.reference_logits(seq)[-1], **TOL)


def test_a_batch_may_read_blocks_another_sequence_writes(model: TinyTransformer) -> None:
    # Sequence 1 reuses the first block sequence 0 fills in the same forward.
    pool = new_pool(model)
    shared = tokens(16, 20)
    tail = tokens(5, 21)
    logits = model.forward(
        [SeqInput(shared, 0, [2]), SeqInput(tail, 16, [2, 6])],
        pool.kv,
    )
    torch.testing.assert_close(logits[1], model.reference_logits(shared + tail)[-1], **TOL)


def test_a_forward_copies_slots_after_its_writes(model: TinyTransformer) -> None:
    """Sequence 1 diverges 5 tokens into the block sequence 0 fills in the same forward: its
    copy of those 5 slots (block 2 -> 7) is made by each layer after the writes, so it reads
    what sequence 0 wrote there, and equals a dense recompute."""
    pool = new_pool(model)
    shared = tokens(21, 22)
    tail = tokens(6, 23)
    copy = ([2 * B + i for i in range(5)], [7 * B + i for i in range(5)])
    logits = model.forward(
        [SeqInput(shared, 0, [3, 2]), SeqInput(tail, 21, [3, 7])], pool.kv, copy)
    dense = model.reference_logits(shared[:21] + tail)[-1]
    torch.testing.assert_close(logits[1], dense, **TOL)
    assert torch.equal(pool.kv[:, :, 7, :5], pool.kv[:, :, 2, :5])
    for bad, why in ((([1, 2], [40]), "slot copy of"), (([1], [16 * B]), "outside the pool"),
                     (([1, 2], [40, 40]), "writes a slot twice"),
                     (([1, 40], [40, 41]), "reads a slot it writes")):
        with pytest.raises(ValueError, match=why):
            model.forward([SeqInput(tail, 0, [5])], pool.kv, bad)


def test_same_seed_is_bit_identical_other_seed_differs(model: TinyTransformer) -> None:
    prompt = tokens(24, seed=30)
    twin = TinyTransformer(ModelConfig(seed=0), device="cpu")
    other = TinyTransformer(ModelConfig(seed=1), device="cpu")
    pool_a, pool_b = new_pool(model), new_pool(twin)
    a = model.forward_all([SeqInput(prompt, 0, [1, 2])], pool_a.kv)[0]
    b = twin.forward_all([SeqInput(prompt, 0, [1, 2])], pool_b.kv)[0]
    assert torch.equal(a, b)
    assert torch.equal(pool_a.kv, pool_b.kv)
    c = other.reference_logits(prompt)
    assert float((c - model.reference_logits(prompt)).abs().min()) > 0.0
    assert float((c - a).abs().max()) > 1.0


def test_tokens_accepted_as_list_numpy_or_tensor(model: TinyTransformer) -> None:
    prompt = tokens(18, seed=40)
    outs = []
    for form in (prompt, np.array(prompt), torch.tensor(prompt)):
        pool = new_pool(model)
        outs.append(model.forward([SeqInput(form, 0, [3, 4])], pool.kv))
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0], outs[2])


def test_ids_past_the_vocabulary_fold_into_it(model: TinyTransformer) -> None:
    """A trace word id (>= 4,096) is read as its embedding row id % 4,096, paged or dense."""
    assert (model.config.vocab_size, model.config.id_space) == (4096, 100_014)
    wide, folded = [5, 4096 + 7, 100_013], [5, 7, 100_013 % 4096]
    torch.testing.assert_close(model.reference_logits(wide), model.reference_logits(folded),
                               rtol=0, atol=0)
    paged = model.forward([SeqInput(wide, 0, [2])], new_pool(model).kv)
    torch.testing.assert_close(paged, model.forward([SeqInput(folded, 0, [2])],
                                                    new_pool(model).kv), rtol=0, atol=0)
    torch.testing.assert_close(paged[0], model.reference_logits(wide)[-1], **TOL)


def test_a_vocabulary_wider_than_the_id_space_is_refused() -> None:
    with pytest.raises(ValueError, match=r"vocab_size 5000 must be in \[1, id_space 4096\]"):
        ModelConfig(vocab_size=5000, id_space=4096)


@pytest.mark.parametrize(
    ("seq", "message"),
    [
        (SeqInput([1, 2, 3], 14, [0]), "block table covers 1 blocks, needs 2"),
        (SeqInput([1, 2, 3], 0, [16]), r"block id outside \[0, 16\)"),
        (SeqInput([1, 100_014], 0, [0]), r"token id outside \[0, 100014\)"),
        (SeqInput([], 0, [0]), "no new tokens"),
        (SeqInput([1], -1, [0]), "start must be >= 0"),
    ],
)
def test_bad_batches_are_refused(model: TinyTransformer, seq: SeqInput, message: str) -> None:
    pool = new_pool(model)
    with pytest.raises(ValueError, match=message):
        model.forward([seq], pool.kv)
    assert not pool.kv.any()


def test_kv_that_does_not_fit_is_refused(model: TinyTransformer) -> None:
    wrong = KVPool(4, B, ModelConfig(n_layers=3).kv_shape(), device="cpu")
    with pytest.raises(ValueError, match="does not fit the model"):
        model.forward([SeqInput([1], 0, [0])], wrong.kv)
    with pytest.raises(ValueError, match="empty batch"):
        model.forward([], new_pool(model).kv)


def test_two_tokens_writing_one_slot_are_refused(model: TinyTransformer) -> None:
    pool = new_pool(model)
    batch = [SeqInput([1, 2], 0, [4]), SeqInput([3], 1, [4])]
    with pytest.raises(ValueError, match="write the same pool slot"):
        model.forward(batch, pool.kv)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    shapes=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 24)), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_random_mixed_batches_equal_dense(
    model: TinyTransformer, shapes: list[tuple[int, int]], seed: int
) -> None:
    """Each (cached, new): prefill ``cached`` alone first, then all ``new`` in one batch."""
    rng = np.random.default_rng(seed)
    free = rng.permutation(32).tolist()
    pool = new_pool(model, 32)
    batch, seqs = [], []
    for i, (cached, new) in enumerate(shapes):
        seq = tokens(cached + new, seed + i)
        table = [free.pop() for _ in range(-(-(cached + new) // B))]
        if cached:
            model.forward([SeqInput(seq[:cached], 0, table)], pool.kv)
        batch.append(SeqInput(seq[cached:], cached, table))
        seqs.append(seq)
    got = model.forward_all(batch, pool.kv)
    for (cached, _), seq, logits in zip(shapes, seqs, got, strict=True):
        torch.testing.assert_close(logits, model.reference_logits(seq)[cached:], **TOL)
