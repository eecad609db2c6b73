"""Reserving KV blocks for running requests: the rule (``full`` or ``grow``), the estimate of
what a request will still write that admission counts on, and the order retraction takes
running requests back in.

``full`` (the engine before issue 35, kept for comparison): a request's lease covers
``prompt + max_new_tokens - 1`` positions from its admission on, whether it writes them or not.

``grow``: a running request holds the blocks it has written and what its next step writes (its
prompt while prefilling, then one more position a decode); a decode takes a block when it
crosses one (``RadixTree.grow``). Admission counts on an estimate instead of the worst case
(SGLang's ``new_token_ratio``): a request that may end early (it has a token policy: sampling,
stop tokens, an end of sequence) is expected to write ``ratio × its remaining max_new``; one
that cannot (greedy without a policy, or a forced answer) counts in full. The ratio starts at
``INIT_RATIO``, falls by ``DECAY`` a step while nothing is retracted, down to ``MIN_RATIO``,
and goes back up to ``INIT_RATIO`` after a retraction. A step admits a request when the blocks
its prompt adds, plus its estimate, fit what the running requests' blocks and estimates leave
of the pool (cached, unpinned blocks count as room: eviction frees them); with nothing running
it is admitted whenever it fits at all, so admission never stalls.

When a step finds no block for a running request's growth, the tree evicts unpinned LRU blocks
first; when none is left, running requests are retracted (``victim``): the newest admitted
first (vLLM's order), except that a request retracted ``PROTECTED`` times already is taken only
when every other one has been too. Once the running requests are all protected the order is
newest first, and the oldest of them always advances: two requests cannot retract each other
forever. A request that is alone always fits (``submit`` refuses one whose worst case exceeds
the pool), and every other request's blocks can be retracted and evicted for it.
A retracted request's computed tokens go into the tree, its pins drop, and it goes back to the
head of the waiting queue; when it is admitted again it matches them (``Request.resume``).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Protocol, TypeVar

INIT_RATIO = 0.7
MIN_RATIO = 0.05
DECAY = 0.002
PROTECTED = 2  # retractions after which a request goes last among the victims


class Reserve(Enum):
    """How a running request holds blocks (see the module doc)."""

    FULL = "full"
    GROW = "grow"


class Planned(Protocol):
    """What the estimate reads of a request."""

    @property
    def max_new(self) -> int: ...

    @property
    def output(self) -> list[int]: ...

    @property
    def retractions(self) -> int: ...

    def early(self) -> bool:
        """Whether it may end before ``max_new`` (a token policy that can stop it)."""
        ...


class NeedEstimate:
    """The ratio of ``max_new`` a request is expected to write (see the module doc)."""

    def __init__(self) -> None:
        self.ratio = INIT_RATIO

    def step(self) -> None:
        """One step without a retraction."""
        self.ratio = max(MIN_RATIO, self.ratio - DECAY)

    def retracted(self) -> None:
        """A retraction: the estimate was too low."""
        self.ratio = max(self.ratio, INIT_RATIO)

    def tokens(self, r: Planned) -> int:
        """Tokens ``r`` is expected to write from now on."""
        left = r.max_new - len(r.output)
        return left if not r.early() else int(left * self.ratio + 0.999)


R = TypeVar("R", bound=Planned)


def victim(running: Sequence[R]) -> R:
    """The running request to retract next (``running`` in admission order, not empty): the
    newest one retracted fewer than ``PROTECTED`` times, else the newest."""
    for r in reversed(running):
        if r.retractions < PROTECTED:
            return r
    return running[-1]
