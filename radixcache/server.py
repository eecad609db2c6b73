"""The engine process: a cache whose events are published, steered by commands.

``TreeServer`` runs workload requests through a ``RadixTree`` in its own step thread (no
model: a request's output is its forced output, as the recorded traces give), publishes
each step's events as one batch (``TreeSource``), a heartbeat when idle and a ``Digest``
every ``digest_every`` batches, optionally the vLLM KV-event format beside it, and answers
the command set of ``radixcache.commands``. When ``radixcache.engine.Engine`` lands, the
same wiring runs with the model (see the closing note of issue 4).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque
from typing import NamedTuple

import numpy as np

from radixcache import commands as cmd
from radixcache import events as ev
from radixcache.kvevents import KVEventPublisher, KVTranslator
from radixcache.pool import KVPool
from radixcache.stream import BindPolicy, Endpoints, Publisher, TreeSource, serve_request
from radixcache.tree import RadixTree, TreeError
from radixcache.workloads import WorkloadError, build_workload


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
    ) -> None:
        config = config if config is not None else ServerConfig()
        self.config = config
        self.tree = RadixTree(KVPool(config.num_blocks, config.block_size))
        self.source = TreeSource(self.tree, digest_every=config.digest_every)
        self.publisher = Publisher(endpoints, self.source.snapshot_at, commands=self.handle,
                                   ring=config.ring, policy=policy)
        self.source.publisher = self.publisher
        self.kv: KVEventPublisher | None = None
        self._translator = KVTranslator(config.block_size, config.num_blocks)
        if kv_endpoints is not None:
            self.kv = KVEventPublisher(*kv_endpoints, policy=policy)
            self.publisher.tap = self._kv_tap
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
        try:
            reply = self.handle(cmd.parse_command_line(line))
        except cmd.CommandError as exc:
            return f"error: {exc}"
        return reply.message if isinstance(reply, cmd.Ok) else f"error: {reply.message}"

    def stats(self) -> dict[str, float | int | str]:
        """The counters ``stats`` replies with."""
        s = self.tree.stats
        return {"nodes": len(self.tree), "served": self._served, "queued": len(self._todo),
                "used_blocks": self.tree.alloc.used_count, "seq": self.publisher.seq,
                "splits": s.splits, "merges": s.merges, "evicted_nodes": s.evicted_nodes,
                "epoch": str(self.publisher.epoch)}
