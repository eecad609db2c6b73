"""The header tells the truth about the engine: a real ``serve`` process killed under the
real app is shown ``○ disconnected`` (docs/architecture.md, "Liveness")."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from inspector.app import InspectorApp
from inspector.feed import Feed
from inspector.live import STALE_S, LiveSource
from inspector.sources import ConnState
from radixcache.serving.driver import TreeDriver
from radixcache.serving.server import Server, ServerConfig
from radixcache.wire import commands as cmd
from radixcache.wire.endpoints import Endpoints, free_ports
from tests.helpers.pilot import sync, type_line, wait_until

SIZE = (150, 44)


def _header(app: InspectorApp) -> str:
    return str(app.query_one("#header").render())


async def _killed_engine_is_shown_disconnected(*, pause: bool) -> None:
    port = free_ports(3)
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--port", str(port),
                             "--blocks", "512"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        app = InspectorApp(LiveSource(f"tcp://127.0.0.1:{port}"), flash_s=0,
                           frame_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "● live" in _header(app), timeout=30)
            if pause:
                await type_line(pilot, "pause")
                await wait_until(pilot, lambda: "⏸ paused" in _header(app))
            proc.kill()
            proc.wait(10)
            # no batch for STALE_S: the state flips; give the frame timer a few seconds more
            await wait_until(pilot, lambda: "○ disconnected" in _header(app),
                             timeout=STALE_S + 10)
            header = _header(app)
            assert "req/s" not in header  # a rate of a dead engine is not a rate
            assert "paused" not in header
    finally:
        proc.kill()
        proc.wait(10)


@sync
async def test_a_killed_engine_is_shown_disconnected() -> None:
    await _killed_engine_is_shown_disconnected(pause=False)


@sync
async def test_a_killed_paused_engine_is_shown_disconnected_not_paused() -> None:
    await _killed_engine_is_shown_disconnected(pause=True)


@contextmanager
def _followed_tree(blocks: int = 256) -> Iterator[tuple[Server, LiveSource, Feed]]:
    """A model-free engine served in this process on consecutive loopback ports, followed by
    a started ``LiveSource`` on its own feed (stopped and closed after the block)."""
    server = Server(TreeDriver(blocks), Endpoints.tcp("127.0.0.1", free_ports(3)),
                    ServerConfig(num_blocks=blocks)).start()
    source = LiveSource(server.publisher.endpoints.events)
    feed = Feed()
    source.start(feed)
    try:
        yield server, source, feed
    finally:
        source.stop()
        server.close()


def _wait(predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_status_is_a_pure_read_and_the_join_reaches_the_feed_without_it() -> None:
    """The subscriber thread tells the feed of the snapshot it loaded (nobody has to ask for
    the status first), and asking for the status writes nothing, before or after the join."""
    with _followed_tree() as (_, source, feed):
        _wait(lambda: source._sub is not None and source._sub.synced.is_set())
        with feed.lock:
            delta = feed.take_locked()
        assert delta.rebuild  # the join's snapshot was handed to the feed by its hook
        state = dict(vars(source))
        status = source.status()
        assert status.state is ConnState.LIVE
        assert dict(vars(source)) == state  # no transition bookkeeping in a read
        assert status == source.status()  # the same facts, the same answer


def test_disconnected_counts_from_the_last_frame_not_from_the_first_look() -> None:
    """Nobody looks while the engine dies: the first look afterwards still says since when it
    went silent (its last frame), not 'since you asked'."""
    with _followed_tree() as (server, source, _):
        _wait(lambda: source._sub is not None and source._sub.synced.is_set())
        server.close()
        sub = source._sub
        assert sub is not None
        _wait(lambda: time.monotonic() - sub.last_frame > STALE_S + 0.5)
        status = source.status()
        assert status.state is ConnState.DISCONNECTED
        assert time.time() - status.since > STALE_S + 0.5


def test_a_command_waits_the_configured_timeout() -> None:
    """``command_timeout_s`` is what ``send`` waits for a reply (nothing listens here)."""
    source = LiveSource(f"tcp://127.0.0.1:{free_ports(3)}", command_timeout_s=0.3)
    reply = source.send(cmd.Stats())
    assert isinstance(reply, cmd.Error)
    assert "within 0.3 s" in reply.message
