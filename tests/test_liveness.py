"""The header tells the truth about the engine: a real ``serve`` process killed under the
real app is shown ``○ disconnected`` (docs/architecture.md, "Liveness")."""

from __future__ import annotations

import subprocess
import sys

from inspector.app import InspectorApp
from inspector.live import STALE_S, LiveSource
from radixcache.wire.endpoints import free_ports
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
