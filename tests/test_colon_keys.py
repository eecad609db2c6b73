"""Keys typed right after ``:`` reach the command line even when they arrive in one burst
(a busy machine reads ``:stats`` from the terminal in one chunk): ``:`` moves the focus at
once, not on a later turn of the app's queue, which the following keys used to beat."""

from __future__ import annotations

from textual import events
from textual.app import App
from textual.keys import _character_to_key
from textual.pilot import Pilot

from inspector.widgets.command_line import CommandLine
from radixcache.wire import commands as cmd
from tests.helpers.pilot import ManualSource, app_for, sync, wait_until


def _burst(app: object, text: str) -> None:
    """Post every key of ``text`` to the app in one go, as a driver does with one read of a
    busy terminal: no key waits for the previous one to be handled."""
    post = app.post_message  # type: ignore[attr-defined]
    for char in text:
        if char == "\r":
            post(events.Key("enter", "\r"))
        else:  # the key names Textual's driver gives printable characters
            post(events.Key(_character_to_key(char), char))


async def _typed(app: App[None], pilot: Pilot[None], keys: str, value: str) -> None:
    """``keys`` posted in one burst: the command line, focused, comes to hold ``value``."""
    _burst(app, keys)
    command = app.query_one("#command", CommandLine)
    await wait_until(pilot, lambda: command.value == value, timeout=5)
    assert app.focused is command


@sync
async def test_keys_right_after_colon_reach_the_command_line() -> None:
    source = ManualSource()
    app = app_for(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await _typed(app, pilot, ":stats", "stats")
        _burst(app, "\r")
        await wait_until(pilot, lambda: len(source.sent) == 1, timeout=5)
        assert source.sent == [cmd.Stats()]


@sync
async def test_colon_and_slash_inside_the_command_line_are_text() -> None:
    app = app_for(ManualSource())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await _typed(app, pilot, "/why 3:4/5", "why 3:4/5")


def test_the_cluster_screen_takes_keys_right_after_colon_too() -> None:
    import asyncio

    from textual.widgets import Input

    from inspector.cluster import ClusterApp
    from inspector.kv_fleet import KVFleet
    from radixcache.traffic.workloads import Vocabulary
    from radixcache.wire.kvevents import KVEventPublisher

    pub = KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    kv = KVFleet([pub.endpoints[0]], [pub.endpoints[1]]).start()

    async def run() -> tuple[str, bool]:
        app = ClusterApp(kv, words=Vocabulary())
        async with app.run_test() as pilot:
            await pilot.pause()
            _burst(app, ":help")
            line = app.query_one(Input)
            await wait_until(pilot, lambda: line.value == "help", timeout=5)
            return line.value, app.focused is line

    try:
        assert asyncio.run(run()) == ("help", True)
    finally:
        kv.close()
        pub.close()
