"""A model folder without tokenizer.json serves ids only: ``serve --model DIR --http`` refuses
it with one line (an HTTP front speaks text), exit 2, and leaves no endpoint behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.checkpoints import build

ROOT = Path(__file__).resolve().parents[1]


def test_http_refuses_a_folder_without_tokenizer_json_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    build("llama", folder)
    (folder / "tokenizer.json").unlink()
    run = tmp_path / "run"
    run.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--model", str(folder),
                        "--dtype", "float32", "--ipc", str(run / "engine"), "--http", "0"],
                       env=env, capture_output=True, text=True, timeout=180, check=False)
    assert (p.returncode, p.stderr) == (2, "error: --http with --model needs the folder's "
                                           "tokenizer.json\n")
    assert sorted(run.iterdir()) == []  # the engine's ipc sockets were closed and removed
