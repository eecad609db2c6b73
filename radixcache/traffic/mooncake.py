"""Mooncake-format traces: reading them (one request at a time, or as flat arrays for the
array pass), and generating valid ones.

The format (what Mooncake publishes its traces in, and Dynamo's and AIPerf's tools read): one
request a line, ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``;
``hash_ids`` name the prompt's blocks of ``hash_block_size`` tokens (512 by default), equal ids
meaning a shared prefix up to and including that block. Every line obeys
``radixcache.core.blockrule``: exactly ``ceil(input_length / block)`` ids, each in [0, 2^64).
The array pass also holds each id to one length over the whole trace (aiperf's rule).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
from array import array
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import msgspec
import numpy as np

from radixcache.core.blockrule import hash_id_problem, hash_run_problem
from radixcache.traffic.traces import (
    BOM,
    MAX_LINE_BYTES,
    MOONCAKE_BLOCK,
    Access,
    TraceError,
    decode_problem,
    lines,
    long_line,
    open_trace,
)

if TYPE_CHECKING:
    from radixcache.traffic.mooncake_scan import Scanned

CHUNK_BYTES = 8 << 20  # the array reader decodes this much of the file at once


class MooncakeRequest(msgspec.Struct):
    """One line of a Mooncake-format trace."""

    input_length: int
    hash_ids: list[int]
    output_length: int = 0
    timestamp: float = 0.0


class HashRuns(NamedTuple):
    """Consecutive requests of a hash-id trace as flat arrays: request i's ids are
    ``ids[ends[i] - n_i : ends[i]]`` (``ends`` cumulative from 0 at the batch start), its prompt
    ``tokens[i]`` tokens; ``first_line`` is the file line of request 0 (0: not from a file).
    A sample (``read_hash_runs(keep=...)``) holds only the sampled ids, and ``wants``: the
    tokens of each one's block (a request's last block may be partial)."""

    ids: np.ndarray  # uint64
    ends: np.ndarray  # int64
    tokens: np.ndarray  # int64
    first_line: int
    line_nos: np.ndarray | None = None  # each request's line, where blank lines intervene
    wants: np.ndarray | None = None  # int32, beside ``ids``: a sample's


def request_problem(rec: MooncakeRequest, hash_block_size: int) -> str | None:
    """Why one decoded request breaks ``radixcache.core.blockrule``, or ``None``."""
    ids = rec.hash_ids
    why = hash_run_problem(len(ids), rec.input_length, hash_block_size)
    if why is None and ids:
        why = hash_id_problem(min(ids), max(ids))
    return why


def _decode(dec: msgspec.json.Decoder[MooncakeRequest], path: Path, i: int,
            line: bytes, block: int) -> MooncakeRequest:
    try:
        rec = dec.decode(line)
    except msgspec.DecodeError as exc:
        raise TraceError(f"{path}:{i}: not a Mooncake-format request: "
                         f"{decode_problem(line, exc)}") from None
    why = request_problem(rec, block)
    if why is not None:
        raise TraceError(f"{path}:{i}: {why}"
                         + (": is --hash-block-size right?" if "hash ids for" in why else ""))
    return rec


def read_requests(path: Path, hash_block_size: int = MOONCAKE_BLOCK
                  ) -> Iterator[tuple[int, MooncakeRequest]]:
    """Stream the valid requests of a Mooncake-format trace with their line numbers."""
    dec = msgspec.json.Decoder(MooncakeRequest)
    for i, line in lines(path):
        yield i, _decode(dec, path, i, line, hash_block_size)


def read_mooncake(path: Path, hash_block_size: int = MOONCAKE_BLOCK) -> Iterator[Access]:
    """Stream a Mooncake-format trace as ``Access`` items (units: 8-byte hash ids)."""
    for _, rec in read_requests(path, hash_block_size):
        ids = array("Q", rec.hash_ids)
        yield Access(ids.tobytes(), len(ids), rec.input_length)


def _runs(recs: list[MooncakeRequest], first_line: int, block: int,
          line_nos: np.ndarray | None = None) -> HashRuns | None:
    """The requests as flat arrays; ``None`` when one breaks the rule (the caller names it)."""
    try:
        counts = np.fromiter((len(r.hash_ids) for r in recs), np.int64, len(recs))
        ends = np.cumsum(counts)
        flat = itertools.chain.from_iterable(r.hash_ids for r in recs)
        ids = np.fromiter(flat, np.uint64, int(ends[-1]) if len(ends) else 0)
        tokens = np.fromiter((r.input_length for r in recs), np.int64, len(recs))
    except OverflowError:  # an id outside [0, 2^64) or a length outside int64
        return None
    return _checked(HashRuns(ids, ends, tokens, first_line, line_nos), block)


def _checked(runs: HashRuns, block: int) -> HashRuns | None:
    """``runs`` if every request obeys ``radixcache.core.blockrule``'s count rule."""
    counts = np.diff(runs.ends, prepend=0)
    t = runs.tokens
    if len(t) and (t.min() < 1 or np.any(counts != (t + block - 1) // block)):
        return None
    return runs


def _last_newline(buf: np.ndarray, end: int) -> int:
    """The index after the last newline in ``buf[:end]``; 0 if there is none."""
    hi = end
    while hi > 0:
        lo = max(0, hi - (1 << 16))
        found = np.flatnonzero(buf[lo:hi] == 10)
        if len(found):
            return lo + int(found[-1]) + 1
        hi = lo
    return 0


def _chunks(path: Path, chunk_bytes: int, ring: int
            ) -> Generator[tuple[np.ndarray, int], None, None]:
    """The file in chunks of whole lines, read into ``ring`` buffers in turn: ``(buf, size)``,
    the chunk being ``buf[:size]`` with ``PAD`` more bytes readable (the scanner's 8-byte
    loads); a buffer is written again ``ring`` chunks later, so up to ``ring - 1`` earlier
    chunks may still be read while the next one is. A byte order mark at byte 0 is dropped; a
    last line without its newline gets one; a line past ``MAX_LINE_BYTES`` is a
    ``TraceError`` naming its byte offset (before a buffer grows to hold it)."""
    from radixcache.traffic.swar import PAD

    # a read of nothing is the end only while a buffer has room past what it holds: room for
    # more than the first read (3 bytes) and, in the next buffer, than the line begun
    bufs = [np.zeros(max(chunk_bytes, len(BOM) + 1) + PAD, np.uint8) for _ in range(ring)]
    turn, buf, offset = 0, bufs[0], 0  # offset: of ``buf[0]`` in the file
    with open_trace(path) as f:
        start = f.read(len(BOM))
        held = 0 if start == BOM else len(start)  # a line begun in the read before
        buf[:held] = np.frombuffer(start, np.uint8)[:held]
        while True:
            got = f.readinto(buf.data[held : len(buf) - PAD])
            end = held + got
            if not got and held:  # the end, in an unterminated line
                buf[end] = 10
                yield buf, end + 1
            if not got:
                return
            cut = _last_newline(buf, end)
            if cut:
                offset += cut
                yield buf, cut
                turn = (turn + 1) % len(bufs)
                nxt = bufs[turn]
                if len(nxt) <= end - cut + PAD:  # the ring's other buffers grow as needed
                    nxt = bufs[turn] = np.zeros(len(buf), np.uint8)
                nxt[: end - cut] = buf[cut:end]  # the line begun: to the front of the next
                buf = nxt
            elif end > MAX_LINE_BYTES:
                raise long_line(path, None, offset + (len(BOM) if start == BOM else 0))
            elif end + PAD == len(buf):  # one line longer than the buffer: a larger one
                buf = bufs[turn] = np.concatenate((buf, np.zeros(len(buf), np.uint8)))
            held = end - cut


def scan_workers() -> int:
    """Threads that scan chunks while the caller analyses the ones before (the scanner holds
    no GIL): the CPUs this process may use, at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def _decoded(dec: msgspec.json.Decoder[MooncakeRequest], path: Path, first: int,
             chunk: bytes, block: int) -> HashRuns:
    """A chunk the scanner left, by msgspec: all at once, else line by line (which names the
    first bad line and numbers the lines past blank ones)."""
    if b"\n\n" not in chunk and not chunk[:1].isspace():
        with contextlib.suppress(msgspec.DecodeError):
            runs = _runs(dec.decode_lines(chunk), first, block)
            if runs is not None:
                return runs
    return _slow(dec, path, first, chunk, block)


def _slow(dec: msgspec.json.Decoder[MooncakeRequest], path: Path, first: int, chunk: bytes,
          block: int) -> HashRuns:
    """Line by line: names the first bad line, and numbers the lines past blank ones."""
    numbered = [(first + n, line) for n, line in enumerate(chunk.split(b"\n")) if line.strip()]
    recs = [_decode(dec, path, i, line, block) for i, line in numbered]
    runs = _runs(recs, first, block, np.asarray([i for i, _ in numbered], np.int64))
    assert runs is not None  # every line passed ``_decode``
    return runs


def read_hash_runs(path: Path, hash_block_size: int = MOONCAKE_BLOCK, keep: int = 0,
                   chunk_bytes: int = CHUNK_BYTES, workers: int | None = None
                   ) -> Iterator[HashRuns]:
    """A Mooncake-format trace as ``HashRuns`` of about ``chunk_bytes`` of file each, in file
    order; with ``keep`` (``mooncake_scan.sample_keep``) only the sampled ids, with their
    ``wants``. A thread reads the file and the compiled scanner reads the common shape, in
    ``workers`` threads (``scan_workers()`` by default), while the caller works on the chunks
    before; a chunk it leaves is decoded by msgspec here (all at once, or line by line to name
    a bad line)."""
    from radixcache.traffic.mooncake_scan import scan_chunk  # numba: when read

    workers = scan_workers() if workers is None else max(1, workers)
    dec = msgspec.json.Decoder(MooncakeRequest)
    first = 1
    with ThreadPoolExecutor(workers, thread_name_prefix="rc-trace-scan") as pool:
        reader = _Reader(path, chunk_bytes, workers + 1, lambda buf, size: pool.submit(
            scan_chunk, buf, size, hash_block_size, keep))
        try:
            for item in reader:
                runs, first = _chunk_runs(dec, path, first, item, hash_block_size, keep)
                reader.done()  # its buffer may be read into again
                if len(runs.tokens):
                    yield runs
        finally:  # stopped early (an error, a --limit): no read or scan left running
            reader.close()


Chunk = tuple[np.ndarray, int, "Future[Scanned | None]"]  # a chunk's buffer, size and scan
Scan = Callable[[np.ndarray, int], "Future[Scanned | None]"]


class _Reader:
    """Reads a file's chunks (``_chunks``) in a thread of its own, ``rc-trace-read``, and hands
    each to ``scan`` as soon as it is read, at most ``ahead`` chunks ahead of the caller, who
    iterates over them in file order and calls ``done()`` once it is through with one (its
    buffer is then read into again). An error of the read is raised to the caller."""

    def __init__(self, path: Path, chunk_bytes: int, ahead: int, scan: Scan) -> None:
        self._slots = threading.Semaphore(ahead)  # chunks read and not done, or being read
        self._out: queue.SimpleQueue[Chunk | Exception | None] = queue.SimpleQueue()
        self._stop = False
        self._thread = threading.Thread(name="rc-trace-read", target=self._run, daemon=True,
                                        args=(path, chunk_bytes, ahead, scan))
        self._thread.start()

    def _run(self, path: Path, chunk_bytes: int, ahead: int, scan: Scan) -> None:
        chunks = _chunks(path, chunk_bytes, ahead + 1)  # the ring: one more than in use
        try:
            while self._slots.acquire() and not self._stop:
                item = next(chunks, None)
                self._out.put(None if item is None else (*item, scan(*item)))
                if item is None:
                    return
        except Exception as exc:  # raised where the caller reads
            self._out.put(exc)
        finally:
            chunks.close()

    def __iter__(self) -> Iterator[Chunk]:
        while (item := self._out.get()) is not None:
            if isinstance(item, Exception):
                raise item
            yield item

    def done(self) -> None:
        self._slots.release()

    def close(self) -> None:
        """Stop reading, and cancel the scans of chunks not handled."""
        self._stop = True
        while self._thread.is_alive():
            self._slots.release()
            self._thread.join(0.01)
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._out.get_nowait()
                if isinstance(item, tuple):
                    item[2].cancel()


def _chunk_runs(dec: msgspec.json.Decoder[MooncakeRequest], path: Path, first: int,
                item: Chunk, block: int, keep: int
                ) -> tuple[HashRuns, int]:
    """One chunk's requests (its scan's, else msgspec's) and the next chunk's first line."""
    from radixcache.traffic.mooncake_scan import sample_runs

    buf, size, fut = item
    scanned = fut.result()
    if scanned is not None:
        runs = HashRuns(scanned.ids, scanned.ends, scanned.tokens, first, None, scanned.wants)
        return runs, first + len(scanned.ends)
    chunk = buf[:size].tobytes()
    runs = _decoded(dec, path, first, chunk, block)
    if keep:
        ids, ends, wants = sample_runs(runs.ids, runs.ends, runs.tokens, keep, block)
        runs = runs._replace(ids=ids, ends=ends, wants=wants)
    return runs, first + chunk.count(b"\n")


def head(runs: HashRuns, n: int) -> HashRuns:
    """The first ``n`` requests of ``runs``."""
    if n >= len(runs.tokens):
        return runs
    cut = int(runs.ends[n - 1]) if n > 0 else 0
    lines_kept = None if runs.line_nos is None else runs.line_nos[:n]
    wants = None if runs.wants is None else runs.wants[:cut]
    return HashRuns(runs.ids[:cut], runs.ends[:n], runs.tokens[:n], runs.first_line, lines_kept,
                    wants)


def line_of(runs: HashRuns, i: int) -> int:
    """The file line of request ``i`` of ``runs``."""
    return runs.first_line + i if runs.line_nos is None else int(runs.line_nos[i])


def generate_runs(n: int, seed: int, batch: int = 1 << 16) -> Iterator[HashRuns]:
    """A seeded Mooncake-format trace of ``n`` requests (512-token blocks) with Mooncake-like
    reuse: 64 shared system prompts (Zipf-popular, 1-8 blocks), multi-turn sessions that resend
    their history plus 1-4 blocks of new tokens, and one-off documents; ~1 request in 5 opens a
    session. Valid by construction: a request's last block, when partial, gets an id of its
    own that no later request asks for (the next turn's block at that place holds more tokens,
    so it is another block), so every id names one block of one length."""
    rng = np.random.default_rng([11, seed])
    systems = [list(range(k * 8, k * 8 + int(m))) for k, m in enumerate(rng.integers(1, 9, 64))]
    zipf = np.cumsum([1 / (k + 1) for k in range(64)])
    next_id, done = 64 * 8, 0
    sessions: list[list[int]] = []
    while done < n:
        m = min(batch, n - done)
        roll, back = rng.random(m), rng.exponential(40, m).astype(np.int64)
        pick = np.searchsorted(zipf, rng.random(m) * zipf[-1], side="right")
        new = rng.integers(1, 4 * MOONCAKE_BLOCK + 1, m)  # new tokens: 1 to 4 blocks' worth
        flat: list[int] = []
        ends, tokens = np.empty(m, np.int64), np.empty(m, np.int64)
        for i in range(m):
            hist = _history(sessions, systems, float(roll[i]), int(back[i]), int(pick[i]))
            nb, part = -(-int(new[i]) // MOONCAKE_BLOCK), int(new[i]) % MOONCAKE_BLOCK
            fresh = range(next_id, next_id + nb)
            flat += hist
            flat += fresh
            tokens[i] = len(hist) * MOONCAKE_BLOCK + int(new[i])
            hist += fresh[: nb - 1] if part else fresh  # the session keeps its whole blocks
            next_id += nb
            ends[i] = len(flat)
        done += m
        yield HashRuns(np.asarray(flat, np.uint64), ends, tokens, 0)


def _history(sessions: list[list[int]], systems: list[list[int]], roll: float, back: int,
             pick: int) -> list[int]:
    """The whole blocks a request resends: a recent session's (70%), a new session's system
    prompt (20%), or none (a one-off document)."""
    if roll < 0.7 and sessions:
        k = len(sessions) - 1 - min(back, len(sessions) - 1)
        hist = sessions[k]
        if len(hist) > 96:  # a context limit: the session ends with this turn
            sessions.pop(k)
        return hist
    if roll < 0.9:
        hist = list(systems[pick])
        sessions.append(hist)
        if len(sessions) > 2000:
            sessions.pop(0)
        return hist
    return []


def generate_mooncake(n: int, seed: int) -> Iterator[MooncakeRequest]:
    """``generate_runs`` as Mooncake-format lines, with Poisson timestamps (ms, mean gap 20)
    and output lengths of 16-512 tokens."""
    rng = np.random.default_rng([12, seed])
    t = 0.0
    for runs in generate_runs(n, seed):
        gaps = rng.exponential(20.0, len(runs.tokens))
        outs = rng.integers(16, 513, len(runs.tokens))
        start = 0
        for i, end in enumerate(runs.ends.tolist()):
            t += float(gaps[i])
            yield MooncakeRequest(int(runs.tokens[i]), runs.ids[start:end].tolist(),
                                  int(outs[i]), round(t))
            start = end


def write_mooncake(path: Path, n: int, seed: int) -> None:
    """Write ``generate_mooncake(n, seed)`` to ``path`` as a Mooncake-format JSONL file."""
    enc = msgspec.json.Encoder()
    with path.open("wb") as f:
        for rec in generate_mooncake(n, seed):
            f.write(enc.encode(rec) + b"\n")
