"""Trace readers for the what-if analysis: every source becomes a stream of ``Access``.

Sources:

- Mooncake-format JSONL (the format Mooncake publishes its traces in and Dynamo's and AIPerf's
  tools read): one request a line, ``{"timestamp": ms, "input_length": n, "output_length": m,
  "hash_ids": [...]}``; ``hash_ids`` name the prompt's blocks of ``hash_block_size`` tokens
  (512 by default), equal ids meaning a shared prefix up to and including that block. Only
  the prompt's blocks are cached (the format has no ids for outputs).
- token JSONL (ours): one request a line, ``{"prompt": [ids], "output": [ids]}``; ``output``
  is optional; other keys are ignored. The cache holds ``prompt + output[:-1]`` (the last
  generated token's K/V is never computed), as the engine inserts it.
- a recording (``.rcx``): the requests the engine finished, rebuilt from its events.
- ``sharegpt``: the built-in multi-turn trace that ``bench tree`` replays.

Readers stream (a million-line file is never held in memory) and stop at the first bad line
with a ``TraceError`` that names the file and line.
"""

from __future__ import annotations

import enum
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, assert_never

import msgspec
import numpy as np

from radixcache.core import events as ev
from radixcache.core.files import FileRefused, open_regular

if TYPE_CHECKING:
    from radixcache.wire.mirror import Mirror, MirrorNode

MOONCAKE_BLOCK = 512
MAX_TRACE_BYTES = 64 * 1024**3  # readers stream; this bounds a run on a mistaken file
# a line longer than this is no request (a Mooncake line of 1M tokens is ~16 KB, a token
# line of 1M ids ~8 MB): refused before it is held, as a file of NULs has no newline at all
MAX_LINE_BYTES = 16 << 20
BOM = b"\xef\xbb\xbf"


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and line."""


class Access(NamedTuple):
    """One request as the analysis sees it.

    ``units``: the cached sequence's units (blocks), ``width`` bytes each, root first;
    ``prompt_units``: how many leading units belong to the prompt (the hit candidates);
    ``prompt_tokens``: the prompt's length in tokens (the hit-rate denominator). A matched
    prompt unit at depth d is worth ``min(block_tokens, prompt_tokens - d * block_tokens)``
    tokens (the Mooncake rule ``min(matched * block, input_length)``)."""

    units: bytes
    prompt_units: int
    prompt_tokens: int


class TokenRequest(NamedTuple):
    """A request with token ids: ``prompt`` is matched, ``cached`` (``prompt + output[:-1]``)
    is what the cache keeps after it. uint32 arrays."""

    prompt: np.ndarray
    cached: np.ndarray


class TraceFormat(enum.Enum):
    """What a SOURCE is."""

    SHAREGPT = "sharegpt"
    RECORDING = "recording"
    MOONCAKE = "mooncake"
    TOKENS = "tokens"


def token_access(req: TokenRequest, block: int) -> Access:
    """The request at block size ``block``: whole blocks only (a partly filled block has no
    key of its own under page-aligned or full-block-hash reuse; at block 1 every token is a
    unit)."""
    n = len(req.cached) // block
    return Access(req.cached[: n * block].tobytes(), len(req.prompt) // block, len(req.prompt))


class _Tokens(msgspec.Struct):
    prompt: list[int]
    output: list[int] = []


def open_trace(path: Path) -> io.BufferedReader:
    """``path`` opened for reading if it is a regular file of at most ``MAX_TRACE_BYTES``;
    ``TraceError`` otherwise (``core.files.open_regular``: a FIFO with no writer would block
    for ever, and a device such as /dev/zero never ends)."""
    try:
        fd, _ = open_regular(path, MAX_TRACE_BYTES)
    except FileRefused as exc:
        raise TraceError(str(exc)) from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot open: {exc.strerror or exc}") from None
    return open(fd, "rb")


def long_line(path: Path, line: int | None, offset: int) -> TraceError:
    """The error for a line past ``MAX_LINE_BYTES`` that starts at byte ``offset``."""
    where = f"{path}:{line}" if line is not None else f"{path}: the line at byte {offset:,}"
    at = f" (at byte {offset:,})" if line is not None else ""
    return TraceError(f"{where}{at}: longer than {MAX_LINE_BYTES >> 20} MiB without a newline: "
                      f"not a trace line")


def lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines with their 1-based numbers, streamed; a UTF-8 byte order mark at byte 0
    is dropped (some editors write one); a line past ``MAX_LINE_BYTES`` is a ``TraceError``
    before it is held whole."""
    with open_trace(path) as f:
        i, offset = 0, 0
        while line := f.readline(MAX_LINE_BYTES + 1):
            i += 1
            if len(line) > MAX_LINE_BYTES:
                raise long_line(path, i, offset)
            offset += len(line)
            if i == 1 and line.startswith(BOM):
                line = line[len(BOM):]
            if line.strip():
                yield i, line


def decode_problem(line: bytes, exc: Exception) -> str:
    """msgspec's reason for refusing ``line``, worded for a person: msgspec calls a string with
    a lone UTF-16 surrogate escape (``"\\ud800"``) "truncated", which it is not."""
    try:
        json.loads(line)
    except ValueError:
        return str(exc)
    if isinstance(exc, msgspec.DecodeError) and "truncated" in str(exc):
        return "a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff)"
    return str(exc)


