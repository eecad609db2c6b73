"""Growing leases and retraction (``serving.reserve``, issue 35): under ``--reserve grow`` a
running request holds what it wrote and what its next step writes, a step that finds no block
retracts running requests into the tree, and every output (and stream) equals the request
served alone. A hypothesis state machine drives random requests with random ``max_tokens``,
early ends and tiny pools, and checks the engine after every step."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixcache.core import events as ev
from radixcache.serving.engine import Engine, EngineConfig, RequestRejected, TokenPolicy
from radixcache.serving.model import tiny_model
from radixcache.serving.policy import SchedulePolicy
from radixcache.serving.requests import StopAfter
from radixcache.serving.reserve import Reserve, victim
from radixcache.serving.sampling import RequestPolicy, Sampling
from radixcache.traffic.tokenizer import shipped

B = 4
TOK = shipped()


class _Make:
    """A fresh token policy each call: stop after ``stop`` tokens (greedy), or seeded
    sampling (``seed``), or none (greedy to ``max_new``)."""

    def __init__(self, stop: int | None, seed: int | None) -> None:
        self.key = (stop, seed)

    def __call__(self) -> TokenPolicy | None:
        stop, seed = self.key
        if seed is not None:
            return RequestPolicy(Sampling(temperature=1.0, seed=seed), TOK)
        return StopAfter(stop) if stop is not None else None


def _policy(stop: int | None, seed: int | None) -> _Make:
    return _Make(stop, seed)


_ALONE: dict[tuple[bytes, int, tuple[int | None, int | None]], list[int]] = {}


def _config(**kw: object) -> EngineConfig:
    return EngineConfig(**{"block_size": B, "model": tiny_model(), "record_events": False,
                           **kw})  # type: ignore[arg-type]


def _alone(prompt: np.ndarray, max_new: int, make: _Make) -> list[int]:
    key = (prompt.tobytes(), max_new, make.key)
    if key in _ALONE:
        return _ALONE[key]
    e = Engine(_config(num_blocks=256))
    try:
        h = e.submit(prompt, max_new, policy=make())
        while e.busy():
            e.step()
        _ALONE[key] = h.result(0).tokens
        return _ALONE[key]
    finally:
        e.close()


def _drive(e: Engine, steps: int = 4000) -> None:
    for _ in range(steps):
        if not e.busy():
            return
        e.step()
        e.check()
    raise AssertionError(f"not done after {steps} steps: a deadlock or a livelock")


def _case(n: int, seed: int) -> list[tuple[np.ndarray, int, _Make]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = rng.integers(0, 300, size=int(rng.integers(3, 30))).astype(np.uint32)
        max_new = int(rng.integers(10, 70))
        stop = int(rng.integers(1, max_new + 1))
        out.append((prompt, max_new, _policy(stop if i % 3 else None, None)))
    return out


@pytest.mark.parametrize("schedule", list(SchedulePolicy))
def test_retraction_keeps_every_output_and_stream_equal_to_alone(schedule: SchedulePolicy) -> None:
    """16 requests on a pool of 34 blocks: some are retracted (the events say so, with the
    tokens kept), every output and every stream equals the request served alone."""
    case = _case(16, 0)
    e = Engine(_config(num_blocks=34, reserve=Reserve.GROW, schedule=schedule,
                       record_events=True))
    try:
        streams: list[list[int]] = [[] for _ in case]
        handles = [e.submit(p, m, policy=make(), on_token=streams[i].append)
                   for i, (p, m, make) in enumerate(case)]
        _drive(e)
        outs = [h.result(0).tokens for h in handles]
        events = e.take_events()
        stats = e.stats()
    finally:
        e.close()
    assert outs == [_alone(p, m, make) for p, m, make in case]
    assert streams == outs
    retracts = [x for x in events if isinstance(x, ev.Retract)]
    assert stats.retractions == len(retracts) > 0
    assert stats.retracted_tokens == sum(x.kept_tokens for x in retracts)
    assert stats.retracted_from_tree + stats.retracted_recomputed == stats.retracted_tokens
    assert stats.reserve == "grow"


def test_grow_holds_only_what_is_written() -> None:
    """One request with max_new 60 that stops after 5: under grow it holds the blocks of its
    prompt and what it wrote, never its worst case (full holds all 17 blocks)."""
    prompt = np.arange(1, 9, dtype=np.uint32)  # 8 tokens: 2 blocks
    held = {}
    for reserve in Reserve:
        e = Engine(_config(num_blocks=64, reserve=reserve))
        try:
            h = e.submit(prompt, 60, policy=StopAfter(5))
            most = 0
            while e.busy():
                e.step()
                e.check()
                most = max(most, e.pinned_blocks())
            assert h.result(0).tokens == _alone(prompt, 60, _policy(5, None))
            held[reserve] = most
        finally:
            e.close()
    assert held == {Reserve.FULL: 17, Reserve.GROW: 3}  # (8 + 60 - 1) / 4; (8 + 5 - 1) / 4


def test_a_request_that_never_fits_is_refused_and_a_lone_one_that_fits_runs() -> None:
    """Worst case past the pool: refused at submit under both rules. A lone request whose
    worst case is the whole pool runs to its end under grow, beside others that retract."""
    e = Engine(_config(num_blocks=8, reserve=Reserve.GROW))
    try:
        with pytest.raises(RequestRejected, match="need 9 blocks; the pool has 8"):
            e.submit(np.arange(1, 5, dtype=np.uint32), 30).result(0)
        big = e.submit(np.arange(1, 5, dtype=np.uint32), 29)  # 32 positions: all 8 blocks
        small = [e.submit(np.arange(10 + i, 14 + i, dtype=np.uint32), 12) for i in range(3)]
        _drive(e)
        assert len(big.result(0).tokens) == 29
        assert [len(h.result(0).tokens) for h in small] == [12, 12, 12]
    finally:
        e.close()


class _Named:
    def __init__(self, rid: int, retractions: int) -> None:
        self.id, self.retractions = rid, retractions
        self.max_new, self.output = 1, []

    def early(self) -> bool:
        return False


def test_victim_order_newest_first_protected_last() -> None:
    rs = [_Named(0, 0), _Named(1, 1), _Named(2, 2)]
    assert victim(rs).id == 1  # the newest is protected (2 retractions already)
    assert victim([_Named(0, 2), _Named(1, 3)]).id == 1  # all protected: the newest


class GrowMachine(RuleBasedStateMachine):
    """Random requests (prompts from a few shared stems, random max_tokens, early ends by
    StopAfter or seeded sampling) on a tiny pool under grow; every step is checked (no leak:
    ``engine.check``), the run ends (no deadlock) and every output equals serving it alone."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: Engine | None = None
        self.sent: list[tuple[np.ndarray, int, _Make, object]] = []

    @precondition(lambda self: self.engine is None)
    @rule(blocks=st.integers(6, 40), schedule=st.sampled_from(list(SchedulePolicy)))
    def start(self, blocks: int, schedule: SchedulePolicy) -> None:
        self.engine = Engine(_config(num_blocks=blocks, reserve=Reserve.GROW,
                                     schedule=schedule, max_step_tokens=24,
                                     share_min_tokens=4))

    @precondition(lambda self: self.engine is not None)
    @rule(stem=st.integers(0, 2), tail=st.lists(st.integers(0, 500), min_size=1, max_size=9),
          max_new=st.integers(1, 30), stop=st.none() | st.integers(1, 30),
          seed=st.none() | st.integers(0, 3))
    def submit(self, stem: int, tail: list[int], max_new: int, stop: int | None,
               seed: int | None) -> None:
        assert self.engine is not None
        prompt = np.array([*range(stem * 7, stem * 7 + 6), *tail], dtype=np.uint32)
        make = _policy(stop, seed)
        h = self.engine.submit(prompt, max_new, policy=make())
        self.sent.append((prompt, max_new, make, h))

    @precondition(lambda self: self.engine is not None)
    @rule(n=st.integers(1, 6))
    def step(self, n: int) -> None:
        assert self.engine is not None
        for _ in range(n):
            self.engine.step()
            self.engine.check()

    @invariant()
    def checked(self) -> None:
        if self.engine is not None:
            self.engine.check()

    def teardown(self) -> None:
        e = self.engine
        if e is None:
            return
        try:
            _drive(e)
            for prompt, max_new, make, h in self.sent:
                err = h.exception(0)  # type: ignore[attr-defined]
                if -(-(len(prompt) + max_new - 1) // B) > e.config.num_blocks:
                    assert isinstance(err, RequestRejected)
                    continue
                assert err is None, err
                assert h.result(0).tokens == _alone(prompt, max_new, make)  # type: ignore[attr-defined]
            assert e.pool.free_blocks + len(e.tree.request_blocks()) <= e.config.num_blocks
            assert not e.tree.request_blocks()  # nothing leased once all finished
        finally:
            e.close()


TestGrowMachine = GrowMachine.TestCase
TestGrowMachine.settings = settings(max_examples=15, stateful_step_count=16, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])


