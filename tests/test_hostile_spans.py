"""One rule for token counts, block counts and hash ids (issue 24 item 5), shared by the native
stream (a snapshot's node cannot claim more tokens than its blocks hold) and the KV events (a
BlockStored's token count is its hashes x its block size: no 0-token block)."""

from __future__ import annotations

import msgspec
import pytest

from radixcache.core import events as ev
from radixcache.core.tokens import InvalidSpan, blocks_spanned, check_full_blocks, check_span
from radixcache.wire.kvevents.codec import decode_batch
from radixcache.wire.mirror import Malformed, Mirror

ROOT = ev.NodeState(0, -1, 0, b"", [], 0, 0)
TOK = b"\x01\x00\x00\x00"


def test_blocks_spanned_counts_every_block_a_span_touches():
    # B = 16: [0, 16) is block 0; [10, 20) touches blocks 0 and 1; [16, 17) block 1 only
    assert [blocks_spanned(s, n, 16) for s, n in [(0, 16), (0, 17), (10, 10), (16, 1),
                                                  (15, 2), (0, 1)]] == [1, 2, 2, 1, 2, 1]


@pytest.mark.parametrize("start, tokens, blocks, size, message", [
    (0, 2**24, 1, 16, "16,777,216 tokens from position 0 need 1,048,576 blocks of 16, not 1"),
    (0, 16, 2, 16, "16 tokens from position 0 need 1 blocks of 16, not 2"),
    (10, 10, 1, 16, "10 tokens from position 10 need 2 blocks of 16, not 1"),
    (0, 0, 0, 16, "a span of 0 tokens"),
    (0, 4, 1, 0, "block size 0"),
    (-1, 4, 1, 16, "position -1"),
])
def test_check_span_refuses_counts_that_disagree(start, tokens, blocks, size, message):
    with pytest.raises(InvalidSpan) as info:
        check_span(start, tokens, blocks, size)
    assert str(info.value) == message


def test_check_full_blocks():
    check_full_blocks(32, 2, 16)
    with pytest.raises(InvalidSpan, match=r"^0 tokens for 1 blocks of 16: want 16$"):
        check_full_blocks(0, 1, 16)
    with pytest.raises(InvalidSpan, match=r"^31 tokens for 2 blocks of 16: want 32$"):
        check_full_blocks(31, 2, 16)


def test_a_16m_token_node_on_one_block_is_refused_before_it_is_loaded():
    # was: accepted (769 MB RSS for the subscriber that loaded it)
    node = ev.NodeState(1, 0, 0, TOK * 2**24, [0], 0, 0)
    snap = ev.Snapshot(16, 64, [ROOT, node], 0, 2, [], 0.92, 0.85)
    with pytest.raises(Malformed) as info:
        Mirror().load_snapshot(snap)
    assert str(info.value) == ("snapshot node 1: 16,777,216 tokens from position 0 need "
                               "1,048,576 blocks of 16, not 1")


def test_a_node_that_does_not_start_where_its_parent_ends_is_refused():
    a = ev.NodeState(1, 0, 0, TOK * 4, [0], 0, 0)
    b = ev.NodeState(2, 1, 9, TOK * 4, [0, 1], 0, 0)  # the parent ends at 4, not 9
    with pytest.raises(Malformed, match=r"^snapshot node 2 starts at 9, its parent ends at 4$"):
        Mirror().load_snapshot(ev.Snapshot(16, 8, [ROOT, a, b], 0, 3, [], 0.92, 0.85))


def stored(hashes: list[int], tokens: list[int], size: int = 16) -> dict[str, object]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
            "token_ids": tokens, "block_size": size}


def test_kv_events_whose_token_count_is_not_hashes_times_block_size_are_refused():
    payload = msgspec.msgpack.encode([1.0, [
        stored([1, 2], list(range(32))),  # good: 2 x 16
        stored([3], []),  # was: accepted, a 0-token block
        stored([4, 5], list(range(20))),  # 20 tokens for 2 blocks of 16
    ], 0])
    batch = decode_batch(payload)
    assert [e.hashes for e in batch.events] == [[1, 2]]
    assert batch.errors == ["BlockStored: 0 tokens for 1 blocks of 16: want 16",
                            "BlockStored: 20 tokens for 2 blocks of 16: want 32"]
