"""The engine's request types: configuration, a request's handle (a ``Future``), its result
and metrics, the engine's running totals, and the errors a handle can carry."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt
import torch

from radixcache.core.tree import Lease, MatchResult
from radixcache.serving.checkpoint import Checkpoint
from radixcache.serving.model import ModelConfig, SeqInput
from radixcache.serving.policy import SchedulePolicy
from radixcache.serving.reserve import Reserve
from radixcache.traffic.workloads import Workload, WorkloadRequest

TokenArray = npt.NDArray[np.uint32]
TokenHook = Callable[[int], None]  # called with each output token as it is chosen


class TokenPolicy(Protocol):
    """How one request's tokens are chosen instead of the greedy argmax (an HTTP front's
    sampling parameters), and when it ends before ``max_new_tokens`` (a stop token or text)."""

    def choose(self, logits: torch.Tensor) -> int:
        """The next token from this step's ``(vocab,)`` logits."""
        ...

    def stops_at(self, token: int) -> bool:
        """True when the request ends with ``token`` (called right after ``choose``)."""
        ...


class StopAfter:
    """A ``TokenPolicy``: the greedy choice, ending after ``n`` tokens, as a real model ends at
    its end of sequence (the seeded tiny model never does; a workload's recorded answer
    length drives it, ``bench engine --section memory``). Its count lives on the object, so it
    survives a retraction like a sampler's state."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"stop_after must be >= 1, got {n}")
        self.n, self.chosen = n, 0

    def choose(self, logits: torch.Tensor) -> int:
        """The argmax of ``logits``."""
        self.chosen += 1
        return int(logits.argmax())

    def stops_at(self, token: int) -> bool:
        """True at its ``n``-th token."""
        return self.chosen >= self.n


class EngineError(Exception):
    """Base class of the errors a request's handle can carry."""


class RequestRejected(EngineError):
    """The request can never be served (it needs more blocks than the whole pool holds)."""


class RequestCancelled(EngineError):
    """The request was dropped by ``reset()`` or ``close()`` before it finished."""


class RequestFailed(EngineError):
    """An exception inside the engine's step failed this request only: its token policy (the
    sampler), its streaming hook, or the model's forward over its batch. Its pins and blocks
    were released and the engine stepped on with the others (``engine`` module doc)."""


class Answers(Enum):
    """How forced answers (trace outputs) are computed.

    DECODE: token by token, as a server decodes (requests stay running, pinned).
    PREFILL: teacher forcing in one pass -- the request's prompt becomes prompt + answer[:-1]
    and it decodes one token. The engine inserts the same sequence, so the tree ends the same;
    ``RequestStart.prompt_tokens`` then counts the answer. Tens of times faster on a CPU.
    """

    DECODE = "decode"
    PREFILL = "prefill"


