"""The engine process: a cache whose events are published, steered by commands.

``EngineServer`` (what ``radixcache serve`` runs) drives an ``Engine`` -- the tiny model,
prefix reuse, continuous batching -- from its own step thread. Every step's events (tree
events, ``RequestStart``/``RequestFinish``, ``Watermark`` samples) go out as one batch with
the next ``seq``; a ``Digest`` every ``digest_every`` batches; a watermark sample (and the
publisher's heartbeat) while idle. One server lock serializes engine steps, commands and
snapshots with publishing, so the snapshot served with seq S holds exactly the events of
batches 1..S::

    step thread:      with lock: engine.step() -> on_step(events) -> publish  (seq S+1)
    snapshot ROUTER:  with lock: publish(engine.take_events()); tree.snapshot(), seq

``TreeServer`` is the model-free variant (a request's output is its forced output, served
through the tree alone): ``bench events`` and the malformed-input tests use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from radixcache.core import events as ev
from radixcache.core.pool import KVPool
from radixcache.core.tree import RadixTree, TreeError
from radixcache.serving.engine import Engine, EngineConfig
from radixcache.serving.model import ModelConfig
from radixcache.traffic.workloads import Workload, WorkloadError, build_workload
from radixcache.wire import commands as cmd
from radixcache.wire.kvevents import KVEventPublisher, KVTranslator
from radixcache.wire.recording import RecordingWriter
from radixcache.wire.security import CurveServer
from radixcache.wire.stream import (
    BindPolicy,
    Endpoints,
    Publisher,
    SnapshotAt,
    TreeSource,
    serve_request,
)


def reply_text(handle: Callable[[cmd.AnyCommand], cmd.AnyReply], line: str) -> str:
    """Parse a command typed by a person, run it through ``handle``, and say what happened."""
    try:
        reply = handle(cmd.parse_command_line(line))
    except cmd.CommandError as exc:
        return f"error: {exc}"
    return reply.message if isinstance(reply, cmd.Ok) else f"error: {reply.message}"


@contextlib.contextmanager
def secured(policy: BindPolicy, curve_keys: Path | None) -> Iterator[
        tuple[BindPolicy, CurveServer | None]]:
    """``policy`` made CURVE (with its authenticator running) when ``curve_keys`` is a key
    directory, else ``policy`` unchanged. The authenticator is stopped if the body raises
    (a refused bind); otherwise the caller owns it and must ``close()`` it."""
    if curve_keys is None:
        yield policy, None
        return
    curve = CurveServer(curve_keys)
    try:
        yield policy.with_curve(curve.keys), curve
    except BaseException:
        curve.close()
        raise


class ServerConfig(NamedTuple):
    """What a server runs with."""

    num_blocks: int = 8192
    block_size: int = 16
    requests_per_step: int = 4
    digest_every: int = 64
    ring: int = 8192


class TreeServer:
    """A tree served over ZeroMQ. ``start()``, then ``close()``."""

    def __init__(
        self, endpoints: Endpoints, config: ServerConfig | None = None, *,
        policy: BindPolicy = BindPolicy.LOCAL_ONLY, kv_endpoints: tuple[str, str] | None = None,
        curve_keys: Path | None = None,
    ) -> None:
        config = config if config is not None else ServerConfig()
        self.config = config
        self.tree = RadixTree(KVPool(config.num_blocks, config.block_size))
        self.source = TreeSource(self.tree, digest_every=config.digest_every)
        self.kv: KVEventPublisher | None = None
        self._translator = KVTranslator(config.block_size, config.num_blocks)
        with secured(policy, curve_keys) as (policy, self.curve):
            self.publisher = Publisher(endpoints, self.source.snapshot_at, commands=self.handle,
                                       ring=config.ring, policy=policy)
            if kv_endpoints is not None:
                self.kv = KVEventPublisher(*kv_endpoints, policy=policy)
                self.publisher.tap = self._kv_tap
        self.source.publisher = self.publisher
        self._todo: deque[np.ndarray] = deque()
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._paused = threading.Event()
        self._stop = threading.Event()
        self._served = 0
        self._thread = threading.Thread(target=self._run, name="rc-server", daemon=True)

    def _kv_tap(self, events: list[ev.AnyEvent]) -> None:
        assert self.kv is not None
        self.kv.publish(self._translator.translate(events))

    def start(self) -> TreeServer:
        """Start publishing and serving."""
        self.publisher.start()
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the step thread and the publishers."""
        self._stop.set()
        self._wake.put(None)
        self._thread.join(5)
        self.publisher.close()
        if self.kv is not None:
            self.kv.close()
        if self.curve is not None:
            self.curve.close()

    def submit_workload(self, name: str, args: list[str]) -> int:
        """Queue a workload's requests; returns how many. Raises ``WorkloadError``."""
        w = build_workload(name, args)
        for r in w.requests:
            out = r.forced_output if r.forced_output is not None else np.zeros(0, np.uint32)
            self._todo.append(np.concatenate([r.prompt, out]).astype(np.uint32))
        self._wake.put(None)
        return len(w.requests)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._paused.is_set() or not self._todo:
                with contextlib.suppress(queue.Empty):
                    self._wake.get(timeout=0.1)
                continue
            with self.source.step() as tree:
                for _ in range(min(self.config.requests_per_step, len(self._todo))):
                    self._serve_one(tree, self._todo.popleft())

    def _serve_one(self, tree: RadixTree, tokens: np.ndarray) -> None:
        try:
            serve_request(tree, tokens)
            self._served += 1
        except TreeError:
            pass  # a prompt larger than the pool: dropped, as an engine would refuse it

    def handle(self, c: cmd.AnyCommand) -> cmd.AnyReply:
        """Do one command (called on the publisher's thread)."""
        try:
            match c:
                case cmd.StartWorkload():
                    n = self.submit_workload(c.name, c.args)
                    return cmd.Ok(f"{c.name}: {n} requests queued", {"requests": n})
                case cmd.Pause():
                    self._paused.set()
                    return cmd.Ok("paused")
                case cmd.Resume():
                    self._paused.clear()
                    self._wake.put(None)
                    return cmd.Ok("resumed")
                case cmd.SetWatermark():
                    self.tree.set_watermarks(c.high, c.low)
                    return cmd.Ok(f"watermarks high {c.high:g} low {c.low:g}")
                case cmd.Evict():
                    with self.source.step() as tree:
                        r = tree.evict(c.tokens)
                    return cmd.Ok(f"evicted {r.nodes} nodes, {r.tokens} tokens",
                                  {"nodes": r.nodes, "tokens": r.tokens, "blocks": r.blocks})
                case cmd.Reset():
                    with self.source.step() as tree:
                        tree.reset()
                    return cmd.Ok("reset")
                case cmd.Stats():
                    return cmd.Ok("stats", self.stats())
                case cmd.TakeSnapshot():
                    at = self.source.snapshot_at()
                    self.publisher.publish([at.snapshot])
                    return cmd.Ok(f"snapshot after seq {at.seq}", {"seq": at.seq})
        except (WorkloadError, TreeError, ValueError) as exc:
            return cmd.Error(str(exc))
        return cmd.Error(f"unsupported command {type(c).__name__}")

    def handle_line(self, line: str) -> str:
        """Parse and do a command typed by a person; returns the reply's message."""
        return reply_text(self.handle, line)

    def stats(self) -> dict[str, float | int | str]:
        """The counters ``stats`` replies with."""
        s = self.tree.stats
        return {"nodes": len(self.tree), "served": self._served, "queued": len(self._todo),
                "used_blocks": self.tree.alloc.used_count, "seq": self.publisher.seq,
                "splits": s.splits, "merges": s.merges, "evicted_nodes": s.evicted_nodes,
                "epoch": str(self.publisher.epoch)}


