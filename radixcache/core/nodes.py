"""The tree's value types: nodes, match/lease/insert/evict results, counters, and the errors
the tree raises (each promises the tree is unchanged)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import NamedTuple, NewType

from radixcache.core.recency import Steps

NodeId = NewType("NodeId", int)

ROOT_ID = NodeId(0)


class TreeError(Exception):
    """Base class of the errors the tree raises on bad input; the tree is unchanged after one."""


class PromptTooLarge(TreeError):
    """The sequence needs more blocks than the whole pool holds: it can never be served."""


class NotPinned(TreeError):
    """``unpin`` (or ``allocate``) of a node that holds no pin."""


class UnknownNode(TreeError, KeyError):
    """A node id (or node object) that is not in this tree."""


@dataclass(slots=True, eq=False)
class RadixNode:
    """A span of tokens ``[start, end)`` (``end = start + tk.count(tokens)``) and the blocks
    covering it."""

    id: NodeId
    parent: RadixNode | None
    start: int
    end: int  # kept, not computed: the match loop reads it once a level
    tokens: bytes  # uint32 little-endian
    blocks: array[int]  # int32: 4 bytes a block, not a 36-byte int object
    children: dict[int, RadixNode] = field(default_factory=dict)
    pins: int = 0  # pins taken on this very node (a pin holds the whole path: see ``pin``)
    clock: int = 0  # last access of its first token
    older: Steps = ()  # where deeper tokens were last used earlier (``core.recency``)
    alive: bool = True
    queued: bool = False  # has an entry in the LRU heap (one at most)

    @property
    def num_tokens(self) -> int:
        """Tokens in this node's span."""
        return self.end - self.start

    @property
    def tail_clock(self) -> int:
        """Last access of its deepest tokens: what the LRU orders leaves by."""
        return self.older[-1][1] if self.older else self.clock

    @property
    def evictable(self) -> bool:
        """An unpinned leaf other than the root: what eviction may take."""
        return not self.children and self.pins == 0 and self.parent is not None

    @property
    def path_pins(self) -> int:
        """Pins that hold this node: its own and every descendant's (O(subtree))."""
        total, stack = 0, [self]
        while stack:
            n = stack.pop()
            total += n.pins
            stack.extend(n.children.values())
        return total


class MatchResult(NamedTuple):
    """Result of ``match``: ``length`` tokens matched; ``node`` is the deepest node touched
    (the match may end inside it); ``block_table`` covers positions ``[0, length)``."""

    length: int
    node: RadixNode
    block_table: array[int]


@dataclass(slots=True, eq=False)
class Lease:
    """Blocks reserved for one running request, from ``allocate`` until ``insert``/``release``.

    ``table`` covers positions ``[0, total)``. Entries from ``private_from`` on are the
    request's own blocks (refcount 1, owned by this lease). When ``inplace`` is a block
    id, the request writes in place after its matched prefix in that tree-owned block,
    whose claim was ``prev_claim`` before the reservation.
    """

    node: RadixNode
    matched: int
    total: int
    table: array[int]
    private_from: int
    inplace: int | None = None  # the tree-owned block continued in place, if any
    prev_claim: int = 0
    done: bool = False


class InsertResult(NamedTuple):
    """``node`` holds the new tokens: a new leaf, or the request's own leaf extended in place
    (None when the sequence was already cached); ``new_tokens`` were added to the tree;
    ``freed`` private blocks of the lease were returned as duplicates."""

    node: RadixNode | None
    new_tokens: int
    freed: int


class EvictResult(NamedTuple):
    """What one eviction pass freed: ``nodes`` removed whole (others may have given up only
    their tail), ``tokens`` no longer cached, ``blocks`` back on the free list;
    ``exhausted``: it stopped short of what was asked, nothing unpinned being left."""

    nodes: int
    tokens: int
    blocks: int
    exhausted: bool = False


@dataclass(slots=True)
class TreeStats:
    """Running counters of structural operations."""

    splits: int = 0
    merges: int = 0
    extends: int = 0
    cow_copies: int = 0
    slots_copied: int = 0
    evicted_nodes: int = 0
    evicted_tokens: int = 0
    inserted_tokens: int = 0
    evict_calls: int = 0
    last_evict_ns: int = 0
