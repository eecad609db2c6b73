"""Event schema versions in recordings: a schema 5 file written by the old code still reads
and replays, a file of a newer schema than this reader is refused with a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.replay import load_recording
from radixcache.core import events as ev
from radixcache.wire.recording import RecordingError, RecordingReader, RecordingWriter

SCHEMA5 = Path(__file__).parent / "data" / "schema5-system.rcx"  # see tests/data/README.md


def test_the_schema_is_6_since_request_cached_changed_meaning() -> None:
    assert ev.SCHEMA_VERSION == 6


def test_a_schema_5_recording_reads_and_replays_unchanged() -> None:
    with RecordingReader(SCHEMA5) as r:
        assert (r.header.format_version, r.header.schema_version) == (2, 5)
        cached = [(e.req, e.prompt_tokens) for rec in r.records()
                  if isinstance(rec.item, ev.Batch) for e in rec.item.events
                  if isinstance(e, ev.RequestCached)]
        # written by the old code: request 0 already emits two (the meaning schema 6 names)
        assert cached == [(0, 528), (0, 542), (1, 528), (2, 527), (3, 543), (4, 550),
                          (5, 546), (6, 531), (7, 552)]
        mirror, events = r.play_all()  # its one Digest event agrees, or this raises
        assert (events, r.damage, len(mirror.nodes)) == (149, None, 10)
    recording = load_recording(SCHEMA5)
    assert (recording.damage, len(recording.batches)) == ("", 4)


def test_a_newer_schema_is_refused_with_what_to_do(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "future.rcx"
    monkeypatch.setattr(ev, "SCHEMA_VERSION", 7)  # a writer from a later radixcache
    with RecordingWriter(path, {"num_blocks": 16, "block_size": 16}):
        pass
    monkeypatch.undo()
    with pytest.raises(RecordingError, match=r"event schema 7 is newer than this reader "
                                             r"\(reads 1 to 6\); upgrade radixcache"):
        RecordingReader(path)
