"""The KV-event screen: radix rows, the dialect and the history's health in its header."""

from __future__ import annotations

import asyncio
import time

from inspector.kv_view import KVEventsApp
from tests.helpers.kvevents import FlakyPublisher, sglang_batches
from tests.helpers.stream import wait_for


async def _until(pilot, predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await pilot.pause(0.02)


def test_screen_names_the_format_shows_radix_rows_and_says_complete():
    payloads, held = sglang_batches(40, 1, seed=3, capacity=200)
    pub = FlakyPublisher(drop=lambda seq: seq % 4 == 3).start(payloads, interval_s=0.0,
                                                             subscribers=0)

    async def run() -> None:
        app = KVEventsApp(*pub.endpoints, frame_interval=0.02)
        async with app.run_test(size=(140, 40)) as pilot:
            await _until(pilot, lambda: sum(len(r.blocks) for r in app.shown_rows())
                         == len({h for h, _ in held}))
            await _until(pilot, lambda: app.status[1] == "history: complete")
            assert app.status == ["format: SGLang format, map encoding", "history: complete"]
            rows = app.shown_rows()
            assert len(rows) < sum(len(r.blocks) for r in rows)  # chains became nodes

    try:
        assert wait_for(pub.done)  # all published before the screen joins: replay brings it
        asyncio.run(run())
    finally:
        pub.close()


def test_screen_without_replay_joined_late_says_incomplete():
    payloads, _ = sglang_batches(20, 16, seed=4)

    async def run(pub: FlakyPublisher) -> None:
        app = KVEventsApp(pub.endpoints[0], frame_interval=0.02)
        async with app.run_test(size=(140, 40)) as pilot:
            pub.start(payloads, interval_s=0.0)  # once the screen has subscribed
            await _until(pilot, lambda: len(app.status) > 1 and "incomplete" in app.status[1])
            assert app.status[1] == "history: incomplete since seq 0: no replay endpoint"

    pub = FlakyPublisher(drop=lambda seq: seq < 2)
    try:
        asyncio.run(run(pub))
    finally:
        pub.close()


def test_screen_with_a_bad_endpoint_says_why_it_stopped():
    async def run() -> None:
        app = KVEventsApp("nonsense", frame_interval=0.02)
        async with app.run_test(size=(140, 40)) as pilot:
            await _until(pilot, lambda: len(app.status) == 3)
            assert app.status[2] == "stopped: ZMQError: Invalid argument (addr='nonsense')"

    asyncio.run(run())
