"""The array reader of Mooncake-format files (``traffic.mooncake.read_hash_runs`` over the
compiled scanner of ``traffic.mooncake_scan``): the scanner against msgspec, exact and sampled;
chunks of any size (lines across chunk edges, a line longer than the buffer, a byte order mark,
an unterminated last line); a sample taken as the file is read against the sample the stack
takes of whole requests; a bad line named by its number in a later chunk."""

from __future__ import annotations

import itertools
import json
import threading
from array import array
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.analysis.hashstack import HashStack
from radixcache.traffic.mooncake import (
    HashRuns,
    generate_mooncake,
    line_of,
    read_hash_runs,
    read_mooncake,
    read_requests,
)
from radixcache.traffic.mooncake_scan import sample_keep, sample_runs, scan_bytes
from radixcache.traffic.traces import Access, TraceError

HALF = sample_keep(0.5)
Flat = tuple[list[int], list[int], list[int], list[int] | None]  # ids, counts, tokens, wants


def flat(runs: list[HashRuns]) -> Flat:
    """The requests of ``runs`` as plain lists (ids, ids a request, tokens, wants)."""
    ids = [int(x) for r in runs for x in r.ids]
    counts = [int(c) for r in runs for c in np.diff(r.ends, prepend=0)]
    wants = None if any(r.wants is None for r in runs) else [
        int(w) for r in runs for w in (r.wants if r.wants is not None else [])]
    return ids, counts, [int(t) for r in runs for t in r.tokens], wants


def accesses(runs: list[HashRuns]) -> list[Access]:
    ids, counts, tokens, _ = flat(runs)
    out, start = [], 0
    for n, tok in zip(counts, tokens, strict=True):
        out.append(Access(array("Q", ids[start : start + n]).tobytes(), n, tok))
        start += n
    return out


def outcome(read: Callable[[], object]) -> object:
    """What a reader gives: its result, or the one line of its ``TraceError``."""
    try:
        return read()
    except TraceError as exc:
        return str(exc)


@given(st.lists(st.tuples(
    st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6),
    st.integers(1, 511),  # tokens in the last block
    st.permutations(["input_length", "hash_ids", "timestamp", "note"]),
    st.sampled_from(["", " ", "  ", "\t"]),
    st.one_of(st.integers(-5, 10**6), st.floats(0, 1e9, allow_nan=False), st.text(max_size=5)),
), min_size=1, max_size=8), st.sampled_from([0, HALF]))
@settings(max_examples=80, deadline=None)
def test_the_scanner_reads_what_msgspec_reads(tmp_path_factory, lines, keep):
    """Keys in any order, any spacing, other values of any kind, ids of 1 to 20 digits: the
    array reader (scanner or msgspec) and the line reader (msgspec alone) agree, whole or
    sampled (the sample of the line reader's requests taken by ``sample_runs``)."""
    path = tmp_path_factory.mktemp("scan") / "m.jsonl"
    text = []
    for ids, last, keys, ws, other in lines:
        tokens = 512 * (len(ids) - 1) + last
        vals = {"input_length": tokens, "hash_ids": ids, "timestamp": other, "note": other}
        sep = f",{ws}"
        text.append("{" + ws + sep.join(f'"{k}":{ws}{json.dumps(vals[k], separators=(sep, ":"))}'
                                     for k in keys)
                    + ws + "}\n")
    path.write_text("".join(text))

    def scanned() -> object:
        return flat(list(read_hash_runs(path, keep=keep)))

    assert outcome(scanned) == outcome(lambda: line_reader(path, keep))


def line_reader(path: Path, keep: int) -> Flat:
    """The requests of ``path`` by the line reader (msgspec alone), sampled by
    ``sample_runs`` when ``keep`` is given."""
    recs = [r for _, r in read_requests(path)]
    ids = np.asarray([x for r in recs for x in r.hash_ids], np.uint64)
    ends = np.cumsum([len(r.hash_ids) for r in recs])
    tokens = np.asarray([r.input_length for r in recs], np.int64)
    if not keep:
        return flat([HashRuns(ids, ends, tokens, 1)])
    ids, ends, wants = sample_runs(ids, ends, tokens, keep, 512)
    return flat([HashRuns(ids, ends, tokens, 1, None, wants)])


