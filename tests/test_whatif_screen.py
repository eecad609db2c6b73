"""The inspector's "what if" screen: the curve of a replay so far, predicted against measured."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
from textual.widgets import Static

from inspector.app import InspectorApp
from inspector.live import LiveSource
from inspector.replay import ReplaySource, load_recording
from inspector.shots import record_demo
from inspector.whatif_screen import WhatIfScreen
from radixcache.analysis.whatif import one_pass
from radixcache.core import events as ev
from radixcache.serving.driver import TreeDriver
from radixcache.serving.server import Server, ServerConfig
from radixcache.traffic.traces import read_recording, token_access
from radixcache.wire.endpoints import Endpoints, free_ports
from radixcache.wire.recorder import LiveRecorder
from tests.helpers.pilot import type_line, wait_until

SIZE = (150, 44)


def expected_headline(path: Path, num_blocks: int, block: int, scope: str) -> str:
    """The same figures computed offline: `radixcache whatif FILE`'s curve at the pool, and
    the hits the recorded RequestStart events measured."""
    curve = one_pass((token_access(r, 1) for r in read_recording(path, [])), 4, 1)
    batches = load_recording(path).batches
    starts = [e for b in batches for e in b.events if isinstance(e, ev.RequestStart)]
    measured = sum(e.hit_tokens for e in starts) / sum(e.prompt_tokens for e in starts)
    cap = num_blocks * block
    predicted = int(curve.hits(np.asarray([cap]))[0]) / curve.prompt_tokens
    return (f"what if: {scope}: {curve.requests:,} finished requests, {curve.prompt_tokens:,} "
            f"prompt tokens\nengine pool {num_blocks:,} blocks x {block} = {cap:,} tokens: "
            f"arrival-order LRU curve {100 * predicted:.2f}% (one request at a time), engine "
            f"measured {100 * measured:.2f}% (batched)")


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
            assert head_text(app) == ("what if: the replay up to batch 0: no request has "
                                      "finished yet; the curve grows as they finish")
            src.step(len(rec.batches))  # to the end: the screen catches up on its next draw
            want = expected_headline(path, snap.num_blocks, snap.block_size,
                                     f"the replay up to batch {len(rec.batches)}")
            await wait_until(pilot, lambda: head_text(app).startswith(want + "\n"))
            await pilot.press("w")
            assert not isinstance(app.screen, WhatIfScreen)

    asyncio.run(run())


def test_over_a_live_engine_the_curve_covers_the_stream_since_the_inspector_joined(tmp_path):
    """A real engine process side (a tree server on loopback), the inspector on its stream and
    a recorder beside it, both joined before the workload: the screen's curve and measured
    hit rate equal `radixcache whatif` over the recording (small pool: LRU evicts 12 times)."""
    endpoints = Endpoints.tcp("127.0.0.1", free_ports(3))  # the inspector finds +1, +2
    server = Server(TreeDriver(160), endpoints, ServerConfig(num_blocks=160)).start()
    path = tmp_path / "live.rcx"
    recorder = LiveRecorder(server.publisher.endpoints, path).start()
    app = InspectorApp(LiveSource(endpoints.events), flash_s=0, frame_interval=0.02)

    def settled() -> bool:
        seq = server.publisher.seq
        return (not server.loop.service.busy() and app.feed.seq >= seq
                and recorder.subscriber.seq >= seq)

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.feed.seq >= 0
                             and recorder.subscriber.synced.is_set())
            joined = app.feed.follow.since
            await type_line(pilot, "chat 6 --seed 3")
            await wait_until(pilot, lambda: app.replies == 1)
            await wait_until(pilot, settled, timeout=20)
            await pilot.press("escape", "w")
            recorder.stop()
            want = expected_headline(path, 160, 16,
                                     f"since the inspector joined (seq {joined:,})")
            await wait_until(pilot, lambda: head_text(app).startswith(want + "\n"))
            view = app.screen.view  # type: ignore[attr-defined]
            # the causes line adds up to what the served requests missed, by the recording
            batches = load_recording(path).batches
            starts = {e.req: e for b in batches for e in b.events
                      if isinstance(e, ev.RequestStart)}
            served = [e.req for b in batches for e in b.events
                      if isinstance(e, ev.RequestFinish) and e.output_tokens > 0]
            missed = sum(starts[r].prompt_tokens - starts[r].hit_tokens for r in served)
            line = head_text(app).splitlines()[3]
            body = line.removeprefix("missed tokens by cause: ")
            assert body != line and body.endswith(" (one request: why REQ)")
            counts = re.findall(r"\d[\d,]*", body.removesuffix(" (one request: why REQ)"))
            assert sum(int(n.replace(",", "")) for n in counts) == missed > 0
            assert "evicted" in body  # the small pool: LRU evicted what later turns wanted
            # every request the engine served (with per-block eviction all 18 of chat 6 fit
            # 160 blocks; whole-leaf eviction rejected one)
            assert (view.curve.requests, view.capacity_tokens) == (len(served), 160 * 16)
            assert len(served) == 18
            assert 0 < view.measured_hits < view.measured_prompt

    try:
        asyncio.run(run())
    finally:
        recorder.stop()
        server.close()
