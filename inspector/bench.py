"""``radixcache bench tui``: the inspector, headless, on a big tree under a fast stream.

``BenchSource`` holds an in-process tree of ``nodes`` nodes (random short sequences, so
most nodes are leaves under a few thousand branch points) and streams, from its own thread,
a batch every 10 ms: as many Access events as keep ``events_per_s`` (50,000), a
Watermark sample every 100 ms, and, while ``changing`` is set, ``requests_per_batch`` new
requests through the tree (nodes created, split, evicted). The bench drives the app with the
Pilot through five phases -- scrolling, nodes changing, key presses, commands, fidelity -- and
reports the frame cost (the app's per-frame update: ``InspectorApp.frame``), the key latency
(key posted to the cursor moved), the events ingested per second, the memory pane's redraws
per second, a command's reply time while the source floods (enter to reply shown; the
source answers between its batches, as an engine's step loop does) and the fidelity
violations (``inspector.fidelity``) over at least ``FIDELITY_FRAMES`` checked frames.

``Path.EMBEDDED`` runs the same load through the embedded engine's path instead
(``inspector.bench_embedded``): the real service loop, its state lock and command handler,
and the feed thread; ``Path.STREAM`` (the default) applies ``BenchSource``'s batches itself.
"""

from __future__ import annotations

import asyncio
import enum
import gc
import queue
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import NamedTuple, Protocol

import numpy as np
from textual import events

from inspector.app import InspectorApp
from inspector.bench_embedded import FloodableCache, embedded_flood
from inspector.feed import Feed
from inspector.fidelity import Fidelity
from inspector.layout import TokenText
from inspector.sources import ConnState, Source, SourceStatus
from radixcache.core import events as ev
from radixcache.traffic.workloads import Vocabulary
from radixcache.wire import commands as cmd

Progress = Callable[[int, int], None]  # (done, total)
FIDELITY_FRAMES = 100
COMMANDS = ("stats", "evict 64")


class Path(enum.Enum):
    """How the bench's batches reach the inspector."""

    STREAM = "stream"  # BenchSource applies them from its own thread
    EMBEDDED = "embedded"  # an EmbeddedSource: service loop + feed thread, as `inspect` runs


class Flood(Protocol):
    """What the phases steer of the load: new nodes on or off, events streamed so far."""

    changing: threading.Event
    streamed: int


class TuiBench(NamedTuple):
    """What ``bench tui`` measured (times in ms)."""

    nodes: int
    frame_ms_p50: float
    frame_ms_p99: float
    frame_ms_p99_scroll: float
    frame_ms_p99_change: float
    key_ms_p50: float
    key_ms_p99: float
    events_per_s: float
    watermark_hz: float
    frames: int
    keys: int
    command_ms_p50: float
    command_ms_p99: float
    commands: int
    fidelity_violations: int
    fidelity_frames: int
    resync_growth_mb: float
    path: str  # Path.value: "stream" or "embedded"


def build_tree(cache: FloodableCache, nodes: int, progress: Progress | None = None) -> None:
    """Grow ``cache`` to at least ``nodes`` nodes from seeded random sequences (seed 0), then
    evict one block. The pool is twice the tree, so the build evicted nothing and the LRU heap
    re-queues lazily every leaf the build touched since it was queued: about 87,000 entries,
    270 ms alone and 600 ms beside the UI, once, on the first eviction. A full pool, as in real
    use, pays that as it goes (it evicts on nearly every allocation); paid here it would be
    the first ``evict`` command's and so the commands' p99, which measures the steady state."""
    rng = np.random.default_rng(0)
    while len(cache) < nodes:
        for _ in range(512):
            cache.serve_now(rng.integers(0, 64, int(rng.integers(3, 9)), dtype=np.uint32))
        cache.take_events()
        if progress is not None:
            progress(min(len(cache), nodes), nodes)
    cache.evict(1)
    cache.take_events()


