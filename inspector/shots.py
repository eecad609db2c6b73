"""Screenshots of the inspector (``radixcache screenshot``): SVG from Textual, PNG via cairosvg.

Four scenes, each driven headless by the Pilot until an explicit condition holds. Three follow
a real engine process (``radixcache serve`` with the tiny model on free loopback ports, its
answers folded into the prefill so a CPU keeps up) and are shot while it is busy:

- ``live_tree``: a ShareGPT chat workload (synthetic chat without the dataset), once requests
  flow, hits are counted, the memory pane has samples and the dataset's words are loaded;
- ``block_map_eviction``: chat on a small pool, once the engine evicts (just-evicted kept red);
- ``kv_events``: the block-hash view attached to the engine's vLLM-format publisher;

and ``replay`` replays, to its end, a recording that ``radixcache record`` made
of a tree-of-thought workload on the same engine.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from textual.app import App

from inspector.app import InspectorApp
from inspector.kv_view import KVEventsApp
from inspector.layout import TokenText
from inspector.live import LiveSource
from inspector.replay import ReplaySource, load_recording
from inspector.sources import DatasetWords
from inspector.widgets.memory import MemoryPane
from radixcache.core import events as ev
from radixcache.core.pool import KVPool
from radixcache.core.tree import RadixTree
from radixcache.traffic.workloads import build_workload
from radixcache.wire import commands as cmd
from radixcache.wire.recording import RecordingWriter
from radixcache.wire.stream import Endpoints, send_command, serve_request

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


class EngineProcess:
    """``radixcache serve`` in a child process on ``free_ports(5)``: events on ``port``,
    snapshot/replay +1, commands +2, vLLM KV events +3 (replay +4). A context manager: the
    process is up and answering commands inside the block, and gone after it."""

    def __init__(self, blocks: int, ready_s: float = 120.0) -> None:
        self.blocks = blocks
        self.ready_s = ready_s
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def events(self) -> str:
        """The engine's event endpoint (what a ``LiveSource`` follows)."""
        return f"tcp://127.0.0.1:{self.port}"

    def kv(self) -> tuple[str, str]:
        """The vLLM-format publisher's event and replay endpoints."""
        return f"tcp://127.0.0.1:{self.port + 3}", f"tcp://127.0.0.1:{self.port + 4}"

    def __enter__(self) -> EngineProcess:
        self.port = free_ports(5)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--port", str(self.port),
             "--blocks", str(self.blocks), "--answers", "prefill", "--kv-events", "vllm"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        commands = Endpoints.from_events(self.events).commands
        deadline = time.monotonic() + self.ready_s
        while not isinstance(send_command(commands, cmd.Stats(), timeout_s=0.5), cmd.Ok):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"the engine on port {self.port} did not come up")
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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
                  *, evicted_s: float = 2.0) -> list[Path]:
    """Follow a fresh engine of ``blocks`` blocks running ``chat 30`` until ``ready(app)``;
    the dataset's words are loaded first, so no preview is drawn before they are known."""
    with EngineProcess(blocks) as engine:
        source = LiveSource(engine.events)
        source.vocabulary().load().wait(120)
        app = InspectorApp(source, flash_s=0, evicted_s=evicted_s)
        return asyncio.run(_shoot(app, ["chat 30"], lambda: ready(app), out, name,
                                  timeout=180))


def _live(out: Path) -> list[Path]:
    return _engine_scene(out, "live_tree", 4096, lambda app: _busy(app, 40))


def _eviction(out: Path) -> list[Path]:
    def ready(app: InspectorApp) -> bool:
        return len(app.blocks.evicted) >= 40 and _busy(app, 60)

    return _engine_scene(out, "block_map_eviction", 2048, ready, evicted_s=3600)


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


def record_engine(path: Path, workload: str, args: str, requests: int) -> Path:
    """``radixcache record`` of ``requests`` requests of ``workload`` on the tiny-model
    engine (answers decoded token by token), its only keyframe the empty tree (so a replay
    from the start counts every request)."""
    subprocess.run([sys.executable, "-m", "cli.main", "record", "--out", str(path),
                    "--workload", workload, "--workload-args", args, "--requests",
                    str(requests), "--blocks", "2048", "--keyframe-every", "1000000",
                    "--answers", "decode"],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   timeout=300)
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
    with EngineProcess(4096) as engine:
        words = DatasetWords()
        words.load().wait(120)  # rows keep the text they were first drawn with
        app = KVEventsApp(*engine.kv(), vocab=words)
        commands = Endpoints.from_events(engine.events).commands
        started: list[cmd.AnyReply] = []

        def ready() -> bool:  # the workload starts once the view is up, so it sees it all
            if not started:
                started.append(send_command(commands, cmd.StartWorkload("chat", ["30"])))
            return len(app.shown_rows()) > 40

        return asyncio.run(_shoot(app, [], ready, out, "kv_events", timeout=180))


def take_all(out: Path, log: Log | None = None) -> list[Path]:
    """Write ``<scene>.svg`` and ``<scene>.png`` of every scene into ``out``."""
    paths: list[Path] = []
    for scene in (_live, _eviction, _replay, _kv_events):
        if log is not None:
            log(f"scene {scene.__name__.strip('_')}")
        paths.extend(scene(out))
    return paths
