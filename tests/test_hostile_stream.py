"""Hostile peers against the subscriber (issue 12 items 2, 4, 5, 8): a crafted frame is
counted and reported, the stream resyncs with backoff, memory stays bounded, and the thread
never dies."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pytest

from radixcache.core import events as ev
from radixcache.wire import subscriber as subscriber_mod
from radixcache.wire import validate
from radixcache.wire.endpoints import u64
from radixcache.wire.mirror import Malformed, Mirror
from radixcache.wire.subscriber import State, Subscriber
from tests.helpers.hostile import FakeEngine, TreeFeed, encode
from tests.helpers.stream import wait_for

ROOT = ev.NodeState(0, -1, 0, b"", [], 0, 0)
TOK = b"\x01\x00\x00\x00"


def snap(nodes: list[ev.NodeState], num_blocks: int = 8, request_blocks: list[int] | None = None
         ) -> ev.Snapshot:
    return ev.Snapshot(16, num_blocks, [ROOT, *nodes], 0, 9, request_blocks or [], 0.92, 0.85)


@pytest.fixture
def peer() -> Iterator[tuple[FakeEngine, TreeFeed, Subscriber]]:
    engine, feed = FakeEngine(), TreeFeed()
    sub = Subscriber(engine.endpoints, request_timeout_s=5.0, backoff_s=0.05,
                     backoff_cap_s=0.4, sync_deadline_s=1.0).start()
    engine.wait_subscribed()
    yield engine, feed, sub
    sub.stop()
    engine.close()
    assert sub.stats.internal_errors == 0


def sync(engine: FakeEngine, feed: TreeFeed, sub: Subscriber) -> None:
    """Answer the pending snapshot request correctly and wait until it is loaded."""
    ident, (kind, req) = engine.request()
    assert kind == b"snapshot"
    engine.reply(ident, *feed.snapshot_frames(req))
    assert wait_for(lambda: sub.state is State.LIVE and sub.seq == feed.seq)


def live_batch_applies(engine: FakeEngine, feed: TreeFeed, sub: Subscriber) -> None:
    """The thread is alive and in sync: the next real batch is applied, digest checked."""
    engine.publish(feed.batch())
    assert wait_for(lambda: sub.seq == feed.seq)
    assert sub.mirror.digest() == feed.tree.digest()


BAD_SNAPSHOTS = {
    "empty tokens": (snap([ev.NodeState(1, 0, 0, b"", [0], 0, 0)]), "tokens of 0 bytes"),
    "3-byte tokens": (snap([ev.NodeState(1, 0, 0, b"abc", [0], 0, 0)]), "tokens of 3 bytes"),
    "unknown parent": (snap([ev.NodeState(1, 5, 0, TOK, [0], 0, 0)]),
                       "parent 5 not listed before it"),
    "block 10**12": (snap([ev.NodeState(1, 0, 0, TOK, [10**12], 0, 0)]),
                     "block 1000000000000 outside the pool of 8 blocks"),
    "negative block": (snap([ev.NodeState(1, 0, 0, TOK, [-1], 0, 0)]),
                       "block -1 outside the pool"),
    "num_blocks 2**62": (snap([], 2**62), "num_blocks 4611686018427387904 out of range"),
    "num_blocks 2**64-1": (snap([], 2**64 - 1), "num_blocks 18446744073709551615 out of range"),
    "request block out of pool": (snap([], 8, [8]), "request block 8 outside"),
}


@pytest.mark.parametrize("case", list(BAD_SNAPSHOTS))
def test_a_malformed_snapshot_is_counted_and_the_next_one_loads(peer, case):
    engine, feed, sub = peer
    bad, message = BAD_SNAPSHOTS[case]
    ident, (_, req) = engine.request()
    engine.reply(ident, b"snap", req, u64(feed.epoch), u64(0), encode(bad))
    assert wait_for(lambda: sub.stats.malformed == 1)
    assert message in sub.last_error
    assert sub.stats.snapshots == 0
    sync(engine, feed, sub)  # asked again (after the backoff), and this one loads
    live_batch_applies(engine, feed, sub)
    assert (sub.stats.malformed, sub.stats.snapshots, sub.stats.requests) == (1, 1, 2)


@pytest.mark.parametrize("reply", [
    [b"batch"], [b"end"], [b"snap", b"x"], [b"who knows", b"?"], [b"error", b"nope"],
], ids=["short batch", "short end", "short snap", "unknown kind", "error"])
def test_a_broken_control_reply_is_counted(peer, reply):
    engine, feed, sub = peer
    ident, (_, req) = engine.request()
    engine.reply(ident, reply[0], req, *reply[1:])
    assert wait_for(lambda: sub.stats.malformed == 1)
    sync(engine, feed, sub)
    live_batch_applies(engine, feed, sub)


def test_a_live_create_with_empty_tokens_is_malformed_and_resyncs(peer):
    engine, feed, sub = peer
    sync(engine, feed, sub)
    empty = ev.NodeCreated(99, 0, 0, b"", [], False)
    crafted = ev.Batch(feed.seq + 1, feed.epoch, 0.0, "x", [empty])
    engine.publish(ev.encode_batch(crafted))
    assert wait_for(lambda: sub.stats.malformed == 1)
    assert sub.last_error == "malformed: create tokens of 0 bytes (whole uint32 ids, at least one)"
    feed.seq += 1  # the crafted batch took that seq: the honest engine's snapshot is past it
    sync(engine, feed, sub)
    live_batch_applies(engine, feed, sub)
    assert sub.stats.resyncs == 1


def test_seq_2_64_minus_1_is_malformed_and_asks_nothing(peer):
    engine, feed, sub = peer
    sync(engine, feed, sub)
    engine.publish(ev.encode_batch(ev.Batch(2**64 - 1, feed.epoch, 0.0, "x", [])))
    live_batch_applies(engine, feed, sub)
    assert sub.stats.malformed == 1 and "seq 18446744073709551615 out of range" in sub.last_error
    assert engine.no_request(0.3) == 0
    assert sub.stats.requests == 1


def test_a_seq_far_ahead_is_dropped_after_one_replay(peer):
    engine, feed, sub = peer
    sync(engine, feed, sub)
    engine.publish(ev.encode_batch(ev.Batch(2**40, feed.epoch, 0.0, "x", [])))
    ident, (kind, req, start) = engine.request()
    assert (kind, int.from_bytes(start, "big")) == (b"replay", feed.seq + 1)
    engine.reply(ident, b"end", req, u64(feed.seq))  # nothing newer: the engine is at feed.seq
    assert wait_for(lambda: sub.stats.malformed == 1)
    assert sub.last_error == f"malformed: batch {feed.epoch}/{2**40} ahead of the engine's " \
                             f"{feed.epoch}/{feed.seq}"
    live_batch_applies(engine, feed, sub)
    assert engine.no_request(0.3) == 0


def test_an_end_marker_mid_replay_falls_back_to_a_snapshot(peer):
    engine, feed, sub = peer
    sync(engine, feed, sub)
    first = feed.batch()
    feed.batch()
    engine.publish(feed.batch())  # seq 3 arrives, 1 and 2 are missing
    ident, (_, req, _) = engine.request()
    engine.reply(ident, b"batch", req, first)
    engine.reply(ident, b"end", req, u64(feed.seq))
    sync(engine, feed, sub)
    assert sub.last_error == "replay ended at seq 1, short of 3"
    assert sub.mirror.digest() == feed.tree.digest()
    assert sub.stats.requests == 3


def test_a_snapshot_that_keeps_the_old_epoch_does_not_loop(peer):
    engine, feed, sub = peer
    sync(engine, feed, sub)
    engine.publish(ev.encode_batch(ev.Batch(1, feed.epoch + 1, 0.0, "x", [])))
    sync(engine, feed, sub)  # the peer answers with the old epoch
    assert sub.stats.malformed == 1
    assert "ahead of the engine's" in sub.last_error
    live_batch_applies(engine, feed, sub)
    assert engine.no_request(0.3) == 0


def test_a_peer_that_never_syncs_gets_backoff_and_is_reported(peer):
    engine, _, sub = peer
    for _ in range(3):
        ident, (_, req) = engine.request()
        engine.reply(ident, b"snap", req, u64(1), u64(0), b"\xc1")  # never valid msgpack
    # backoff 0.05 doubling to a 0.4 s cap: at most 1 + 2.0 / 0.2 requests in 2 s (the old
    # subscriber asked again at once: thousands)
    assert engine.no_request(2.0) <= 10
    status = sub.status()
    assert status.unsyncable and not status.synced
    assert status.state is State.WAIT_SNAPSHOT
    assert status.malformed == 3 and status.last_error.startswith("malformed: undecodable snapshot")


def test_the_buffer_while_waiting_is_capped_in_bytes(peer, monkeypatch):
    monkeypatch.setattr(subscriber_mod, "MAX_BUFFER_BYTES", 4 * 2**20)
    engine, feed, sub = peer
    engine.request()  # never answered
    for seq in range(1, 11):
        engine.publish(ev.encode_batch(ev.Batch(seq, feed.epoch, 0.0, "x" * 2**20, [])))
    assert wait_for(lambda: sub.stats.buffer_dropped == 7)
    assert len(sub._held.items) == 3


def test_a_300m_block_pool_is_refused_before_any_allocation():
    tracemalloc.start()
    with pytest.raises(Malformed, match="num_blocks 300000000 out of range"):
        Mirror().load_snapshot(snap([], 300_000_000))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000


@pytest.mark.parametrize("event, message", [
    (ev.BlockAlloc([-1]), "BlockAlloc block -1 outside the pool of 8 blocks"),
    (ev.BlockFree([8]), "BlockFree block 8 outside the pool of 8 blocks"),
    (ev.Cow(0, -3, 1), "cow dst -3 out of range [0, 7]"),
    (ev.Merge(1, 2, -5), "merge dropped block -5 out of range [0, 7]"),
    (ev.Access(2**63, 1), "access node 9223372036854775808 out of range"),
])
def test_negative_and_out_of_pool_ids_are_malformed(event, message):
    m = Mirror()
    m.load_snapshot(snap([]))
    with pytest.raises(Malformed) as info:
        m.apply(event)
    assert str(info.value).startswith(message)
    assert m.used_blocks == 0


def test_stop_returns_promptly_under_a_flood(peer):
    engine, feed, sub = peer
    sync(engine, feed, sub)
    frame = ev.encode_batch(ev.Batch(10**6, feed.epoch, 0.0, "x", []))
    for _ in range(20_000):
        engine.publish(frame)
    sub.stop(timeout=5.0)
    assert sub._thread is not None and not sub._thread.is_alive()


def test_an_oversized_frame_kills_the_connection_and_the_subscriber_remakes_it(monkeypatch):
    monkeypatch.setattr(validate, "MAX_BATCH_BYTES", 2**20)  # read when the SUB is made
    engine, feed = FakeEngine(), TreeFeed()
    sub = Subscriber(engine.endpoints, silence_s=0.3).start()
    try:
        engine.wait_subscribed()
        sync(engine, feed, sub)
        engine.publish(b"\x00" * 2**21)  # libzmq drops this connection for good
        engine.wait_subscribed()  # ... and the subscriber's new SUB subscribes again
        ident, (kind, req, start) = engine.request()  # what did we miss?
        assert (kind, int.from_bytes(start, "big")) == (b"replay", feed.seq + 1)
        engine.reply(ident, b"end", req, u64(feed.seq))
        live_batch_applies(engine, feed, sub)
        assert (sub.stats.reconnects, sub.stats.malformed, sub.stats.internal_errors) == (1, 0, 0)
        assert sub.last_error == "no frame in 0.3 s: reconnected the event socket"
    finally:
        sub.stop()
        engine.close()


# -- issue 24: a seq that goes backwards, a replay that never satisfies -----------------------
def test_a_seq_that_goes_backwards_is_reported_and_resyncs(peer):
    engine, feed, sub = peer
    sync(engine, feed, sub)
    for _ in range(12):
        engine.publish(feed.batch())
    assert wait_for(lambda: sub.seq == 12)
    again = TreeFeed(epoch=feed.epoch)  # the peer starts numbering over, in the same epoch
    frames = [again.batch(requests=1) for _ in range(10)]  # 10 batches of creates, seq 1..10
    engine.publish(frames[0])
    ident, (kind, req) = engine.request()  # was: nothing asked, all 10 dropped as duplicates
    assert kind == b"snapshot"
    assert sub.stats.seq_backwards == 1
    assert sub.last_error == (f"the engine's seq went backwards in epoch {feed.epoch}: 1 after "
                              f"12; resyncing from a snapshot")
    for frame in frames[1:]:
        engine.publish(frame)
    engine.reply(ident, *again.snapshot_frames(req))
    assert wait_for(lambda: sub.state is State.LIVE and sub.seq == 10)
    assert sub.mirror.digest() == again.tree.digest()
    assert (sub.stats.seq_backwards, sub.stats.resyncs, sub.stats.snapshots) == (1, 1, 2)
    live_batch_applies(engine, again, sub)


def test_a_replay_that_never_satisfies_falls_back_to_a_snapshot(peer):
    engine, feed, sub = peer
    sync(engine, feed, sub)
    feed.batch()  # seq 1 is lost, and the peer's replay never brings it back
    asks = []
    for _ in range(subscriber_mod.MAX_REPLAY_ASKS + 1):
        engine.publish(feed.batch())  # the next batch, past the gap
        ident, body = engine.request()
        asks.append(body[0])
        if body[0] == b"snapshot":
            break
        engine.reply(ident, b"end", body[1], u64(0))  # "nothing after seq 0"
    # was: a replay asked for every gap, for ever (64-73 asks in 4 s), never a snapshot
    assert asks == [b"replay"] * subscriber_mod.MAX_REPLAY_ASKS + [b"snapshot"]
    assert sub.last_error == (f"{subscriber_mod.MAX_REPLAY_ASKS} replays from seq 1 brought "
                              f"nothing: asking for a snapshot")
    assert sub.stats.replay_fallbacks == 1
    engine.reply(ident, *feed.snapshot_frames(body[1]))
    assert wait_for(lambda: sub.state is State.LIVE and sub.stats.snapshots == 2)
    live_batch_applies(engine, feed, sub)