def read_token_jsonl(path: Path) -> Iterator[TokenRequest]:
    """Stream a token JSONL trace (see the module docstring for the format)."""
    dec = msgspec.json.Decoder(_Tokens)
    for i, line in lines(path):
        try:
            rec = dec.decode(line)
            prompt = np.asarray(rec.prompt, dtype=np.int64)
            out = np.asarray(rec.output[:-1], dtype=np.int64)
        except (msgspec.DecodeError, OverflowError) as exc:
            raise TraceError(f"{path}:{i}: not a token request: {decode_problem(line, exc)}"
                             ) from None
        both = np.concatenate((prompt, out))
        if not len(prompt) or both.min() < 0 or both.max() >= 2**32:
            raise TraceError(f"{path}:{i}: need a non-empty prompt of token ids in [0, 2^32)")
        yield TokenRequest(prompt.astype(np.uint32), both.astype(np.uint32))


def detect_format(source: str) -> TraceFormat:
    """Which reader a SOURCE needs: ``sharegpt``, ``*.rcx``, else by the first line's keys."""
    if source == "sharegpt":
        return TraceFormat.SHAREGPT
    path = Path(source)
    if path.suffix == ".rcx":
        return TraceFormat.RECORDING
    for i, line in lines(path):
        try:
            keys = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            raise TraceError(f"{path}:{i}: not JSON (want a JSONL trace or a .rcx)") from None
        if isinstance(keys, dict) and "hash_ids" in keys:
            return TraceFormat.MOONCAKE
        if isinstance(keys, dict) and "prompt" in keys:
            return TraceFormat.TOKENS
        raise TraceError(f"{path}:{i}: neither a Mooncake request (hash_ids) nor tokens (prompt)")
    raise TraceError(f"{path}: empty trace")


class RequestTracker:
    """Rebuilds the requests an engine finished from its event stream, one event at a time
    (a recording here; the inspector feeds it the live stream the same way).

    Call ``after(e)`` once ``e`` has been applied to ``mirror``. A finished request's
    sequence is the path to the node its insert touched last (the ``Access`` right before
    its ``RequestFinish``: only its unlock and the frees of duplicate blocks come between,
    and neither changes a path), cut to prompt + output - 1 tokens; its prompt length comes
    from its ``RequestStart``. The path is read at the ``RequestFinish``, so the many
    ``Access`` events of matches cost nothing."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self._prompts: dict[int, int] = {}
        self._node: int | None = None  # the node of the last Access, once one came

    def after(self, e: ev.AnyEvent) -> TokenRequest | None:
        """The request ``e`` finished, if it finished one."""
        match e:
            case ev.Access():
                self._node = e.node
            case ev.RequestStart():
                self._prompts[e.req] = e.prompt_tokens
            case ev.RequestFinish():
                return self._finished(e)
            case (ev.NodeCreated() | ev.Extend() | ev.Split() | ev.Merge() | ev.Evict() | ev.Pin()
                  | ev.BlockAlloc() | ev.BlockFree() | ev.Cow() | ev.Watermark() | ev.Snapshot()
                  | ev.Reset() | ev.Counters() | ev.Fault() | ev.Digest() | ev.RequestCached()
                  | ev.Queue() | ev.Retract()):
                pass  # no request starts or ends, no path is touched for one (a request's
                # early prompt insert, before its RequestCached, is followed by its final one)
            case _:
                assert_never(e)
        return None

    def finished(self, e: ev.RequestFinish) -> tuple[bytes, int] | None:
        """For a ``RequestFinish`` (instead of ``after``): the request's cached sequence
        (prompt + output - 1 tokens, little-endian uint32 ids) and its prompt length in
        tokens, or None when the stream did not show them."""
        p = self._prompts.pop(e.req, None)
        node = None if self._node is None else self.mirror.nodes.get(self._node)
        if p is None or node is None:
            return None
        n = p + e.output_tokens - 1
        seq = path_tokens(node)[: 4 * n if n >= 0 else -4]  # (as a [: n] slice of ids)
        return (seq, p) if len(seq) >= 4 * p else None

    def _finished(self, e: ev.RequestFinish) -> TokenRequest | None:
        got = self.finished(e)
        if got is None:
            return None
        seq = np.frombuffer(got[0], dtype="<u4")
        return TokenRequest(seq[: got[1]].astype(np.uint32), seq.astype(np.uint32))


def read_recording(path: Path, notes: list[str]) -> Iterator[TokenRequest]:
    """The requests a recording's engine finished, in finishing order (``RequestTracker``).
    A damaged file yields the requests before the damage and says where in ``notes``."""
    from radixcache.wire.mirror import Mirror

    tracker = RequestTracker(Mirror())
    for e in replay_recording(path, tracker.mirror, notes):
        req = tracker.after(e)
        if req is not None:
            yield req


def replay_recording(path: Path, mirror: Mirror, notes: list[str]) -> Iterator[ev.AnyEvent]:
    """Apply a recording to ``mirror`` from its first keyframe (later ones hold nothing the
    batches do not), yielding each event once applied. A damaged file stops at the damage and
    says where in ``notes``."""
    from radixcache.wire.recording import Keyframe, RecordingReader

    reader = RecordingReader(path)
    started = False
    for rec in reader.records():
        item = rec.item
        if isinstance(item, Keyframe):
            if not started:
                mirror.load_snapshot(item.snapshot, item.seq)
            continue
        started = True
        mirror.seq = item.seq
        for e in item.events:
            mirror.apply(e)
            yield e
    if reader.damage is not None:
        notes.append(f"{path}: read up to byte {reader.damage.offset}: {reader.damage.reason}")


def path_tokens(n: MirrorNode | None) -> bytes:
    """The tokens from the root to the end of node ``n``."""
    parts = []
    while n is not None:
        parts.append(n.tokens)
        n = n.parent
    return b"".join(reversed(parts))
