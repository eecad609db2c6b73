"""One test per found item of issue 16 (and issue 12 item 3, issue 15 item 4), each failing on
the code before the fix: the merge order, honest incompleteness, tiers, presentation, hostile
events, the radix view's figures."""

from __future__ import annotations

import msgspec

from radixcache.wire.kvevents import BlockView, KVStream, MergeLimits, Sync, hash_label
from radixcache.wire.kvevents.codec import (
    Encoding,
    Engine,
    Removed,
    Stored,
    WireFormat,
    decode_batch,
)
from radixcache.wire.kvevents.radix import radix_rows, top_prefixes, tree_lines
from radixcache.wire.kvevents.view import Holder
from tests.helpers.kvevents import sglang_batches


class ListLink:
    """A replay link that only records what was asked."""

    def __init__(self) -> None:
        self.requests: list[int] = []
        self.resets = 0

    def request(self, start: int) -> None:
        self.requests.append(start)

    def reset(self) -> None:
        self.resets += 1


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pack(events, rank=0) -> bytes:
    return msgspec.msgpack.encode([1.0, events, rank])


def stored(hashes, parent, page=1, medium="GPU", tokens=None) -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens if tokens is not None else [7] * (len(hashes) * page),
            "block_size": page, "medium": medium}


# -- issue 16 item 1: the replay/live merge -------------------------------------------------
def test_a_hole_left_by_a_short_replay_is_asked_for_and_nothing_after_it_is_applied_early():
    payloads, held = sglang_batches(8, 16)
    link, clock = ListLink(), Clock()
    stream = KVStream(link, clock=clock)
    assert link.requests == [0]
    for seq in (4, 5, 6, 7):  # live batches while the first replay is slow; 2-3 were lost
        stream.merger.live(seq, payloads[seq], clock())
    for seq in (0, 1):  # the replay was answered when the publisher had only 0-1
        stream.merger.replayed(seq, payloads[seq], clock())
    stream.merger.replay_end(clock())
    assert (stream.last_seq, link.requests) == (1, [0, 2])
    assert stream.health().sync is Sync.CATCHING_UP
    for seq in range(2, 8):
        stream.merger.replayed(seq, payloads[seq], clock())
    stream.merger.replay_end(clock())
    assert stream.last_seq == 7
    assert stream.view.keys() == held
    assert (stream.merger.stats.lost, stream.merger.stats.duplicates) == (0, 4)
    assert stream.health().sync is Sync.COMPLETE


# -- issue 16 item 2: honest incompleteness --------------------------------------------------
def test_without_replay_a_quiet_stream_is_complete_as_seen_and_a_clear_makes_it_whole():
    payloads, _ = sglang_batches(6, 16)
    clock = Clock()
    stream = KVStream(None, clock=clock)
    assert stream.health().line() == "catching up since seq 0: no batch yet (no replay endpoint)"
    stream.merger.live(0, payloads[0], clock())
    stream.merger.live(1, payloads[1], clock())
    assert stream.health().line() == "complete as far as seen (no replay endpoint)"
    clock.now += 60  # quiet is not loss: vLLM and SGLang send no heartbeat
    assert stream.health().line() == "complete as far as seen (no replay endpoint)"
    stream.merger.live(3, payloads[3], clock())  # seq 2 is gone for good
    assert stream.health().line() == "incomplete since seq 2: no replay endpoint"
    stream.merger.live(4, pack([{"type": "AllBlocksCleared"}]), clock())
    assert stream.health().sync is Sync.COMPLETE
    assert stream.view.blocks == {}


def test_a_silent_replay_is_retried_on_a_new_connection_with_backoff():
    link, clock = ListLink(), Clock()
    stream = KVStream(link, clock=clock, limits=MergeLimits(replay_timeout_s=3.0, idle_s=1.0))
    stream.merger.live(5, pack([]), clock())
    for _ in range(40):
        clock.now += 0.5
        stream.merger.tick(clock())
    assert stream.health().line() == "incomplete since seq 0: replay endpoint silent for 20 s"
    assert link.resets == 4  # asked at 0, 4, 9 and 16 s; each silent for 3 s
    assert link.requests == [0, 0, 0, 0]


