"""``radixcache bench http``: a hostile client against ``serve --http`` in its own process.

Four phases, each one figure the HTTP front promises:

1. ``/health`` every 10 ms while four 1M-character prompts arrive at once (refused: they
   cannot fit the context): its p50/p99 latency and the four statuses;
2. ``leavers`` clients ask for ``max_tokens`` 30,000 and leave after 0.5 s; then a 2-token
   request's latency, and what the engine still runs or queues (nothing, once the aborts land);
3. ``concurrent`` 2-token requests at once: how many were answered;
4. 200 prompts of one 900 KB word: the server's RSS before and after.

The server is ``python -m cli.main serve --http`` on free loopback ports; its RSS is read from
``/proc``. Figures depend on the machine and its load (report ``uptime`` beside them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import httpx
import numpy as np

from radixcache.tools.bench_serve import served


class BenchHttpConfig(NamedTuple):
    """What the bench sends."""

    blocks: int = 2048
    leavers: int = 300
    concurrent: int = 500
    big_prompts: int = 200
    big_chars: int = 900_000


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _health_under_big_prompts(c: httpx.AsyncClient, url: str) -> dict[str, object]:
    big = {"prompt": "x" * 1_000_000, "max_tokens": 1}
    posts = [asyncio.ensure_future(c.post(f"{url}/v1/completions", json=big))
             for _ in range(4)]
    times: list[float] = []
    start = time.perf_counter()
    while not all(p.done() for p in posts) or time.perf_counter() - start < 2.0:
        t0 = time.perf_counter()
        await c.get(f"{url}/health")
        times.append((time.perf_counter() - t0) * 1e3)
        await asyncio.sleep(0.01)
    statuses = sorted(p.result().status_code for p in posts)
    return {"health_p50_ms": float(np.percentile(times, 50)),
            "health_p99_ms": float(np.percentile(times, 99)), "health_samples": len(times),
            "big_prompt_statuses": statuses}


async def _leave(c: httpx.AsyncClient, url: str) -> None:
    body = {"prompt": "tell me everything", "max_tokens": 30_000, "stream": True}
    with contextlib.suppress(TimeoutError, httpx.HTTPError):
        async with asyncio.timeout(0.5), c.stream("POST", f"{url}/v1/completions",
                                                 json=body) as r:
            async for _ in r.aiter_bytes():
                pass


async def _after_leavers(c: httpx.AsyncClient, url: str, n: int) -> dict[str, object]:
    await asyncio.gather(*(_leave(c, url) for _ in range(n)))
    t0 = time.perf_counter()
    r = await c.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    answer_ms = (time.perf_counter() - t0) * 1e3
    await asyncio.sleep(0.5)
    [load] = (await c.get(f"{url}/get_load")).json()
    return {"leavers": n, "after_leavers_status": r.status_code,
            "after_leavers_answer_ms": answer_ms,
            "left_running": load["num_running_reqs"], "left_waiting": load["num_waiting_reqs"]}


async def _concurrent(c: httpx.AsyncClient, url: str, n: int) -> dict[str, object]:
    body = {"prompt": "a short question", "max_tokens": 2}
    rs = await asyncio.gather(*(c.post(f"{url}/v1/completions", json=body) for _ in range(n)),
                              return_exceptions=True)
    ok = sum(1 for r in rs if isinstance(r, httpx.Response) and r.status_code == 200)
    return {"concurrent_requests": n, "concurrent_answered": ok}


async def _big_words(c: httpx.AsyncClient, url: str, pid: int, n: int,
                     chars: int) -> dict[str, object]:
    before = rss_mb(pid)
    statuses: dict[int, int] = {}
    for i in range(n):
        word = chr(ord("a") + i % 26) * chars
        r = await c.post(f"{url}/v1/completions", json={"prompt": word, "max_tokens": 1})
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
    return {"big_word_prompts": n, "big_word_statuses": statuses,
            "rss_before_mb": before, "rss_growth_mb": rss_mb(pid) - before}


def run(config: BenchHttpConfig, phase: Callable[[str], None]) -> dict[str, object]:
    """Every phase against one fresh server; ``phase(name)`` as each starts."""
    async def main(url: str, pid: int) -> dict[str, object]:
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
        out: dict[str, object] = {"blocks": config.blocks}
        async with httpx.AsyncClient(timeout=120, limits=limits) as c:
            phase("health under four 1M-character prompts")
            out.update(await _health_under_big_prompts(c, url))
            phase(f"{config.leavers} clients that leave")
            out.update(await _after_leavers(c, url, config.leavers))
            phase(f"{config.concurrent} concurrent requests")
            out.update(await _concurrent(c, url, config.concurrent))
            phase(f"{config.big_prompts} prompts of a {config.big_chars:,}-character word")
            out.update(await _big_words(c, url, pid, config.big_prompts, config.big_chars))
        return out

    with served(config.blocks) as server:  # serve's own step budget (512 tokens)
        return asyncio.run(main(server.url, server.pid))
