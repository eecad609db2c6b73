"""The vLLM/SGLang KV-event format: translation from our tree, both encodings, both replays."""

from __future__ import annotations

import msgspec
import zmq

from radixcache.serving.driver import serve_request
from radixcache.wire import kvevents as kv
from radixcache.wire.endpoints import u64
from radixcache.wire.kvevents import BlockView, KVEventPublisher, KVEventsClient, KVTranslator, Sync
from tests.helpers.stream import make_source, prompts, wait_for


def expected_blocks(tree) -> dict[int, list[int]]:
    """hash -> tokens of every full block of every path, computed from the tree directly."""
    B = tree.B
    out: dict[int, list[int]] = {}
    for node in list(tree.live_nodes()):
        path = []
        n = node
        while n is not None:
            path.append(n.tokens)
            n = n.parent
        seq = b"".join(reversed(path))
        parent = None
        for end in range(B, len(seq) // 4 + 1, B):
            parent = kv.chain_hash(parent, seq[(end - B) * 4:end * 4])
            out[parent] = list(memoryview(seq[(end - B) * 4:end * 4]).cast("I"))
    return out


def test_translator_tracks_the_full_blocks_of_every_path():
    source = make_source(num_blocks=256)
    tree = source.tree
    tr = KVTranslator(16, 256)
    blocks = BlockView()
    for i, tokens in enumerate(prompts(400, seed=5)):
        serve_request(tree, tokens)
        for e in tr.translate(tree.take_events()):
            blocks.apply(kv.decode_event(msgspec.msgpack.decode(msgspec.msgpack.encode(e))))
        if i % 50 == 49:
            want = expected_blocks(tree)
            assert {h: b.tokens for h, b in blocks.blocks.items()} == want
            assert tr.live_blocks == len(want)
    assert blocks.stats.removed > 0
    assert blocks.stats.unknown_removed == 0
    for b in blocks.blocks.values():
        assert b.parent is None or b.parent in blocks.blocks


def test_our_publisher_to_our_client_with_replay_from_zero():
    source = make_source(num_blocks=256)
    tr = KVTranslator(16, 256)
    pub = KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    try:
        sent = 0
        for tokens in prompts(120, seed=5):
            serve_request(source.tree, tokens)
            wire = tr.translate(source.tree.take_events())
            pub.publish(wire)
            sent += bool(wire)
        assert wait_for(lambda: pub.seq == sent - 1)
        client = KVEventsClient(*pub.endpoints, start_seq=0)
        try:
            assert wait_for(lambda: (client.poll(0.02), client.last_seq == pub.seq)[1])
            assert {h: b.tokens for h, b in client.blocks.items()} == expected_blocks(source.tree)
            assert client.merger.stats.replayed == pub.seq + 1
            assert client.stats.malformed == 0
            assert client.health().sync is Sync.COMPLETE
        finally:
            client.close()
    finally:
        pub.close()


def _old_array_payload(ts, events):
    return msgspec.msgpack.encode([ts, events])


def test_old_array_form_int_and_bytes_hashes_and_old_replay_framing():
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    h1, h2 = 2**64 - 5, -7  # uint64 and int64
    b1 = b"\x01" * 32  # a bytes hash
    batches = [
        _old_array_payload(1.0, [["BlockStored", [h1, h2], None, list(range(8)), 4, None]]),
        _old_array_payload(2.0, [["BlockStored", [b1], h2, [8, 9, 10, 11], 4, None, "GPU"]]),
        _old_array_payload(3.0, [["BlockRemoved", [h1]], ["BlockRemoved", [b"\xff"], "GPU"]]),
    ]
    client = KVEventsClient(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}")
    try:
        assert router.poll(5000)
        ident, empty, start = router.recv_multipart()
        assert (empty, start) == (b"", u64(0))
        for seq, payload in enumerate(batches[:2]):  # older framing: no topic frame
            router.send_multipart([ident, b"", u64(seq), payload])
        router.send_multipart([ident, b"", b"\xff" * 8, b""])
        assert wait_for(lambda: (client.poll(0.02), client.last_seq == 1)[1])
        assert set(client.blocks) == {h1, h2, b1}
        assert client.blocks[b1].parent == h2
        assert client.blocks[b1].tokens == [8, 9, 10, 11]
        assert [b.hash for b in client.view.children(h1)] == [h2]
        assert [b.hash for b in client.view.roots()] == [h1]
        assert wait_for(lambda: (pub.send_multipart([b"", u64(2), batches[2]]),
                                 client.poll(0.02), client.last_seq == 2)[2])
        assert set(client.blocks) == {h2, b1}
        assert [b.hash for b in client.view.roots()] == [h2]
        assert client.view.stats.unknown_removed == 1
        assert client.merger.stats.replayed == 2
    finally:
        client.close()
        pub.close(linger=0)
        router.close(linger=0)


def test_map_form_decodes_and_garbage_is_rejected():
    batch = kv.decode_batch(kv.encode_payload(kv.KVEventBatch(
        5.0, [kv.BlockStored([1, 2], None, list(range(32)), 16), kv.BlockRemoved([2]),
              kv.AllBlocksCleared()])))
    assert batch.ts == 5.0
    assert batch.events == [kv.Stored([1, 2], None, list(range(32)), 16, "GPU"),
                            kv.Removed([2], "GPU"), kv.Cleared()]
    assert batch.errors == []
    raw = msgspec.msgpack.decode(kv.encode_payload(kv.KVEventBatch(1.0, [kv.BlockRemoved([3])])))
    assert raw == [1.0, [{"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU"}], 0]
    for bad in (b"\xc1", msgspec.msgpack.encode("x"), msgspec.msgpack.encode([1.0, 2])):
        try:
            kv.decode_batch(bad)
        except kv.KVEventsError:
            continue
        raise AssertionError(bad)
    odd = kv.decode_batch(msgspec.msgpack.encode(
        [1.0, [["Nope"], {"type": "BlockRemoved", "block_hashes": [1.5]}, ["AllBlocksCleared"]]]))
    assert odd.events == [kv.Cleared()]
    assert odd.errors == ["unknown event type 'Nope'",
                          "a block hash must be bytes or an integer, got float"]
