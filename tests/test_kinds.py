"""Every event kind is handled by every dispatcher, and the doc's list of dispatchers is the
code's: a new kind in ``AnyEvent`` fails here (no example below), at import (a table built by
``exhaustive``) or in mypy and here (a ``match`` ending in ``assert_never``)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from inspector.feed import Feed
from inspector.widgets.event_log import KINDS as LOG_KINDS
from inspector.widgets.event_log import describe
from radixcache.analysis import misses
from radixcache.analysis.follow import Follower
from radixcache.core import events as ev
from radixcache.core.kinds import KINDS, TAGS, KindsError, exhaustive
from radixcache.traffic.traces import RequestTracker
from radixcache.wire import mirror, validate
from radixcache.wire.export import jsonl_lines, perfetto_events
from radixcache.wire.kvevents.codec import AllBlocksCleared, BlockRemoved, BlockStored
from radixcache.wire.kvevents.translate import KVTranslator
from radixcache.wire.mirror import Mirror, MirrorError

ROOT = Path(__file__).resolve().parent.parent
B, N = 4, 8


def tok(*ids: int) -> bytes:
    return struct.pack(f"<{len(ids)}I", *ids)


def stream() -> list[ev.AnyEvent]:
    """One event of every kind, in an order that fits an empty pool of 8 blocks of 4 slots."""
    root = ev.NodeState(0, -1, 0, b"", [], 0, 0)
    return [
        ev.Snapshot(B, N, [root], 0, 1, [], 0.9, 0.8),
        ev.Pin(0, 1),
        ev.RequestStart(1, 11, 0),
        ev.BlockAlloc([0, 1, 2]),
        ev.NodeCreated(1, 0, 0, tok(*range(1, 9)), [0, 1], shared_first=False),
        ev.Extend(1, tok(9, 10, 11, 12), [2]),
        ev.Access(1, 1),
        ev.Pin(0, -1),
        ev.RequestFinish(1, 2, 1.5),
        ev.Split(1, 4, 2, [0], [1, 2]),
        ev.Cow(0, 3, 2),
        ev.BlockAlloc([3]),
        ev.BlockFree([3]),
        ev.Evict(1, 8, [1, 2]),
        ev.BlockAlloc([1]),
        ev.NodeCreated(3, 2, 4, tok(20, 21, 22, 23), [1], shared_first=False),
        ev.Merge(2, 3, None),
        ev.Watermark(2, N, 0.9, 0.8),
        ev.Counters(0, 1, 1, 0, 11, 0, 1, 8, 1, 0, 0, paused=False),
        ev.Fault("rc-service-loop", "RuntimeError: boom"),
        ev.Reset(),
        ev.Digest(Mirror(B, N).digest()),
        ev.RequestCached(1, 11),  # (a request's prompt cached while it decodes)
        ev.Retract(1, 12, 3),  # (a running request retracted into the tree)
        ev.Queue("lpm", 3, 1, [ev.Waiting(2, ev.WaitReason.SHARING, 1, 1, 0, 8)]),
    ]


def test_the_stream_has_one_example_of_every_kind() -> None:
    """A new kind needs its example here, and with it every dispatcher below meets it."""
    assert {type(e) for e in stream()} == set(KINDS)
    assert len(set(TAGS.values())) == len(KINDS)


def test_exhaustive_names_what_a_table_lacks() -> None:
    everything = {k: 0 for k in KINDS}
    assert exhaustive("t", everything) == everything
    del everything[ev.Cow]
    with pytest.raises(KindsError, match=r"^t: lacks Cow$"):
        exhaustive("t", everything)
    with pytest.raises(KindsError, match=r"^t: lacks Cow; both handles and ignores Pin$"):
        exhaustive("t", everything, ignored=[ev.Pin])
    with pytest.raises(KindsError, match="names non-events NodeState"):
        exhaustive("t", everything, ignored=[ev.Cow, ev.NodeState])  # type: ignore[list-item]


def test_the_mirror_and_the_validator_take_every_kind() -> None:
    assert set(mirror._HANDLERS) == set(KINDS)
    assert set(validate._CHECKS) == set(KINDS)
    assert set(misses._HANDLERS) < set(KINDS)


def test_an_unknown_kind_is_malformed_not_out_of_sync() -> None:
    with pytest.raises(validate.Malformed, match="unknown event kind NodeState"):
        validate.check_event(ev.NodeState(1, 0, 0, tok(1), [], 0, 0), N)  # type: ignore[arg-type]
    m = Mirror(B, N)
    with pytest.raises(validate.Malformed):
        m.apply(ev.NodeState(1, 0, 0, tok(1), [], 0, 0))  # type: ignore[arg-type]


def test_every_kind_passes_the_mirror_and_its_followers() -> None:
    m = Mirror()
    follower = Follower(m)
    seen: list[str] = []
    for e in stream():
        validate.check_event(e, N)
        if isinstance(e, ev.Snapshot):
            m.load_snapshot(e, 0)
        else:
            m.apply(e)
        seen.append(TAGS[type(e)])
    assert follower.error is None
    assert seen == [TAGS[type(e)] for e in stream()]
    assert (m.stats.splits, m.stats.merges, m.stats.extends, m.stats.evictions) == (1, 1, 1, 1)
    assert (m.fault, m.counters) == (stream()[19], stream()[18])
    why = follower.misses.why(1)
    assert why is not None and (why.prompt_tokens, why.hit_tokens, why.finished) == (11, 0, True)


def test_the_request_tracker_rebuilds_the_request_from_every_kind() -> None:
    m = Mirror()
    tracker = RequestTracker(m)
    finished = []
    for e in stream():
        m.load_snapshot(e, 0) if isinstance(e, ev.Snapshot) else m.apply(e)
        if (req := tracker.after(e)) is not None:
            finished.append((req.prompt.tolist(), req.cached.tolist()))
    assert finished == [(list(range(1, 12)), list(range(1, 13)))]


def test_the_translator_takes_every_kind() -> None:
    t = KVTranslator(B, N)
    out = [type(w) for e in stream() for w in t.translate([e])]
    assert out == [AllBlocksCleared, BlockStored, BlockStored, BlockRemoved, BlockStored,
                   AllBlocksCleared]


def test_the_feed_and_the_log_take_every_kind() -> None:
    feed = Feed(Mirror(B, N))
    feed.observe(ev.Batch(1, 0, 100.0, "e", stream()))
    d = feed.take()
    assert [e.kind for e in d.log] == [t for e in stream() if (t := TAGS[type(e)]) in LOG_KINDS]
    assert (d.events, d.rebuild, sorted(d.evicted), d.merged) == (len(stream()), True, [1], {2: 3})
    lines = {TAGS[type(e)]: describe(e) for e in stream()}
    assert lines == {
        "snapshot": "1 nodes", "lock": "", "rstart": "req 1 11 tok, 0 hit", "alloc": "1 blocks",
        "create": "n3 under n2, 4 tok from position 4", "extend": "n1 +4 tok, +1 blocks",
        "access": "", "rfinish": "req 1 +2 tok", "split": "n1 after its first 4 tok → prefix n2",
        "cow": "0→3 (2 slots)", "free": "1 blocks", "evict": "n1 8 tok, 2 blocks freed",
        "merge": "n2+n3", "wm": "2/8 blocks", "counters": "", "reset": "", "digest": "",
        "fault": "thread rc-service-loop died: RuntimeError: boom",
        "rcached": "req 1: 11 tok of its prompt cached, readable now",
        "retract": "retracted r1: 12 tokens kept in the tree, 3 blocks freed",
        "queue": "lpm: 1 waiting (the stats pane says why)"}


def test_the_exports_take_every_kind() -> None:
    batch = ev.Batch(1, 0, 100.0, "e", stream())
    assert [line.split('"kind":"')[1].split('"')[0] for line in jsonl_lines([batch])] == [
        TAGS[type(e)] for e in stream()]
    names = [e["name"] for e in perfetto_events([batch]) if e.get("ph") != "M"]
    assert names == ["req 1", "req 1", "split", "cow", "evict", "merge", "pool", "reset",
                     "prompt cached", "retracted", "queue"]


def _dispatchers() -> set[str]:
    """Modules that dispatch on event kinds: a table built by ``exhaustive`` or a ``match``
    with ``case ev.X()`` arms."""
    found = set()
    for pkg in ("radixcache", "inspector", "cli"):
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            if re.search(r"= exhaustive\(|case \(?ev\.\w+\(\)", text):
                found.add(str(path.relative_to(ROOT)))
    return found


def test_the_docs_list_of_dispatchers_is_the_codes() -> None:
    """docs/architecture.md's "A new event kind" line names every module that dispatches on
    kinds, and each of them handles every kind (the tests above)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    line = next(x for x in doc.splitlines() if x.startswith("- **A new event kind**"))
    listed = line.split("the dispatchers:", 1)[1]
    named = {f"radixcache/{p}" if not p.startswith("inspector/") else p
             for p in re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py)`", listed)}
    assert named == _dispatchers()


def test_a_missing_mirror_handler_is_a_bug_not_a_resync() -> None:
    """Unknown kinds stop at validation; what reaches a handler is a known kind, so a
    state that does not fit is the only MirrorError."""
    m = Mirror(B, N)
    with pytest.raises(MirrorError, match="unknown node 5"):
        m.apply(ev.Pin(5, 1))
