"""How one step's work is split into model forwards: one forward unless the padded attention
layout (queries padded to the longest chunk, keys to the longest context) would waste more
than it computes; then prefills apart and decodes grouped by context."""

from __future__ import annotations

import torch

from radixcache.serving.batch import SeqInput
from radixcache.serving.requests import Request
from radixcache.serving.running import (
    GPU_SPLIT_PAIRS,
    SPLIT_PAIRS,
    Planned,
    _by_context,
    _wasteful,
    split_pairs,
)


def _decodes(*contexts: int) -> Planned:
    """One-token decodes whose contexts (start + 1) are ``contexts``; the request is never
    read by the grouping, so a placeholder stands for it."""
    req = Request.__new__(Request)
    return [(req, SeqInput([7], c - 1, [])) for c in contexts]


def _contexts(groups: list[Planned]) -> list[list[int]]:
    return [[s.start + len(s.tokens) for _, s in g] for g in groups]


def test_short_decodes_are_not_padded_to_one_long_context() -> None:
    work = _decodes(*([100] * 29), 2000)
    # padded: 30 x 2,000 pairs; needed: 29 x 100 + 2,000 -> 55,100 of waste
    assert _wasteful(work)
    assert _contexts(_by_context(work)) == [[100] * 29, [2000]]


def test_similar_contexts_stay_in_one_forward() -> None:
    assert not _wasteful(_decodes(*([2000] * 30)))
    assert _contexts(_by_context(_decodes(1990, 2000, 1995))) == [[1990, 1995, 2000]]
    assert not _wasteful(_decodes(5000))  # a single sequence pads nothing


def test_a_small_waste_is_not_worth_another_forward() -> None:
    # 9 x 400 = 3,600 pairs padded for 400 + 8 x 10 = 480 needed: 3,120 < SPLIT_PAIRS
    work = _decodes(*([10] * 8), 400)
    assert SPLIT_PAIRS > 9 * 400 - 480 and not _wasteful(work)
    assert _contexts(_by_context(work)) == [[10] * 8 + [400]]


def test_groups_are_greedy_by_context() -> None:
    work = _decodes(3000, *([10] * 6), 1000, 990, 2990)
    # six 10s then 990: 7 x 990 padded for 1,050 needed -> a new forward; 990 ... 3,000:
    # 4 x 3,000 = 12,000 padded for 7,980 needed, a waste below what it computes -> one
    groups = _by_context(work)
    assert _contexts(groups) == [[10] * 6, [990, 1000, 2990, 3000]]
    assert not any(_wasteful(g) for g in groups)


def test_a_gpu_splits_only_a_much_larger_waste() -> None:
    """On a GPU a padded pair costs far less against a forward's launches: 29 short decodes
    beside a 2,000-token one stay in one forward there (55,100 pairs of waste)."""
    assert split_pairs(torch.device("cpu")) == SPLIT_PAIRS
    assert split_pairs(torch.device("cuda")) == GPU_SPLIT_PAIRS
    work = _decodes(*([100] * 29), 2000)
    assert not _wasteful(work, GPU_SPLIT_PAIRS)
    assert _contexts(_by_context(work, GPU_SPLIT_PAIRS)) == [[100] * 29 + [2000]]