# -- issue 16 item 3: tiers ------------------------------------------------------------------
def test_a_block_lives_while_any_tier_holds_it_vllm_and_sglang_media():
    for tiers in (("GPU", "CPU"), ("GPU", "CPU_PINNED")):  # vLLM offloading, SGLang HiCache
        view = BlockView()
        view.apply(Stored([1, 2], None, [0] * 32, 16, tiers[0]))
        view.apply(Stored([2], 1, [0] * 16, 16, tiers[1]))
        view.apply(Removed([2], tiers[0]))
        assert set(view.blocks) == {1, 2}
        assert view.blocks[2].holders == {Holder(0, tiers[1])}
        assert dict(view.tiers) == {tiers[0]: 1, tiers[1]: 1}
        view.apply(Removed([2], tiers[1]))
        assert set(view.blocks) == {1}
        assert view.stats.unknown_removed == 0


# -- issue 16 item 4: presentation -----------------------------------------------------------
def test_one_hash_rendering_unsigned_fixed_width():
    signed = -0x364DD52700000000
    assert hash_label(signed) == "c9b22ad900000000"
    assert hash_label(signed) == hash_label(signed + 2**64)
    assert hash_label(5) == "0000000000000005"
    assert hash_label(b"\xab" * 32) == "abababababababab"
    assert hash_label(b"\x01") == "01.............."


def test_page_size_1_chain_prints_as_one_node_and_the_format_is_named():
    view = BlockView()
    view.apply(Stored(list(range(1, 101)), None, list(range(100)), 1, "GPU"))
    view.apply(Stored([201, 202], 50, [5, 6], 1, "GPU"))
    lines = tree_lines(view, 10)
    assert lines == [
        "▸ 0000000000000001 ×50 [50 tok] [0, 1, 2, 3, 4, 5, 6, 7]  GPU  2 children",
        "  · 0000000000000033 ×50 [50 tok] [50, 51, 52, 53, 54, 55, 56, 57]  GPU",
        "  · 00000000000000c9 ×2 [2 tok] [5, 6]  GPU",
    ]
    sglang = decode_batch(pack([{**stored([-3], None), "cache_salt": None, "session_id": None}]))
    vllm_old = decode_batch(msgspec.msgpack.encode([1.0, [["BlockStored", [b"\x01"], None, [1],
                                                           1, None]]]))
    plain = decode_batch(pack([stored([3], None)]))
    assert sglang.fmt.label() == "SGLang format, map encoding"
    assert vllm_old.fmt == WireFormat(Engine.VLLM, Encoding.ARRAY)
    assert plain.fmt == WireFormat(Engine.UNKNOWN, Encoding.MAP)


# -- issue 12 item 3: hostile KV events ------------------------------------------------------
def test_self_parent_loops_bad_tokens_and_deep_nesting_each_count_one_malformed_event():
    link, clock = ListLink(), Clock()
    stream = KVStream(link, clock=clock)
    stream.merger.replay_end(clock())
    deep = b"\x93\xcb" + b"\x00" * 8 + b"\x91" * 200_000 + b"\xc0" + b"\x00"
    frames = [
        pack([stored([100], None)]),
        pack([stored([200, 200], 100)]),  # a loop along its own path
        pack([stored([300], 300)]),  # its own parent
        pack([stored([400], 100, tokens=["a"]), {**stored([401], 100), "token_ids": None},
              stored([402], 100, tokens=[{"x": 1}]), stored([403], 100)]),
        deep,
        pack([stored([100], 403)]),  # a stored hash under another parent: would close a loop
        pack([stored([500], 100)]),
    ]
    for seq, payload in enumerate(frames):
        stream.merger.live(seq, payload, clock())
    assert stream.last_seq == 6
    assert set(stream.view.blocks) == {100, 403, 500}
    assert stream.stats.malformed == 6
    assert stream.view.stats.conflicts == 1
    assert stream.stats.last_error == "seq 4: msgpack nested too deep"
    assert tree_lines(stream.view, 100) == [
        "▸ 0000000000000064 [1 tok] [7]  GPU  2 children",
        "  · 0000000000000193 [1 tok] [7]  GPU",
        "  · 00000000000001f4 [1 tok] [7]  GPU",
    ]


def test_a_loop_that_slipped_in_is_drawn_finitely():
    view = BlockView()
    view.apply(Stored([1], 2, [0], 1, "GPU"))
    view.apply(Stored([2], 1, [0], 1, "GPU"))  # 1 -> 2 -> 1: no root
    view.apply(Stored([3], None, [0], 1, "GPU"))
    assert [r.blocks[0].hash for r in radix_rows(view)] == [3]
    assert len(view.blocks) == 3


