"""Scheduling policies: the order in which waiting requests are admitted.

``fcfs``: first come, first served (arrival order).

``lpm``: longest cached prefix first. Each waiting request is matched against the tree
without touching it (``RadixTree.peek``); the ones that reuse most go first, ties in arrival
order (SGLang's ``lpm``).

``dfs-weight``: depth-first over the tree the waiting requests form. Each request sits at
the node where its cached match ends; a node's weight is the number of requests in its
subtree. The walk visits heavier children first and yields a node's own requests after its
subtree's, so requests that share a cached path run together, deepest first (SGLang's
``dfs-weight``; the order the RadixAttention paper shows maximises reuse for a batch)::

    root (5)                      order: r1 r3  r4  r2 r5
    ├── a (3)                            └ b ┘  a   └ c ┘
    │   ├── b (2: r1, r3)
    │   └── (r4 at a)
    └── c (2: r2, r5)

The cache-aware policies also hold a request whose prefix a running request is computing
now (in-batch prefix sharing, see ``serving.scheduler``). Neither ordering changes what a
request computes: only when.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from radixcache.core.nodes import RadixNode
from radixcache.wire.commands import SchedulePolicy

__all__ = ["Candidate", "SchedulePolicy", "dfs_weight", "ordered"]


class Candidate(NamedTuple):
    """A waiting request's place in a scheduling step: its position in arrival order, the
    node where its cached match ends and the cached length (None and 0 under ``fcfs``)."""

    position: int
    node: RadixNode | None
    cached: int


def ordered(policy: SchedulePolicy, cands: Sequence[Candidate]) -> list[Candidate]:
    """``cands`` (in arrival order) in ``policy``'s admission order."""
    if policy is SchedulePolicy.LPM:
        return sorted(cands, key=lambda c: -c.cached)  # stable: ties keep arrival order
    if policy is SchedulePolicy.DFS_WEIGHT:
        return dfs_weight(cands)
    return list(cands)


def dfs_weight(cands: Sequence[Candidate]) -> list[Candidate]:
    """Depth-first over the nodes the candidates' matches end at (see the module doc).
    O(sum of their depths): only the paths of those nodes are visited, not the whole tree."""
    at: dict[int, list[Candidate]] = {}
    weight: dict[int, int] = {}
    kids: dict[int, list[RadixNode]] = {}
    roots: list[RadixNode] = []
    for c in cands:
        if c.node is None:
            continue
        at.setdefault(c.node.id, []).append(c)
        n: RadixNode | None = c.node
        while n is not None:
            new = n.id not in weight
            weight[n.id] = weight.get(n.id, 0) + 1
            if new:
                (kids.setdefault(n.parent.id, []) if n.parent else roots).append(n)
            n = n.parent
    out: list[Candidate] = [c for c in cands if c.node is None]
    stack: list[tuple[RadixNode, bool]] = [(r, False) for r in roots]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            out.extend(at.get(node.id, ()))
            continue
        stack.append((node, True))
        children = sorted(kids.get(node.id, ()), key=lambda k: -weight[k.id])
        stack.extend((k, False) for k in reversed(children))  # heaviest popped first
    return out
