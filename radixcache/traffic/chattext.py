"""Text <-> token ids for the HTTP fronts, exact both ways.

The engine's ids are the ShareGPT trace's (``traffic.sharegpt``): a word is
``crc32(word) % 100000`` and the chat template's special tokens have ids above that. Text
carries them as markers, and any id without a known word as ``#id``::

    "<bos> <hdr>human<end> hello world <eot> <hdr>gpt<end>"   # the chat template
    "#81234 #100007"                                          # ids with no word (model output)

``encode(decode(ids)) == ids`` for every id below the vocabulary size: decoded words are
joined by single spaces and each known word hashes back to its own id. This is what lets a
client (``radixcache load``) send a conversation as text through a router and get the very
tokens the engine cached.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from radixcache.traffic.sharegpt import (
    BOS,
    EOT,
    HDR,
    HDR_END,
    ROLE_GPT,
    ROLE_HUMAN,
    ROLE_OTHER,
    ROLE_SYSTEM,
    VOCAB_SIZE,
    WORD_VOCAB,
    word_id,
)
from radixcache.traffic.workloads import WORDS

MARKERS: dict[str, int] = {"<bos>": BOS, "<hdr>": HDR, "<end>": HDR_END, "<eot>": EOT}
ROLES: dict[str, int] = {"human": ROLE_HUMAN, "gpt": ROLE_GPT, "system": ROLE_SYSTEM,
                         "other": ROLE_OTHER}
# OpenAI roles to the trace's: what a chat client sends, as the workloads lay it out
OPENAI_ROLES: dict[str, int] = {"user": ROLE_HUMAN, "assistant": ROLE_GPT, "system": ROLE_SYSTEM}

_TOKEN_RE = re.compile(r"<bos>|<hdr>|<end>|<eot>|#\d+|\w+|[^\w\s]")


class TextCodec:
    """Encodes text to ids and decodes ids to text; learns the words it encodes so that
    decoding them later gives words, not ``#id``. Not thread-safe for ``learn`` and ``encode``
    at once with ``decode`` of the same new word (a dict update; the worst case is ``#id``)."""

    def __init__(self, words: Sequence[str] = WORDS) -> None:
        self._words: dict[int, str] = {word_id(w): w for w in words}
        self._words.update({v: k for k, v in MARKERS.items()})

    def learn(self, text: str) -> None:
        """Remember the words of ``text`` (the first word seen for an id is kept)."""
        for w in _TOKEN_RE.findall(text):
            if w not in MARKERS and not w.startswith("#"):
                self._words.setdefault(word_id(w), w)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``. Raises ``ValueError`` on a ``#id`` outside the vocabulary."""
        out: list[int] = []
        for w in _TOKEN_RE.findall(text):
            i = _one_id(w, out[-1] if out else None)
            if i < WORD_VOCAB and not w.startswith("#"):  # a word: not a marker, role or #id
                self._words.setdefault(i, w)
            out.append(i)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``: words, markers (a role right after ``<hdr>`` by name), else ``#id``."""
        parts: list[str] = []
        prev: int | None = None
        for i in ids:
            i = int(i)
            if prev == HDR and i in _ROLE_NAMES:
                parts[-1] += _ROLE_NAMES[i]
            elif i == HDR_END and prev is not None and prev in _ROLE_NAMES and parts:
                parts[-1] += "<end>"
            else:
                word = self._words.get(i, f"#{i}")
                # a word spelled like a role right after <hdr> would read back as the role
                parts.append(f"#{i}" if prev == HDR and word in ROLES else word)
            prev = i
        return " ".join(parts)


_ROLE_NAMES = {v: k for k, v in ROLES.items()}


def _one_id(w: str, prev: int | None) -> int:
    if w in MARKERS:
        return MARKERS[w]
    if prev == HDR and w in ROLES:
        return ROLES[w]
    if w.startswith("#"):
        i = int(w[1:])
        if i >= VOCAB_SIZE:
            raise ValueError(f"token #{i} is outside the vocabulary [0, {VOCAB_SIZE})")
        return i
    return word_id(w)


def chat_prompt(messages: Sequence[tuple[str, str]], codec: TextCodec) -> list[int]:
    """The workloads' chat template over OpenAI messages ``(role, content)``:
    ``<bos>`` then ``<hdr> role <end> content <eot>`` per message, then ``<hdr> gpt <end>``
    (the generation prompt). Roles: user -> human, assistant -> gpt, system -> system, any
    other -> other."""
    out = [BOS]
    for role, content in messages:
        out += [HDR, OPENAI_ROLES.get(role, ROLE_OTHER), HDR_END, *codec.encode(content), EOT]
    return [*out, HDR, ROLE_GPT, HDR_END]
