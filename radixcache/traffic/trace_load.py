"""A trace file as a workload for ``radixcache load --trace FILE``, so that what ``radixcache
whatif FILE`` predicts can be checked against an engine fed the same requests over HTTP.

- A Mooncake-format trace (JSONL): request i's prompt is its blocks' tokens, each block drawn
  from the workload words by a generator seeded with the block's hash id, so requests that
  share hash ids share the same prefix of words (a partial block is its id's first tokens:
  an id names one block of one length). Its answer is capped at ``output_length``. It is sent
  at its ``timestamp`` (ms from the first request's).
- A ShareGPT file (a JSON array of ``{"conversations": [{"from", "value"}, ...]}``): every
  ``gpt`` message after a ``human`` one is a request whose prompt is the conversation so far in
  the chat template, as the built-in ShareGPT trace builds it
  (``traffic.sharegpt_text.conversation_requests``), sent as the file's own words; the next
  turn follows it and carries the engine's real answer (``WorkloadRequest.after``, as the chat
  workload does). It has no timestamps: it is sent at ``--rate``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from radixcache.traffic.mooncake import read_requests
from radixcache.traffic.sharegpt import TokenArray
from radixcache.traffic.sharegpt_text import (
    SPECIAL_NAMES,
    conversation_requests,
    record_messages,
    word_id,
)
from radixcache.traffic.traces import MOONCAKE_BLOCK, TraceError, TraceFormat, detect_format
from radixcache.traffic.workload_types import Vocabulary, Workload, WorkloadRequest

WORD_RE = re.compile(r"\w+|[^\w\s]")  # sharegpt_text's words


class TraceWorkload:
    """A trace's requests as a ``Workload``, and their send times (seconds from the first;
    ``None``: the trace has none, send at a rate)."""

    def __init__(self, workload: Workload, times: list[float] | None) -> None:
        self.workload = workload
        self.times = times


def _block_tokens(words: np.ndarray, hash_id: int, n: int, size: int) -> np.ndarray:
    """The first ``n`` tokens of block ``hash_id`` (``size`` tokens when whole)."""
    rng = np.random.default_rng([hash_id & 0xFFFFFFFF, hash_id >> 32])
    return rng.choice(words, size)[:n]


def mooncake_workload(path: Path, limit: int, hash_block_size: int = MOONCAKE_BLOCK,
                      max_tokens: int = 16) -> TraceWorkload:
    """The first ``limit`` requests of a Mooncake-format trace (see the module docstring)."""
    words = Vocabulary().ids
    reqs: list[WorkloadRequest] = []
    stamps: list[float] = []
    for line, rec in read_requests(path, hash_block_size):
        if len(reqs) >= limit:
            break
        left, parts = rec.input_length, []
        for h in rec.hash_ids:
            n = min(left, hash_block_size)
            parts.append(_block_tokens(words, h, n, hash_block_size))
            left -= n
        prompt = np.concatenate(parts).astype(np.uint32)
        out = max(1, min(rec.output_length or max_tokens, max_tokens))
        reqs.append(WorkloadRequest(prompt, out, None, f"line {line}", None))
        stamps.append(rec.timestamp / 1000)
    first = min(stamps, default=0.0)
    w = Workload("trace", {"requests": len(reqs)}, reqs, str(path), Vocabulary())
    return TraceWorkload(w, [t - first for t in stamps])


class LearnedWords:
    """Token ids as the words they were made from, learned while tokenizing a ShareGPT file
    (``traffic.sharegpt_text``'s words: crc32 ids), so that ``Workload.text`` sends the file's
    own words, and the template markers as the tokenizer's special tokens."""

    def __init__(self) -> None:
        self.names: dict[int, str] = dict(SPECIAL_NAMES)

    def tokenize(self, text: str) -> list[int]:
        """Ids of ``text``'s words, remembering each id's first word."""
        out = []
        for w in WORD_RE.findall(text):
            i = word_id(w)
            self.names.setdefault(i, w)
            out.append(i)
        return out

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """The words of ``tokens`` joined by spaces."""
        names = self.names
        return " ".join(names.get(int(t), f"#{int(t)}") for t in tokens)


def sharegpt_workload(path: Path, limit: int) -> TraceWorkload:
    """The first ``limit`` requests of a ShareGPT file, conversation by conversation (the
    requests of ``traffic.sharegpt_text.conversation_requests``: the built-in trace's)."""
    try:
        records = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: not a ShareGPT JSON file: {exc}") from None
    if not isinstance(records, list):
        raise TraceError(f"{path}: not a ShareGPT JSON file: want a JSON array of records")
    words, reqs = LearnedWords(), list[WorkloadRequest]()
    for k, rec in enumerate(records):
        stream, turns = conversation_requests(record_messages(rec), words.tokenize)
        ids, prev = np.asarray(stream, np.uint32), None
        for j, (p, o) in enumerate(turns[: max(0, limit - len(reqs))]):
            reqs.append(WorkloadRequest(ids[:p], o, ids[p : p + o], f"record {k} turn {j}", prev))
            prev = len(reqs) - 1
    if not reqs:
        raise TraceError(f"{path}: no human -> gpt turn in any record")
    return TraceWorkload(Workload("trace", {"requests": len(reqs)}, reqs, str(path), words),
                         None)


def trace_workload(source: str, limit: int, hash_block_size: int = MOONCAKE_BLOCK,
                   max_tokens: int = 16) -> TraceWorkload:
    """A Mooncake-format JSONL or a ShareGPT JSON file as a workload; ``TraceError`` on
    anything else (a special file, a token JSONL, a recording)."""
    path = Path(source)
    if path.suffix == ".json":
        from radixcache.traffic.traces import open_trace

        open_trace(path).close()  # a regular file of a sane size, before reading it whole
        return sharegpt_workload(path, limit)
    if detect_format(source) is not TraceFormat.MOONCAKE:
        raise TraceError(f"{path}: --trace takes a Mooncake-format JSONL or a ShareGPT .json")
    return mooncake_workload(path, limit, hash_block_size, max_tokens)