IDS_TEXTS = ["0", "7", "42", "1234567", "12345678", "99999999", "123456789",
             "18446744073709551615", "18446744073709551616", "01", "00", "1e3", "1.0", "-1",
             "1a", "", " 5", "5 ", "5\t"]


@pytest.mark.parametrize("text", IDS_TEXTS)
@pytest.mark.parametrize("keep", [0, HALF])
def test_compact_ids_of_every_length_read_as_msgspec_reads_them(tmp_path, text, keep):
    """Ids without spaces (``[12,345]``, the compact form the scanner reads a word at a
    time): 1 to 8 digits, then a separator inside or just past the word, longer ids, leading
    zeros and other numbers that are not ids: the same requests or the same error as the
    line reader, in the middle of the list and last in it."""
    for ids in (f"[{text},3]", f"[3,{text}]", f"[{text}]"):
        path = tmp_path / "m.jsonl"
        n = ids.count(",") + 1
        path.write_text(f'{{"input_length":{512 * n},"hash_ids":{ids}}}\n')
        assert outcome(lambda p=path: flat(list(read_hash_runs(p, keep=keep)))) == outcome(
            lambda p=path: line_reader(p, keep)), ids


@pytest.mark.parametrize("text", ["0", "7", "1234567", "12345678", "123456789",
                                  "18446744073709551615"])
def test_the_scanner_reads_compact_ids_itself(text):
    """The valid ids above are the scanner's to read (no fallback to msgspec)."""
    for ids in (f"[{text},5]", f"[5,{text}]"):
        got = scan_bytes(f'{{"input_length":1024,"hash_ids":{ids}}}\n'.encode(), 512)
        assert got is not None, ids
        assert [int(x) for x in got.ids] == json.loads(ids)


def test_chunks_of_any_size_read_the_same_requests(tmp_path):
    """Lines across chunk edges, lines longer than the buffer (1 and 7 bytes: it grows), a
    byte order mark, a last line without its newline, scanned by one thread or three: the same
    requests as the line reader, each with its own line number."""
    path = tmp_path / "m.jsonl"
    body = "".join(msgspec.json.encode(x).decode() + "\n" for x in generate_mooncake(300, 4))
    path.write_bytes(b"\xef\xbb\xbf" + body.encode()[:-1])
    want = list(read_mooncake(path))
    assert len(want) == 300
    for size, workers in itertools.product((1, 7, 100, 4096, 1 << 20), (1, 3)):
        runs = list(read_hash_runs(path, chunk_bytes=size, workers=workers))
        assert accesses(runs) == want, (size, workers)
        assert [line_of(r, i) for r in runs for i in range(len(r.tokens))] == list(
            range(1, 301))


def test_every_chunk_size_reads_a_file_whose_last_line_has_no_newline(tmp_path):
    """A chunk under the 3 bytes first read, or a line begun that fills the next (smaller)
    buffer exactly, left no room to read: the read of nothing was taken for the end, and a line
    was cut ("Input data was truncated", or the scanner's "needs PAD bytes")."""
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"input_length": 1000, "hash_ids": [1, 2]}\n'
                     b'{"input_length": 600, "hash_ids": [1, 3]}')
    want = list(read_mooncake(path))
    assert len(want) == 2
    for size in range(1, 100):
        assert accesses(list(read_hash_runs(path, chunk_bytes=size, workers=1))) == want, size


