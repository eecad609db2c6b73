"""The running requests and the model that advances them (continuous batching).

Each step: decodes first, one token per running request that has output, then prefill chunks
of the requests still prefilling, in admission order, up to ``max_step_tokens`` in all. All of
them go through one model forward, unless the padded attention layout would waste more than
it computes (``_wasteful``): every sequence's queries are padded to the longest chunk and its
keys to the longest context, so decodes padded to a long prefill chunk, or 29 short decodes
padded to one 2,000-token context (16.4 ms against 2.1 ms for two forwards, tiny model, one
CPU thread), cost more than another forward. Then the prefills run in one forward and the
decodes in as few as keep each one's waste in bounds, shortest contexts first
(``_by_context``). ``Running`` knows the model and the pool's K/V, never the tree: the plan's
releases go through the ``Admission`` it is handed, and the engine settles what finished
(insert, unpin) and counts it.

A step executes the scheduler's ``StepPlan`` (``serving.admission``): its first forward runs
every prefill chunk and makes ``plan.copies`` after each layer's writes. Right after the
forward that ended prefills, ``Admission.release`` caches their prompts and admits the waiting
requests the plan holds for them (``plan.releases``), and their prefill chunks run in the same
step, with what is left of ``max_step_tokens`` (in the decodes' forward when that adds no
padding, else in one more), so a held request waits for its sharer's prefill forward, not for
the rest of the step and the next one::

    step(plan):  prefills ──▶ release(prefilled): insert, admit held ──▶ decodes + their prefills

When a prefill that ``plan.releases`` names ends in this step, the first forward runs the
prefills alone, and the decodes go with the released requests' prefills: as many forwards as
before (the released chunks needed one of their own), and the held requests wait for a
prefill forward, not for one with every running request's decode in it.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

from radixcache.serving.admission import Admission, Released, StepPlan
from radixcache.serving.model import Model, SeqInput, SlotCopy
from radixcache.serving.requests import Request

Planned = list[tuple[Request, SeqInput]]


class Work(NamedTuple):
    """What one ``Running.step`` computed."""

    sequences: int
    prefill_tokens: int  # prompt tokens computed (the prefill chunks)
    decode_tokens: int
    forwards: int
    prefilled: list[Request]  # their prefill ended after the release (if any): not cached yet
    released: Released  # admitted (or refused) by the release, mid-step


def _choose(r: Request, logits: torch.Tensor, greedy: int) -> int:
    """The request's next token: forced (a trace's answer), its policy's, else greedy."""
    if r.forced is not None:
        return int(r.forced[len(r.output)])
    return r.policy.choose(logits) if r.policy is not None else int(greedy)


