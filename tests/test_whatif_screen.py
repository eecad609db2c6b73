"""The inspector's "what if" screen: the curve of a replay so far, predicted against measured."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from textual.widgets import Static

from inspector.app import InspectorApp
from inspector.live import LiveSource
from inspector.replay import ReplaySource, load_recording
from inspector.shots import record_demo
from inspector.whatif_screen import NO_HISTORY, WhatIfScreen
from radixcache.analysis.whatif import one_pass
from radixcache.core import events as ev
from radixcache.traffic.traces import read_recording, token_access
from radixcache.wire.endpoints import free_ports

SIZE = (150, 44)


def expected_headline(path: Path, batches: list[ev.Batch], num_blocks: int, block: int) -> str:
    """The same figures computed offline: `radixcache whatif FILE`'s curve at the pool."""
    curve = one_pass((token_access(r, 1) for r in read_recording(path, [])), 4, 1)
    starts = [e for b in batches for e in b.events if isinstance(e, ev.RequestStart)]
    measured = sum(e.hit_tokens for e in starts) / sum(e.prompt_tokens for e in starts)
    cap = num_blocks * block
    predicted = int(curve.hits(np.asarray([cap]))[0]) / curve.prompt_tokens
    return (f"what if: {curve.requests:,} finished requests, {curve.prompt_tokens:,} prompt "
            f"tokens\nengine pool {num_blocks:,} blocks x {block} = {cap:,} tokens: curve "
            f"predicts {100 * predicted:.2f}%, engine measured {100 * measured:.2f}%")


def head_text(app: InspectorApp) -> str:
    screen = app.screen
    assert isinstance(screen, WhatIfScreen)
    return str(screen.query_one("#whatif-head", Static).render())


def test_the_screen_shows_the_replay_so_far_and_follows_it(tmp_path):
    path = record_demo(tmp_path / "tot.rcx", requests=30)
    rec = load_recording(path)
    snap = rec.keyframes[0][1]
    src = ReplaySource(rec)
    app = InspectorApp(src, flash_s=0, frame_interval=0.02)

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("w")
            await pilot.pause()
            assert head_text(app).startswith("what if: 0 finished requests, 0 prompt tokens")
            src.step(len(rec.batches))  # to the end: the screen catches up on its next draw
            want = expected_headline(path, rec.batches, snap.num_blocks, snap.block_size)
            for _ in range(200):  # a condition, not a duration: redraws come every 0.5 s
                if not head_text(app).startswith("what if: 0 "):
                    break
                await asyncio.sleep(0.02)
            assert head_text(app).startswith(want + "\n")
            await pilot.press("w")
            assert not isinstance(app.screen, WhatIfScreen)

    asyncio.run(run())


def test_a_live_source_is_told_how_to_get_its_curve():
    app = InspectorApp(LiveSource(f"tcp://127.0.0.1:{free_ports(3)}"), flash_s=0)

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("w")
            await pilot.pause()
            assert head_text(app) == NO_HISTORY

    asyncio.run(run())
