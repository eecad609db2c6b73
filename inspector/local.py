"""LocalSource: an in-process radix tree driven by seeded workloads, for tests and screenshots.

This module is the inspector's stand-in for an engine process, and the only one in
``inspector/`` that touches a ``RadixTree``; the app sees it only as a ``Source`` (batches in,
commands out), exactly like a remote engine. No model runs: a request's output is its forced
output, or seeded word ids. One batch per step of ``step_requests`` requests, each ending with
a ``Watermark`` sample, so a given command sequence always yields the same batches.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from inspector.feed import Feed
from inspector.replay import Recording
from inspector.sources import ConnState, DatasetWords, SourceStatus
from radixcache.core import events as ev
from radixcache.core.pool import KVPool, PoolExhausted
from radixcache.core.tree import PromptTooLarge, RadixTree, TreeError
from radixcache.serving.memory import MemorySource
from radixcache.traffic.workloads import WorkloadError, WorkloadRequest, build_workload
from radixcache.wire import commands as cmd

Clock = Callable[[], float]


class LocalSource:
    """A ``Source`` over an in-process ``RadixTree`` of ``num_blocks`` blocks."""

    def __init__(
        self,
        num_blocks: int = 1024,
        *,
        step_requests: int = 4,
        interval: float = 0.02,
        clock: Clock = time.time,
        recording: Recording | None = None,
        keyframe_every: int = 16,
        memory: MemorySource | None = None,
    ) -> None:
        self.tree = RadixTree(KVPool(num_blocks, 16))
        self.step_requests = step_requests
        self.interval = interval
        self.clock = clock
        self.recording = recording
        self.keyframe_every = keyframe_every
        self.sent: list[cmd.AnyCommand] = []
        self._inbox: queue.Queue[tuple[cmd.AnyCommand, Future[cmd.AnyReply]]] = queue.Queue()
        self._pending: deque[WorkloadRequest] = deque()
        self._paused = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._feed: Feed | None = None
        self._seq = 0
        self._req = 0
        self._text = DatasetWords()
        self._memory = memory if memory is not None else MemorySource()
        self._note = self._memory.nvml_error or ""
        self._started = clock()

    # -- Source ----------------------------------------------------------------------------
    def start(self, feed: Feed) -> None:
        """Load the tree's snapshot into ``feed`` and start the stepping thread."""
        self._feed = feed
        self.tree.take_events()
        snapshot = self.tree.snapshot()
        if self.recording is not None:
            self.recording.keyframe(snapshot)
        feed.load(snapshot, 0, self.clock())
        self._publish([self._watermark()])
        self._thread = threading.Thread(target=self._run, name="local-source", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._memory.close()

    def status(self) -> SourceStatus:
        """Always LOCAL; ``busy`` while requests are queued or commands wait."""
        busy = bool(self._pending and not self._paused) or not self._inbox.empty()
        return SourceStatus(ConnState.LOCAL, "local", self._started, "", busy, self._note)

    def send(self, command: cmd.AnyCommand) -> cmd.AnyReply:
        """Queue ``command`` for the stepping thread and wait for its reply (10 s at most)."""
        self.sent.append(command)
        done: Future[cmd.AnyReply] = Future()
        self._inbox.put((command, done))
        return done.result(timeout=10)

    def vocabulary(self) -> DatasetWords:
        """The synthetic workloads' words, then ShareGPT's once loaded (``DatasetWords``)."""
        return self._text

    def idle(self) -> bool:
        """True when no request or command is waiting (tests wait for this)."""
        return not self._pending and self._inbox.empty() and not self._working

    _working = False

    # -- the stepping thread ---------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._working = True
            try:
                self._drain_inbox()
                stepped = self._step()
            finally:
                self._working = False
            if not stepped:
                self._stop.wait(self.interval)

    def _drain_inbox(self) -> None:
        while True:
            try:
                command, done = self._inbox.get_nowait()
            except queue.Empty:
                return
            reply = self._execute(command)
            self._publish([*self.tree.take_events(), self._watermark()])
            done.set_result(reply)

    def _step(self) -> bool:
        """Serve up to ``step_requests`` queued requests as one batch; False when idle."""
        if self._paused or not self._pending:
            return False
        out: list[ev.AnyEvent] = []
        for _ in range(min(self.step_requests, len(self._pending))):
            self._serve(self._pending.popleft(), out)
        out.append(self._watermark())
        self._publish(out)
        return True

    def _serve(self, request: WorkloadRequest, out: list[ev.AnyEvent]) -> None:
        """One request: match and lock the prompt, allocate, insert prompt + output, unlock."""
        t0 = time.perf_counter()
        rid, self._req = self._req, self._req + 1
        output = request.forced_output
        if output is None:
            rng = np.random.default_rng(rid)
            ids = self._text.synthetic.ids
            output = ids[rng.integers(0, len(ids), request.max_new_tokens)]
        full = np.concatenate([request.prompt, output]).astype(np.uint32)
        tree = self.tree
        m = tree.match_and_lock(request.prompt)
        out.extend(tree.take_events())
        out.append(ev.RequestStart(rid, len(request.prompt), m.length))
        try:
            lease = tree.allocate(m, len(full))
            tree.insert(full, lease)
            produced = len(output)
        except (PoolExhausted, PromptTooLarge):
            produced = 0
        tree.unlock(m.node)
        out.extend(tree.take_events())
        out.append(ev.RequestFinish(rid, produced, (time.perf_counter() - t0) * 1000))

    def _execute(self, command: cmd.AnyCommand) -> cmd.AnyReply:
        tree = self.tree
        try:
            match command:
                case cmd.StartWorkload(name=name, args=args):
                    w = build_workload(name, args)
                    self._pending.extend(w.requests)
                    return cmd.Ok(f"{name}: {len(w.requests)} requests queued ({w.source})")
                case cmd.Pause():
                    self._paused = True
                    return cmd.Ok("paused")
                case cmd.Resume():
                    self._paused = False
                    return cmd.Ok("resumed")
                case cmd.SetWatermark(high=high, low=low):
                    tree.set_watermarks(high, low)
                    return cmd.Ok(f"watermarks high {high:.0%} low {low:.0%}")
                case cmd.Evict(tokens=tokens):
                    r = tree.evict(tokens)
                    return cmd.Ok(f"evicted {r.nodes} nodes, {r.tokens} tokens, {r.blocks} blocks")
                case cmd.Reset():
                    self._pending.clear()
                    tree.reset()
                    return cmd.Ok("reset: the cache is empty")
                case cmd.TakeSnapshot():
                    self._publish([tree.snapshot()])
                    return cmd.Ok("snapshot published")
                case _:
                    return cmd.Ok("stats", self._stats())
        except (WorkloadError, ValueError, TreeError) as err:
            return cmd.Error(str(err))

    def _stats(self) -> dict[str, float | int | str]:
        s = self.tree.stats
        return {"nodes": len(self.tree), "splits": s.splits, "merges": s.merges,
                "cow_copies": s.cow_copies, "evicted_nodes": s.evicted_nodes,
                "pending": len(self._pending)}

    def _watermark(self) -> ev.Watermark:
        a = self.tree.alloc
        sample = self._memory.sample(a.used_count, a.num_blocks, self.tree.pool.kv.nbytes)
        self._note = sample.nvml_error or ""
        return ev.Watermark(a.used_count, a.num_blocks, self.tree.high, self.tree.low,
                            sample.device_used_bytes, sample.device_total_bytes)

    def _publish(self, events: list[ev.AnyEvent]) -> None:
        self._seq += 1
        batch = ev.Batch(self._seq, 1, self.clock(), "local", events)
        rec = self.recording
        if rec is not None:
            rec.add(batch)
            if len(rec.batches) % self.keyframe_every == 0:
                rec.keyframe(self.tree.snapshot())
        if self._feed is not None:
            self._feed.apply(batch)
