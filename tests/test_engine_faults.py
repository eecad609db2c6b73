"""A request can fail only itself: an exception inside an engine step (a request's sampler,
its streaming hook, the model's forward over its batch) fails the requests it concerns with
``RequestFailed``, releases their pins and blocks, says so with a ``Fault`` naming them, and
the engine steps on; the others' answers are what serving each alone gives."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from radixcache.core import events as ev
from radixcache.serving.batch import ForwardBatch, SeqInput
from radixcache.serving.engine import (
    Engine,
    EngineConfig,
    RequestCancelled,
    RequestFailed,
    RequestHandle,
)
from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
from radixcache.serving.model import ModelConfig, SlotCopy, TinyTransformer
from radixcache.serving.policy import SchedulePolicy
from radixcache.serving.requests import Request

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
SYSTEM = np.random.default_rng(1).integers(0, 100_000, 40).tolist()  # a shared prefix


def _engine(policy: SchedulePolicy = SchedulePolicy.LPM) -> Engine:
    return Engine(EngineConfig(num_blocks=64, model=SMALL, schedule=policy, max_step_tokens=64))


def _prompt(i: int) -> list[int]:
    return SYSTEM + np.random.default_rng(100 + i).integers(0, 100_000, 6 + i).tolist()


class Raising:
    """A token policy that chooses greedily until its ``at``-th token, then raises (the
    sampler of issue 33: ``torch.multinomial`` on an all-zero row)."""

    def __init__(self, at: int) -> None:
        self.at, self.chosen = at, 0

    def choose(self, logits: torch.Tensor) -> int:
        if self.chosen == self.at:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        self.chosen += 1
        return int(logits.argmax())

    def stops_at(self, token: int) -> bool:
        return False


def _alone(prompt: list[int], n: int) -> list[int]:
    engine = _engine()
    h = engine.submit(prompt, n)
    while not h.done():
        engine.step()
    return h.result(0).tokens


def _run(engine: Engine, handles: Sequence[RequestHandle]) -> list[ev.AnyEvent]:
    events: list[ev.AnyEvent] = []
    for _ in range(200):
        if all(h.done() for h in handles):
            break
        engine.step()
        engine.check()  # tree invariants, and no pin or lease outlives its request
        events += engine.take_events()
    assert all(h.done() for h in handles)
    return events


@pytest.mark.parametrize("policy", list(SchedulePolicy))
@pytest.mark.parametrize("at", [0, 3])  # its first token (the prefill's) or a decode's
def test_a_raising_sampler_fails_its_request_only(policy: SchedulePolicy, at: int) -> None:
    engine = _engine(policy)
    handles = [engine.submit(_prompt(i), 8, policy=Raising(at) if i == 1 else None)
               for i in range(4)]
    events = _run(engine, handles)
    with pytest.raises(RequestFailed) as failed:
        handles[1].result(0)
    assert str(failed.value) == (
        f"request 1 failed: choosing or streaming its token {at} raised RuntimeError:"
        " probability tensor contains either inf, nan or element < 0")
    faults = [e for e in events if isinstance(e, ev.Fault)]
    assert faults == [ev.Fault("MainThread", str(failed.value), req=1)]
    for i in (0, 2, 3):
        assert handles[i].result(0).tokens == _alone(_prompt(i), 8)
    stats = engine.stats()
    assert (stats.finished, stats.failed, stats.running, stats.waiting) == (3, 1, 0, 0)
    assert engine.pinned_blocks() == 0
    # the engine steps on: the same prompt again is served, from the cache
    again = engine.submit(_prompt(1), 8)
    _run(engine, [again])
    assert again.result(0).tokens == _alone(_prompt(1), 8)


def test_a_raising_stream_hook_fails_its_request_only() -> None:
    engine = _engine()
    seen: list[int] = []

    def hook(token: int) -> None:
        seen.append(token)
        if len(seen) == 2:
            raise BrokenPipeError("the client's socket is gone")

    handles = [engine.submit(_prompt(i), 6, on_token=hook if i == 0 else None)
               for i in range(3)]
    _run(engine, handles)
    with pytest.raises(RequestFailed, match="token 1 raised BrokenPipeError: the client's"):
        handles[0].result(0)
    assert [h.result(0).tokens for h in handles[1:]] == [_alone(_prompt(i), 6) for i in (1, 2)]
    assert len(seen) == 2  # nothing more is streamed to a failed request


class FailingModel:
    """The real model, whose forward raises for every batch holding a sequence that reads
    ``marker`` (a test double of the model: the point is the engine's recovery)."""

    def __init__(self, model: TinyTransformer, marker: int) -> None:
        self.model, self.marker, self.raised = model, marker, 0

    def forward(self, batch: Sequence[SeqInput] | ForwardBatch, kv: torch.Tensor,
                copy: SlotCopy | None = None) -> torch.Tensor:
        assert not isinstance(batch, ForwardBatch)
        if any(self.marker in list(s.tokens) for s in batch):
            self.raised += 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.model.forward(batch, kv, copy)


def test_a_forward_that_raises_fails_its_batch_and_the_engine_steps_on() -> None:
    """``first`` decodes while ``marked`` and ``later`` prefill: the padding splits the step
    into a prefill forward (both, failing) and a decode forward (``first``, served on)."""
    engine = _engine(SchedulePolicy.FCFS)
    marker = 7
    engine.running.model = FailingModel(engine.model, marker)  # type: ignore[assignment]
    first = engine.submit(_prompt(0), 5)
    engine.step()  # alone in its prefill forward
    marked = engine.submit([marker, *_prompt(5)], 5)
    later = engine.submit(_prompt(2), 5)
    _run(engine, [first, marked, later])
    assert first.result(0).tokens == _alone(_prompt(0), 5)
    for rid, h in ((1, marked), (2, later)):
        with pytest.raises(RequestFailed) as failed:
            h.result(0)
        assert str(failed.value) == (
            f"request {rid} failed: the model's forward over its batch raised "
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert (engine.stats().failed, engine.running.model.raised) == (2, 1)
    after = engine.submit(_prompt(3), 5)  # the batch failed, not the engine
    _run(engine, [after])
    assert after.result(0).tokens == _alone(_prompt(3), 5)


def test_a_forward_failing_over_blocks_published_before_it_stops_the_engine_loudly() -> None:
    """Blocks published into the tree before the forward that writes them (in-forward
    sharing) are half written when that forward raises: serving from them would be wrong,
    so the step raises ``CorruptStep`` and the loop's thread dies with a ``Fault``."""
    engine = _engine(SchedulePolicy.LPM)
    marker = 9
    a = engine.submit(SYSTEM + SYSTEM + [marker, 1, 2], 4)  # 83 tokens: 2 prefill chunks
    engine.step()
    engine.running.model = FailingModel(engine.model, marker)  # type: ignore[assignment]
    b = engine.submit(SYSTEM + SYSTEM + [marker, 1, 3, 4], 4)  # admitted beside ``a``
    batches: list[ev.Batch] = []
    died = threading.Event()

    def sink(batch: ev.Batch) -> None:
        batches.append(batch)
        if any(isinstance(e, ev.Fault) for e in batch.events):
            died.set()

    loop = ServiceLoop(engine, BatchSink(sink), LoopConfig(0)).start()
    try:
        assert died.wait(30)
    finally:
        loop.close()
    assert loop.fault is not None and loop.fault.error.startswith(
        "CorruptStep: the model's forward failed while it wrote blocks already in the tree")
    assert batches[-2].events[-1] == ev.Fault("rc-service-loop", loop.fault.error)
    assert isinstance(a.exception(0), RequestCancelled)  # by ``close``, after the fault
    assert isinstance(b.exception(0), RequestCancelled)


def test_a_request_aborted_while_it_is_admitted_is_let_go_with_nothing_held() -> None:
    """``abort`` takes a waiting request off the queue from another thread; when that happens
    between the scheduler's choice and the end of its admission, the admission undoes its pin
    and lease instead of running a request whose handle is already failed."""
    engine = _engine()
    done = engine.submit(_prompt(0), 2)
    _run(engine, [done])
    h = engine.submit(_prompt(0), 2)
    req = engine.scheduler.take(h.id or 0)  # what ``abort`` does, before the admission ends
    assert req is not None
    inflight: list[Request] = []
    assert engine.scheduler.admission.admit(req, inflight) is None
    assert (inflight, req.lease, engine.pinned_blocks()) == ([], None, 0)
    engine.check()  # no pin, no lease left behind
    assert sum(n.pins for n in engine.tree.live_nodes()) == 0
