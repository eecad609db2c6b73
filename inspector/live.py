"""LiveSource: a running engine, followed by ``radixcache.wire.subscriber.Subscriber``.

The subscriber thread receives, decodes, recovers gaps and applies batches to the feed's
mirror under the feed's lock (it is given both); the feed only records what changed
(``Feed.observe``). Commands go over the engine's command socket (``stream.send_command``).

Who owns what (docs/architecture.md, thread map): the subscriber thread is the only writer of
the liveness facts (the subscriber's own fields, and ``_synced_at`` here through the
``on_snapshot`` hook, which also tells the feed its mirror was replaced); the UI thread only
reads them in ``status()``, which derives the state and since when from those facts and
changes nothing.

Which text the engine's ids are (``inspector.engine_facts``): after every snapshot the
``rc-engine-facts`` thread asks the engine's ``stats`` (retrying while it does not answer) and
adopts the model folder it names into ``vocabulary()``; the K/V bytes it names go into
``status()``.
"""

from __future__ import annotations

import threading
import time

from inspector.engine_facts import EngineFacts, ModelWords, same_machine
from inspector.feed import Feed
from inspector.sources import ConnState, SourceStatus
from radixcache.core.guard import Guard
from radixcache.serving.stats import Stats
from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.security import ClientCurve
from radixcache.wire.subscriber import State, Subscriber

STALE_S = 3.0  # no frame (heartbeats included) for this long: shown as disconnected
FACTS_RETRY_S = 1.0  # between two ``stats`` asked of an engine that did not answer


class LiveSource:
    """A ``Source`` over the engine at ``endpoint`` (its event endpoint, tcp:// or ipc://)."""

    def __init__(self, endpoint: str, *, request_timeout_s: float = 2.0,
                 command_timeout_s: float = 5.0, curve: ClientCurve | None = None,
                 connecting: str = "") -> None:
        self.endpoint = endpoint
        self.curve = curve  # CURVE client keys (None: $RADIXCACHE_CURVE_KEYS, else plain)
        self.connecting = connecting  # what the header says until the first snapshot
        self.endpoints = Endpoints.from_events(endpoint)
        self._timeout = request_timeout_s  # a snapshot or replay asked of the engine
        self._command_timeout = command_timeout_s  # one command's round trip
        self._sub: Subscriber | None = None
        self._feed: Feed | None = None
        self._started = time.time()  # CONNECTING since then
        self._synced_at = 0.0  # wall time of the last snapshot loaded (subscriber thread)
        self._vocab = ModelWords()
        self.facts = EngineFacts()  # replaced whole by rc-engine-facts, read by status()
        self._ask = threading.Event()  # a snapshot came: ask the engine what it serves
        self._closed = threading.Event()
        self.guard = Guard()  # rc-engine-facts's

    def start(self, feed: Feed) -> None:
        """Start the subscriber thread on the feed's mirror and lock, and the thread that
        asks the engine which text its ids are."""
        self._feed = feed
        sub = Subscriber(self.endpoints, feed.mirror, on_batch=feed.observe,
                         on_snapshot=self._on_snapshot, request_timeout_s=self._timeout,
                         lock=feed.lock, curve=self.curve)
        self._sub = sub.start()
        self.guard.start("rc-engine-facts", self._learn_facts)

    def _learn_facts(self) -> None:
        """rc-engine-facts: after each snapshot, the engine's ``stats`` into ``facts`` and
        its model folder into the vocabulary (ends on ``stop``; never joined: a ``stats`` in
        flight ends within the command timeout)."""
        while True:
            self._ask.wait()
            if self._closed.is_set():
                return
            self._ask.clear()
            try:
                stats = Stats.of(self.send(cmd.Stats()))
            except cmd.CommandError:
                stats = None
            if stats is not None:
                facts = EngineFacts.of(stats)
                self._vocab.adopt(facts.model_dir, local=same_machine(self.endpoint))
                self.facts = facts
            else:
                self._ask.set()
                if self._closed.wait(FACTS_RETRY_S):
                    return

    def _on_snapshot(self, epoch: int, seq: int, snapshot: object) -> None:
        """Subscriber thread, right after a snapshot replaced the mirror (join or resync)."""
        del epoch, seq, snapshot
        now = time.time()
        if self._feed is not None:
            self._feed.resynced(now)
        self._synced_at = now
        self._ask.set()  # a new engine, perhaps: ask again what it serves

    def stop(self) -> None:
        """Stop the subscriber and the facts thread (idempotent)."""
        self._closed.set()
        self._ask.set()
        if self._sub is not None:
            self._sub.stop()

    def _current(self) -> tuple[ConnState, float]:
        """The state and since when (time.time()), read from the subscriber's facts. Silence
        first: an engine sends a heartbeat every 0.25 s, so no frame on either socket for
        ``STALE_S`` means it is gone (since its last frame), whatever the subscriber still
        waits for (a replay it asks of a dead engine never comes: "resyncing" would last
        forever)."""
        sub = self._sub
        if sub is None or not sub.synced.is_set():
            return ConnState.CONNECTING, self._started
        now, mono = time.time(), time.monotonic()
        silent = mono - sub.last_frame
        if silent > STALE_S:
            return ConnState.DISCONNECTED, now - silent
        if sub.state is not State.LIVE:
            return ConnState.RESYNCING, now - sub.status().out_of_sync_s
        return ConnState.LIVE, self._synced_at

    def status(self) -> SourceStatus:
        """CONNECTING (no snapshot yet), LIVE, RESYNCING (waiting for a snapshot or replay) or
        DISCONNECTED, since when. A pure read: asking changes nothing, from any thread."""
        state, since = self._current()
        gaps = self._sub.stats.gaps if self._sub is not None else 0
        detail = f"{gaps} gaps recovered" if gaps else ""
        if state is ConnState.CONNECTING:
            detail = self.connecting
        fault = self.guard.fault
        if fault is not None:
            detail = fault.line()
        f = self.facts
        return SourceStatus(state, self.endpoint, since, detail,
                            kv_bytes_per_block=f.kv_bytes_per_block,
                            kv_bytes_per_token=f.kv_bytes_per_token)

    def send(self, command: cmd.AnyCommand) -> cmd.AnyReply:
        """One round trip on the command socket within ``command_timeout_s`` (``Error`` on
        timeout, never raises)."""
        return send_command(self.endpoints.commands, command,
                            timeout_s=self._command_timeout, curve=self.curve)

    def vocabulary(self) -> ModelWords:
        """The synthetic workloads' words, then ShareGPT's once loaded in the background
        (``DatasetWords``: ids until then, and for words the dataset lacks); the model
        folder's tokenizer once the engine says it serves one (``ModelWords``)."""
        return self._vocab
