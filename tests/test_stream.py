"""The event stream over real loopback sockets: join, gaps, restarts, malformed frames, commands."""

from __future__ import annotations

import zmq

from radixcache.tools.lossy import HashDrop, LossyHop
from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from radixcache.wire.endpoints import BindPolicy, Endpoints, check_bind
from radixcache.wire.publisher import Publisher, SnapshotAt
from radixcache.wire.subscriber import Subscriber
from tests.helpers.stream import Relay, caught_up, drive, make_source, prompts, serving, wait_for


def test_late_joiner_converges_by_snapshot():
    source = make_source()
    with serving(source) as pub:
        drive(source, prompts(200, seed=1))
        sub = Subscriber(pub.endpoints).start()
        try:
            assert sub.wait_synced(5)
            drive(source, prompts(50, seed=2))
            assert wait_for(caught_up(sub, pub))
            with sub.lock:
                assert sub.mirror.digest() == source.tree.digest()
            assert sub.stats.snapshots == 1
            assert sub.stats.gaps == 0
            assert sub.stats.malformed == 0
            assert sub.stats.digest_ok == sub.stats.digest_checks > 0
        finally:
            sub.stop()


def test_one_percent_dropped_batches_are_replayed():
    source = make_source(digest_every=8)
    hook = HashDrop(0.01)
    with serving(source) as pub, LossyHop(pub.endpoints, hook) as hop:
        sub = Subscriber(hop.endpoints).start()
        try:
            assert sub.wait_synced(5)
            requests = prompts(1500, seed=5)
            drive(source, requests)
            assert wait_for(caught_up(sub, pub))
            with sub.lock:
                assert sub.mirror.digest() == source.tree.digest()
            # every seq the hash picks is lost on the wire and replayed
            assert sorted(hook.dropped) == [s for s in range(1, pub.seq + 1) if hook(s)]
            assert len(hook.dropped) >= 1
            # a loss while a replay is pending is covered by that replay: not a gap of its own
            assert 1 <= sub.stats.gaps <= len(hook.dropped)
            assert sub.stats.replayed_batches >= len(hook.dropped)
            assert sub.stats.snapshots == 1
            assert sub.stats.resyncs == 0
        finally:
            sub.stop()


def test_gap_older_than_ring_takes_a_fresh_snapshot():
    source = make_source()
    with serving(source, ring=4) as pub, LossyHop(pub.endpoints, lambda seq: 20 <= seq < 30) as hop:
        sub = Subscriber(hop.endpoints).start()
        try:
            assert sub.wait_synced(5)
            drive(source, prompts(60, seed=4))
            assert wait_for(caught_up(sub, pub))
            with sub.lock:
                assert sub.mirror.digest() == source.tree.digest()
            assert sub.stats.too_old == 1
            assert sub.stats.snapshots == 2
        finally:
            sub.stop()


def test_engine_restart_new_epoch_is_detected_and_resynced(tmp_path):
    endpoints = Endpoints.ipc(str(tmp_path / "engine"))
    source = make_source()
    with serving(source, endpoints, epoch=1000) as pub:
        sub = Subscriber(pub.endpoints).start()
        assert sub.wait_synced(5)
        drive(source, prompts(40, seed=5))
        assert wait_for(caught_up(sub, pub))
    restarted = make_source()  # the new engine starts empty, on the same endpoints
    try:
        with serving(restarted, endpoints, epoch=2000) as pub2:
            drive(restarted, prompts(30, seed=6))
            assert wait_for(caught_up(sub, pub2))
            with sub.lock:
                assert sub.mirror.digest() == restarted.tree.digest()
            assert sub.epoch == 2000
            assert sub.stats.epochs == 1
            assert sub.stats.snapshots == 2
    finally:
        sub.stop()


def test_malformed_frames_are_counted_and_skipped():
    source = make_source()
    with serving(source) as pub, Relay(pub.endpoints) as relay:
        sub = Subscriber(relay.endpoints).start()
        try:
            assert sub.wait_synced(5)
            for garbage in (b"\x93garbage", b"", b"\xc1", b"\x95\x01\x02"):
                relay.inject(garbage)
            drive(source, prompts(30, seed=7))
            assert wait_for(caught_up(sub, pub))
            with sub.lock:
                assert sub.mirror.digest() == source.tree.digest()
            assert sub.stats.malformed == 4
            assert sub.stats.snapshots == 1
        finally:
            sub.stop()


def test_commands_are_typed_and_anything_else_is_an_error():
    seen: list[cmd.AnyCommand] = []

    def handle(c: cmd.AnyCommand) -> cmd.AnyReply:
        seen.append(c)
        return cmd.Ok(f"did {type(c).__name__}", {"n": len(seen)})

    source = make_source()
    pub = Publisher(Endpoints.tcp("127.0.0.1", 0), lambda: SnapshotAt(source.tree.snapshot(), 0),
                    commands=handle)
    with pub:
        ep = pub.endpoints.commands
        assert send_command(ep, cmd.Evict(64)) == cmd.Ok("did Evict", {"n": 1})
        assert send_command(ep, cmd.SetWatermark(0.9, 0.8)) == cmd.Ok("did SetWatermark", {"n": 2})
        with zmq.Context.instance().socket(zmq.DEALER) as raw:
            raw.connect(ep)
            raw.send(b"\x92\xa4nope\x01")
            assert raw.poll(5000)
            reply = cmd.decode_reply(raw.recv())
        assert isinstance(reply, cmd.Error)
        assert reply.message.startswith("not a command")
    assert seen == [cmd.Evict(64), cmd.SetWatermark(0.9, 0.8)]


def test_snapshot_at_counts_only_published_batches():
    source = make_source()
    with serving(source) as pub:
        drive(source, prompts(5, seed=8))
        assert source.loop is not None
        at = source.loop.snapshot_at()
        assert isinstance(at, SnapshotAt)
        assert at.seq == pub.seq
        assert len(at.snapshot.nodes) == len(source.tree) + 1


def test_parse_command_line():
    chat = cmd.StartWorkload("chat", ["20", "--seed", "7"])
    assert cmd.parse_command_line("chat 20 --seed 7") == chat
    assert cmd.parse_command_line("evict 4096") == cmd.Evict(4096)
    assert cmd.parse_command_line("watermark 0.9 0.8") == cmd.SetWatermark(0.9, 0.8)
    assert cmd.parse_command_line("pause") == cmd.Pause()
    for bad in ("", "evict", "evict x", "watermark 1", "pause now"):
        try:
            cmd.parse_command_line(bad)
        except cmd.CommandError:
            continue
        raise AssertionError(bad)


def test_binding_beyond_loopback_needs_an_explicit_policy():
    check_bind("tcp://127.0.0.1:5557", BindPolicy.LOCAL_ONLY)
    check_bind("ipc:///tmp/x-events", BindPolicy.LOCAL_ONLY)
    try:
        check_bind("tcp://0.0.0.0:5557", BindPolicy.LOCAL_ONLY)
    except ValueError as exc:
        assert "refusing to bind" in str(exc)
    else:
        raise AssertionError("bound 0.0.0.0 without permission")
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_bind("tcp://0.0.0.0:5557", BindPolicy.ANY)
    assert [str(w.message).split(":")[0] for w in caught] == ["binding tcp"]
