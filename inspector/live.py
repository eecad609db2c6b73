"""LiveSource: a running engine, followed by ``radixcache.wire.subscriber.Subscriber``.

The subscriber thread receives, decodes, recovers gaps and applies batches to the feed's
mirror under the feed's lock (it is given both); the feed only records what changed
(``Feed.observe``). Commands go over the engine's command socket (``stream.send_command``).
"""

from __future__ import annotations

import time

from inspector.feed import Feed
from inspector.sources import ConnState, DatasetWords, SourceStatus
from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.security import ClientCurve
from radixcache.wire.subscriber import State, Subscriber

STALE_S = 3.0  # no frame (heartbeats included) for this long: shown as disconnected


class LiveSource:
    """A ``Source`` over the engine at ``endpoint`` (its event endpoint, tcp:// or ipc://)."""

    def __init__(self, endpoint: str, *, request_timeout_s: float = 2.0,
                 curve: ClientCurve | None = None, connecting: str = "") -> None:
        self.endpoint = endpoint
        self.curve = curve  # CURVE client keys (None: $RADIXCACHE_CURVE_KEYS, else plain)
        self.connecting = connecting  # what the header says until the first snapshot
        self.endpoints = Endpoints.from_events(endpoint)
        self._timeout = request_timeout_s
        self._sub: Subscriber | None = None
        self._feed: Feed | None = None
        self._since = time.time()
        self._state = ConnState.CONNECTING
        self._snapshots = 0
        self._vocab = DatasetWords()

    def start(self, feed: Feed) -> None:
        """Start the subscriber thread on the feed's mirror and lock."""
        self._feed = feed
        sub = Subscriber(self.endpoints, feed.mirror, on_batch=self._on_batch,
                         request_timeout_s=self._timeout, lock=feed.lock, curve=self.curve)
        self._sub = sub.start()

    def _on_batch(self, batch: object) -> None:
        from radixcache.core import events as ev

        if self._feed is None or not isinstance(batch, ev.Batch):
            return
        if self._sub is not None and self._sub.stats.snapshots != self._snapshots:
            self._snapshots = self._sub.stats.snapshots
            self._feed.resynced(batch.ts)
        self._feed.observe(batch)

    def stop(self) -> None:
        """Stop the subscriber (idempotent)."""
        if self._sub is not None:
            self._sub.stop()

    def _current(self) -> ConnState:
        """Silence first: an engine sends a heartbeat every 0.25 s, so no frame on either
        socket for ``STALE_S`` means it is gone, whatever the subscriber still waits for (a
        replay it asks of a dead engine never comes: "resyncing" would last forever)."""
        sub = self._sub
        if sub is None or not sub.synced.is_set():
            return ConnState.CONNECTING
        if time.monotonic() - sub.last_frame > STALE_S:
            return ConnState.DISCONNECTED
        if sub.state is not State.LIVE:
            return ConnState.RESYNCING
        return ConnState.LIVE

    def status(self) -> SourceStatus:
        """CONNECTING (no snapshot yet), LIVE, RESYNCING (waiting for a snapshot or replay) or
        DISCONNECTED, since when."""
        state = self._current()
        if state is not self._state:
            self._state, self._since = state, time.time()
        if self._sub is not None and self._feed is not None \
                and self._sub.stats.snapshots != self._snapshots:
            self._snapshots = self._sub.stats.snapshots
            self._feed.resynced(time.time())
        gaps = self._sub.stats.gaps if self._sub is not None else 0
        detail = f"{gaps} gaps recovered" if gaps else ""
        if state is ConnState.CONNECTING:
            detail = self.connecting
        return SourceStatus(state, self.endpoint, self._since, detail)

    def send(self, command: cmd.AnyCommand) -> cmd.AnyReply:
        """One round trip on the command socket (``Error`` on timeout, never raises)."""
        return send_command(self.endpoints.commands, command, timeout_s=5.0, curve=self.curve)

    def vocabulary(self) -> DatasetWords:
        """The synthetic workloads' words, then ShareGPT's once loaded in the background
        (``DatasetWords``: ids until then, and for words the dataset lacks)."""
        return self._vocab
