"""Issue 16's must-reach over real sockets: lost live batches, slow replays, unrecoverable
history reported, lost tails found, tiers kept apart."""

from __future__ import annotations

import re

import pytest

from radixcache.wire.endpoints import u64
from radixcache.wire.kvevents import KVEventsClient, MergeLimits, Sync
from radixcache.wire.kvevents.codec import Encoding, Engine, WireFormat
from tests.helpers.kvevents import FlakyPublisher, sglang_batches
from tests.helpers.stream import wait_for


def follow(client: KVEventsClient, cond, timeout: float = 20.0) -> bool:
    """Poll the client until ``cond()`` or ``timeout``."""
    return wait_for(lambda: (client.poll(0.02), cond())[1], timeout)


@pytest.mark.parametrize(("page", "capacity"), [(16, 1_010), (1, 15_472)])
def test_every_fourth_batch_lost_and_slow_replays_end_exact(page, capacity):
    """SGLang's own run held 1,010 blocks at page size 16 and 15,472 at page size 1."""
    payloads, held = sglang_batches(3_000, page, seed=7, capacity=capacity)
    assert len({h for h, m in held if m == "GPU"}) >= capacity
    pub = FlakyPublisher(replay_delay_s=1.0, drop=lambda seq: seq % 4 == 3)
    client = KVEventsClient(*pub.endpoints)
    try:
        pub.start(payloads, interval_s=0.002)
        assert follow(client, lambda: pub.done() and client.last_seq == len(payloads) - 1,
                      timeout=120)
        assert client.view.keys() == held
        assert client.health().sync is Sync.COMPLETE
        assert client.merger.stats.lost == 0
        assert client.view.stats.unknown_removed == 0
        assert client.stats.malformed == 0
        assert client.fmt == WireFormat(Engine.SGLANG, Encoding.MAP)
        assert len(pub.requests) >= 2  # the holes really were filled by (slow) replays
    finally:
        client.close()
        pub.close()


def test_lost_tail_is_found_by_an_idle_probe():
    payloads, held = sglang_batches(12, 16)
    pub = FlakyPublisher(drop=lambda seq: seq >= 9)  # the last three never arrive live
    client = KVEventsClient(*pub.endpoints, limits=MergeLimits(idle_s=0.3))
    try:
        pub.start(payloads, interval_s=0.0)
        assert follow(client, lambda: client.last_seq == 11, timeout=5)
        assert client.view.keys() == held
        assert client.health().sync is Sync.COMPLETE
    finally:
        client.close()
        pub.close()


def test_replay_buffer_that_lost_the_start_is_reported_within_5_s():
    payloads, _ = sglang_batches(30, 16)
    pub = FlakyPublisher(ring=10)
    pub.start(payloads, interval_s=0.0, subscribers=0)
    assert wait_for(pub.done)
    client = KVEventsClient(*pub.endpoints)
    try:
        assert follow(client, lambda: client.health().sync is Sync.INCOMPLETE, timeout=5)
        assert client.health().line() == "incomplete since seq 0: replay buffer starts at 20"
        assert client.last_seq == 29
    finally:
        client.close()
        pub.close()


def test_no_replay_endpoint_late_join_is_reported_at_the_first_batch():
    payloads, _ = sglang_batches(30, 16)
    pub = FlakyPublisher(drop=lambda seq: seq < 5)  # joined after seq 4
    client = KVEventsClient(pub.endpoints[0])
    try:
        pub.start(payloads, interval_s=0.0)
        assert follow(client, lambda: client.last_seq == 29, timeout=5)
        assert client.health().line() == "incomplete since seq 0: no replay endpoint"
        assert client.merger.stats.lost == 5
    finally:
        client.close()
        pub.close()


def test_dead_replay_endpoint_is_reported_within_5_s_and_batches_still_wait():
    payloads, _ = sglang_batches(10, 16)
    pub = FlakyPublisher(drop=lambda seq: seq < 3)  # joined after seq 2
    dead = FlakyPublisher()
    dead_replay = dead.endpoints[1]
    dead.close()  # nothing listens there any more
    client = KVEventsClient(pub.endpoints[0], dead_replay,
                            limits=MergeLimits(replay_timeout_s=1.0))
    try:
        pub.start(payloads, interval_s=0.0)
        assert follow(client, lambda: client.health().sync is Sync.INCOMPLETE, timeout=5)
        assert client.health().line().startswith("incomplete since seq 0: replay endpoint silent")
        assert client.last_seq == -1  # nothing applied past the unfilled start
        assert client.merger.pending_bytes == sum(len(p) + 64 for p in payloads[3:])
    finally:
        client.close()
        pub.close()


