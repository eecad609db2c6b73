"""Screenshots of the inspector (``radixcache screenshot``): SVG from Textual, PNG via cairosvg.

Six scenes, each driven headless by the Pilot until an explicit condition holds. Five follow
a real engine served in this process (the same ``Server`` as ``radixcache serve``, the tiny
model on free loopback ports, its answers folded into the prefill so a CPU keeps up) and are
shot while it is busy:

- ``live_tree``: a ShareGPT chat workload (synthetic chat without the dataset), once requests
  flow, hits are counted, the memory pane has samples and the dataset's words are loaded;
- ``block_map_eviction``: chat on a small pool, once the engine evicts (just-evicted kept red);
- ``whatif_live``: the same, then ``w``: the curve of the requests finished so far;
- ``why_missed``: the same, then ``why N`` for a request that lost tokens to eviction;
- ``kv_events``: the block-hash view attached to the engine's vLLM-format publisher;

and ``replay`` replays, to its end, a recording of a tree-of-thought workload made as
``radixcache record`` makes it (``record_service``) on the same engine.

Each SVG and PNG is written whole or not at all (``core.files.write_whole``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from textual.app import App
from textual.pilot import Pilot

from inspector.app import InspectorApp
from inspector.kv_view import KVEventsApp
from inspector.layout import TokenText
from inspector.live import LiveSource
from inspector.replay import ReplaySource, load_recording
from inspector.sources import DatasetWords
from inspector.whatif_screen import WhatIfScreen
from inspector.why_screen import WhyScreen
from inspector.widgets.memory import MemoryPane
from radixcache.analysis.misses import Cause
from radixcache.core.files import write_whole
from radixcache.serving.server import Server, record_file, tiny_engine_server
from radixcache.traffic.workloads import build_workload
from radixcache.wire import commands as cmd

SIZE = (160, 48)
Check = Callable[[], bool]
After = Callable[[Pilot[None]], Awaitable[None]]
Log = Callable[[str], None]


def monospace_font_missing() -> str | None:
    """Why the PNGs would not be monospace (Textual's SVG asks for Fira Code; without it the
    renderer falls back to a proportional font and columns drift), or None."""
    import shutil
    import subprocess

    if shutil.which("fc-match") is None:
        return "fc-match not found: cannot tell whether the Fira Code font is installed"
    found = subprocess.run(["fc-match", "-f", "%{family}", "Fira Code"], capture_output=True,
                           text=True, check=False).stdout
    if "Fira Code" not in found:
        return (f"the Fira Code font is not installed (fc-match gives {found!r}): the PNGs "
                "will use a proportional font (Debian: apt install fonts-firacode)")
    return None


def svg_to_png(svg: str, png: Path) -> None:
    """Render Textual's SVG with cairosvg (whitespace kept: ``xml:space="preserve"``)."""
    import cairosvg

    if 'xml:space="preserve"' not in svg:
        svg = svg.replace("<svg ", '<svg xml:space="preserve" ', 1)
    data = cairosvg.svg2png(bytestring=svg.encode(), output_width=SIZE[0] * 12)
    assert isinstance(data, bytes)  # no write_to: the PNG is returned
    write_whole(png, data)


async def _until(pilot: Pilot[None], check: Check, what: str, timeout: float = 60.0) -> None:
    """Let the app run until ``check()`` holds; ``RuntimeError`` naming ``what`` after
    ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up in {timeout:g} s")
        await pilot.pause(0.05)


async def _shoot(app: App[None], lines: list[str], ready: Check, out: Path, name: str,
                 timeout: float = 60.0, after: After | None = None) -> list[Path]:
    async with app.run_test(size=SIZE) as pilot:
        for line in lines:
            await pilot.press("escape", "colon")
            app.query_one("#command").value = line  # type: ignore[attr-defined]
            await pilot.press("enter")
            await pilot.pause(0.3)
        await _until(pilot, ready, f"screenshot {name}: the scene", timeout)
        if after is not None:  # keys and lines that need the scene up (a screen, a request)
            await after(pilot)
        await pilot.pause(0.5)
        svg = app.export_screenshot(title=f"radixcache {name}")
    write_whole(out / f"{name}.svg", svg.encode("utf-8"))
    svg_to_png(svg, out / f"{name}.png")
    return [out / f"{name}.svg", out / f"{name}.png"]


@contextlib.contextmanager
def served_engine(blocks: int) -> Iterator[Server]:
    """A tiny-model engine served in this process on free loopback ports (events, snapshot,
    commands, and a vLLM-format KV publisher), running inside the block."""
    server = tiny_engine_server(blocks, kv_events=True).start()
    try:
        yield server
    finally:
        server.close()


def _words_ready(vocab: TokenText | None) -> bool:
    """True once a ``DatasetWords`` has its dataset's words (or knows it has none)."""
    return not isinstance(vocab, DatasetWords) or vocab.load().is_set()


def _busy(app: InspectorApp, requests: int) -> bool:
    """Requests flow (non-zero rate), hits counted, a memory sample shown, all on screen."""
    s = app.feed.mirror.stats
    return (s.requests >= requests and s.hit_tokens > 0 and app.req_per_s > 0
            and app.query_one(MemoryPane).sample is not None
            and _words_ready(app.source.vocabulary()) and app.caught_up())


