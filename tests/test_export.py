"""Export of recordings: JSON lines and the Perfetto/Chrome trace."""

from __future__ import annotations

import json

from radixcache.core import events as ev
from radixcache.wire.export import jsonl_lines, perfetto_json
from radixcache.wire.recording import Keyframe

SNAP = ev.Snapshot(16, 8, [ev.NodeState(0, -1, 0, b"", [], 0, 0)], 0, 1, [], 0.92, 0.85)
BATCHES = [
    Keyframe(0, 5, 0, SNAP),
    ev.Batch(1, 5, 100.0, "t", [
        ev.RequestStart(1, 20, 0),
        ev.NodeCreated(1, 0, 0, b"\x01\x00\x00\x00\x02\x00\x00\x00", [0], False),
        ev.Watermark(2, 8, 0.92, 0.85),
    ]),
    ev.Batch(2, 5, 100.5, "t", [
        ev.Split(1, 1, 2, [0], [0]), ev.Cow(0, 3, 1), ev.Evict(1, 1, [3]), ev.Merge(2, 1, None),
        ev.RequestFinish(1, 4, 12.5),
    ]),
]


def test_jsonl_has_one_object_per_event_and_keyframe():
    lines = [json.loads(x) for x in jsonl_lines(BATCHES)]
    assert [x["kind"] for x in lines] == [
        "keyframe", "rstart", "create", "wm", "split", "cow", "evict", "merge", "rfinish"]
    assert lines[0] == {"kind": "keyframe", "seq": 0, "epoch": 5, "nodes": 1}
    assert lines[2] == {"seq": 1, "epoch": 5, "ts": 100.0, "kind": "create", "node": 1,
                        "parent": 0, "start": 0, "tokens": [1, 2], "blocks": [0],
                        "shared_first": False}


def test_perfetto_trace_has_request_slices_instants_and_a_counter():
    trace = json.loads(perfetto_json(BATCHES))
    events = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    assert [(e["ph"], e["name"], e["ts"]) for e in events] == [
        ("b", "req 1", 0.0), ("C", "pool", 0.0),
        ("i", "split", 500000.0), ("i", "cow", 500000.0), ("i", "evict", 500000.0),
        ("i", "merge", 500000.0), ("e", "req 1", 500000.0),
    ]
    assert events[1]["args"] == {"used_blocks": 2, "total_blocks": 8}
    assert [e["args"] for e in events[2:6]] == [
        {"node": 1, "offset": 1, "prefix": 2}, {"src": 0, "dst": 3, "slots": 1},
        {"node": 1, "tokens": 1, "blocks_freed": 1}, {"parent": 2, "child": 1}]
    assert {e["id"] for e in events if e["ph"] in "be"} == {1}
    assert sum(e["ph"] == "M" for e in trace["traceEvents"]) == 3


def test_cli_record_export_and_kv_tree(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app
    from radixcache.wire.kvevents import BlockStored, KVEventPublisher

    runner = CliRunner()
    out = tmp_path / "run.rcx"
    res = runner.invoke(app, ["record", "--workload", "chat", "--requests", "40",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["export", str(out), "--format", "perfetto"])
    assert res.exit_code == 0, res.output
    trace = json.loads((tmp_path / "run.json").read_text())
    assert {e["ph"] for e in trace["traceEvents"]} >= {"M", "i"}
    pub = KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    try:
        pub.publish([BlockStored([11, 12], None, list(range(32)), 16)])
        res = runner.invoke(app, ["tree", "--kv-events", pub.endpoints[0],
                                  "--replay", pub.endpoints[1], "--seconds", "0.5"])
    finally:
        pub.close()
    assert res.exit_code == 0, res.output
    assert res.output.rstrip().splitlines()[-1] == "live blocks: 2"


# -- issue 24 item 7: export writes nothing that `tree` rejects; format version 0 ---------------
def _crafted(path) -> int:
    """A recording whose second batch decodes but does not fit (an unknown node); returns
    that batch's offset."""
    from radixcache.wire.recording import RecordingReader, RecordingWriter

    with RecordingWriter(path, {}) as w:
        w.write_keyframe(0, 5, SNAP)
        w.write_batch(BATCHES[1])
        w.write_batch(ev.Batch(2, 5, 101.0, "t", [ev.Evict(99, 1, [3])]))
    return [r.offset for r in RecordingReader(path).records()][-1]


def test_export_stops_where_tree_stops_and_says_so(tmp_path, capsys):
    import pytest

    from cli.main import main

    path = tmp_path / "crafted.rcx"
    bad = _crafted(path)
    with pytest.raises(SystemExit) as info:
        main(["export", str(path), "--out", str(tmp_path / "x.jsonl")])
    out = capsys.readouterr()
    assert info.value.code in (0, None)
    warning = f"warning: stopped at byte {bad:,}: batch seq 2 does not fit: unknown node 99"
    assert out.err.splitlines() == [warning]
    kinds = [json.loads(x)["kind"] for x in (tmp_path / "x.jsonl").read_text().splitlines()]
    assert kinds == ["keyframe", "rstart", "create", "wm"]  # was: the evict of node 99 too
    with pytest.raises(SystemExit):
        main(["tree", str(path)])
    # the same place, the same words (after the count read, which `tree` says on stderr)
    assert capsys.readouterr().err.splitlines() == ["3 events read", warning]


def test_format_version_0_is_refused(tmp_path):
    import struct

    import pytest

    from radixcache.wire.recording import RecordingError, RecordingReader

    path = tmp_path / "v0.rcx"
    _crafted(path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, 8, 0)
    path.write_bytes(bytes(data))
    with pytest.raises(RecordingError, match=r"format version 0 is not one this reader knows "
                                             r"\(1 to 2\)$"):
        RecordingReader(path)


def test_a_format_1_file_is_read_as_before(tmp_path):
    """Format 2 only added the note frame: a file that says 1 reads the same."""
    import struct

    from radixcache.wire.recording import RecordingReader

    path = tmp_path / "v1.rcx"
    _crafted(path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, 8, 1)
    path.write_bytes(bytes(data))
    with RecordingReader(path) as reader:
        items = [r.item for r in reader.records()]
        assert reader.capture_note() is None and reader.damage is None
    assert items == [Keyframe(0, 5, 0, SNAP), BATCHES[1], items[2]] and len(items) == 3