def test_metrics_count_retractions_as_vllm_preemptions() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from radixcache.serving.prometheus import Counters, EngineCollector

    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: Counters(1, 2, 1, 3, 0, 0, 4, 8, 0, 16, 5), "m"))
    text = generate_latest(registry).decode()
    assert 'vllm:num_preemptions_total{model_name="m"} 5.0' in text


def test_the_memory_section_reports_both_rules_with_stable_keys() -> None:
    """``bench engine --section memory`` on synthetic requests (no dataset): both rules, the
    keys the issue names, equal outputs, nothing failed; grow holds what it writes."""
    from radixcache.tools.bench_engine import memory_pass, memory_report

    rng = np.random.default_rng(3)
    reqs = [(rng.integers(0, 300, size=int(rng.integers(4, 20))).astype(np.uint32),
             int(rng.integers(1, 30))) for _ in range(10)]
    figures = [memory_pass(reqs, 40, _config(num_blocks=40, max_running=10, reserve=how),
                           lambda _d, _t: None) for how in (Reserve.FULL, Reserve.GROW)]
    report = memory_report(*figures, blocks=40, max_tokens=40)["memory"]
    assert isinstance(report, dict)
    keys = {"running_mean", "written_over_held", "retractions", "retracted_tokens_from_tree",
            "retracted_tokens_recomputed", "requests_per_s", "ttft_ms_p50", "ttft_ms_p99",
            "failed", "outputs_equal"}
    for name in ("full", "grow"):
        assert keys <= set(report[name])
        assert report[name]["failed"] == 0 and report[name]["outputs_equal"] is True
    assert report["full"]["retractions"] == 0
    assert report["grow"]["written_over_held"] > report["full"]["written_over_held"]
    assert report["grow"]["running_mean"] > report["full"]["running_mean"]


