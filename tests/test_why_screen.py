"""The inspector's "why" screen: a request picked in the event log (or named with `why N`)
shows its matched path and each missed span's cause, as the feed's miss history says."""

from __future__ import annotations

import re

from textual.widgets import Static

from inspector.app import InspectorApp
from inspector.why_screen import STYLES, WhyScreen
from inspector.widgets.event_log import EventLog
from radixcache.analysis.misses import Cause
from radixcache.core import events as ev
from radixcache.serving.memory import MemorySource
from tests.helpers.local import LocalSource
from tests.helpers.pilot import T0, NoNvml, sync, type_line, wait_until

SIZE = (150, 44)


def _body(app: InspectorApp) -> str:
    screen = app.screen
    assert isinstance(screen, WhyScreen)
    return str(screen.query_one("#why-body", Static).render())


async def _served(app: InspectorApp, pilot, line: str) -> None:  # type: ignore[no-untyped-def]
    """Type a workload command and wait until it is served and on screen."""
    await type_line(pilot, line)
    await wait_until(pilot, lambda: app.replies == 1 and app.source.idle()  # type: ignore[attr-defined]
                     and app.caught_up())


@sync
async def test_enter_on_a_request_in_the_event_log_explains_it() -> None:
    app = InspectorApp(LocalSource(96, clock=lambda: T0, memory=MemorySource(nvml=NoNvml())),  # type: ignore[arg-type]
                       flash_s=0, frame_interval=0.02)
    async with app.run_test(size=SIZE) as pilot:
        await _served(app, pilot, "chat 4 --seed 3")
        await type_line(pilot, "filter rstart")
        await pilot.press("escape", "e")  # e selects the newest request event shown
        log = app.query_one(EventLog)
        entries = [e for e in app.panes.of(EventLog).kept if e.kind == "rstart"]
        assert app.focused is log and log.selected is entries[-1]
        await pilot.press("up")  # the one before it
        assert log.selected is entries[-2]
        picked = entries[-2].event
        assert isinstance(picked, ev.RequestStart)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, WhyScreen))
        # written from the engine's own event, not from the history's words
        p, h = picked.prompt_tokens, picked.hit_tokens
        lines = _body(app).splitlines()
        assert lines[0] == (f"request {picked.req}, admitted in batch {entries[-2].seq}: "
                            f"prompt {p:,} tokens, {h:,} read from the cache "
                            f"({100 * h / p:.1f}%), {p - h:,} computed")
        assert lines[1].startswith("matched path: ")
        spans = lines[2:-2]
        assert spans and all(re.fullmatch(r"  tokens (\d+)-(\d+) \((\d+)\): .+", s)
                             for s in spans), spans
        assert sum(int(re.match(r"  tokens \d+-\d+ \((\d+)\)", s)[1])  # type: ignore[index]
                   for s in spans) == p - h  # the spans cover what it computed
        assert lines[-2:] == ["", "escape: close"]
        await pilot.press("escape")
        assert not isinstance(app.screen, WhyScreen)
        # every finished request was explained, and the spans cover exactly what it missed
        with app.feed.lock:
            whys = app.feed.follow.misses.all()
        served = {e.event.req for e in app.panes.of(EventLog).kept
                  if isinstance(e.event, ev.RequestFinish) and e.event.output_tokens > 0}
        assert len(served) >= 8
        assert {w.req for w in whys if w.spans is not None} == served
        for w in whys:
            if w.spans is not None:
                assert sum(s.end - s.start for s in w.spans) == w.missed
        causes = {s.cause for w in whys for s in w.spans or ()}
        assert Cause.NEVER_SEEN in causes


@sync
async def test_why_on_the_command_line_and_its_mistakes() -> None:
    app = InspectorApp(LocalSource(1024, clock=lambda: T0, memory=MemorySource(nvml=NoNvml())),  # type: ignore[arg-type]
                       flash_s=0, frame_interval=0.02)
    async with app.run_test(size=SIZE) as pilot:
        await _served(app, pilot, "fork 3")
        await type_line(pilot, "why 1")
        await wait_until(pilot, lambda: isinstance(app.screen, WhyScreen))
        body = _body(app)
        assert body.startswith("request 1, admitted in batch ")
        assert "matched path: n" in body
        await pilot.press("escape")
        for bad in ("why one", "why ²", "why -1", "why 1 2"):
            await type_line(pilot, bad)
            assert app.messages[-1] == ("✗ usage: why REQ (a request id, as the event log "
                                        "shows it)"), bad
        await type_line(pilot, "why 999")
        await wait_until(pilot, lambda: isinstance(app.screen, WhyScreen))
        assert _body(app).startswith("request 999: not seen since seq 0 ")
        await pilot.press("escape")
        await type_line(pilot, "filter create")
        await pilot.press("escape", "e", "up", "enter")  # no request shown: a create picked
        assert app.messages[-1] == ("✗ the selected entry is not a request event (rstart or "
                                    "rfinish; filter rstart rfinish shows them), or type: "
                                    "why REQ")  # no Markdown backticks on a terminal


def test_each_cause_has_its_colour() -> None:
    assert set(STYLES) == set(Cause)


@sync
async def test_the_default_filter_shows_what_enter_explains() -> None:
    """``e`` then Enter on the default filter: ``e`` selects the newest request's finish,
    and the why screen opens on it."""
    app = InspectorApp(LocalSource(1024, clock=lambda: T0, memory=MemorySource(nvml=NoNvml())),  # type: ignore[arg-type]
                       flash_s=0, frame_interval=0.02)
    async with app.run_test(size=SIZE) as pilot:
        await _served(app, pilot, "fork 3")
        await pilot.press("escape", "e")
        log = app.query_one(EventLog)
        finishes = [e for e in log.kept if isinstance(e.event, ev.RequestFinish)]
        picked = log.selected
        assert picked is not None and picked is finishes[-1]
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, WhyScreen))
        assert _body(app).startswith(f"request {picked.event.req}, admitted in batch ")
