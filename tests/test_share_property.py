"""Sharing in the forward under random traffic: requests behind a few shared prefixes arrive
at random steps into small pools and small step budgets, under lpm and dfs-weight. After every
step the engine's ``check()`` holds (pins, leases, the tree), and every request's output equals
the same request's alone on an engine without a cache: publishing blocks before they are
computed, reading them in the forward that writes them and copying a boundary block again in
that forward never changes an answer."""

from __future__ import annotations

import numpy as np
from hypothesis import event, given
from hypothesis import strategies as st

from radixcache.serving.engine import Engine, EngineConfig, RequestHandle
from radixcache.serving.model import ModelConfig
from radixcache.serving.policy import SchedulePolicy

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)

Arrival = tuple[int, int, int, int, int]  # (step, prefix, own tokens, own seed, max_new)

arrivals = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 2), st.integers(1, 40),
              st.integers(0, 3), st.integers(1, 5)),
    min_size=2, max_size=14)


def _prompt(prefixes: list[list[int]], a: Arrival) -> list[int]:
    own = np.random.default_rng(1_000 + a[3]).integers(0, 4_000, a[2]).tolist()
    return prefixes[a[1]] + own


@given(arrivals=arrivals, lengths=st.lists(st.integers(17, 90), min_size=3, max_size=3),
       blocks=st.integers(24, 80), step_tokens=st.sampled_from([24, 48, 96, 512]),
       policy=st.sampled_from([SchedulePolicy.LPM, SchedulePolicy.DFS_WEIGHT]))
def test_sharing_in_the_forward_keeps_every_answer_and_every_invariant(
        arrivals: list[Arrival], lengths: list[int], blocks: int, step_tokens: int,
        policy: SchedulePolicy) -> None:
    rng = np.random.default_rng(7)
    prefixes = [rng.integers(0, 4_000, n).tolist() for n in lengths]
    engine = Engine(EngineConfig(num_blocks=blocks, model=SMALL, schedule=policy,
                                 max_step_tokens=step_tokens, share_min_tokens=8))
    handles: list[tuple[Arrival, RequestHandle]] = []
    for step in range(400):
        for a in arrivals:
            if a[0] == step:
                handles.append((a, engine.submit(_prompt(prefixes, a), a[4])))
        engine.step()
        engine.check()
        if len(handles) == len(arrivals) and all(h.done() for _, h in handles):
            break
    assert all(h.done() for _, h in handles)  # nothing stuck
    event(f"shared {min(engine.scheduler.shared, 3)}, held {min(engine.scheduler.held, 1)}")
    alone = Engine(EngineConfig(num_blocks=blocks, model=SMALL, cache=False))
    for a, h in handles:
        ref = alone.submit(_prompt(prefixes, a), a[4])
        while not ref.done():
            alone.step()
        if ref.exception() is not None:  # too large for the pool: rejected by both
            assert type(h.exception()) is type(ref.exception())
            continue
        assert h.result().tokens == ref.result().tokens
