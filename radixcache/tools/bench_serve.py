"""``radixcache bench serve``: the chat workload through HTTP beside the same workload in
process, rate by rate, and at saturation.

Each pass sends the first ``rate * seconds`` requests of the chat workload (``max_tokens``
answers) at Poisson arrivals of ``rate`` per second (open loop; the next turn of a
conversation goes at its arrival or when the turn before it is answered, whichever is later),
then every request at once (saturation). The same prompts go both ways:

- ``http``: a real ``serve --http`` in a child process, streamed (``/v1/completions``,
  ``stream: true``) by aiohttp clients (``traffic.sse``: the light client serving benchmarks
  use, as it shares the machine) on one asyncio loop in this process; a prompt travels as the
  workload's text and the server tokenizes it. TTFT is the first chunk's arrival, inter-token
  latency the gaps between chunks. CPU seconds are the server's processes' (``/proc``), and
  apart from them the client's own (``client_cpu_s_per_request``).
- ``in_process``: an ``Engine`` stepped by a ``ServiceLoop`` in this process, as ``serve``
  steps it (its events going nowhere), driven by the same asyncio schedule; each prompt is the
  shipped tokenizer's ids of that same text. TTFT is the first token's hook call, inter-token
  latency the gaps between hook calls. CPU seconds are this process's.

The server's cache is flushed (``/flush_cache``) and the in-process engine reset before each
pass, so every pass starts cold; one request each way warms both up before the first. Figures
depend on the machine and its load (the JSON carries the load average); the bench asserts
nothing about them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import aiohttp
import httpx
import numpy as np

from radixcache.traffic import sse
from radixcache.traffic.load import arrivals
from radixcache.traffic.workloads import Workload, build_workload
from radixcache.wire.endpoints import free_ports

Figures = dict[str, float | int]


class BenchServeConfig(NamedTuple):
    """What the bench sends."""

    rates: tuple[float, ...] = (5.0, 20.0, 60.0)
    seconds: float = 10.0  # each rate's pass sends rate * seconds requests
    max_tokens: int = 32
    blocks: int = 4096
    seed: int = 0
    step_tokens: int = 256  # the engine's per-step token budget, both ways (serve's default)
    front_process: bool = True  # serve's HTTP front in a process of its own (serve's default)


class Timed(NamedTuple):
    """One request: when it was sent and when each piece of its answer arrived."""

    error: str | None
    sent: float
    pieces: tuple[float, ...]  # perf_counter of each chunk (HTTP) or token (in process)


def summarize(timed: Sequence[Timed], wall_s: float, cpu_s: float) -> Figures:
    """TTFT and inter-token p50/p99 (ms), requests/s and CPU s per request of one pass."""
    ok = [t for t in timed if t.error is None and t.pieces]
    ttft = [(t.pieces[0] - t.sent) * 1e3 for t in ok]
    itl = [g * 1e3 for t in ok for g in np.diff(t.pieces)]

    def pct(xs: list[float], q: float) -> float:
        return round(float(np.percentile(xs, q)), 2) if xs else 0.0

    return {"requests": len(timed), "failed": len(timed) - len(ok),
            "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99),
            "itl_ms_p50": pct(itl, 50), "itl_ms_p99": pct(itl, 99), "itl_samples": len(itl),
            "requests_per_s": round(len(ok) / wall_s, 2) if wall_s > 0 else 0.0,
            "cpu_s_per_request": round(cpu_s / len(ok), 5) if ok else 0.0,
            "wall_s": round(wall_s, 3)}


def chat_workload(requests: int, seed: int) -> Workload:
    """The chat workload cut to its first ``requests`` (a turn's predecessor is always
    earlier, so the cut is closed)."""
    conversations = min(1000, max(1, requests // 2 + 1))
    w = build_workload("chat", {"conversations": conversations, "seed": seed})
    while len(w.requests) < requests and conversations < 1000:
        conversations = min(1000, conversations * 2)
        w = build_workload("chat", {"conversations": conversations, "seed": seed})
    return cut(w, requests)


def cut(w: Workload, n: int) -> Workload:
    """``w``'s first ``n`` requests."""
    return dataclasses.replace(w, requests=w.requests[:n])


# -- one schedule, two ways of sending ------------------------------------------------------
@dataclass(slots=True)
class _Schedule:
    workload: Workload
    send: Callable[[int], asyncio.Future[Timed]]
    done: dict[int, asyncio.Event] = field(default_factory=dict)
    out: dict[int, Timed] = field(default_factory=dict)