def test_tree_against_a_dead_replay_port_says_what_waits(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    payloads, _ = sglang_batches(51, 16)
    pub = FlakyPublisher(drop=lambda seq: seq == 0)  # 50 batches arrive, behind a hole
    dead = FlakyPublisher()
    dead_replay = dead.endpoints[1]
    dead.close()

    pub.start(payloads, interval_s=0.0)  # once the command has subscribed
    try:
        res = CliRunner().invoke(app, ["tree", "--kv-events", pub.endpoints[0],
                                       "--replay", dead_replay, "--seconds", "1.5"])
    finally:
        pub.close()
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        "blocks", "format: no batch yet",
        "history: catching up since seq 0: waiting for a replay, 50 batches held back",
        "live blocks: 0"]


def test_data_parallel_rank_1_by_topic():
    payloads, held = sglang_batches(20, 16, rank=1)
    pub = FlakyPublisher(topic=b"kv@dp1")
    other = KVEventsClient(pub.endpoints[0], topic=b"kv@dp0")
    client = KVEventsClient(*pub.endpoints, topic=b"kv@dp1")
    try:
        pub.start(payloads, interval_s=0.0, subscribers=2)
        assert follow(client, lambda: client.last_seq == 19, timeout=5)
        assert client.view.keys() == held
        assert {r for b in client.view.blocks.values() for r in b.ranks} == {1}
        other.poll(0.1)
        assert (other.last_seq, other.view.blocks) == (-1, {})
    finally:
        client.close()
        other.close()
        pub.close()


def test_malformed_frames_are_counted_and_the_stream_goes_on():
    payloads, held = sglang_batches(3, 16)
    pub = FlakyPublisher()  # not started: the test thread drives its XPUB socket
    client = KVEventsClient(pub.endpoints[0])
    try:
        assert pub.pub.poll(5000) and pub.pub.recv()[:1] == b"\x01"  # subscribed
        for frames in ([b"kv-events"], [b"kv-events", b"short", b"x"],
                       [b"kv-events", u64(0), b"\xc1"]):
            pub.pub.send_multipart(frames)
        for seq, payload in enumerate(payloads, start=1):
            pub.pub.send_multipart([b"kv-events", u64(seq), payload])
        assert follow(client, lambda: client.last_seq == 3, timeout=5)
        assert client.stats.malformed == 3
        assert client.stats.last_error == ("seq 0: not msgpack: MessagePack data is malformed: "
                                           "invalid opcode '\\xc1' (byte 0)")
        assert client.view.keys() == held
        assert client.health().sync is Sync.COMPLETE
    finally:
        client.close()
        pub.close()


# -- issue 21: no false "incomplete" on a complete stream, the real alarm on one with drops ----
def _tree_lines(pub: FlakyPublisher, payloads: list[bytes], replay: str | None) -> list[str]:
    """``radixcache tree --kv-events`` against ``pub`` for 4.5 s: the stream ends early, then
    stays quiet longer than any replay timeout (SGLang sends no heartbeat)."""
    from typer.testing import CliRunner

    from cli.main import app

    pub.start(payloads, interval_s=0.0)  # once the command has subscribed
    args = ["tree", "--kv-events", pub.endpoints[0], "--seconds", "4.5", "--limit", "0"]
    try:
        res = CliRunner().invoke(app, [*args, *(["--replay", replay] if replay else [])])
    finally:
        pub.close()
    assert res.exit_code == 0, res.output
    # how long the endpoint was silent depends on the machine's load: not asserted
    return [re.sub(r"for \d+ s", "for N s", line) for line in res.output.splitlines()
            if line.startswith("history:")]


def _dead_endpoint() -> str:
    dead = FlakyPublisher()
    dead.close()  # nothing listens there any more
    return dead.endpoints[1]


@pytest.mark.parametrize("replay", ["answers", "none", "silent"])
def test_a_complete_sglang_stream_is_never_called_incomplete(replay):
    payloads, _ = sglang_batches(48, 16, seed=3)
    pub = FlakyPublisher()
    endpoint = {"answers": pub.endpoints[1], "none": None, "silent": _dead_endpoint()}[replay]
    assert _tree_lines(pub, payloads, endpoint) == [{
        "answers": "history: complete",
        "none": "history: complete as far as seen (no replay endpoint)",
        "silent": "history: complete as far as seen (replay endpoint silent for N s)"}[replay]]


@pytest.mark.parametrize("replay", ["none", "silent"])
def test_an_sglang_stream_with_a_drop_is_called_incomplete(replay):
    payloads, _ = sglang_batches(48, 16, seed=3)
    pub = FlakyPublisher(drop=lambda seq: seq == 20)
    endpoint = None if replay == "none" else _dead_endpoint()
    assert _tree_lines(pub, payloads, endpoint) == [{
        "none": "history: incomplete since seq 20: no replay endpoint",
        "silent": "history: incomplete since seq 20: replay endpoint silent for N s"}[replay]]
