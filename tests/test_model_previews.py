"""The inspector's previews in the served model's text: an engine serving a model folder names
it in its ``stats`` (``model_dir``), and the inspector, embedded or live on this machine,
decodes each node's tokens with that folder's tokenizer; an engine on another machine, or a
folder without a tokenizer, shows ids with a note. The memory pane shows the K/V bytes of a
block and of a token (at 80x24 too), and the ``stats`` reply carries them."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from inspector.app import InspectorApp
from inspector.embedded import EmbeddedSource
from inspector.engine_facts import EngineFacts, ModelWords, same_machine
from inspector.feed import Feed
from inspector.layout import preview_text
from inspector.live import LiveSource
from inspector.widgets.memory import MemoryPane, kv_line, size_text
from inspector.widgets.tree_view import TreeView
from radixcache.core import tokens as tk
from radixcache.serving.checkpoint import Checkpoint
from radixcache.serving.engine import Answers, Engine, EngineConfig
from radixcache.serving.loop import LoopConfig, Sampling
from radixcache.serving.memory import MemorySource
from radixcache.serving.server import Server, ServerConfig
from radixcache.serving.stats import Stats
from radixcache.traffic.folder_tokenizer import FolderTokenizer
from radixcache.wire import commands as cmd
from radixcache.wire.endpoints import Endpoints, free_ports
from tests.helpers.checkpoints import folder_fixture
from tests.helpers.pilot import NoNvml, sync, type_line, wait_until

PER_TOKEN = 2 * 2 * 16 * 4 * 2  # layers x KV heads x head dim x float32 x (K, V): 512 bytes
PER_BLOCK = PER_TOKEN * 16


folder = folder_fixture("llama", "TinyLlama-previews")


def _engine(folder: Path) -> Engine:
    return Engine(EngineConfig(num_blocks=256, device="cpu", answers=Answers.PREFILL,
                               checkpoint=Checkpoint(str(folder), "float32")),
                  memory=MemorySource(nvml=NoNvml()))  # type: ignore[arg-type]


def _embedded(folder: Path) -> EmbeddedSource:
    return EmbeddedSource(_engine(folder), LoopConfig(sampling=Sampling.EVERY_BATCH))


def _nodes(feed: Feed) -> list[list[int]]:
    with feed.lock:
        return [tk.to_list(n.tokens) for n in feed.mirror.nodes.values() if n.tokens]


def _wait(predicate: object, timeout_s: float = 60.0) -> None:
    done = threading.Event()
    assert callable(predicate)
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return
        done.wait(0.05)  # polls a condition another thread makes true; asserts nothing on time
    raise AssertionError(f"not within {timeout_s} s")


def test_an_embedded_engine_s_node_previews_are_its_tokenizer_s_decoding(folder: Path) -> None:
    src, feed = _embedded(folder), Feed()
    src.start(feed)
    try:
        reply = src.send(cmd.StartWorkload("chat", ["2", "--seed", "1"]))
        assert isinstance(reply, cmd.Ok)
        _wait(src.idle)
        words, tok = src.vocabulary(), FolderTokenizer(folder)
        assert (words.model_dir, words.decodes) == (str(folder.resolve()), True)
        assert words.note == f"previews in the text of {folder.resolve() / 'tokenizer.json'}"
        nodes = _nodes(feed)
        assert len(nodes) >= 3
        for ids in nodes:
            assert words.text(ids) == tok.decode(ids)
            head = tk.from_ids(ids[:8])
            assert preview_text(head, words, 200) == f'"{tok.decode(ids[:8])}"'
        assert any(c.isalpha() for ids in nodes for c in tok.decode(ids))  # words, not ids
    finally:
        src.stop()


@sync
async def test_the_tree_pane_shows_the_model_s_text_and_the_memory_pane_its_kv_bytes_at_80x24(
        folder: Path) -> None:
    src = _embedded(folder)
    app = InspectorApp(src, flash_s=0, frame_interval=0.02)
    tok = FolderTokenizer(folder)
    async with app.run_test(size=(80, 24)) as pilot:
        await type_line(pilot, "chat 2")
        await wait_until(pilot, lambda: app.replies == 1 and src.idle() and app.caught_up(),
                         timeout=60)
        tree = app.query_one(TreeView)
        await wait_until(pilot, lambda: len(tree.rows) > 2)
        row = tree.rows[1]
        text = tree.render_line(1).text
        want = tok.decode(tk.to_list(row.node.tokens)[:8])
        assert want[:3] in text  # the row's preview (cut to its room) starts with the text
        assert app.messages.count(f"✓ previews in the text of "
                                  f"{folder.resolve() / 'tokenizer.json'}") == 1
        await type_line(pilot, "stats")  # the reply names the K/V bytes and the folder
        await wait_until(pilot, lambda: app.replies == 2)
        said = app.messages[-1]
        assert f"kv_bytes_per_block={PER_BLOCK}  kv_bytes_per_token={PER_TOKEN}" in said
        assert f"model_dir={folder.resolve()}" in said
        await pilot.press("f4")  # 80x24 hides the memory pane: f4 shows it
        mem = app.query_one(MemoryPane)
        await wait_until(pilot, lambda: mem.size.height > 0 and mem.sample is not None)
        await pilot.pause(0.1)
        lines = [s.text for s in app.screen._compositor.render_strips()]
        assert mem.kv == (PER_BLOCK, PER_TOKEN)
        assert sum("8KiB/blk 512B/tok" in line for line in lines) == 1
        await pilot.resize_terminal(120, 40)
        await pilot.pause(0.2)
        lines = [s.text for s in app.screen._compositor.render_strips()]
        assert sum("K/V 8KiB/block 512B/token" in line for line in lines) == 1, "\n".join(lines)


def test_the_stats_reply_says_the_kv_bytes_and_the_model_folder(folder: Path) -> None:
    engine = _engine(folder)
    try:
        facts = EngineFacts.of(Stats.of(engine.stats().reply()))  # as the wire carries it
        assert facts == EngineFacts(folder.resolve().name, str(folder.resolve()), PER_BLOCK,
                                    PER_TOKEN)
    finally:
        engine.close()


@pytest.fixture
def served(folder: Path) -> Iterator[Server]:
    engine = _engine(folder)
    port = free_ports(3)
    server = Server(engine, Endpoints.tcp("127.0.0.1", port),
                    ServerConfig(block_size=16, num_blocks=256)).start()
    try:
        yield server
    finally:
        server.close()


def test_a_live_inspector_on_this_machine_decodes_with_the_engine_s_folder(
        served: Server, folder: Path) -> None:
    src, feed = LiveSource(served.publisher.endpoints.events), Feed()
    src.start(feed)
    try:
        assert isinstance(src.send(cmd.StartWorkload("chat", ["2"])), cmd.Ok)
        words, tok = src.vocabulary(), FolderTokenizer(folder)
        _wait(lambda: words.decodes and len(_nodes(feed)) >= 2)
        assert (src.status().kv_bytes_per_block, src.status().kv_bytes_per_token) == (
            PER_BLOCK, PER_TOKEN)
        for ids in _nodes(feed):
            assert words.text(ids) == tok.decode(ids)
    finally:
        src.stop()


def test_a_folder_elsewhere_or_without_a_tokenizer_shows_ids_with_a_note(
        folder: Path, tmp_path: Path) -> None:
    assert [same_machine(e) for e in ("ipc:///tmp/x-events", "tcp://127.0.0.1:5557",
                                      "tcp://[::1]:5557", "tcp://10.0.0.7:5557")] == [
        True, True, True, False]
    far = ModelWords()
    far.adopt(str(folder), local=False)
    assert (far.text([7, 42, 99]), far.decodes) == ("7 42 99", False)
    assert far.note == (f"previews show token ids: the engine's model folder {folder} is on "
                        "another machine")
    bare = tmp_path / "no-tokenizer"
    shutil.copytree(folder, bare)
    (bare / "tokenizer.json").unlink()
    here = ModelWords()
    before = here.revision
    here.adopt(str(bare), local=True)
    assert (here.text([7, 42]), here.revision) == ("7 42", before + 1)
    assert here.note == (f"previews show token ids: {bare}: no tokenizer.json (a fast "
                         "tokenizer is needed)")
    here.adopt("", local=True)  # the seeded model again: the workloads' words
    assert (here.decodes, here.note, here.text([1])) == (False, "", ModelWords().text([1]))


def test_sizes_and_the_kv_line_fit_their_room() -> None:
    assert [size_text(n) for n in (512, 8192, 23040, 368640, 3 << 20)] == [
        "512B", "8KiB", "22.5KiB", "360KiB", "3MiB"]
    assert kv_line(8192, 512, 40) == "K/V 8KiB/block 512B/token"
    assert kv_line(8192, 512, 16) == "8KiB/blk 512B/tok"
    assert kv_line(0, 0, 40) == ""