async def _one(s: _Schedule, i: int, due: float, progress: Callable[[], None]) -> None:
    after = s.workload.requests[i].after
    if after is not None:
        await s.done[after].wait()
    await asyncio.sleep(max(0.0, due - time.perf_counter()))
    s.out[i] = await s.send(i)
    s.done[i].set()
    progress()


async def drive(workload: Workload, send: Callable[[int], asyncio.Future[Timed]],
                offsets: Sequence[float], progress: Callable[[], None]) -> tuple[list[Timed],
                                                                                 float]:
    """Send request i at ``offsets[i]`` seconds from now (after its predecessor is answered);
    every request's ``Timed`` in workload order and the wall time."""
    s = _Schedule(workload, send)
    n = len(workload.requests)
    s.done = {i: asyncio.Event() for i in range(n)}
    start = time.perf_counter()
    await asyncio.gather(*(_one(s, i, start + offsets[i], progress) for i in range(n)))
    return [s.out[i] for i in range(n)], time.perf_counter() - start


# -- through HTTP ---------------------------------------------------------------------------
class Served(NamedTuple):
    """A running ``serve --http``."""

    url: str
    pid: int
    commands: str  # its ZeroMQ command endpoint (``stats`` carries the step timeline)


def timeline(commands: str) -> dict[str, float | int]:
    """The ``timeline_*`` figures of the server's ``stats`` (its last steps)."""
    from radixcache.wire import commands as cmd
    from radixcache.wire.client import send_command

    try:
        stream = cmd.stats_reply(send_command(commands, cmd.Stats(), timeout_s=30)).stream
    except cmd.CommandError as exc:
        raise RuntimeError(f"stats: {exc}") from None
    if stream is None:
        raise RuntimeError("stats: the reply has no stream figures")
    return dict(stream.timeline)


