"""Every word a person can type in the inspector's command lines, from one table.

The engine's control words are ``radixcache.wire.commands.CONTROLS``, the workloads
``radixcache.traffic.workloads.WORKLOADS``, and the words a screen answers itself are ``LOCAL``
(the main screen) and ``CLUSTER`` (the cluster screen) here. Completion, the parser's
messages, the help screen, the cluster screen's message and the README's list all read
``main_words()`` or ``cluster_words()``: adding a command is one entry in one of these tables
(and, for a local word, its handler in the screen, which a test ties to the table).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from radixcache.traffic.workloads import WORKLOADS
from radixcache.wire.commands import CONTROLS


class Kind(enum.Enum):
    """Who answers a word: the engine starts a workload or obeys a control, or the screen."""

    WORKLOAD = "workload"
    CONTROL = "control"
    LOCAL = "local"


class Word(NamedTuple):
    """One command word: ``usage`` (``evict TOKENS``), an ``example``, what it ``does``."""

    usage: str
    example: str
    does: str
    kind: Kind = Kind.LOCAL

    @property
    def word(self) -> str:
        """The word that starts it."""
        return self.usage.split()[0]

    def usage_line(self) -> str:
        """``usage`` with its example: what a mistake is answered with."""
        return f"{self.usage} (e.g. {self.example})"


def _table(words: tuple[Word, ...]) -> Mapping[str, Word]:
    return MappingProxyType({w.word: w for w in words})


LOCAL = _table((
    Word("filter KIND...", "filter split evict cow", "event kinds the log shows (`filter all`)"),
    Word("why REQ", "why 42", "why request REQ missed"),
    Word("help", "help", "the keys and these words"),
    Word("quit", "quit", "leave the inspector"),
))
CLUSTER = _table((
    Word("kill RANK", "kill 1", "stop replica RANK (the router routes around it)"),
    Word("restart RANK|router", "restart 1", "start replica RANK, or the router, again"),
    Word("quit", "quit", "leave; what `radixcache cluster` started stops"),
))


def _engine_words() -> tuple[Word, ...]:
    workloads = tuple(Word(s.usage(), s.example, s.help, Kind.WORKLOAD)
                      for s in WORKLOADS.values())
    controls = tuple(Word(c.usage, c.example, c.does, Kind.CONTROL) for c in CONTROLS.values())
    return workloads + controls


def main_words() -> Mapping[str, Word]:
    """The main screen's words: workloads, control words, then its own, in help order."""
    return _table((*_engine_words(), *LOCAL.values()))


def cluster_words() -> Mapping[str, Word]:
    """The cluster screen's words: workloads (sent through the router), then its own."""
    return _table((*(w for w in _engine_words() if w.kind is Kind.WORKLOAD), *CLUSTER.values()))


def usage_line(word: str) -> str:
    """The usage of a main-screen word, with its example (``evict TOKENS (e.g. evict 4096)``)."""
    return main_words()[word].usage_line()


def help_lines(words: Mapping[str, Word]) -> list[str]:
    """The examples of ``words``, one line per kind (``chat 20 · tot 3 4 · ...``)."""
    return [" · ".join(w.example for w in words.values() if w.kind is kind)
            for kind in Kind if any(w.kind is kind for w in words.values())]


def readme_list() -> str:
    """The README's command list: every main-screen word's example, in backticks."""
    return ", ".join(f"`{w.example}`" for w in main_words().values())
