"""Screenshots of the inspector (``radixcache screenshot``): SVG from Textual, PNG via cairosvg.

Four scenes, each driven headless by the Pilot until an explicit condition holds:

- ``live_tree``: an engine server in this process (``TreeServer`` on free loopback ports)
  after a chat workload, followed over ZeroMQ by a ``LiveSource``;
- ``block_map_eviction``: a fork workload then ``evict``, just-evicted blocks kept red;
- ``replay``: a recording written with ``RecordingWriter``, replayed half way;
- ``kv_events``: the block-hash view attached to the server's vLLM-format publisher.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from textual.app import App

from inspector.app import InspectorApp
from inspector.kv_view import KVEventsApp
from inspector.live import LiveSource
from inspector.local import LocalSource
from inspector.replay import ReplaySource, load_recording
from radixcache import events as ev
from radixcache.pool import KVPool
from radixcache.recording import RecordingWriter
from radixcache.server import ServerConfig, TreeServer
from radixcache.stream import Endpoints, serve_request
from radixcache.tree import RadixTree
from radixcache.workloads import Vocabulary, build_workload

SIZE = (160, 48)
Check = Callable[[], bool]
Log = Callable[[str], None]


def free_ports(count: int) -> int:
    """A port P such that P .. P + count - 1 are free on 127.0.0.1 right now (an engine binds
    events on P, snapshot/replay on P + 1, commands on P + 2, vLLM KV events on P + 3, P + 4)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count > 65535:
            continue
        try:
            held = []
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return base
    raise OSError(f"no {count} consecutive free ports on 127.0.0.1")


def svg_to_png(svg: str, png: Path) -> None:
    """Render Textual's SVG with cairosvg (whitespace kept: ``xml:space="preserve"``)."""
    import cairosvg

    if 'xml:space="preserve"' not in svg:
        svg = svg.replace("<svg ", '<svg xml:space="preserve" ', 1)
    cairosvg.svg2png(bytestring=svg.encode(), write_to=str(png), output_width=SIZE[0] * 12)


async def _shoot(app: App[None], lines: list[str], ready: Check, out: Path, name: str,
                 timeout: float = 60.0) -> list[Path]:
    async with app.run_test(size=SIZE) as pilot:
        for line in lines:
            await pilot.press("escape", "colon")
            app.query_one("#command").value = line  # type: ignore[attr-defined]
            await pilot.press("enter")
            await pilot.pause(0.3)
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"screenshot {name}: the scene did not come up in {timeout} s")
            await pilot.pause(0.05)
        await pilot.pause(0.5)
        svg = app.export_screenshot(title=f"radixcache {name}")
    (out / f"{name}.svg").write_text(svg, encoding="utf-8")
    svg_to_png(svg, out / f"{name}.png")
    return [out / f"{name}.svg", out / f"{name}.png"]


def _live(out: Path) -> list[Path]:
    server = TreeServer(Endpoints.tcp("127.0.0.1", free_ports(3)),
                        ServerConfig(num_blocks=2048)).start()
    try:
        app = InspectorApp(LiveSource(server.publisher.endpoints.events), flash_s=0)

        def ready() -> bool:
            st = server.stats()
            done = st["queued"] == 0 and st["served"] != 0
            return done and len(app.feed.mirror.nodes) - 1 == st["nodes"] and app.caught_up()

        return asyncio.run(_shoot(app, ["chat 20 --seed 7"], ready, out, "live_tree"))
    finally:
        server.close()


def _eviction(out: Path) -> list[Path]:
    src = LocalSource(1024)
    app = InspectorApp(src, flash_s=0, evicted_s=3600)

    def ready() -> bool:
        return len(app.replies) >= 3 and src.idle() and app.caught_up()

    lines = ["fork 8", "chat 6", "evict 900"]
    return asyncio.run(_shoot(app, lines, ready, out, "block_map_eviction"))


def record_demo(path: Path, requests: int = 60) -> Path:
    """A small recording of a tree-of-thought workload (keyframe every 100 events)."""
    tree = RadixTree(KVPool(2048, 16))
    prompts = []
    for r in build_workload("tot", ["3", "3"]).requests:
        extra = r.forced_output if r.forced_output is not None else np.zeros(0, np.uint32)
        prompts.append(np.concatenate([r.prompt, extra]).astype(np.uint32))
    with RecordingWriter(path, {"num_blocks": 2048}, keyframe_every=100) as w:
        w.write_keyframe(0, 1, tree.snapshot())
        for seq, tokens in enumerate(prompts[:requests], start=1):
            serve_request(tree, tokens)
            w.write_batch(ev.Batch(seq, 1, 1_700_000_000.0 + seq, "radixcache",
                                   tree.take_events()))
            if w.needs_keyframe:
                w.write_keyframe(seq, 1, tree.snapshot())
    return path


def _replay(out: Path) -> list[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        rec = load_recording(record_demo(Path(tmp) / "tot.rcx"))
    src = ReplaySource(rec)
    app = InspectorApp(src, flash_s=0)

    def ready() -> bool:
        if src.index == 0:
            src.step(len(rec.batches) * 2 // 3)
        return app.caught_up() and src.index > 0

    return asyncio.run(_shoot(app, [], ready, out, "replay"))


def _kv_events(out: Path) -> list[Path]:
    any_port = ("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    server = TreeServer(Endpoints.tcp("127.0.0.1", 0), ServerConfig(num_blocks=2048),
                        kv_endpoints=any_port).start()
    assert server.kv is not None
    try:
        server.handle_line("chat 6 --seed 3")
        while server.stats()["queued"]:
            time.sleep(0.05)
        app = KVEventsApp(server.kv.endpoints[0], server.kv.endpoints[1], vocab=Vocabulary())

        def ready() -> bool:
            return len(app.shown_rows()) > 20

        return asyncio.run(_shoot(app, [], ready, out, "kv_events"))
    finally:
        server.close()


def take_all(out: Path, log: Log | None = None) -> list[Path]:
    """Write ``<scene>.svg`` and ``<scene>.png`` of every scene into ``out``."""
    paths: list[Path] = []
    for scene in (_live, _eviction, _replay, _kv_events):
        if log is not None:
            log(f"scene {scene.__name__.strip('_')}")
        paths.extend(scene(out))
    return paths
