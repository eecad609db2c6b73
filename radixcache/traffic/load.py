"""An open-loop HTTP client: a workload sent as text to any OpenAI ``/v1/completions`` URL.

Request i is due at the i-th arrival of a Poisson process of ``rate`` per second (seeded),
whatever the earlier replies did (open loop); a dependent request (the next turn of a chat)
goes at its arrival time or when the turn before it is answered, whichever is later, because
its prompt carries that answer. Like a chat client, the next turn's prompt is the previous
prompt, the server's real answer, then the workload's new message -- so the engine's cached
``prompt + answer`` is a prefix of what comes next, as in production. Prompts and answers
travel as text, so a router that routes on text (sglang-router's ``cache_aware``) sees what it
would see in production: a workload's token ids become its words (``Workload.text``), which
the server encodes with the shipped tokenizer (``traffic.tokenizer``); the template markers
(``<bos>``, ``<hdr>``, ...) are its special tokens. As in production, the server re-encodes
the previous answer's text, which may split into other tokens than it was generated as, so a
next turn hits at least the previous prompt and at most all of it plus the answer.

Every request streams (``stream: true``, over ``traffic.sse``'s aiohttp client): the time to
first token is the first chunk's arrival; ``stream_options.include_usage`` brings the cached
prompt tokens back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import aiohttp
import numpy as np

from radixcache.traffic import sse
from radixcache.traffic.workloads import Workload, WorkloadRequest


class Reply(NamedTuple):
    """One answered (or failed) request."""

    request: int  # its index in the workload
    error: str | None  # why it failed; None when answered
    prompt_tokens: int  # as the server counted them
    cached_tokens: int
    output_tokens: int
    answer: str
    ttft_ms: float
    latency_ms: float

    @property
    def ok(self) -> bool:
        """Answered."""
        return self.error is None


@dataclass(slots=True)
class LoadResult:
    """Every reply, in workload order, and the wall time of the whole run."""

    replies: list[Reply]
    wall_s: float

    @property
    def failed(self) -> list[Reply]:
        """Replies that carry an error."""
        return [r for r in self.replies if not r.ok]

    def summary(self) -> dict[str, float | int]:
        """Requests, failures, TTFT p50/p99 (ms), output tokens/s, requests/s, hit rate."""
        ok = [r for r in self.replies if r.ok]
        ttft = np.asarray([r.ttft_ms for r in ok] or [0.0])
        prompt = sum(r.prompt_tokens for r in ok)
        wall = self.wall_s or 1e-9
        return {"requests": len(self.replies), "failed": len(self.replies) - len(ok),
                "ttft_p50_ms": float(np.percentile(ttft, 50)),
                "ttft_p99_ms": float(np.percentile(ttft, 99)),
                "output_tokens_per_s": sum(r.output_tokens for r in ok) / wall,
                "requests_per_s": len(ok) / wall,
                "hit_rate": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0}


class LoadConfig(NamedTuple):
    """How to send: ``rate`` requests/s (Poisson), answers of at most ``max_tokens``."""

    url: str
    rate: float
    max_tokens: int = 16
    model: str = "radixcache-tiny"
    seed: int = 0
    timeout_s: float = 300.0
    # a refused connection reached no server (a router restarting): sent again for this long
    connect_retry_s: float = 30.0


@dataclass(slots=True)
class _Run:
    config: LoadConfig
    workload: Workload
    on_reply: Callable[[Reply], None] | None
    sent: dict[int, str] = field(default_factory=dict)  # index -> prompt + answer text
    done: dict[int, asyncio.Event] = field(default_factory=dict)
    replies: dict[int, Reply] = field(default_factory=dict)


def _prompt(run: _Run, r: WorkloadRequest) -> str:
    """``r``'s prompt as text, with the turn it follows replaced by what was really said."""
    w = run.workload
    if r.after is None or r.after not in run.sent:
        return w.text(r.prompt)
    before = w.requests[r.after]
    known = before.prompt.tolist()
    if before.forced_output is not None:
        known += before.forced_output.tolist()
    if r.prompt[: len(known)].tolist() != known:
        return w.text(r.prompt)  # not a continuation: send it as built
    return f"{run.sent[r.after]} {w.text(r.prompt[len(known):])}"