# -- the engine with its model ------------------------------------------------------------------


def tiny_model() -> ModelConfig:
    """The smallest model the engine serves well on a CPU: 1 layer, d_model 32, 2 query heads
    over 1 K/V head of 16 (the full ShareGPT vocabulary, so trace token ids stay valid)."""
    return ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)


class Answers(enum.Enum):
    """How forced answers (trace outputs) are computed.

    DECODE: token by token, as a server decodes (requests stay running, locks held).
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


class DigestEvery:
    """Numbers batches and appends a ``Digest`` of ``tree`` to every ``every``-th one (0: never).
    The caller must hold whatever keeps the tree from changing between the events and the
    digest (the server lock, or the single thread of a headless recording)."""

    def __init__(self, tree: RadixTree, every: int) -> None:
        self.tree, self.every = tree, every
        self.batches = 0

    def stamp(self, events: list[ev.AnyEvent]) -> list[ev.AnyEvent]:
        """Count one batch; returns ``events`` with a ``Digest`` appended when one is due."""
        self.batches += 1
        if self.every and self.batches % self.every == 0:
            events.append(ev.Digest(self.tree.digest()))
        return events


class EngineServerConfig(NamedTuple):
    """What an ``EngineServer`` runs with (the engine's own knobs are in ``engine``)."""

    engine: EngineConfig = EngineConfig(model=tiny_model())
    answers: Answers = Answers.DECODE
    digest_every: int = 64
    ring: int = 8192
    loop: tuple[str, ...] = ()  # command lines injected in turn whenever the engine is idle


DEFAULT_LOOP = ("chat 8", "system 40 --seed {n}", "tot 2 4 --seed {n}", "fork 12 --seed {n}",
                "flood 40 --seed {n}")


class EngineServer:
    """An ``Engine`` served over ZeroMQ (see the module doc). ``start()``, then ``close()``."""

    def __init__(
        self, endpoints: Endpoints, config: EngineServerConfig | None = None, *,
        policy: BindPolicy = BindPolicy.LOCAL_ONLY, kv_endpoints: tuple[str, str] | None = None,
        curve_keys: Path | None = None,
    ) -> None:
        self.config = config if config is not None else EngineServerConfig()
        self._lock = threading.Lock()  # steps, commands and snapshots, with their publishing
        self.engine = Engine(self.config.engine, on_step=self._on_step)
        self.digests = DigestEvery(self.engine.tree, self.config.digest_every)
        self.kv: KVEventPublisher | None = None
        with secured(policy, curve_keys) as (policy, self.curve):
            self.publisher = Publisher(endpoints, self.snapshot_at, commands=self.handle,
                                       ring=self.config.ring, policy=policy)
            if kv_endpoints is not None:
                ecfg = self.config.engine
                translator = KVTranslator(ecfg.block_size, ecfg.num_blocks)
                kv = self.kv = KVEventPublisher(*kv_endpoints, policy=policy)
                self.publisher.tap = lambda events: kv.publish(translator.translate(events))
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._loop_count = 0
        self.loop_error: str | None = None  # why --loop stopped, when an entry failed
        self._thread = threading.Thread(target=self._run, name="rc-engine-server", daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> EngineServer:
        """Start publishing and stepping."""
        self.publisher.start()
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop stepping, cancel what is unfinished, stop the publishers."""
        self._stop.set()
        self._wake.set()
        self._thread.join(10)
        with self._lock:
            self.engine.close()
        self.publisher.close()
        if self.kv is not None:
            self.kv.close()

    # -- publishing (self._lock held) ---------------------------------------------------------
    def _on_step(self, events: list[ev.AnyEvent]) -> None:
        if events:
            self._publish(events)

    def _publish(self, events: list[ev.AnyEvent]) -> int:
        return self.publisher.publish(self.digests.stamp(events))

    def _flush(self) -> None:
        events = self.engine.take_events()
        if events:
            self._publish(events)

    def snapshot_at(self) -> SnapshotAt:
        """The tree's snapshot and the seq of the last batch it includes (events recorded
        since the last step are published first, so the two agree)."""
        with self._lock:
            self._flush()
            return SnapshotAt(self.engine.tree.snapshot(), self.publisher.seq)

    # -- the step thread ----------------------------------------------------------------------
    def _busy(self) -> bool:
        m = self.engine.metrics()
        return m.running > 0 or (m.waiting > 0 and not self.engine.paused)

    def _run(self) -> None:
        every = self.config.engine.watermark_every_s
        last_sample = 0.0
        while not self._stop.is_set():
            if self._busy():
                with self._lock:
                    self.engine.step()
                continue
            if self.config.loop and self.loop_error is None and not self.engine.paused:
                self._inject_next()
                continue
            if time.monotonic() - last_sample >= every:
                last_sample = time.monotonic()
                with self._lock:
                    self._publish([*self.engine.take_events(), self.engine.watermark()])
            self._wake.wait(every)
            self._wake.clear()

    def _inject_next(self) -> None:
        loop = self.config.loop
        line = loop[self._loop_count % len(loop)].format(n=self._loop_count // len(loop))
        self._loop_count += 1
        try:
            reply = self.handle(cmd.parse_command_line(line))
        except cmd.CommandError as exc:
            reply = cmd.Error(str(exc))
        if isinstance(reply, cmd.Error):  # a bad entry must not spin: stop looping
            self.loop_error = f"loop entry {line!r}: {reply.message}"

    def wake(self) -> None:
        """Tell the step thread there is work (after ``engine.submit`` from another front)."""
        self._wake.set()

    # -- commands (the publisher's thread) ----------------------------------------------------
    def submit_workload(self, name: str, args: list[str]) -> int:
        """Submit a workload's requests (dependent ones follow their predecessors); returns
        how many. Raises ``WorkloadError``."""
        w = build_workload(name, args)
        if self.config.answers is Answers.PREFILL:
            w = fold_answers(w)
        self.engine.run_workload(w)
        self._wake.set()
        return len(w.requests)

    def handle(self, c: cmd.AnyCommand) -> cmd.AnyReply:
        """Do one command; its tree events go out as one batch before the reply."""
        try:
            if isinstance(c, cmd.StartWorkload):
                n = self.submit_workload(c.name, c.args)
                return cmd.Ok(f"{c.name}: {n} requests submitted", {"requests": n})
            if isinstance(c, cmd.Stats):
                return cmd.Ok("stats", self.stats())
            with self._lock:
                reply = self._handle_locked(c)
                self._flush()
            self._wake.set()
            return reply
        except (WorkloadError, TreeError, ValueError) as exc:
            return cmd.Error(str(exc))

    def _handle_locked(self, c: cmd.AnyCommand) -> cmd.AnyReply:
        e = self.engine
        match c:
            case cmd.Pause():
                e.pause()
                return cmd.Ok("paused")
            case cmd.Resume():
                e.resume()
                return cmd.Ok("resumed")
            case cmd.SetWatermark():
                e.set_watermarks(c.high, c.low)
                return cmd.Ok(f"watermarks high {c.high:g} low {c.low:g}")
            case cmd.Evict():
                r = e.evict(c.tokens)
                return cmd.Ok(f"evicted {r.nodes} nodes, {r.tokens} tokens",
                              {"nodes": r.nodes, "tokens": r.tokens, "blocks": r.blocks})
            case cmd.Reset():
                m = e.metrics()
                e.reset()
                return cmd.Ok(f"reset ({m.waiting + m.running} requests cancelled)")
            case cmd.TakeSnapshot():
                self._flush()
                seq = self.publisher.seq
                self._publish([e.tree.snapshot()])
                return cmd.Ok(f"snapshot after seq {seq}", {"seq": seq})
        return cmd.Error(f"unsupported command {type(c).__name__}")

    def handle_line(self, line: str) -> str:
        """Parse and do a command typed by a person; returns the reply's message."""
        return reply_text(self.handle, line)

    def stats(self) -> dict[str, float | int | str]:
        """The engine's counters (``Engine.stats``), the tree's digest, and the stream's seq
        (the last batch published; the digest is the tree's after it), batches and epoch."""
        with self._lock:
            self._flush()
            out = self.engine.stats()
            out["digest"] = self.engine.tree.digest()
            out.update(seq=self.publisher.seq, batches=self.digests.batches,
                       epoch=str(self.publisher.epoch), loop_rounds=self._loop_count)
        if self.loop_error is not None:
            out["loop_error"] = self.loop_error
        return out


# -- headless recording -------------------------------------------------------------------------


class RecordResult(NamedTuple):
    """What ``record_workload`` wrote and how the requests ended."""

    batches: int
    events: int
    finished: int
    rejected: int
    steps: int
    digest: str  # the tree's digest after the last batch (also the file's last Digest)


def record_workload(
    engine: Engine, workload: Workload, writer: RecordingWriter, *, digest_every: int = 64,
    epoch: int = 1, limit: int | None = None,
) -> RecordResult:
    """Run the first ``limit`` requests of ``workload`` on ``engine`` in this thread (no
    scheduler thread, no sockets) until every one is done, writing each step's events as one
    batch (seq 1, 2, ... with no empty batches), a keyframe first and whenever the writer
    needs one, a ``Digest`` every ``digest_every`` batches and one in the last batch.

    ``engine`` must be fresh, not started, and have no ``on_step`` of its own.
    """
    digests = DigestEvery(engine.tree, digest_every)
    seq = 0

    def write(events: list[ev.AnyEvent]) -> None:
        nonlocal seq
        seq += 1
        writer.write_batch(ev.Batch(seq, epoch, time.time(), "radixcache", events))
        if writer.needs_keyframe:
            writer.write_keyframe(seq, epoch, engine.tree.snapshot())

    def on_step(events: list[ev.AnyEvent]) -> None:
        if events:
            write(digests.stamp(events))

    engine.on_step = on_step
    writer.write_keyframe(0, epoch, engine.tree.snapshot())
    engine.run_workload(workload, limit)
    while True:
        m = engine.metrics()
        if not m.waiting and not m.running:
            break
        engine.step()
    digest = engine.tree.digest()
    write([*engine.take_events(), engine.watermark(), ev.Digest(digest)])
    m = engine.metrics()
    return RecordResult(writer.batches, writer.events, m.finished, m.rejected, m.steps, digest)