def _engine_scene(out: Path, name: str, blocks: int, ready: Callable[[InspectorApp], bool],
                  *, evicted_s: float = 2.0, after: Callable[[InspectorApp], After] | None = None
                  ) -> list[Path]:
    """Follow a fresh engine of ``blocks`` blocks running ``chat 30`` until ``ready(app)``;
    the dataset's words are loaded first, so no preview is drawn before they are known."""
    with served_engine(blocks) as engine:
        source = LiveSource(engine.publisher.endpoints.events)
        source.vocabulary().load().wait(120)
        app = InspectorApp(source, flash_s=0, evicted_s=evicted_s)
        return asyncio.run(_shoot(app, ["chat 30"], lambda: ready(app), out, name,
                                  timeout=180, after=after(app) if after else None))


def _live(out: Path) -> list[Path]:
    return _engine_scene(out, "live_tree", 4096, lambda app: _busy(app, 40))


def _eviction(out: Path) -> list[Path]:
    def ready(app: InspectorApp) -> bool:
        return len(app.blocks.evicted) >= 40 and _busy(app, 60)

    return _engine_scene(out, "block_map_eviction", 2048, ready, evicted_s=3600)


def _evicting(app: InspectorApp) -> bool:
    return len(app.blocks.evicted) >= 40 and _busy(app, 60)


def _whatif(out: Path) -> list[Path]:
    """The what-if screen over a live engine that evicts."""
    def after(app: InspectorApp) -> After:
        async def run(pilot: Pilot[None]) -> None:
            await pilot.press("escape", "w")
            await _until(pilot, lambda: isinstance(app.screen, WhatIfScreen)
                         and app.screen.view is not None and app.screen.view.curve.requests > 0,
                         "screenshot whatif_live: the what-if curve")
        return run

    return _engine_scene(out, "whatif_live", 2048, _evicting, after=after)


def _telling(app: InspectorApp) -> int | None:
    """A finished request that hit in part and lost a span to eviction (the most telling)."""
    with app.feed.lock:
        for w in reversed(app.feed.follow.misses.all()):
            if w.hit_tokens and any(s.cause is Cause.EVICTED for s in w.spans or ()):
                return w.req
    return None


def _why(out: Path) -> list[Path]:
    """The why screen of a request that lost tokens to eviction."""
    def after(app: InspectorApp) -> After:
        async def run(pilot: Pilot[None]) -> None:
            await pilot.press("escape", "colon")
            app.query_one("#command").value = f"why {_telling(app)}"  # type: ignore[attr-defined]
            await pilot.press("enter")
            await _until(pilot, lambda: isinstance(app.screen, WhyScreen),
                         "screenshot why_missed: the why screen")
        return run

    return _engine_scene(out, "why_missed", 512,  # small: turns come back to evicted history
                         lambda app: _busy(app, 40) and _telling(app) is not None, after=after)


def record_demo(path: Path, requests: int = 60) -> Path:
    """A small recording of a tree-of-thought workload with no model (the tree driver, one
    request a batch; keyframe every 100 events)."""
    w = build_workload("tot", ["3", "3"])
    record_file(path, dataclasses.replace(w, requests=w.requests[:requests]), model=False,
                keyframe_every=100)
    return path


def record_engine(path: Path, workload: str, args: str, requests: int) -> Path:
    """A recording of ``requests`` requests of ``workload`` on the tiny-model engine (answers
    decoded token by token), its only keyframe the empty tree (so a replay from the start
    counts every request)."""
    w = build_workload(workload, args.split())
    record_file(path, dataclasses.replace(w, requests=w.requests[:requests]), model=True,
                keyframe_every=1_000_000)
    return path


def _replay(out: Path) -> list[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        rec = load_recording(record_engine(Path(tmp) / "tot.rcx", "tot", "3 4", 1000))
    src = ReplaySource(rec)
    app = InspectorApp(src, flash_s=0)

    def ready() -> bool:  # the end: a recording's one Watermark is in its last batch
        if src.index == 0:
            src.step(len(rec.batches))
        return app.caught_up() and src.index > 0

    return asyncio.run(_shoot(app, [], ready, out, "replay"))


def _kv_events(out: Path) -> list[Path]:
    with served_engine(4096) as engine:
        words = DatasetWords()
        words.load().wait(120)  # rows keep the text they were first drawn with
        assert engine.kv is not None
        app = KVEventsApp(*engine.kv.endpoints, vocab=words)
        started: list[cmd.AnyReply] = []

        def ready() -> bool:  # the workload starts once the view is up, so it sees it all
            if not started:
                started.append(engine.loop.command(cmd.StartWorkload("chat", ["30"])))
            return sum(len(r.blocks) for r in app.shown_rows()) > 200  # rows are radix nodes

        return asyncio.run(_shoot(app, [], ready, out, "kv_events", timeout=180))


def take_all(out: Path, log: Log | None = None) -> list[Path]:
    """Write ``<scene>.svg`` and ``<scene>.png`` of every scene into ``out``."""
    paths: list[Path] = []
    for scene in (_live, _eviction, _whatif, _why, _replay, _kv_events):
        if log is not None:
            log(f"scene {scene.__name__.strip('_')}")
        paths.extend(scene(out))
    return paths