@contextlib.contextmanager
def served(blocks: int, step_tokens: int = 256, *,
           front_process: bool = False) -> Iterator[Served]:
    """``serve --http`` in a child process (``--front-process``: its front in a grandchild),
    once ``/health`` answers."""
    port = free_ports(4)
    root = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--http",
            str(port + 3), "--blocks", str(blocks), "--step-tokens", str(step_tokens),
            "--front-process" if front_process else "--front-thread"]
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port + 3}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            why = (f"exited ({proc.returncode})" if proc.poll() is not None
                   else "did not answer /health within 120 s")
            raise RuntimeError(f"serve --http {why}")
        yield Served(url, proc.pid, f"tcp://127.0.0.1:{port + 2}")
    finally:
        proc.terminate()
        proc.wait(30)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and of its children alive now (serve's
    front process) (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        with contextlib.suppress(OSError):
            own += cpu_seconds(int(child))
    return own


async def _stream(c: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> Timed:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
    sent, pieces = time.perf_counter(), []
    try:
        async for at, chunk in sse.stream(c, f"{url}/v1/completions", body):
            choices = chunk.get("choices")
            if choices and choices[0].get("text"):
                pieces.append(at)
    except sse.StreamRefused as exc:
        return Timed(f"HTTP {exc.status}", sent, ())
    except sse.CLIENT_ERRORS as exc:
        return Timed(f"{type(exc).__name__}: {exc}", sent, ())
    return Timed(None, sent, tuple(pieces))


async def http_pass(server: Served, workload: Workload, offsets: Sequence[float],
                    max_tokens: int, progress: Callable[[], None]) -> Figures:
    """One pass through ``server`` (its cache flushed first): the server's figures and the
    client's own CPU seconds per request (``client_cpu_s_per_request``: this process's, as
    the client shares the machine with the server)."""
    url, pid = server.url, server.pid
    texts = [workload.text(r.prompt) for r in workload.requests]
    async with sse.session(1000, 300) as c:
        async with c.post(f"{url}/flush_cache") as r:
            if r.status != 200:
                raise RuntimeError(f"flush_cache answered {r.status}: {(await r.text())[:200]}")

        def send(i: int) -> asyncio.Future[Timed]:
            return asyncio.ensure_future(_stream(c, url, texts[i], max_tokens))

        cpu0, own0 = cpu_seconds(pid), time.process_time()
        timed, wall = await drive(workload, send, offsets, progress)
        out = summarize(timed, wall, cpu_seconds(pid) - cpu0)
        ok = max(1, len(timed) - int(out["failed"]))
        out["client_cpu_s_per_request"] = round((time.process_time() - own0) / ok, 5)
        return out


# -- in process -------------------------------------------------------------------------------
class InProcess:
    """An engine as ``serve`` configures it, stepped by a ``ServiceLoop`` on its thread."""

    def __init__(self, blocks: int, step_tokens: int = 256) -> None:
        import torch

        from radixcache.serving.engine import Engine, EngineConfig
        from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
        from radixcache.serving.model import tiny_model

        torch.set_num_threads(1)  # as ``serve --threads 1``
        self.engine = Engine(EngineConfig(num_blocks=blocks, model=tiny_model(),
                                          max_step_tokens=step_tokens))
        self.loop = ServiceLoop(self.engine, BatchSink(lambda _: None), LoopConfig()).start()

    def close(self) -> None:
        """Stop the loop and the engine."""
        self.loop.close()

    async def run(self, workload: Workload, offsets: Sequence[float], max_tokens: int,
                  progress: Callable[[], None]) -> Figures:
        """One pass on a reset engine."""
        from radixcache.traffic.tokenizer import shipped

        tok = shipped()
        prompts = [tok.encode(workload.text(r.prompt)) for r in workload.requests]
        with self.loop.changing() as service:
            service.reset()
            self.loop.timeline.clear()
        aio = asyncio.get_running_loop()

        def send(i: int) -> asyncio.Future[Timed]:
            fut: asyncio.Future[Timed] = aio.create_future()
            pieces: list[float] = []
            sent = time.perf_counter()
            handle = self.engine.submit(prompts[i], max_tokens,
                                        on_token=lambda _t: pieces.append(time.perf_counter()))
            self.loop.wake()

            def finished(_h: object) -> None:
                err = handle.exception()
                t = Timed(None if err is None else str(err), sent, tuple(pieces))
                aio.call_soon_threadsafe(fut.set_result, t)

            handle.add_done_callback(finished)
            return fut

        cpu0 = time.process_time()
        timed, wall = await drive(workload, send, offsets, progress)
        return summarize(timed, wall, time.process_time() - cpu0)


# -- the whole bench ----------------------------------------------------------------------------
Progress = Callable[[str, int, int], None]  # (pass name, done, total)


def _counter(progress: Progress, name: str, total: int) -> Callable[[], None]:
    done = [0]
    progress(name, 0, total)

    def tick() -> None:
        done[0] += 1
        progress(name, done[0], total)

    return tick


def run(config: BenchServeConfig, progress: Progress) -> dict[str, object]:
    """Every rate, then saturation, through HTTP and in process (see the module doc); with
    each pass's step timeline (``serving.timeline``: the server's last steps, the in-process
    loop's steps of that pass)."""
    counts = [max(1, round(rate * config.seconds)) for rate in config.rates]
    workload = chat_workload(max(counts), config.seed)
    inproc = InProcess(config.blocks, config.step_tokens)
    rates: list[dict[str, object]] = []
    timelines: list[dict[str, object]] = []
    warm = cut(workload, 1)  # one request each way first: the first forward pays for setup
    passes = [(rate, cut(workload, n), arrivals(n, rate, config.seed))
              for rate, n in zip(config.rates, counts, strict=True)]
    passes.append((0.0, workload, [0.0] * len(workload.requests)))  # 0: saturated
    try:
        with served(config.blocks, config.step_tokens,
                    front_process=config.front_process) as server:
            asyncio.run(http_pass(server, warm, [0.0], 2, lambda: None))
            asyncio.run(inproc.run(warm, [0.0], 2, lambda: None))
            for rate, w, offsets in passes:
                n, name = len(w.requests), f"{rate:g}/s" if rate else "saturated"
                row: dict[str, object] = {"rate": rate, "requests": n}
                row["http"] = asyncio.run(http_pass(server, w, offsets, config.max_tokens,
                                                    _counter(progress, f"{name} http", n)))
                timelines.append({"pass": f"{name} http", **timeline(server.commands)})
                row["in_process"] = asyncio.run(inproc.run(
                    w, offsets, config.max_tokens, _counter(progress, f"{name} in process", n)))
                timelines.append({"pass": f"{name} in process",
                                  **inproc.loop.timeline.figures()})
                rates.append(row)
    finally:
        inproc.close()
    saturated = rates.pop()
    del saturated["rate"]
    return {"workload": "chat", "max_tokens": config.max_tokens, "seconds": config.seconds,
            "blocks": config.blocks, "step_tokens": config.step_tokens,
            "front": "process" if config.front_process else "thread",
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "rates": rates, "saturated": saturated, "timelines": timelines}