# -- issue 15 item 4: the radix view's figures -----------------------------------------------
def test_radix_nodes_rates_churn_and_top_prefixes():
    clock = Clock()
    view = BlockView(clock)
    view.apply(Stored([1, 2, 3], None, list(range(48)), 16, "GPU"), rank=0)
    view.apply(Stored([1, 2, 3], None, list(range(48)), 16, "GPU"), rank=1)
    view.apply(Stored([4], 3, [9] * 16, 16, "GPU"), rank=0)
    view.apply(Stored([5, 6], 3, [8] * 32, 16, "GPU"), rank=0)
    clock.now += 2
    view.apply(Removed([6], "GPU"), rank=0)  # 2 s after it was stored: churn
    clock.now += 20
    view.apply(Removed([4], "GPU"), rank=0)  # 22 s: not churn
    rows = radix_rows(view)
    assert [(len(r.blocks), r.tokens, r.depth, r.children, r.subtree, r.holders())
            for r in rows] == [(3, 48, 0, 1, 4, "GPU r0,1"), (1, 16, 1, 0, 1, "GPU")]
    assert rows[0].preview(4) == [0, 1, 2, 3]
    assert [r.subtree for r in top_prefixes(rows, 1)] == [4]
    assert (view.stats.stored, view.stats.removed, view.stats.churned) == (9, 2, 1)
    clock.now = 122.5
    assert view.rates() == (0.0, 0.1)


def test_batches_held_behind_a_hole_are_bounded_in_bytes():
    link, clock = ListLink(), Clock()
    stream = KVStream(link, clock=clock, limits=MergeLimits(pending_bytes=1_000))
    payload = pack([stored([1], None, tokens=[1] * 100)])
    body = len(payload) + 64  # what one held batch is counted as
    for seq in range(1, 1 + 1_000 // body):
        stream.merger.live(seq, payload, clock())
    assert stream.merger.pending_bytes == (1_000 // body) * body
    assert stream.last_seq == -1
    stream.merger.live(99, payload, clock())  # one more would pass the bound: seq 0 is given up
    assert stream.health().line() == (f"incomplete since seq 0: {(1_000 // body + 1) * body:,} "
                                      "bytes buffered behind the hole")
    assert stream.last_seq == 1_000 // body
    assert stream.merger.pending_bytes == body  # 99 still waits for the seqs before it


def test_a_restarted_publisher_starts_the_view_over_and_its_history_is_replayed():
    old, _ = sglang_batches(6, 16, seed=1)
    new, _ = sglang_batches(4, 16, seed=2)
    new = [pack([stored([77], None)]), *new[1:]]  # vLLM sends no AllBlocksCleared first
    link, clock = ListLink(), Clock()
    stream = KVStream(link, clock=clock)
    stream.merger.replay_end(clock())
    for seq in range(6):
        stream.merger.live(seq, old[seq], clock())
    stream.merger.live(2, new[2], clock())  # seqs went back: the engine restarted; 0-1 missed
    assert link.requests == [0, 0]
    assert stream.view.blocks == {}
    for seq in range(4):
        stream.merger.replayed(seq, new[seq], clock())
    stream.merger.replay_end(clock())
    clean = KVStream(None, clock=clock)
    for seq in range(4):
        clean.merger.live(seq, new[seq], clock())
    assert stream.view.keys() == clean.view.keys()
    assert 77 in stream.view.blocks
    assert (stream.merger.stats.restarts, stream.health().sync) == (1, Sync.COMPLETE)


def test_two_ranks_share_one_view_and_a_restart_of_one_keeps_the_other():
    clock = Clock()
    view = BlockView(clock)
    rank0, rank1 = KVStream(None, view=view, clock=clock), KVStream(None, view=view, clock=clock)
    rank0.merger.live(0, pack([stored([1, 2], None)], rank=0), clock())
    rank1.merger.live(0, pack([stored([1, 3], None)], rank=1), clock())
    rank1.merger.live(1, pack([stored([4], 3)], rank=1), clock())
    assert [r.holders() for r in radix_rows(view)] == ["GPU r0,1", "GPU", "GPU r1"]
    rank1.merger.live(0, pack([stored([9], None)], rank=1), clock())  # rank 1 restarted
    assert {h: b.ranks for h, b in view.blocks.items()} == {1: [0], 2: [0], 9: [1]}
    assert rank1.merger.stats.restarts == 1