def test_a_sample_taken_as_the_file_is_read_is_the_stacks_own(tmp_path):
    """Sampling ids as they are read (the scanner, or ``sample_runs`` for a chunk msgspec
    reads: here the one with an escaped string) gives the curve the stack gives when it
    samples whole requests itself, and holds about the sampled share of the ids."""
    path = tmp_path / "m.jsonl"
    recs = [msgspec.to_builtins(r) for r in generate_mooncake(20_000, 5)]
    recs[7000]["note"] = "an \"escaped\" word"  # that chunk: msgspec
    path.write_text("".join(json.dumps(x) + "\n" for x in recs))
    whole = list(read_hash_runs(path, chunk_bytes=1 << 16))
    for rate in (0.5, 0.05):
        by_stack, as_read = HashStack(512, rate), HashStack(512, rate)
        for r in whole:
            by_stack.add(r.ids, r.ends, r.tokens)
        kept = 0
        for r in read_hash_runs(path, keep=as_read.keep, chunk_bytes=1 << 16):
            as_read.add(r.ids, r.ends, r.tokens, r.wants)
            kept += len(r.ids)
        a, b = by_stack.curve(), as_read.curve()
        assert np.array_equal(a.cum, b.cum) and a.prompt_tokens == b.prompt_tokens
        assert (as_read.requests, as_read.distinct) == (20_000, by_stack.distinct)
        total = sum(len(r.ids) for r in whole)
        assert abs(kept / total - rate) < 0.2 * rate, (kept, total)


@pytest.mark.parametrize("keep", [0, HALF])
def test_a_bad_line_in_a_later_chunk_is_named(tmp_path, keep):
    lines = [msgspec.json.encode(x).decode() for x in generate_mooncake(200, 6)]
    lines[40] = ""  # a blank line: numbers still count it
    lines[150] = json.dumps({"input_length": 1000, "hash_ids": [1]})
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as exc:
        list(read_hash_runs(path, keep=keep, chunk_bytes=2048))
    assert str(exc.value) == (f"{path}:151: 1 hash ids for 1000 tokens: blocks of 512 tokens "
                              "need exactly 2: is --hash-block-size right?")


def test_an_exact_stack_refuses_a_sample():
    ids, ends, tokens = (np.asarray([1], np.uint64), np.asarray([1]), np.asarray([5]))
    with pytest.raises(ValueError, match="a sample's ids given to an exact stack"):
        HashStack(512).add(ids, ends, tokens, np.asarray([5], np.int32))


def test_an_empty_file_and_a_lone_mark_hold_no_requests(tmp_path):
    for body in (b"", b"\xef\xbb\xbf", b"\n\n"):
        path = tmp_path / "m.jsonl"
        path.write_bytes(body)
        assert list(read_hash_runs(Path(path))) == []


def test_a_reader_stopped_early_leaves_no_thread(tmp_path):
    """A caller that stops after the first chunk (``--limit``) or meets an error: the read
    and scan threads end with the generator, and an unreadable path is the caller's error."""
    path = tmp_path / "m.jsonl"
    path.write_bytes(b"".join(msgspec.json.encode(x) + b"\n" for x in generate_mooncake(3000, 7)))
    runs = read_hash_runs(path, chunk_bytes=4096, workers=2)
    assert len(next(runs).tokens) > 0
    runs.close()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("rc-trace-")]
    assert alive == []
    with pytest.raises(TraceError):
        list(read_hash_runs(tmp_path))  # a folder, not a trace
    assert [t.name for t in threading.enumerate() if t.name.startswith("rc-trace-")] == []


def test_a_chunk_holding_more_sampled_ids_than_its_share_is_read_whole(tmp_path):
    """A sample's arrays are sized for four times its share of a chunk's ids: a chunk whose
    ids are all in the sample (6,000 of them, at a 0.1% rate) is scanned again with room for
    every id, and reads as msgspec reads it."""
    keep = sample_keep(0.001)
    every = np.arange(8_000_000, dtype=np.uint64)
    kept = sample_runs(every, np.asarray([len(every)]), np.asarray([512 * len(every)]), keep, 512)
    ids = [int(x) for x in kept[0][:6000]]
    assert len(ids) == 6000
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"input_length": 512 * 100, "hash_ids": ids[i:i + 100]},
                                       separators=(",", ":")) + "\n"
                            for i in range(0, 6000, 100)))
    got = flat(list(read_hash_runs(path, keep=keep)))
    assert got[0] == ids and got == line_reader(path, keep)
    assert scan_bytes(path.read_bytes(), 512, keep) is not None  # the scanner's, not msgspec's
