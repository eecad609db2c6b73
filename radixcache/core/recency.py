"""Recency inside a node: when its tokens were last used, as a staircase of access clocks.

A node's ``clock`` is the last access of its first token. A match or an insert that ends
inside a node uses only the tokens before its end, so the rest keeps its older time: the
node's ``older`` steps say where the time drops and to what, deepest last::

    node [100, 180)  clock 42   older ((120, 17), (160, 9))
         tokens 100..119 used at 42, 120..159 at 17, 160..179 at 9

Positions increase, clocks strictly decrease and stay below ``clock``; a child's ``clock`` is
never above its parent's deepest time. Eviction takes the least recent tokens, which are the
deepest ones of some leaf (``tail_clock``): with per-block tail eviction this is exactly the
LRU over blocks that the what-if curve models. At block size B > 1 a block is as recent as its
most recent token, so steps sit on block boundaries (rounded up: a block used in part was used).

These are pure functions over ``(clock, older)``; the tree and the mirror apply the same ones,
so their digests stay equal.
"""

from __future__ import annotations

from bisect import bisect_left

Steps = tuple[tuple[int, int], ...]  # (first position, access clock) of each older stretch


def tail_clock(clock: int, older: Steps) -> int:
    """The access time of the node's deepest tokens (what the LRU orders leaves by)."""
    return older[-1][1] if older else clock


def clock_at(clock: int, older: Steps, pos: int) -> int:
    """The access time of the token at ``pos`` (inside the node)."""
    for p, c in reversed(older):
        if p <= pos:
            return c
    return clock


def stamp(clock: int, older: Steps, end: int, upto: int, now: int, block: int) -> Steps:
    """The steps after the tokens before ``upto`` were used at ``now`` (the node's new clock);
    ``end`` is the node's end. ``upto`` rounds up to a block boundary."""
    upto = -(-upto // block) * block
    if upto >= end:
        return ()
    if not older:  # the common case, without the generator
        return ((upto, clock),)
    return ((upto, clock_at(clock, older, upto)), *((p, c) for p, c in older if p > upto))


def split(clock: int, older: Steps, pos: int) -> tuple[Steps, int, Steps]:
    """Cut at ``pos``: the prefix's steps, the suffix's clock and the suffix's steps."""
    if not older:
        return (), clock, ()
    return (tuple((p, c) for p, c in older if p < pos), clock_at(clock, older, pos),
            tuple((p, c) for p, c in older if p > pos))


def join(parent_clock: int, older: Steps, child_start: int, child_clock: int,
         child_older: Steps, block: int, end: int) -> Steps:
    """The steps of a parent (``parent_clock``, ``older``) merged with its only child, which
    starts at ``child_start`` and ends at ``end``. The block the two share (when the child
    starts inside one) is as recent as the parent's part of it."""
    at = -(-child_start // block) * block
    if not older and not child_older:  # the common case: one step at most
        return ((at, child_clock),) if at < end and child_clock < parent_clock else ()
    steps = list(older)
    for p, c in ((at, clock_at(child_clock, child_older, at)),
                 *((p, c) for p, c in child_older if p > at)):
        if p >= end:
            break
        if c < (steps[-1][1] if steps else parent_clock):
            steps.append((p, c))
    return tuple(steps)


def trim(older: Steps, end: int) -> Steps:
    """The steps left when the node ends at ``end`` (its tail was evicted)."""
    return older[: bisect_left(older, (end,))]  # (end,) sorts before every (end, c)


def well_formed(start: int, end: int, clock: int, older: Steps, block: int) -> bool:
    """Positions increase inside ``(start, end)`` on block boundaries, clocks strictly
    decrease below ``clock``."""
    last_p, last_c = start, clock
    for p, c in older:
        if not (last_p < p < end and p % block == 0 and c < last_c):
            return False
        last_p, last_c = p, c
    return True
