"""Record files: keyframes and seeking, truncation and corruption, versions and limits."""

from __future__ import annotations

import random
import struct

import pytest

from radixcache.core import events as ev
from radixcache.serving.driver import serve_request
from radixcache.wire.mirror import Mirror
from radixcache.wire.recording import (
    Keyframe,
    RecordingError,
    RecordingReader,
    RecordingWriter,
    mirror_snapshot,
)
from tests.helpers.stream import make_source, prompts


def record(path, n=300, keyframe_every=200):
    """Record ``n`` requests (one batch each); returns the digests after each batch."""
    tree = make_source().tree
    digests = []
    with RecordingWriter(path, {"num_blocks": 256, "block_size": 16},
                         keyframe_every=keyframe_every) as w:
        w.write_keyframe(0, 7, tree.snapshot())
        for seq, tokens in enumerate(prompts(n, seed=5), start=1):
            serve_request(tree, tokens)
            w.write_batch(ev.Batch(seq, 7, float(seq), "t", tree.take_events()))
            digests.append((w.events, tree.digest()))
            if w.needs_keyframe:
                w.write_keyframe(seq, 7, tree.snapshot())
    return digests


def test_round_trip_and_keyframe_index(tmp_path):
    path = tmp_path / "run.rcx"
    digests = record(path)
    r = RecordingReader(path)
    assert r.header.config == {"num_blocks": 256, "block_size": 16}
    items = [rec.item for rec in r.records()]
    batches = [i for i in items if isinstance(i, ev.Batch)]
    assert [b.seq for b in batches] == list(range(1, 301))
    assert r.damage is None
    refs = r.keyframes()
    assert refs[0].events_before == 0
    assert len(refs) == sum(isinstance(i, Keyframe) for i in items) > 3
    mirror = Mirror(16, 256)
    for b in batches:
        mirror.apply_batch(b)
    assert mirror.digest() == digests[-1][1]
    for target in (0, 1000, digests[150][0], digests[-1][0]):
        m, at = r.mirror_at(target)
        assert at == min([e for e, _ in [(0, ""), *digests] if e >= target] or [digests[-1][0]])
        assert m.digest() == (dict(digests)[at] if at else Mirror(16, 256).digest())


def test_seek_starts_from_the_nearest_keyframe(tmp_path):
    path = tmp_path / "run.rcx"
    digests = record(path)
    r = RecordingReader(path)
    refs = r.keyframes()
    target = refs[2].events_before
    m, at = r.mirror_at(target)
    assert at == target
    assert m.digest() == dict(digests)[target]


def test_a_file_cut_at_a_random_byte_reads_up_to_the_cut(tmp_path):
    path = tmp_path / "run.rcx"
    record(path)
    data = path.read_bytes()
    full = [rec.offset for rec in RecordingReader(path).records()]
    rng = random.Random(4)
    for _ in range(5):
        cut = rng.randrange(200, len(data) - 16 - 100)
        path.write_bytes(data[:cut])
        r = RecordingReader(path)
        got = [rec.offset for rec in r.records()]
        assert r.damage is not None
        assert got == [o for o in full if o < r.damage.offset]
        assert r.damage.offset <= cut
        assert r.damage.offset == min(o for o in [*full, len(data)] if o > got[-1])
        assert r.damage.reason.startswith("truncated")
        assert r.keyframes()[0].events_before == 0  # the index is rebuilt by scanning


def test_a_flipped_byte_is_reported_as_a_checksum_mismatch(tmp_path):
    path = tmp_path / "run.rcx"
    record(path)
    full = [rec.offset for rec in RecordingReader(path).records()]
    data = bytearray(path.read_bytes())
    data[full[40] + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    r = RecordingReader(path)
    assert len(list(r.records())) == 40
    assert r.damage is not None
    assert r.damage == (full[40], "checksum mismatch")


def test_empty_future_and_foreign_files_are_refused(tmp_path):
    empty = tmp_path / "empty.rcx"
    empty.write_bytes(b"")
    with pytest.raises(RecordingError, match="empty file"):
        RecordingReader(empty)
    future = tmp_path / "future.rcx"
    future.write_bytes(struct.pack("<8sHH", b"RADIXREC", 99, 0) + b"\0" * 20)
    with pytest.raises(RecordingError, match="format version 99 is newer"):
        RecordingReader(future)
    foreign = tmp_path / "foreign.rcx"
    foreign.write_bytes(b"PK\x03\x04" + b"\0" * 40)
    with pytest.raises(RecordingError, match="bad magic"):
        RecordingReader(foreign)


def test_an_oversized_length_is_damage_not_an_allocation(tmp_path):
    path = tmp_path / "run.rcx"
    record(path, n=10)
    full = [rec.offset for rec in RecordingReader(path).records()]
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, full[3], 2**31)
    path.write_bytes(bytes(data))
    r = RecordingReader(path)
    assert len(list(r.records())) == 3
    assert r.damage is not None
    assert r.damage.offset == full[3]
    assert "exceeds" in r.damage.reason


def test_mirror_snapshot_round_trips_the_digest():
    source = make_source()
    for tokens in prompts(100, seed=5):
        serve_request(source.tree, tokens)
    m = Mirror()
    m.load_snapshot(source.tree.snapshot())
    again = Mirror()
    again.load_snapshot(mirror_snapshot(m))
    assert again.digest() == source.tree.digest()


def test_record_service_shows_each_written_batch_to_its_progress(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``radixcache record`` draws its progress bar from this hook (it printed nothing for
    37 s before): every batch written, once, in order, holding every finished request."""
    from radixcache.serving.driver import TreeDriver
    from radixcache.serving.server import record_service
    from radixcache.traffic.workloads import build_workload

    seen: list[ev.Batch] = []
    with RecordingWriter(tmp_path / "tot.rcx", {"num_blocks": 256, "block_size": 16}) as w:
        r = record_service(TreeDriver(256), build_workload("tot", ["2", "2"]), w,
                           progress=seen.append)
    assert [b.seq for b in seen] == list(range(1, r.batches + 1))
    assert sum(type(e) is ev.RequestFinish for b in seen for e in b.events) == 7