def fold_answers(workload: Workload) -> Workload:
    """``workload`` with each forced answer moved into its prompt (see ``Answers.PREFILL``);
    requests without a forced answer, or with a one-token answer, are kept as they are."""
    out = []
    for r in workload.requests:
        f = r.forced_output
        if f is not None and len(f) > 1:
            r = r._replace(prompt=np.concatenate([r.prompt, f[:-1]]).astype(np.uint32),
                           max_new_tokens=1, forced_output=f[-1:])
        out.append(r)
    return dataclasses.replace(workload, requests=out)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What an engine runs with. ``cache=False`` serves without reuse (match forced to 0,
    nothing inserted, blocks freed at finish) for on/off comparisons. ``schedule`` orders the
    waiting queue (``serving.policy``); a request waits at most ``max_wait_steps`` scheduling
    steps before it goes ahead of every policy choice, and is held for a running request's
    insert only when they share at least ``share_min_tokens`` uncached tokens
    (``serving.scheduler``); ``share_in_forward``: instead of waiting, such a request is
    admitted at once and reads the shared blocks in the forward that writes them, when that
    forward ends the sharer's prefill (False: it always waits for the insert). ``checkpoint``:
    serve that local folder's model (``serving.checkpoint``) instead of the seeded ``model``.
    ``reserve``: a lease of the worst case at admission, or leases that grow
    (``serving.reserve``)."""

    num_blocks: int = 4096
    block_size: int = 16
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: bool = True
    max_step_tokens: int = 512
    max_running: int = 64
    high: float = 0.92
    low: float = 0.85
    record_events: bool = True
    answers: Answers = Answers.DECODE  # how workloads' forced answers are computed
    device: str | None = None
    schedule: SchedulePolicy = SchedulePolicy.FCFS
    max_wait_steps: int = 64
    share_min_tokens: int = 32
    share_in_forward: bool = True
    checkpoint: Checkpoint | None = None  # a Hugging Face folder to serve instead of ``model``
    reserve: Reserve = Reserve.GROW  # how running requests hold blocks (``serving.reserve``)


class RequestMetrics(NamedTuple):
    """One finished request. Times in ms since ``submit``; token counts exact."""

    request: int
    prompt_tokens: int
    hit_tokens: int  # served from the cache (never more than prompt_tokens - 1)
    prefill_tokens: int  # computed by the model: prompt_tokens - hit_tokens
    output_tokens: int
    queue_ms: float  # submit -> admitted
    ttft_ms: float  # submit -> first output token
    latency_ms: float  # submit -> last output token
    decode_tokens_per_s: float  # (output_tokens - 1) / (last - first token time); 0 if one


class RequestResult(NamedTuple):
    """What ``RequestHandle.result`` returns. ``logits`` is ``(output_tokens, vocab)`` on the
    CPU when submitted with ``keep_logits=True``: row i is the distribution of token i."""

    tokens: list[int]
    metrics: RequestMetrics
    logits: torch.Tensor | None


class StepReport(NamedTuple):
    """What one ``step`` did."""

    admitted: int
    sequences: int
    prefill_tokens: int
    decode_tokens: int
    forwards: int
    finished: int


class RequestHandle(Future[RequestResult]):
    """A ``concurrent.futures.Future`` of one request's ``RequestResult``; it fails with the
    request's ``EngineError`` (rejected, cancelled). It cannot be cancelled by the caller
    (the engine owns the request once submitted: ``reset()`` cancels). ``id`` is the engine's
    request id, ``None`` until a workload's dependent request is submitted."""

    def __init__(self, request_id: int | None = None) -> None:
        super().__init__()
        self.id = request_id
        self.set_running_or_notify_cancel()  # from now on ``cancel()`` is refused

    def settle(self, result: RequestResult | None, error: EngineError | None) -> None:
        """Finish the future with ``result``, or fail it with ``error`` (the engine's side)."""
        if error is not None:
            self.set_exception(error)
        else:
            assert result is not None
            self.set_result(result)


@dataclass(slots=True, eq=False)
class Request:
    """One request inside the engine, from ``submit`` to its finish (see ``engine``)."""

    id: int
    prompt: TokenArray
    max_new: int
    forced: TokenArray | None
    keep_logits: bool
    handle: RequestHandle
    submitted: float
    admitted: float = 0.0
    match: MatchResult | None = None
    lease: Lease | None = None
    computed: int = 0  # positions whose K/V are in the pool
    output: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    first_token_at: float = 0.0
    on_token: TokenHook | None = None
    policy: TokenPolicy | None = None  # chooses the tokens (sampling), may stop early
    key: bytes = b""  # prompt[:-1] as uint32 bytes: what the scheduler compares
    queued: int = 0  # the scheduler's step count when it was queued
    aged_at: int | None = None  # the step it reached ``max_wait_steps`` waiting, if it did
    held: bool = False  # was held for a running request's insert at least once
    published: bool = False  # its prompt's blocks went in the tree before its prefill ran
    error: str | None = None  # why a step failed it (then the engine fails its handle)
    fill: TokenArray = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))
    retractions: int = 0  # times it was retracted into the tree (``serving.retract``)
    hit: int = -1  # tokens its first admission served from the cache (-1: not admitted yet)
    kept: int = 0  # tokens its last retraction put in the tree (what its resumption may hit)

    def __post_init__(self) -> None:
        self.fill = self.prompt
        self.key = self.prompt[:-1].astype("<u4").tobytes()

    @property
    def prefilling(self) -> bool:
        """Whether its next forward computes ``fill`` (its prompt; after a retraction its
        prompt and output so far), not one decode."""
        return self.computed < len(self.fill)

    def early(self) -> bool:
        """Whether it may end before ``max_new`` (a token policy may stop it; a forced answer
        or the plain greedy choice runs to the end, and so does a policy whose ``may_stop`` is
        False: sampling with no stop rule on a model without an end of sequence): what
        ``serving.reserve`` estimates."""
        return (self.policy is not None and self.forced is None
                and getattr(self.policy, "may_stop", True))

    def need(self) -> int:
        """Positions its lease must cover for its next step (a growing lease): its ``fill``
        while prefilling, else everything written so far and the next decode's position."""
        return len(self.fill) if self.prefilling else len(self.prompt) + len(self.output)

    def resume(self) -> None:
        """Made waiting again by a retraction: its next admission prefills its prompt and
        output so far (matching what the retraction kept in the tree), and the last token of
        that prefill is the decode it would have run, so its output goes on unchanged."""
        self.fill = np.concatenate([self.prompt, np.asarray(self.output, dtype=np.uint32)]) \
            if self.output else self.prompt
        self.key = self.fill[:-1].astype("<u4").tobytes()
        self.match, self.lease, self.computed, self.published = None, None, 0, False

    @property
    def total(self) -> int:
        """Positions whose K/V the request writes or reuses."""
        return len(self.prompt) + self.max_new - 1

    def metrics(self, now: float) -> RequestMetrics:
        """This request's figures, finished at ``now`` (``time.perf_counter``)."""
        hit = max(self.hit, 0)
        span = now - self.first_token_at
        n = len(self.output)
        rate = (n - 1) / span if n > 1 and span > 0 else 0.0
        return RequestMetrics(self.id, len(self.prompt), hit, len(self.prompt) - hit, n,
                              (self.admitted - self.submitted) * 1e3,
                              (self.first_token_at - self.submitted) * 1e3,
                              (now - self.submitted) * 1e3, rate)

    def next_input(self) -> SeqInput:
        """The tokens of this request's next forward (a decode: its last output token)."""
        assert self.lease is not None
        pos = len(self.prompt) + len(self.output) - 1
        return SeqInput([self.output[-1]], pos, self.lease.table)


