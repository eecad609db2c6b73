"""The typed ``stats`` reply: one ``Stats`` encoded by name, read back exactly, and a clear error
for a peer of another version."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import msgspec
import pytest
import zmq

from inspector.commands import stats_line
from radixcache.serving.stats import Stats
from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from tests.helpers.stream import tree_server, wait_for

FIGURES = Stats(generation=2, submitted=11, finished=7, rejected=1, cancelled=3, waiting=4,
                running=5, paused=True, steps=13, prompt_tokens=400, hit_tokens=100,
                prefill_tokens=300, output_tokens=50, busy_s=2.5, nodes=17, used_blocks=19,
                num_blocks=64, splits=6, merges=2, cow_copies=8, evicted_nodes=9,
                evicted_tokens=144, cache="on", model="tiny", device="cpu", schedule="lpm",
                failed=1, kv_bytes_per_block=4096, kv_bytes_per_token=256)


def test_the_reply_round_trips_typed_and_names_every_figure_on_the_wire() -> None:
    stream = cmd.StreamFigures(seq=41, batches=40, digest="ab12", program_rounds=3,
                               fault="thread x died: E: y")
    socket = cmd.SocketFigures(commands_too_large=1, command_connections_dropped=2)
    reply = msgspec.structs.replace(FIGURES.reply(), stream=stream, socket=socket)
    data = cmd.encode_reply(reply)
    back = cmd.decode_reply(data)
    assert back == reply
    assert Stats.of(back) == FIGURES
    assert (Stats.of(back).paused, Stats.of(back).hit_rate) == (True, 0.25)
    assert Stats.of(back).decode_tokens_per_s == 20.0
    tag, figures, on_wire_stream, on_wire_socket = msgspec.msgpack.decode(data)
    assert tag == "stats"  # a client in any language reads the figures by name:
    assert (figures["submitted"], figures["paused"], figures["busy_s"]) == (11, True, 2.5)
    assert figures["schedule"] == "lpm" and len(figures) == len(Stats.__struct_fields__)
    assert on_wire_stream["seq"] == 41 and on_wire_stream["program_error"] is None
    assert on_wire_socket == {"commands_too_large": 1, "command_connections_dropped": 2}


def test_a_served_cache_answers_its_own_figures_exactly() -> None:
    server = tree_server(256).start()
    try:
        assert server.loop.command(cmd.StartWorkload("flood", ["3"])) == cmd.Ok(
            "flood: 3 requests submitted (synthetic flood of 3 unique prompts)", {"requests": 3})
        assert wait_for(lambda: server.service.counters().finished == 3)
        reply = cmd.stats_reply(send_command(server.publisher.endpoints.commands, cmd.Stats()))
        got = Stats.of(reply)
        assert (got.generation, got.submitted, got.finished, got.rejected, got.cancelled) == (
            0, 3, 3, 0, 0)
        assert (got.waiting, got.running, got.paused, got.num_blocks) == (0, 0, False, 256)
        assert got == server.loop.stats()  # idle: the same figures in process
        assert reply.stream is not None and reply.stream.program_rounds == 0
        assert reply.stream.digest == server.service.digest()
        assert reply.socket == cmd.SocketFigures(commands_too_large=0,
                                                 command_connections_dropped=0)
        line = stats_line(reply)  # what ``:stats`` shows in the inspector
        assert "  submitted=3  finished=3  rejected=0  " in line
        assert got.hit_tokens == 0 and "  hit_rate=0.0  decode_tokens_per_s=" in line  # unique
        assert f"  seq={reply.stream.seq}  " in line and "fault=" not in line
        assert line.endswith("commands_too_large=0  command_connections_dropped=0")
    finally:
        server.close()


def test_figures_of_a_newer_or_older_engine_read_by_name() -> None:
    fields = msgspec.structs.asdict(FIGURES)
    newer = cmd.StatsReply(msgspec.Raw(msgspec.msgpack.encode({**fields, "a_later_figure": 4})))
    assert Stats.of(newer) == FIGURES  # a figure this reader does not know is skipped
    older = {k: v for k, v in fields.items() if k != "kv_bytes_per_token"}
    assert Stats.of(cmd.StatsReply(msgspec.Raw(msgspec.msgpack.encode(older)))) == (
        msgspec.structs.replace(FIGURES, kv_bytes_per_token=0))  # its default


def test_what_is_no_stats_reply_says_so() -> None:
    with pytest.raises(cmd.CommandError, match=r"^no reply from x$"):
        Stats.of(cmd.Error("no reply from x"))
    bad = cmd.StatsReply(msgspec.Raw(msgspec.msgpack.encode({"submitted": "many"})))
    with pytest.raises(cmd.CommandError,
                       match=r"^not a stats reply: Expected `int`, got `str` - at `\$.submitted`"):
        Stats.of(bad)
    with pytest.raises(cmd.CommandError, match=r"^not a stats reply: Object missing required"):
        Stats.of(cmd.StatsReply(msgspec.Raw(msgspec.msgpack.encode({}))))


@pytest.fixture
def old_engine() -> Iterator[str]:
    """A command socket that answers as engines before the typed reply did: ``["ok", "stats",
    {name: value}]`` to everything."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()
    old = msgspec.msgpack.encode(["ok", "stats", {"submitted": 1, "paused": 0}])

    def serve() -> None:
        while not stop.is_set():
            if sock.poll(50):
                *head, _ = sock.recv_multipart()
                sock.send_multipart([*head, old])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{port}"
    stop.set()
    thread.join(5)
    sock.close()


def test_an_older_engine_is_named_as_such(old_engine: str) -> None:
    reply = send_command(old_engine, cmd.Stats())
    assert reply == cmd.Ok("stats", {"submitted": 1, "paused": 0})
    with pytest.raises(cmd.CommandError) as err:
        Stats.of(reply)
    assert str(err.value) == ("the engine answered stats with an untyped reply: it is an older "
                              "radixcache than this client (upgrade the engine)")


def test_a_reply_of_a_newer_engine_is_named_as_such() -> None:
    with pytest.raises(cmd.CommandError) as err:
        cmd.decode_reply(msgspec.msgpack.encode(["figures", {"submitted": 1}]))
    assert str(err.value) == ("reply 'figures' is not one this client reads: the engine is a "
                              "newer radixcache (upgrade this client)")
    with pytest.raises(cmd.CommandError, match=r"^not a reply: "):
        cmd.decode_reply(msgspec.msgpack.encode(["stats"]))  # a known tag, cut short