class Running:
    """The admitted requests, in admission order (see the module doc). Not thread-safe: the
    engine's stepping thread owns it."""

    def __init__(self, model: Model, kv: torch.Tensor, max_step_tokens: int) -> None:
        self.model, self.kv, self.max_step_tokens = model, kv, max_step_tokens
        self.split = split_pairs(kv.device)
        self.requests: list[Request] = []
        self.forward_s = 0.0  # seconds in ``model.forward`` since start

    def __len__(self) -> int:
        return len(self.requests)

    def step(self, plan: StepPlan, admission: Admission) -> Work:
        """Execute ``plan`` (see the module doc): lay out this step's decodes and prefill
        chunks, run the forward(s), append each request's next token (a prefill's only once
        its last chunk ran). ``admission`` releases the held requests after the first
        forward; the ones it admits join ``requests``."""
        decodes, prefills = self._plan()
        work = decodes + prefills
        prefilled: list[Request] = []
        released = Released()
        late: Planned = []
        groups = [work] if work else []
        if _wasteful(work, self.split):
            groups = ([prefills] if prefills else []) + _by_context(decodes, self.split)
        elif decodes and prefills and plan.releasing(_ending(prefills)):
            groups = [prefills, decodes]  # the held requests' prefills join the decodes
        forwards = 0
        while groups:
            self._forward(groups.pop(0), prefilled, plan.copies if not forwards else None)
            forwards += 1
            if forwards == 1 and prefilled:
                released = admission.release(plan, prefilled, self.requests)
                self.requests.extend(released.admitted)
                prefilled = []
                late = self._chunks(list(released.admitted),
                                    self.max_step_tokens - _tokens(work))
                if late and groups and not _wasteful(groups[0] + late, self.split):
                    groups[0] = groups[0] + late  # with the decodes: one forward, not two
                elif late:
                    groups.append(late)
        return Work(len(work) + len(late), _tokens(prefills) + _tokens(late), len(decodes),
                    forwards, prefilled, released)

    def take_done(self) -> list[Request]:
        """Remove and return the requests that produced all their tokens."""
        done = [r for r in self.requests if len(r.output) == r.max_new]
        if done:
            self.requests = [r for r in self.requests if len(r.output) < r.max_new]
        return done

    def take(self, ids: set[int]) -> list[Request]:
        """Remove and return the running requests whose id is in ``ids`` (aborted)."""
        gone = [r for r in self.requests if r.id in ids]
        if gone:
            self.requests = [r for r in self.requests if r.id not in ids]
        return gone

    def take_all(self) -> list[Request]:
        """Remove and return every running request (reset, close)."""
        out, self.requests = self.requests, []
        return out

    def _plan(self) -> tuple[Planned, Planned]:
        decodes = [(r, r.next_input()) for r in self.requests if not r.prefilling]
        return decodes, self._chunks(self.requests, self.max_step_tokens - len(decodes))

    @staticmethod
    def _chunks(requests: list[Request], budget: int) -> Planned:
        """Prefill chunks of the ``requests`` still prefilling, in order, ``budget`` tokens in
        all."""
        prefills: Planned = []
        for r in requests:
            if budget <= 0:
                break
            if not r.prefilling:
                continue
            assert r.lease is not None
            n = min(len(r.fill) - r.computed, budget)
            chunk = r.fill[r.computed : r.computed + n]
            prefills.append((r, SeqInput(chunk, r.computed, r.lease.table)))
            budget -= n
        return prefills

    def take_failed(self) -> list[Request]:
        """Remove and return the requests a step failed (``Request.error`` set)."""
        failed = [r for r in self.requests if r.error is not None]
        if failed:
            self.requests = [r for r in self.requests if r.error is None]
        return failed

    def _forward(self, group: Planned, prefilled: list[Request],
                 copy: SlotCopy | None = None) -> None:
        """Run the model over ``group`` and advance its requests. A forward that raises fails
        every request of ``group`` (their K/V writes went to slots only they hold), unless
        one of them published its prompt before computing it: then blocks the tree holds
        are half written, and ``CorruptStep`` says so (the engine cannot go on)."""
        t0 = time.perf_counter()
        try:
            logits = self.model.forward([s for _, s in group], self.kv, copy)
        except Exception as exc:  # the requests of this forward fail, the engine steps on
            if any(r.published and r.computed < len(r.prompt) for r, _ in group):
                raise CorruptStep(f"the model's forward failed while it wrote blocks already"
                                  f" in the tree: {_one_line(exc)}") from exc
            for r, _ in group:
                r.error = f"the model's forward over its batch raised {_one_line(exc)}"
            return
        finally:
            self.forward_s += time.perf_counter() - t0  # the step timeline's forward phase
        self._advance(group, logits, prefilled)

    @staticmethod
    def _advance(group: Planned, logits: torch.Tensor, prefilled: list[Request]) -> None:
        now = time.perf_counter()
        # one argmax and one device sync per forward, skipped when every token is forced
        free = any(r.forced is None for r, _ in group)
        greedy = logits.argmax(-1).tolist() if free else []
        for i, (r, s) in enumerate(group):
            first = s.start < len(r.fill)  # a prefill chunk (after a retraction: a refill)
            r.computed = s.start + len(s.tokens)
            if first:
                if r.computed < len(r.fill):
                    continue  # an inner prefill chunk: no token yet
                if not r.output:
                    r.first_token_at = now
            n = len(r.output)
            try:
                _next_token(r, logits[i], greedy[i] if free else 0)
            except Exception as exc:  # its sampler or its hook: it fails, the others go on
                r.error = f"choosing or streaming its token {n} raised {_one_line(exc)}"
                continue
            if first:
                prefilled.append(r)