class WorkloadRun(NamedTuple):
    """Handles of a workload's requests, in the workload's order (a dependent request's
    handle exists at once; it is submitted when the request it waits for is done)."""

    handles: list[RequestHandle]

    def wait(self, timeout: float | None = None) -> list[RequestResult | EngineError]:
        """Wait for every request; each entry is its result or its error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[RequestResult | EngineError] = []
        for h in self.handles:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            err = h.exception(left)
            if err is None:
                out.append(h.result(0))
            else:
                assert isinstance(err, EngineError)  # the engine fails handles with no other
                out.append(err)
        return out

Submit = Callable[[TokenArray, int, TokenArray | None], RequestHandle]  # ``Engine.submit``


def feed_workload(submit: Submit, workload: Workload, limit: int | None) -> WorkloadRun:
    """Submit the first ``limit`` (all when None) requests of ``workload`` through
    ``submit``; a request with ``after = i`` is submitted when request ``i`` is done (from the
    thread finishing it). Returns at once; ``run.wait()`` waits for all."""
    reqs = workload.requests[:limit] if limit is not None else workload.requests
    proxies = [RequestHandle() for _ in reqs]
    for r, proxy in zip(reqs, proxies, strict=True):
        feed = _Feed(submit, r, proxy)
        if r.after is None:
            feed.submit()
        else:
            proxies[r.after].add_done_callback(feed.after_done)
    return WorkloadRun(proxies)


class _Feed(NamedTuple):
    """Submits one workload request and reports its outcome on the workload's proxy handle."""

    submit_one: Submit
    request: WorkloadRequest
    proxy: RequestHandle

    def submit(self) -> None:
        r = self.request
        handle = self.submit_one(r.prompt, r.max_new_tokens, r.forced_output)
        self.proxy.id = handle.id
        handle.add_done_callback(self.copy_outcome)

    def after_done(self, done: Future[RequestResult]) -> None:
        if isinstance(done.exception(), RequestCancelled):  # a reset or close ends the workload
            self.proxy.settle(None, RequestCancelled("an earlier request was cancelled"))
            return
        self.submit()

    def copy_outcome(self, done: Future[RequestResult]) -> None:
        error = done.exception()
        if error is not None:
            assert isinstance(error, EngineError)
            self.proxy.settle(None, error)
        else:
            self.proxy.settle(done.result(), None)


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0



def percentiles(values: Sequence[float]) -> tuple[float, float]:
    """(p50, p99) of ``values``; (0, 0) for none."""
    return _percentile(values, 50), _percentile(values, 99)
