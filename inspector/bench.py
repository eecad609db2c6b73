"""``radixcache bench tui``: the inspector, headless, on a big tree under a fast stream.

``BenchSource`` holds an in-process tree of ``nodes`` nodes (random short sequences, so
most nodes are leaves under a few thousand branch points) and streams, from its own thread,
a batch every 10 ms: as many Access events as keep ``events_per_s`` (50,000), a
Watermark sample every 100 ms, and, while ``changing`` is set, ``requests_per_batch`` new
requests through the tree (nodes created, split, evicted). The bench drives the app with the
Pilot through three phases -- scrolling, nodes changing, key presses -- and reports the frame
cost (the app's per-frame update: ``InspectorApp.frame``), the key latency (key posted to
handled), the events ingested per second and the memory pane's redraws per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import statistics
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from textual import events
from textual.pilot import Pilot

from inspector.app import InspectorApp
from inspector.feed import Feed
from inspector.layout import TokenText
from inspector.sources import ConnState, SourceStatus
from radixcache.core import events as ev
from radixcache.core.pool import KVPool
from radixcache.core.tree import RadixTree, TreeError
from radixcache.serving.driver import serve_request
from radixcache.traffic.workloads import Vocabulary
from radixcache.wire import commands as cmd

Progress = Callable[[int, int], None]  # (done, total)


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


def build_tree(nodes: int, progress: Progress | None = None) -> RadixTree:
    """A tree of at least ``nodes`` nodes from seeded random sequences (seed 0)."""
    tree = RadixTree(KVPool(nodes * 2 + 4096, 16))
    rng = np.random.default_rng(0)
    while len(tree) < nodes:
        for _ in range(512):
            serve_request(tree, rng.integers(0, 64, int(rng.integers(3, 9)), dtype=np.uint32))
        tree.take_events()
        if progress is not None:
            progress(min(len(tree), nodes), nodes)
    return tree


class BenchSource:
    """A ``Source`` streaming Access floods and, while ``changing`` is set, new nodes."""

    def __init__(self, tree: RadixTree, *, events_per_s: int = 50_000,
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
            events: list[ev.AnyEvent] = []
            if self.changing.is_set():
                for _ in range(self.requests_per_batch):
                    tokens = self._rng.integers(0, 64, int(self._rng.integers(3, 12)),
                                                dtype=np.uint32)
                    with contextlib.suppress(TreeError):
                        serve_request(self.tree, tokens)
                events.extend(self.tree.take_events())
            for _ in range(max(0, owed - len(events))):  # keep up with the target rate
                events.append(ev.Access(0, clock))
                clock += 1
            if t0 - last_wm >= 0.1:
                last_wm = t0
                a = self.tree.alloc
                events.append(ev.Watermark(a.used_count, a.num_blocks, self.tree.high,
                                           self.tree.low, None, None))
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
        """Commands are not part of the bench."""
        return cmd.Error("bench: commands are not served")

    def vocabulary(self) -> TokenText:
        """The synthetic words."""
        return Vocabulary()


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _key(app: InspectorApp, pilot: Pilot[None], name: str) -> float:
    """Post ``name`` as the terminal driver would; ms until the tree pane handled it."""
    before = app.tree_pane.key_handled_at
    t0 = time.perf_counter()
    app.post_message(events.Key(name, None))
    while app.tree_pane.key_handled_at == before:
        await asyncio.sleep(0.001)
        if time.perf_counter() - t0 > 5:
            raise RuntimeError(f"key {name} not handled within 5 s")
    return (app.tree_pane.key_handled_at - t0) * 1000


async def _drive(app: InspectorApp, src: BenchSource, seconds: float,
                 step: Callable[[str], None]) -> tuple[list[float], list[float], list[float],
                                                        float, float]:
    """The three phases; returns (scroll frames, change frames, key ms, events/s, wm Hz)."""
    async with app.run_test(size=(160, 50)) as pilot:
        while len(app.tree_pane.rows) < 2:
            await pilot.pause(0.05)
        memory = app.query_one("#memory")
        draws0, ev0, t_start = getattr(memory, "draws", 0), src.streamed, time.perf_counter()
        step("scrolling")
        app.frame_ms.clear()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            await _key(app, pilot, "pagedown")
            await asyncio.sleep(1 / 30)
        scroll = list(app.frame_ms)
        step("nodes changing")
        src.changing.set()
        app.frame_ms.clear()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            await _key(app, pilot, "pageup" if app.tree_pane.cursor > 5000 else "down")
            await asyncio.sleep(1 / 30)
        change = list(app.frame_ms)
        src.changing.clear()
        step("key presses")
        keys: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            keys.append(await _key(app, pilot, "down"))
            await asyncio.sleep(0.05)
        took = time.perf_counter() - t_start
        events_per_s = (src.streamed - ev0) / took
        wm_hz = (getattr(memory, "draws", 0) - draws0) / took
    return scroll, change, keys, events_per_s, wm_hz


def run_bench(nodes: int = 100_000, seconds: float = 3.0, *,
              progress: Progress | None = None,
              step: Callable[[str], None] | None = None) -> TuiBench:
    """Build the tree, run the three phases of ``seconds`` each, return the figures."""
    tree = build_tree(nodes, progress)
    gc.freeze()  # the engine's tree lives in another process in real use, not in the UI's heap
    src = BenchSource(tree)
    app = InspectorApp(src, flash_s=0)
    scroll, change, keys, eps, wm = asyncio.run(
        _drive(app, src, seconds, step if step is not None else (lambda _: None)))
    frames = scroll + change
    return TuiBench(
        nodes=len(tree), frame_ms_p50=round(statistics.median(frames), 3) if frames else 0.0,
        frame_ms_p99=round(_pct(frames, 0.99), 3),
        frame_ms_p99_scroll=round(_pct(scroll, 0.99), 3),
        frame_ms_p99_change=round(_pct(change, 0.99), 3),
        key_ms_p50=round(_pct(keys, 0.5), 3), key_ms_p99=round(_pct(keys, 0.99), 3),
        events_per_s=round(eps), watermark_hz=round(wm, 2), frames=len(frames), keys=len(keys))