class CorruptStep(RuntimeError):
    """A step failed in a way that left the cache wrong (blocks in the tree half written): the
    engine must stop, loudly, rather than serve from them."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}".rstrip(": ")


def _next_token(r: Request, logits: torch.Tensor, greedy: int) -> None:
    """Append ``r``'s next token (forced, its policy's, else ``greedy``) and tell its hook."""
    r.output.append(_choose(r, logits, greedy))
    if r.on_token is not None:
        r.on_token(r.output[-1])
    if r.policy is not None and r.policy.stops_at(r.output[-1]):
        r.max_new = len(r.output)  # finishes this step, cached as if it had run out
    if r.keep_logits:
        r.logits.append(logits.detach().to("cpu", copy=True))


def prefill_ends(requests: list[Request], r: Request, max_step_tokens: int) -> bool:
    """Whether ``r``'s prefill ends in the next step's first forward over ``requests`` (the
    running ones, in admission order): as ``Running._plan`` lays the step out, decodes first,
    then prefill chunks in order, so every prefill before ``r`` and its own must fit what the
    decodes leave of ``max_step_tokens``."""
    left = max_step_tokens - sum(1 for q in requests if not q.prefilling)
    for q in requests:
        if q.prefilling:
            left -= len(q.fill) - q.computed
            if q is r:
                return left >= 0
    return False


def _tokens(planned: Planned) -> int:
    return sum(len(s.tokens) for _, s in planned)


def _ending(prefills: Planned) -> set[int]:
    """The requests whose last prefill chunk is in ``prefills``."""
    return {r.id for r, s in prefills if s.start + len(s.tokens) == len(r.fill)}


# The waste one forward may carry before another forward is cheaper: query-key pairs of
# padding, beyond as many as it computes. On a CPU a forward's fixed cost is about that of
# 4,000 pairs (0.8 ms against 0.19 us a pair, tiny model, one thread). On a GPU a padded pair
# costs about a thousandth of that and a forward's launches about as much: an estimate, not
# yet measured there (no GPU was at hand), so that it does not split where it should not.
SPLIT_PAIRS = 4096
GPU_SPLIT_PAIRS = 4096 * 1024


def split_pairs(device: torch.device) -> int:
    """The padding one forward may waste on ``device`` (see ``SPLIT_PAIRS``)."""
    return SPLIT_PAIRS if device.type == "cpu" else GPU_SPLIT_PAIRS


def _pairs(planned: Planned) -> tuple[int, int]:
    """(query-key pairs the padded layout computes, pairs the sequences need)."""
    most_new = most_ctx = need = 0
    for _, s in planned:
        n = len(s.tokens)
        ctx = s.start + n
        most_new, most_ctx = max(most_new, n), max(most_ctx, ctx)
        need += n * ctx
    return len(planned) * most_new * most_ctx, need


def _over(padded: int, need: int, split: int) -> bool:
    """The rule: padding wastes more than the forward computes, and more than ``split``."""
    return padded - need > max(need, split)


def _wasteful(planned: Planned, split: int = SPLIT_PAIRS) -> bool:
    """Whether one forward over ``planned`` would waste more on padding than it computes
    (and more than ``split`` pairs)."""
    return len(planned) > 1 and _over(*_pairs(planned), split)


def _by_context(planned: Planned, split: int = SPLIT_PAIRS) -> list[Planned]:
    """``planned`` in forwards of similar contexts, shortest first, each one not
    ``_wasteful`` (greedy, in one pass: sorted by context, the longest is the last added)."""
    groups: list[Planned] = []
    group: Planned = []
    most_new = need = 0
    for item in sorted(planned, key=lambda p: p[1].start + len(p[1].tokens)):
        n = len(item[1].tokens)
        ctx = item[1].start + n
        new, more = max(most_new, n), need + n * ctx
        if group and _over((len(group) + 1) * new * ctx, more, split):
            groups.append(group)
            group, new, more = [], n, n * ctx
        group.append(item)
        most_new, need = new, more
    return [*groups, group] if group else groups