def test_retraction_with_the_cache_off_recomputes_and_stays_equal() -> None:
    """Cache off: a retracted request keeps nothing (its blocks are freed, ``kept_tokens``
    0) and recomputes; its output is still the one served alone."""
    case = _case(16, 0)
    e = Engine(_config(num_blocks=34, reserve=Reserve.GROW, cache=False, record_events=True))
    try:
        handles = [e.submit(p, m, policy=make()) for p, m, make in case]
        _drive(e)
        outs = [h.result(0).tokens for h in handles]
        retracts = [x for x in e.take_events() if isinstance(x, ev.Retract)]
        stats = e.stats()
    finally:
        e.close()
    assert outs == [_alone(p, m, make) for p, m, make in case]
    assert retracts and all(x.kept_tokens == 0 for x in retracts)
    assert stats.retracted_tokens == stats.retracted_from_tree == 0


def _two_long(blocks: int) -> tuple[Engine, list[object], int, list[ev.AnyEvent]]:
    """Two 4-token prompts that each write 20 tokens, admitted together (the estimate at its
    floor), on a pool of ``blocks`` blocks of 4: both cannot finish side by side (12 blocks),
    so the newer is retracted once. Returns the engine, the outputs, the most holds seen after
    a step and the events."""
    from radixcache.serving.reserve import MIN_RATIO

    e = Engine(_config(num_blocks=blocks, reserve=Reserve.GROW, record_events=True))
    e.scheduler.admission.estimate.ratio = MIN_RATIO
    prompts = [np.array([1, 2, 3, 4], np.uint32), np.array([9, 8, 7, 6], np.uint32)]
    handles = [e.submit(p, 20, policy=StopAfter(20)) for p in prompts]
    most = 0
    events: list[ev.AnyEvent] = []
    while e.busy():
        e.step()
        e.check()  # the hold's pin counted, nothing leaked
        most = max(most, len(e.scheduler.admission.holds))
        events += e.take_events()
    outs: list[object] = [h.result(0).tokens for h in handles]
    assert outs == [_alone(p, 20, _policy(20, None)) for p in prompts]
    return e, outs, most, events


