"""``radixcache demo --model DIR`` shows that model's cache live: its engine process serves the
folder, the stream builds the tree (headless: the mirror equals the engine's), and an inspector
following it on this machine previews each node in the folder's own text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from cli.cmd_demo import running_demo
from cli.options import model_args
from inspector.feed import Feed
from inspector.live import LiveSource
from radixcache.core import tokens as tk
from radixcache.serving.policy import SchedulePolicy
from radixcache.traffic.folder_tokenizer import FolderTokenizer
from tests.helpers.checkpoints import folder_fixture

ROOT = Path(__file__).resolve().parents[1]


folder = folder_fixture("qwen2", "TinyQwen-demo")


def test_demo_headless_with_a_model_folder_builds_its_tree(folder: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "cli.main", "demo", "--no-inspect", "--seconds",
                        "4", "--model", str(folder), "--dtype", "float32", "--blocks", "512",
                        "--mix", "chat 2,tot 2 2", "--json"], env=env, capture_output=True,
                       text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["workloads_sent"] >= 1 and s["served"] >= 1
    assert s["nodes"] > 1 and s["mirror_nodes"] == s["nodes"]  # the stream's tree is the engine's
    assert s["resyncs"] == 0


def test_the_demo_s_inspector_previews_the_model_s_text(folder: Path) -> None:
    tok, feed = FolderTokenizer(folder), Feed()
    with running_demo(512, ("tot 2 2",), 0.5, SchedulePolicy.FCFS,
                      model_args(str(folder), "float32")) as (engine, _loop):
        src = LiveSource(engine.endpoints.events)
        src.start(feed)
        try:
            words, wait = src.vocabulary(), threading.Event()
            for _ in range(1200):  # up to 60 s: an engine loading torch on a loaded machine
                with feed.lock:
                    nodes = [tk.to_list(n.tokens) for n in feed.mirror.nodes.values()
                             if n.tokens]
                if words.decodes and len(nodes) >= 2:
                    break
                wait.wait(0.05)  # polls what the engine's and the subscriber's threads do
            assert (words.decodes, words.model_dir) == (True, str(folder.resolve()))
            assert len(nodes) >= 2
            assert [words.text(ids) for ids in nodes] == [tok.decode(ids) for ids in nodes]
        finally:
            src.stop()