class _Answer(NamedTuple):
    text: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_ms: float


async def _post(client: aiohttp.ClientSession, run: _Run, prompt: str,
                max_tokens: int) -> _Answer:
    """Stream one completion."""
    body = {"model": run.config.model, "prompt": prompt, "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    t0, first, text = time.perf_counter(), 0.0, []
    usage: dict[str, int | dict[str, int]] = {}
    async for at, chunk in sse.stream(client, f"{run.config.url}/v1/completions", body):
        if "error" in chunk:
            raise RuntimeError(str(chunk["error"].get("message")))
        if chunk.get("choices"):
            first = first or at
            text.append(chunk["choices"][0].get("text") or "")
        usage = chunk.get("usage") or usage
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
    return _Answer("".join(text), int(usage.get("prompt_tokens", 0)),  # type: ignore[arg-type]
                   int(cached), int(usage.get("completion_tokens", 0)),  # type: ignore[arg-type]
                   (first - t0) * 1e3)


async def _post_retrying(client: aiohttp.ClientSession, run: _Run, prompt: str,
                         max_tokens: int) -> _Answer:
    """``_post``, sent again every 0.1 s while the connection is refused (nothing was sent:
    a router being restarted), for at most ``connect_retry_s``."""
    give_up = time.perf_counter() + run.config.connect_retry_s
    while True:
        try:
            return await _post(client, run, prompt, max_tokens)
        except sse.Refused:
            if time.perf_counter() > give_up:
                raise
            await asyncio.sleep(0.1)


async def _one(client: aiohttp.ClientSession, run: _Run, i: int, due: float) -> None:
    r = run.workload.requests[i]
    if r.after is not None:
        await run.done[r.after].wait()
    await asyncio.sleep(max(0.0, due - time.perf_counter()))
    prompt = _prompt(run, r)
    cap = min(r.max_new_tokens or run.config.max_tokens, run.config.max_tokens)
    t0 = time.perf_counter()
    try:
        a = await _post_retrying(client, run, prompt, cap)
        reply = Reply(i, None, a.prompt_tokens, a.cached_tokens, a.output_tokens, a.text,
                      a.ttft_ms, (time.perf_counter() - t0) * 1e3)
        run.sent[i] = prompt + a.text
    except (*sse.CLIENT_ERRORS, RuntimeError, ValueError) as exc:
        reply = Reply(i, f"{type(exc).__name__}: {exc}", 0, 0, 0, "", 0.0, 0.0)
    run.replies[i] = reply
    run.done[i].set()
    if run.on_reply is not None:
        run.on_reply(reply)


def arrivals(count: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start of each of ``count`` Poisson arrivals at ``rate`` per second."""
    gaps = np.random.default_rng([7, seed]).exponential(1.0 / rate, size=count)
    return [float(t) for t in np.cumsum(gaps)]


async def run_load(config: LoadConfig, workload: Workload,
                   on_reply: Callable[[Reply], None] | None = None,
                   times: Sequence[float] | None = None) -> LoadResult:
    """Send every request of ``workload`` (see the module doc) and wait for all replies.
    ``on_reply`` is called on the event loop as each one ends (a progress bar). ``times``:
    each request's send time (seconds from the start, a trace's timestamps) instead of
    Poisson arrivals at ``config.rate``."""
    if config.rate <= 0 and times is None:
        raise ValueError(f"rate must be > 0, got {config.rate}")
    run = _Run(config, workload, on_reply)
    n = len(workload.requests)
    run.done = {i: asyncio.Event() for i in range(n)}
    start = time.perf_counter()
    offsets = list(times) if times is not None else arrivals(n, config.rate, config.seed)
    due = [start + t for t in offsets]
    async with sse.session(256, config.timeout_s) as client:
        await asyncio.gather(*(_one(client, run, i, due[i]) for i in range(n)))
    return LoadResult([run.replies[i] for i in range(n)], time.perf_counter() - start)


def load(config: LoadConfig, workload: Workload,
         on_reply: Callable[[Reply], None] | None = None,
         times: Sequence[float] | None = None) -> LoadResult:
    """``run_load`` in a fresh event loop (blocks until every reply is in)."""
    return asyncio.run(run_load(config, workload, on_reply, times))