def test_a_retracted_request_holds_its_tokens_and_takes_them_all_back() -> None:
    """11 blocks: the step that would run the pool dry retracts the newer request while 5
    blocks are still free for the older one's growth; what it computed (20 tokens, 5 blocks)
    stays pinned while it waits, so its resumption matches all of it: nothing recomputed."""
    e, _outs, most, events = _two_long(11)
    try:
        s = e.stats()
        assert [x for x in events if isinstance(x, ev.Retract)] == [ev.Retract(1, 20, 5)]
        assert most == 1
        assert (s.retractions, s.retracted_tokens, s.retracted_from_tree,
                s.retracted_recomputed) == (1, 20, 20, 0)
        assert not e.scheduler.admission.holds  # dropped when it ran again
    finally:
        e.close()


def test_a_lone_request_that_needs_held_blocks_takes_them() -> None:
    """10 blocks: the hold's 5 blocks and the older request's 5 fill the pool, and the older
    one, alone now, needs a 6th: its growth drops the hold (the tree evicts from those
    blocks, LRU), so the retracted request recomputes part of what it kept; both outputs are
    still the ones served alone and no step deadlocks."""
    e, _outs, most, events = _two_long(10)
    try:
        s = e.stats()
        assert [x for x in events if isinstance(x, ev.Retract)] == [ev.Retract(1, 20, 5)]
        assert most == 0  # made and dropped within the same step
        assert (s.retractions, s.retracted_tokens, s.retracted_from_tree,
                s.retracted_recomputed) == (1, 20, 8, 12)
    finally:
        e.close()


def test_a_sampled_answer_nothing_can_stop_counts_in_full() -> None:
    """The seeded model has no end of sequence: a sampled request without a stop rule runs to
    its max_tokens, so admission counts it in full (2 of 4 at a time on 12 blocks, none
    retracted); with a stop string it may end early and is estimated (all 4 admitted)."""
    from radixcache.serving.reserve import MIN_RATIO

    prompts = [np.array([i, i + 1, i + 2, i + 3], np.uint32) for i in (1, 20, 40, 60)]
    seen = {}
    for stop in ((), ("zzzz-never",)):
        e = Engine(_config(num_blocks=12, reserve=Reserve.GROW))
        e.scheduler.admission.estimate.ratio = MIN_RATIO
        policies = [RequestPolicy(Sampling(temperature=1.0, seed=i, stop=stop), TOK)
                    for i in range(4)]
        assert [p.may_stop for p in policies] == [bool(stop)] * 4
        handles = [e.submit(p, 20, policy=q) for p, q in zip(prompts, policies, strict=True)]
        e.step()
        most = len(e.running.requests)
        _drive(e)
        seen[bool(stop)] = (most, e.stats().retractions)
        assert all(h.exception(0) is None for h in handles)
        e.close()
    assert seen[False] == (2, 0)
    assert seen[True][0] == 4