class BenchSource:
    """A ``Source`` streaming Access floods and, while ``changing`` is set, new nodes."""

    def __init__(self, tree: FloodableCache, *, events_per_s: int = 50_000,
                 requests_per_batch: int = 4, interval: float = 0.01) -> None:
        self.tree = tree
        self.events_per_s = events_per_s
        self.requests_per_batch = requests_per_batch
        self.interval = interval
        self.changing = threading.Event()
        self.streamed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._feed: Feed | None = None
        self._rng = np.random.default_rng(1)
        self._since = time.time()
        self._inbox: queue.Queue[tuple[cmd.AnyCommand, Future[cmd.AnyReply]]] = queue.Queue()

    def start(self, feed: Feed) -> None:
        """Load the tree's snapshot and start streaming."""
        self._feed = feed
        self.tree.take_events()
        feed.load(self.tree.snapshot(), 0, time.time())
        self._thread = threading.Thread(target=self._run, name="bench-source", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seq, clock, last_wm = 1, 1 << 40, 0.0
        assert self._feed is not None
        start, owed = time.perf_counter(), 0
        while not self._stop.is_set():
            t0 = time.perf_counter()
            owed = int((t0 - start) * self.events_per_s) - self.streamed
            events: list[ev.AnyEvent] = self._commands()
            if self.changing.is_set():
                for _ in range(self.requests_per_batch):
                    tokens = self._rng.integers(0, 64, int(self._rng.integers(3, 12)),
                                                dtype=np.uint32)
                    self.tree.serve_now(tokens)  # a prompt that does not fit is refused
                events.extend(self.tree.take_events())
            for _ in range(max(0, owed - len(events))):  # keep up with the target rate
                events.append(ev.Access(0, clock))
                clock += 1
            if t0 - last_wm >= 0.1:
                last_wm = t0
                events.append(self.tree.watermark())
            self._feed.apply(ev.Batch(seq, 1, time.time(), "bench", events))
            self.streamed += len(events)
            seq += 1
            self._stop.wait(max(0.0, self.interval - (time.perf_counter() - t0)))

    def stop(self) -> None:
        """Stop streaming (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def status(self) -> SourceStatus:
        """LOCAL, named ``bench``."""
        return SourceStatus(ConnState.LOCAL, "bench", self._since, "", memory_note="bench")

    def send(self, command: cmd.AnyCommand) -> cmd.AnyReply:
        """Answered by the stream thread between two batches (10 s at most)."""
        done: Future[cmd.AnyReply] = Future()
        self._inbox.put((command, done))
        return done.result(timeout=10)

    def _commands(self) -> list[ev.AnyEvent]:
        """Serve waiting commands; their events go out in the next batch."""
        while True:
            try:
                command, done = self._inbox.get_nowait()
            except queue.Empty:
                return self.tree.take_events()
            match command:
                case cmd.Evict(tokens=tokens):
                    r = self.tree.evict(tokens)
                    done.set_result(cmd.Ok(f"evicted {r.nodes} nodes, {r.tokens} tokens"))
                case cmd.Stats():
                    done.set_result(self.tree.stats().reply())
                case _:
                    done.set_result(cmd.Error("bench: only stats and evict are served"))

    def vocabulary(self) -> TokenText:
        """The synthetic words."""
        return Vocabulary()


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _key(app: InspectorApp, name: str) -> float:
    """Post ``name`` as the terminal driver would; ms until the tree pane's cursor moved."""
    before = app.tree_pane.cursor
    t0 = time.perf_counter()
    app.post_message(events.Key(name, None))
    while app.tree_pane.cursor == before:
        await asyncio.sleep(0.001)
        if time.perf_counter() - t0 > 5:
            raise RuntimeError(f"key {name} not handled within 5 s")
    return (time.perf_counter() - t0) * 1000


class Phases(NamedTuple):
    """What the phases measured."""

    scroll: list[float]
    change: list[float]
    keys: list[float]
    events_per_s: float
    watermark_hz: float
    commands: list[float]


async def _keys(app: InspectorApp, seconds: float, pick: Callable[[], str]) -> list[float]:
    out: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        out.append(await _key(app, pick()))
        await asyncio.sleep(1 / 30)
    return out


async def _commands(app: InspectorApp, count: int) -> list[float]:
    """Type ``count`` commands one after another, each after the previous reply."""
    replies = app.commands
    for i in range(count):
        want = replies.replies + 1
        replies.submit(COMMANDS[i % len(COMMANDS)])
        while replies.replies < want:
            await asyncio.sleep(0.005)
    return list(replies.command_ms)


async def _drive(app: InspectorApp, src: Flood, seconds: float,
                 step: Callable[[str], None], check: Fidelity) -> Phases:
    """The five phases."""
    async with app.run_test(size=(160, 50)):
        while len(app.tree_pane.rows) < 2:
            await asyncio.sleep(0.05)
        memory = app.query_one("#memory")
        draws0, ev0, t_start = getattr(memory, "draws", 0), src.streamed, time.perf_counter()
        step("scrolling")
        app.frame_ms.clear()
        await _keys(app, seconds, lambda: "pagedown")
        scroll = list(app.frame_ms)
        step("nodes changing")
        src.changing.set()
        app.frame_ms.clear()
        await _keys(app, seconds, lambda: "pageup" if app.tree_pane.cursor > 5000 else "down")
        change = list(app.frame_ms)
        src.changing.clear()
        step("key presses")
        keys = await _keys(app, seconds, lambda: "down")
        took = time.perf_counter() - t_start
        events_per_s = (src.streamed - ev0) / took
        wm_hz = (getattr(memory, "draws", 0) - draws0) / took
        step("commands")
        src.changing.set()
        commands = await _commands(app, max(10, int(seconds * 5)))
        step("fidelity")
        check.every = 1
        while check.checked < FIDELITY_FRAMES:
            await asyncio.sleep(0.05)
        src.changing.clear()
    return Phases(scroll, change, keys, events_per_s, wm_hz, commands)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def resync_growth(tree: FloodableCache, times: int = 10) -> float:
    """MB the process grew over the last ``times - 5`` of ``times`` resyncs of a mirror to
    ``tree``'s snapshot, each followed by ``gc.freeze()`` as the app does after a big layout
    (0 when a dropped tree is freed; a frozen cycle would keep each one)."""
    feed, snapshot = Feed(), tree.snapshot()
    base = 0.0
    for i in range(times):
        feed.load(snapshot, i, time.time())
        gc.freeze()
        if i == 4:
            base = _rss_mb()
    return round(_rss_mb() - base, 1)


def _sources(tree: FloodableCache, path: Path) -> tuple[Source, Flood]:
    if path is Path.EMBEDDED:
        return embedded_flood(tree)
    src = BenchSource(tree)
    return src, src


def run_bench(tree: FloodableCache, nodes: int = 100_000, seconds: float = 3.0, *,
              progress: Progress | None = None, step: Callable[[str], None] | None = None,
              path: Path = Path.STREAM) -> TuiBench:
    """Grow ``tree`` (a fresh model-free cache from the CLI) to ``nodes`` nodes, run the
    phases (``seconds`` each; fidelity until 100 frames are checked) with the batches taking
    ``path``, return the figures."""
    build_tree(tree, nodes, progress)
    gc.freeze()  # the engine's tree lives in another process in real use, not in the UI's heap
    src, flood = _sources(tree, path)
    check = Fidelity(every=1 << 30)  # off until the fidelity phase
    app = InspectorApp(src, flash_s=0, check=check)
    growth = resync_growth(tree)
    p = asyncio.run(_drive(app, flood, seconds, step if step is not None else (lambda _: None),
                           check))
    frames = p.scroll + p.change
    return TuiBench(
        nodes=len(tree), frame_ms_p50=round(statistics.median(frames), 3) if frames else 0.0,
        frame_ms_p99=round(_pct(frames, 0.99), 3),
        frame_ms_p99_scroll=round(_pct(p.scroll, 0.99), 3),
        frame_ms_p99_change=round(_pct(p.change, 0.99), 3),
        key_ms_p50=round(_pct(p.keys, 0.5), 3), key_ms_p99=round(_pct(p.keys, 0.99), 3),
        events_per_s=round(p.events_per_s), watermark_hz=round(p.watermark_hz, 2),
        frames=len(frames), keys=len(p.keys),
        command_ms_p50=round(_pct(p.commands, 0.5), 3),
        command_ms_p99=round(_pct(p.commands, 0.99), 3), commands=len(p.commands),
        fidelity_violations=len(check.violations), fidelity_frames=check.checked,
        resync_growth_mb=growth, path=path.value)
