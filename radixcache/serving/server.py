"""A cache service over ZeroMQ (what ``radixcache serve`` runs), and headless recording.

``Server`` puts one ``ServiceLoop`` in front of one ``Publisher``: the loop steps the service
and publishes each step as a batch; the publisher's command socket hands each typed command to
``ServiceLoop.command`` (the one handler), its snapshot socket asks ``ServiceLoop.snapshot_at``.
With ``kv_endpoints`` a tap of the publisher also translates every batch into vLLM-format KV events.

``record_service`` runs the same loop in the caller's thread with the batches going to a
recording file instead of a socket.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from radixcache.core import events as ev
from radixcache.core.guard import ThreadFault
from radixcache.serving.loop import BatchSink, LoopConfig, ServiceLoop
from radixcache.serving.service import CacheService
from radixcache.traffic.workloads import Workload
from radixcache.wire import commands as cmd
from radixcache.wire.endpoints import BindPolicy, Endpoints, free_ports
from radixcache.wire.kvevents.pubsub import KVEventPublisher
from radixcache.wire.kvevents.translate import KVTranslator
from radixcache.wire.publisher import Publisher, SnapshotAt, Tap
from radixcache.wire.recording import RecordingWriter
from radixcache.wire.security import CurveServer


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
    """How a server publishes (the service's own knobs are its own)."""

    loop: LoopConfig = LoopConfig()
    ring: int = 8192  # batches kept for replay
    block_size: int = 16  # for the KV-event translation
    num_blocks: int = 8192


class Server:
    """``service`` served on ``endpoints``. ``start()``, then ``close()``."""

    def __init__(
        self, service: CacheService, endpoints: Endpoints, config: ServerConfig | None = None,
        *, policy: BindPolicy = BindPolicy.LOCAL_ONLY, kv_endpoints: tuple[str, str] | None = None,
        curve_keys: Path | None = None,
    ) -> None:
        self.config = config if config is not None else ServerConfig()
        self.service = service
        self.kv: KVEventPublisher | None = None
        with secured(policy, curve_keys) as (policy, self.curve):
            taps: list[Tap] = []
            if kv_endpoints is not None:
                translator = KVTranslator(self.config.block_size, self.config.num_blocks)
                kv = self.kv = KVEventPublisher(*kv_endpoints, policy=policy)
                taps.append(lambda events: kv.publish(translator.translate(events)))
            try:
                self.publisher = Publisher(endpoints, self._snapshot_at, commands=self._command,
                                           ring=self.config.ring, policy=policy, taps=taps)
            except Exception:
                if self.kv is not None:  # its sockets are bound already: give them back
                    self.kv.close()
                raise
        self._after_step: list[Callable[[], None]] = []
        self.loop = ServiceLoop(service, self.publisher, self.config.loop, pace=self._stepped)

    def after_step(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` on the stepping thread after each step, no lock held (the front
        process's port forwards the step's tokens)."""
        self._after_step.append(hook)

    def _stepped(self) -> None:
        for hook in self._after_step:
            hook()

    # the publisher is made before the loop (the loop publishes to it): these two bind late
    def _snapshot_at(self) -> SnapshotAt:
        return self.loop.snapshot_at()

    def _command(self, c: cmd.AnyCommand) -> cmd.AnyReply:
        return self.loop.command(c)

    def start(self) -> Server:
        """Start publishing and stepping."""
        self.publisher.start()
        self.loop.start()
        return self

    @property
    def fault(self) -> ThreadFault | None:
        """The first death of one of the server's threads (loop, publisher), if any."""
        return self.loop.fault or self.publisher.guard.fault

    def close(self) -> None:
        """Stop stepping (unfinished requests are cancelled), then the publishers and the
        CURVE authenticator; every socket is closed afterwards."""
        self.loop.close()
        self.publisher.close()
        if self.kv is not None:
            self.kv.close()
        if self.curve is not None:
            self.curve.close()


class RecordResult(NamedTuple):
    """What ``record_service`` wrote and how the requests ended."""

    batches: int
    events: int
    counters: ev.Counters
    steps: int
    digest: str  # the tree's digest after the last batch (also the file's last Digest)


def record_service(service: CacheService, workload: Workload, writer: RecordingWriter, *,
                   digest_every: int = 64, epoch: int = 1,
                   progress: Callable[[ev.Batch], None] | None = None,
                   until: Callable[[], bool] | None = None) -> RecordResult:
    """Run ``workload`` on a fresh ``service`` in this thread until every request is done
    (or ``until()`` is true between two steps: a SIGTERM), writing each step as one batch
    (seq 1, 2, ... with no empty batches), a keyframe first and whenever the writer needs one
    (taken right after the batch it follows, at that seq), a ``Digest`` every ``digest_every``
    batches and one in the last batch. ``progress`` sees each batch once written (``record``
    counts the finished requests in it)."""
    def on_batch(batch: ev.Batch) -> None:
        writer.write_batch(batch)
        if progress is not None:
            progress(batch)
        if writer.needs_keyframe:
            writer.write_keyframe(batch.seq, batch.epoch, service.snapshot())

    service.take_events()
    writer.write_keyframe(0, epoch, service.snapshot())
    sink = BatchSink(on_batch, epoch=epoch, clock=time.time)
    loop = ServiceLoop(service, sink, LoopConfig(digest_every, sample_every_s=float("inf")))
    service.submit_workload(workload)
    steps = loop.run_until_idle(until=until)
    c = service.counters()
    return RecordResult(writer.batches, writer.events, c, steps, service.digest())


def tiny_engine_server(blocks: int, *, kv_events: bool = False) -> Server:
    """A served engine in this process on free loopback ports: the tiny model, answers folded
    into the prefill (so a CPU keeps up), and with ``kv_events`` a vLLM-format publisher.
    Not started. For the screenshots and tests that want a real engine without a process."""
    from radixcache.serving.engine import Answers, Engine, EngineConfig
    from radixcache.serving.model import tiny_model

    engine = Engine(EngineConfig(num_blocks=blocks, model=tiny_model(),
                                 answers=Answers.PREFILL))
    # consecutive ports (events P, snapshot P+1, commands P+2, KV P+3/P+4), so a client that
    # knows only the event endpoint finds the others, as with ``serve --port P``
    port = free_ports(5)
    kv = (f"tcp://127.0.0.1:{port + 3}", f"tcp://127.0.0.1:{port + 4}") if kv_events else None
    config = ServerConfig(block_size=engine.config.block_size, num_blocks=blocks)
    return Server(engine, Endpoints.tcp("127.0.0.1", port), config, kv_endpoints=kv)


def record_file(path: Path, workload: Workload, *, model: bool, blocks: int = 2048,
                keyframe_every: int = 50_000, step_requests: int = 1) -> RecordResult:
    """Record ``workload`` into ``path``: on the tiny-model engine (``model``, answers decoded
    token by token) or on the tree driver (``step_requests`` a batch)."""
    from radixcache.serving.driver import TreeDriver
    from radixcache.serving.engine import Engine, EngineConfig
    from radixcache.serving.model import tiny_model

    service: CacheService = (Engine(EngineConfig(num_blocks=blocks, model=tiny_model()))
                             if model else TreeDriver(blocks, step_requests=step_requests))
    try:
        with RecordingWriter(path, {"num_blocks": blocks}, keyframe_every=keyframe_every) as w:
            return record_service(service, workload, w)
    finally:
        service.close()
