"""A recording names its model folder in its header (``model_dir``, ``model_name``), and its
replay decodes the previews with that folder's tokenizer when the folder is on this machine;
a folder gone since shows ids and says why; a file without the keys (older, or the seeded
model's) replays with the workloads' words, as it did before."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from inspector.engine_facts import ModelWords, ids_text
from inspector.replay import ReplaySource, load_recording
from inspector.sources import DatasetWords
from radixcache.core import events as ev
from radixcache.core import tokens as tk
from radixcache.serving.driver import serve_request
from radixcache.traffic.folder_tokenizer import FolderTokenizer
from radixcache.wire.recording import RecordingReader, RecordingWriter
from tests.helpers.checkpoints import folder_fixture
from tests.helpers.stream import make_source

folder = folder_fixture("llama", "TinyLlama-recorded")


def _record(out: Path, *model: str) -> None:
    done = CliRunner().invoke(app, ["record", "--requests", "3", "--blocks", "256",
                                    "--device", "cpu", "--out", str(out), *model])
    assert done.exit_code == 0, done.output


def _node_ids(src: ReplaySource) -> list[list[int]]:
    """Token runs of every node the recording's first keyframe and batches insert."""
    ids: list[list[int]] = []
    for batch in src.rec.batches:
        for e in batch.events:
            tokens = getattr(e, "tokens", None)
            if tokens is not None and len(tokens):
                ids.append(tk.to_list(tokens))
    return ids



def _settled(words: DatasetWords) -> DatasetWords:
    """``words`` once its dataset words are in (or known to be missing): ``text`` never waits
    for them, so two instances compared mid-load could disagree."""
    assert words.load().wait(120)
    return words

def test_a_model_recording_replays_in_the_folder_s_text(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.rcx"
    _record(out, "--model", str(folder))
    with RecordingReader(out) as r:
        cfg = r.header.config
        assert (cfg["model_dir"], cfg["model_name"]) == (str(folder.resolve()), folder.name)
    src = ReplaySource(load_recording(out))
    words, tok = src.vocabulary(), FolderTokenizer(folder)
    assert isinstance(words, ModelWords)
    assert (words.decodes, words.model_dir) == (True, str(folder.resolve()))
    assert words.note == f"previews in the text of {folder.resolve() / 'tokenizer.json'}"
    runs = _node_ids(src)
    assert runs
    for ids in runs:
        assert words.text(ids) == tok.decode(ids)


def test_a_folder_gone_since_the_recording_shows_ids_and_says_why(folder: Path,
                                                                  tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    out = tmp_path / "gone.rcx"
    _record(out, "--model", str(moved))
    shutil.rmtree(moved)
    words = ReplaySource(load_recording(out)).vocabulary()
    assert isinstance(words, ModelWords)
    assert (words.decodes, words.model_dir) == (False, str(moved.resolve()))
    assert words.note.startswith("previews show token ids: ")
    assert str(moved.resolve()) in words.note
    assert words.text([5, 7]) == ids_text([5, 7]) == "5 7"


def test_a_seeded_model_recording_and_an_older_file_show_the_workloads_words(
        tmp_path: Path) -> None:
    out = tmp_path / "tiny.rcx"
    _record(out)
    with RecordingReader(out) as r:
        assert (r.header.config["model_dir"], r.header.config["model_name"]) == (
            "", "tiny transformer (layers=1)")
    rec = load_recording(out)
    assert rec.model_dir == ""
    words = ReplaySource(rec).vocabulary()
    assert isinstance(words, ModelWords)
    assert (words.decodes, words.note) == (False, "")
    assert _settled(words).text([5, 7]) == _settled(DatasetWords()).text([5, 7])


def test_an_older_file_without_the_keys_replays_with_the_workloads_words(tmp_path: Path) -> None:
    """A header written before the keys existed (the config test_recording writes)."""
    out = tmp_path / "old.rcx"
    tree = make_source().tree
    with RecordingWriter(out, {"num_blocks": 256, "block_size": 16}) as w:
        w.write_keyframe(0, 7, tree.snapshot())
        serve_request(tree, list(range(40)))
        w.write_batch(ev.Batch(1, 7, 1.0, "t", tree.take_events()))
    rec = load_recording(out)
    assert (rec.model_dir, len(rec.batches)) == ("", 1)
    words = ReplaySource(rec).vocabulary()
    assert isinstance(words, ModelWords)
    assert (words.decodes, words.note) == (False, "")
    assert _settled(words).text([5, 7]) == _settled(DatasetWords()).text([5, 7])
