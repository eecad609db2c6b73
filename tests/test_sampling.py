"""The sampler chooses a token for any logits and any parameters: NaN never wins, ``+inf``
wins outright, a subnormal top_p or temperature is the argmax, and only a row with no number
at all is refused (``ValueError``, for that request)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.serving.sampling import GREEDY_BELOW, MIN_LOGPROB, RequestPolicy, Sampling
from radixcache.traffic.tokenizer import shipped

TOK = shipped()
V = TOK.vocab_size
EDGES = [0.0, -0.0, 5e-324, 1e-320, 1e-46, 1e-45, 1e-39, 1e-38, GREEDY_BELOW, 1e-5 * 0.999,
         0.5, 1.0, 2.0, 1e308, math.inf, -math.inf, math.nan, -1.0]


def _choose(logits: torch.Tensor, *, temperature: float = 0.0, top_p: float = 1.0,
            top_k: int = 0, seed: int | None = None) -> int:
    return RequestPolicy(Sampling(temperature, top_p, top_k, seed), TOK).choose(logits)


def _logits(values: dict[int, float], rest: float = 0.0) -> torch.Tensor:
    row = torch.full((V,), rest, dtype=torch.float32)
    for i, v in values.items():
        row[i] = v
    return row


@pytest.mark.parametrize("top_p", [1e-320, 1e-46, 5e-324, 1e-9])
def test_a_top_p_that_is_zero_in_float32_keeps_the_likeliest(top_p: float) -> None:
    row = torch.randn(V, generator=torch.Generator().manual_seed(1))
    for seed in range(20):
        assert _choose(row, temperature=1.0, top_p=top_p, seed=seed) == int(row.argmax())


@pytest.mark.parametrize("temperature", [1e-320, 1e-39, 5e-324, 1e-6, 0.0, -0.0])
def test_a_temperature_under_the_threshold_is_greedy(temperature: float) -> None:
    row = torch.randn(V, generator=torch.Generator().manual_seed(2))
    assert _choose(row, temperature=temperature, seed=1) == int(row.argmax())


def test_the_smallest_sampled_temperature_cannot_overflow() -> None:
    # float32 logits at their largest over 1e-5 are 3.4e43: infinite in float32, not float64
    row = _logits({7: 3.4e38, 9: 3.3e38}, rest=-3.4e38)
    assert [_choose(row, temperature=GREEDY_BELOW, seed=s) for s in range(10)] == [7] * 10


def test_nan_logits_never_win() -> None:
    row = _logits({5: 1.0}, rest=math.nan)
    assert _choose(row) == 5
    assert [_choose(row, temperature=2.0, seed=s) for s in range(10)] == [5] * 10
    assert _choose(row, temperature=1.0, top_p=0.5, top_k=3, seed=0) == 5


def test_infinite_logits_take_the_whole_probability() -> None:
    row = _logits({3: math.inf, 11: math.inf, 12: math.nan}, rest=1.0)
    picked = {_choose(row, temperature=1.0, seed=s) for s in range(40)}
    assert picked == {3, 11}
    assert _choose(row) == 3  # greedy: the first of the largest


def test_minus_infinity_everywhere_but_one_is_that_one() -> None:
    row = _logits({42: -1e30}, rest=-math.inf)
    assert [_choose(row, temperature=1.5, top_p=0.9, seed=s) for s in range(5)] == [42] * 5


@pytest.mark.parametrize("rest", [math.nan, -math.inf])
def test_a_row_with_no_finite_logit_is_refused(rest: float) -> None:
    with pytest.raises(ValueError, match="the model's logits hold no finite value"):
        _choose(_logits({}, rest=rest), temperature=1.0, seed=0)
    with pytest.raises(ValueError, match="the model's logits hold no finite value"):
        _choose(_logits({}, rest=rest))


def test_logprobs_of_ruled_out_tokens_are_the_floor_not_infinity() -> None:
    row = _logits({0: 0.0, 1: 0.0}, rest=-math.inf)
    policy = RequestPolicy(Sampling(logprobs=3), TOK)
    assert policy.choose(row) == 0
    entry = policy._pending[0]
    assert entry.logprob == pytest.approx(math.log(0.5))
    assert [p for _, p in entry.top] == pytest.approx([math.log(0.5), math.log(0.5),
                                                       MIN_LOGPROB])


_FLOATS = st.one_of(st.sampled_from(EDGES), st.floats(allow_nan=True, allow_infinity=True))
_LOGIT = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, 3.4e38, -3.4e38, 1e-45, 0.0]),
                   st.floats(width=32, allow_nan=True, allow_infinity=True))


@settings(max_examples=300, deadline=None)
@given(values=st.dictionaries(st.integers(0, V - 1), _LOGIT, min_size=1, max_size=12),
       rest=st.sampled_from([0.0, -math.inf, math.nan, -1e30]),
       temperature=_FLOATS, top_p=_FLOATS, top_k=st.integers(-5, V + 5),
       seed=st.integers(0, 2**63 - 1), logprobs=st.sampled_from([None, 0, 5]))
def test_any_logits_and_parameters_give_a_token_or_a_clear_refusal(
        values: dict[int, float], rest: float, temperature: float, top_p: float, top_k: int,
        seed: int, logprobs: int | None) -> None:
    row = _logits(values, rest)
    clean = torch.where(row.isnan(), -math.inf, row.double())
    policy = RequestPolicy(Sampling(temperature, top_p, top_k, seed, logprobs), TOK)
    if not bool((clean > -math.inf).any()):
        with pytest.raises(ValueError, match="no finite value"):
            policy.choose(row)
        return
    token = policy.choose(row)
    assert 0 <= token < V
    assert clean[token] > -math.inf  # never a NaN or a ruled-out token
    if bool(clean.isposinf().any()):
        assert clean[token] == math.inf  # +inf takes the whole probability
    if not temperature >= GREEDY_BELOW:
        assert token == int(clean.argmax())
    for entry in policy._pending:  # what JSON can carry
        assert all(MIN_LOGPROB <= p <= 0 for p in [entry.logprob, *(q for _, q in entry.top)])
