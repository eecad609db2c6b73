"""Reserving KV blocks for running requests: the rule (``full`` or ``grow``), the estimate of
what a request will still write that admission counts on, and the order retraction takes
running requests back in.

``full`` (the rule before growing leases, kept for comparison): a request's lease covers
``prompt + max_new_tokens - 1`` positions from its admission on, whether it writes them or not.

``grow`` (the default): a running request holds the blocks it has written and what its next
step writes (its prompt while prefilling, then one more position a decode); a decode takes a
block when it crosses one (``RadixTree.grow``). Admission counts on an estimate instead of the
worst case (SGLang's ``new_token_ratio``): a request that may end early (it has a token policy:
sampling, stop tokens, an end of sequence) is expected to write ``ratio × its remaining
max_new``; one that cannot (greedy without a policy, or a forced answer) counts in full. The
ratio starts at ``INIT_RATIO``, falls by ``DECAY`` a step while nothing is retracted, down to
``MIN_RATIO``; after a retraction it is, as SGLang's ``retract_decode`` sets it, the share of
their ``max_new`` the running requests have written, with ``RETRACT_STEPS`` decodes more each
(when that is higher). A step admits a request when the blocks its prompt adds, plus its
estimate, fit what the running requests' blocks and estimates leave of the pool (cached,
unpinned blocks count as room: eviction frees them); with nothing running it is admitted
whenever it fits at all, so admission never stalls.

When a step's growth needs more blocks than the free and evictable ones (the pool less what the
leases and the holds pin), running requests are retracted (``victim``) with a ``Hold``: what
they computed goes into the tree and stays pinned while they wait, so their resumption matches
all of it. When a lease still finds no block after eviction, holds are dropped (oldest first),
then requests are retracted without one. The order: the newest admitted first (vLLM's order),
except that a request retracted ``PROTECTED`` times already is taken only when every other one
has been too. Once the running requests are all protected the order is newest first, and the
oldest of them always advances: two requests cannot retract each other forever. A request that
is alone always fits (``submit`` refuses one whose worst case exceeds the pool), and every
other request's blocks can be retracted and evicted for it. A retracted request's computed
tokens go into the tree, its own pin moves to its hold, and it goes back to the head of the
waiting queue; when it is admitted again it matches them (``Request.resume``) and the hold
drops.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import NamedTuple, Protocol, TypeVar

from radixcache.core.nodes import RadixNode

INIT_RATIO = 0.7
MIN_RATIO = 0.05
DECAY = 0.002
PROTECTED = 2  # retractions after which a request goes last among the victims
RETRACT_STEPS = 20  # SGLang's retract_decode_steps: the decodes a retraction's ratio adds


class Hold(NamedTuple):
    """A retracted request's pin on what it kept in the tree: ``node`` (pinned once) and the
    ``blocks`` of its path."""

    node: RadixNode
    blocks: frozenset[int]


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

    def retracted(self, running: Sequence[Planned]) -> None:
        """A retraction: the estimate was too low. As SGLang's ``retract_decode``: the ratio
        the requests still running have written of their ``max_new`` so far, with
        ``RETRACT_STEPS`` more decodes each, at most 1 (never lower than it was)."""
        wrote = sum(len(r.output) for r in running)
        most = sum(r.max_new for r in running)
        if most:
            self.ratio = max(self.ratio, min(1.0, (wrote + RETRACT_STEPS * len(running)) / most))

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
