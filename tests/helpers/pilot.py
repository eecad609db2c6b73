"""Pilot helpers for the inspector's tests, and two sources that only tests need: one that
delivers hand-written batches, and one that floods another source's stream to 50k events/s."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Coroutine, Sequence

from inspector.app import InspectorApp
from inspector.feed import Feed
from inspector.layout import TokenText
from inspector.sources import ConnState, Source, SourceStatus
from radixcache.core import events as ev
from radixcache.core import tokens as tk
from radixcache.traffic.workloads import Vocabulary
from radixcache.wire import commands as cmd

T0 = 1_700_000_000.0


class NoNvml:
    """An NVML module whose init fails (so every machine renders the same memory pane)."""

    def nvmlInit(self) -> None:
        raise RuntimeError("no driver (test)")


async def wait_until(pilot, predicate: Callable[[], bool], timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Let the app run until ``predicate()`` holds (an AssertionError after ``timeout`` s: a
    bound for a stuck app, generous because a loaded 2-core machine serves a workload slowly)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await pilot.pause(0.01)


async def type_line(pilot, line: str) -> None:  # type: ignore[no-untyped-def]
    """Focus the command line with ``:``, put ``line`` in it, press enter."""
    await pilot.press("escape", "colon")
    pilot.app.query_one("#command").value = line
    await pilot.press("enter")


def sync(fn: Callable[..., Coroutine[None, None, None]]) -> Callable[..., None]:
    """Run an async Pilot test with asyncio (no async pytest plugin is installed)."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


def tokens(*ids: int) -> bytes:
    """Token ids as the wire carries them (``core.tokens``: uint32 little-endian)."""
    return tk.from_ids(ids)


class ManualSource:
    """A ``Source`` whose batches the test writes (``push``); commands get ``reply``."""

    def __init__(self, num_blocks: int = 64) -> None:
        self.num_blocks = num_blocks
        self.feed: Feed | None = None
        self.seq = 0
        self.reply: cmd.AnyReply = cmd.Ok("submitted")
        self.sent: list[cmd.AnyCommand] = []

    def start(self, feed: Feed) -> None:
        """An empty tree of ``num_blocks`` blocks."""
        self.feed = feed
        root = ev.NodeState(0, -1, 0, b"", [], 0, 0)
        feed.load(ev.Snapshot(16, self.num_blocks, [root], 0, 1, [], 0.92, 0.85), 0, T0)

    def push(self, events: Sequence[ev.AnyEvent]) -> None:
        """Deliver one batch."""
        assert self.feed is not None
        self.seq += 1
        self.feed.apply(ev.Batch(self.seq, 7, T0, "manual", list(events)))

    def stop(self) -> None:
        """Nothing runs."""

    def status(self) -> SourceStatus:
        """LIVE, named ``manual``."""
        return SourceStatus(ConnState.LIVE, "manual", T0, "", memory_note="no NVML (test)")

    def send(self, command: cmd.AnyCommand) -> cmd.AnyReply:
        """Record and answer ``reply``."""
        self.sent.append(command)
        return self.reply

    def vocabulary(self) -> TokenText:
        """Synthetic words."""
        return Vocabulary()


class Flooded:
    """Another source's real stream, with Access events on the root interleaved so that the
    feed takes ``events_per_s`` in all (batches every 10 ms, paced by elapsed time)."""

    def __init__(self, inner: Source, events_per_s: int = 50_000) -> None:
        self.inner = inner
        self.events_per_s = events_per_s
        self.streamed = 0
        self.started = 0.0
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, feed: Feed) -> None:
        """Start the inner source, then the flood."""
        self.inner.start(feed)
        self.started = time.perf_counter()
        self._thread = threading.Thread(target=self._flood, args=(feed,), daemon=True)
        self._thread.start()

    def _flood(self, feed: Feed) -> None:
        clock = 1 << 40
        while not self._halt.is_set():
            owed = int((time.perf_counter() - self.started) * self.events_per_s) - self.streamed
            events: list[ev.AnyEvent] = [ev.Access(0, clock + i) for i in range(max(0, owed))]
            clock += len(events)
            feed.apply(ev.Batch(feed.seq, feed.epoch, feed.last_ts, "flood", events))
            self.streamed += len(events)
            self._halt.wait(0.01)

    def stop(self) -> None:
        """Stop the flood, then the inner source."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(5)
        self.inner.stop()

    def status(self) -> SourceStatus:
        """The inner source's."""
        return self.inner.status()

    def send(self, command: cmd.AnyCommand) -> cmd.AnyReply:
        """To the inner source."""
        return self.inner.send(command)

    def vocabulary(self) -> TokenText | None:
        """The inner source's."""
        return self.inner.vocabulary()


def app_for(source: Source, **kwargs: object) -> InspectorApp:
    """An app that draws every frame quickly and without flashes."""
    return InspectorApp(source, flash_s=0, frame_interval=0.02, **kwargs)  # type: ignore[arg-type]
