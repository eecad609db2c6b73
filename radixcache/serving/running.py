"""The running requests and the model that advances them (continuous batching).

Each step: decodes first, one token per running request that has output, then prefill chunks
of the requests still prefilling, in admission order, up to ``max_step_tokens`` in all. All of
them go through one model forward, unless the padded attention layout would waste more than
half of its work (decodes padded to a long prefill chunk): then the step runs two forwards,
decodes and prefills. ``Running`` knows the model and the pool's K/V, never the tree: the
engine settles what finished (insert, unpin) and counts it.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

from radixcache.serving.model import SeqInput, TinyTransformer
from radixcache.serving.requests import Request

Planned = list[tuple[Request, SeqInput]]


class Work(NamedTuple):
    """What one ``Running.step`` computed."""

    sequences: int
    prefill_tokens: int  # prompt tokens computed (the prefill chunks)
    decode_tokens: int
    forwards: int
    prefilled: list[Request]  # their prefill ended: the first output token was chosen


def _choose(r: Request, logits: torch.Tensor, greedy: int) -> int:
    """The request's next token: forced (a trace's answer), its policy's, else greedy."""
    if r.forced is not None:
        return int(r.forced[len(r.output)])
    return r.policy.choose(logits) if r.policy is not None else int(greedy)


class Running:
    """The admitted requests, in admission order (see the module doc). Not thread-safe: the
    engine's stepping thread owns it."""

    def __init__(self, model: TinyTransformer, kv: torch.Tensor, max_step_tokens: int) -> None:
        self.model, self.kv, self.max_step_tokens = model, kv, max_step_tokens
        self.requests: list[Request] = []

    def __len__(self) -> int:
        return len(self.requests)

    def step(self) -> Work:
        """Plan this step's decodes and prefill chunks, run the forward(s), append each
        request's next token (a prefill's only once its last chunk ran)."""
        decodes, prefills = self._plan()
        prefilled: list[Request] = []
        forwards = self._forward(decodes, prefills, prefilled)
        return Work(len(decodes) + len(prefills), sum(len(s.tokens) for _, s in prefills),
                    len(decodes), forwards, prefilled)

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
        decodes = [(r, r.next_input()) for r in self.requests if r.output]
        budget = self.max_step_tokens - len(decodes)
        prefills: Planned = []
        for r in self.requests:
            if budget <= 0:
                break
            if r.output:
                continue
            assert r.lease is not None
            n = min(len(r.prompt) - r.computed, budget)
            chunk = r.prompt[r.computed : r.computed + n]
            prefills.append((r, SeqInput(chunk, r.computed, r.lease.table)))
            budget -= n
        return decodes, prefills

    def _forward(self, decodes: Planned, prefills: Planned, prefilled: list[Request]) -> int:
        """Run the model over the planned sequences; returns the number of forwards."""
        work = decodes + prefills
        if not work:
            return 0
        total = sum(len(s.tokens) for _, s in work)
        longest = max(len(s.tokens) for _, s in work)
        groups = [work]
        if decodes and prefills and len(work) * longest > 2 * total:
            groups = [decodes, prefills]  # padding decodes to a long chunk would dominate
        for group in groups:
            logits = self.model.forward([s for _, s in group], self.kv)
            self._advance(group, logits, prefilled)
        return len(groups)

    @staticmethod
    def _advance(group: Planned, logits: torch.Tensor, prefilled: list[Request]) -> None:
        now = time.perf_counter()
        # one argmax and one device sync per forward, skipped when every token is forced
        free = any(r.forced is None for r, _ in group)
        greedy = logits.argmax(-1).tolist() if free else []
        for i, (r, s) in enumerate(group):
            r.computed = s.start + len(s.tokens)
            if not r.output:
                if r.computed < len(r.prompt):
                    continue  # an inner prefill chunk: no token yet
                r.first_token_at = now
                prefilled.append(r)
            r.output.append(_choose(r, logits[i], greedy[i] if free else 0))
            if r.on_token is not None:
                r.on_token(r.output[-1])
            if r.policy is not None and r.policy.stops_at(r.output[-1]):
                r.max_new = len(r.output)  # finishes this step, cached as if it had run out
            if r.keep_logits:
                r.logits.append(logits[i].detach().to("cpu", copy=True))
