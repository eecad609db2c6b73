"""Many engines' trees as one: the merged prefix tree of a fleet, built from their mirrors.

Each replica's mirror is walked node by node and its tokens inserted into one radix tree
whose nodes record which replicas hold them. Where two replicas hold the same prefix, the
merged node is marked with both: its tokens are held twice, memory the fleet spends on a
duplicate (what a router that scatters a conversation costs). Mooncake's paper plots this
replication count for its hot blocks.

Merged nodes split wherever any replica's nodes end or diverge, so every node is held by
whole replicas: a node's holders are a superset of each child's.

``Fleet`` follows N engines' streams (one ``Subscriber`` each) and ``settle`` waits until
every mirror equals its engine (digest and seq from a ``Stats`` command).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from radixcache.wire import commands as cmd
from radixcache.wire.client import send_command
from radixcache.wire.endpoints import Endpoints
from radixcache.wire.kvevents import Block, BlockView
from radixcache.wire.mirror import Mirror, MirrorNode
from radixcache.wire.security import ClientCurve
from radixcache.wire.subscriber import Subscriber

Tokens = npt.NDArray[np.uint32]
# an idle engine sends a watermark sample every 0.25 s: silence this long means it is down
STALE_S = 1.5


@dataclass(slots=True, eq=False)
class FleetNode:
    """A span of tokens and the replicas (ranks) that hold all of it."""

    tokens: Tokens
    parent: FleetNode | None
    holders: set[int] = field(default_factory=set)
    children: dict[int, FleetNode] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        """Tokens in the span."""
        return len(self.tokens)

    @property
    def duplicated(self) -> int:
        """Tokens of this node held more than once across the fleet."""
        return len(self.tokens) * max(0, len(self.holders) - 1)


class FleetStats(NamedTuple):
    """Token counts over the merged tree."""

    nodes: int
    unique_tokens: int  # distinct cached prefixes' tokens
    held_tokens: int  # summed over replicas
    duplicated_tokens: int  # held_tokens - unique_tokens
    replication: dict[int, int]  # replicas holding -> tokens


def _common(a: Tokens, b: Tokens) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class FleetTree:
    """The merged prefix tree (see the module doc)."""

    def __init__(self) -> None:
        self.root = FleetNode(np.zeros(0, np.uint32), None)

    def add_mirror(self, rank: int, mirror: Mirror) -> None:
        """Insert every node of ``mirror`` as held by ``rank``."""
        stack: list[tuple[MirrorNode, FleetNode]] = [
            (c, self.root) for c in mirror.root.children.values()]
        while stack:
            m, at = stack.pop()
            end = self._insert(at, np.frombuffer(m.tokens, dtype="<u4"), rank)
            stack.extend((c, end) for c in m.children.values())

    def add_blocks(self, rank: int, blocks: BlockView) -> None:
        """Insert every block chain of a foreign engine's KV events as held by ``rank``.
        A block whose parent was never seen (stored before this view joined) starts at the
        root: its depth is unknown, its tokens are not."""
        stack: list[tuple[Block, FleetNode]] = [(b, self.root) for b in blocks.roots()]
        while stack:
            b, at = stack.pop()
            end = self._insert(at, np.asarray(b.tokens, dtype=np.uint32), rank)
            stack.extend((c, end) for c in blocks.children(b.hash))

    def _insert(self, node: FleetNode, tokens: Tokens, rank: int) -> FleetNode:
        """Insert ``tokens`` below the end of ``node``; returns the node ending where they end."""
        i = 0
        while i < len(tokens):
            child = node.children.get(int(tokens[i]))
            if child is None:
                child = FleetNode(tokens[i:].copy(), node, {rank})
                node.children[int(tokens[i])] = child
                return child
            n = _common(child.tokens, tokens[i:])
            if n < len(child.tokens):
                _split(child, n)
            child.holders.add(rank)
            node, i = child, i + n
        return node

    def walk(self) -> Iterator[FleetNode]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def stats(self) -> FleetStats:
        """Token counts (see ``FleetStats``)."""
        nodes = unique = held = 0
        replication: dict[int, int] = {}
        for n in self.walk():
            nodes += 1
            unique += n.num_tokens
            held += n.num_tokens * len(n.holders)
            k = len(n.holders)
            replication[k] = replication.get(k, 0) + n.num_tokens
        return FleetStats(nodes, unique, held, held - unique, dict(sorted(replication.items())))


def _split(node: FleetNode, at: int) -> None:
    """Keep ``tokens[:at]`` in ``node``; the rest becomes its only child (same holders)."""
    tail = FleetNode(node.tokens[at:], node, set(node.holders), node.children)
    for c in tail.children.values():
        c.parent = tail
    node.tokens = node.tokens[:at]
    node.children = {int(tail.tokens[0]): tail}


def merge(mirrors: Sequence[Mirror | None]) -> FleetTree:
    """The merged tree of ``mirrors`` (rank = index; None: a replica down, holding nothing)."""
    tree = FleetTree()
    for rank, m in enumerate(mirrors):
        if m is not None:
            tree.add_mirror(rank, m)
    return tree


class Fleet:
    """One ``Subscriber`` per engine. ``start()``, then ``close()``."""

    def __init__(self, endpoints: Sequence[Endpoints], curve: ClientCurve | None = None) -> None:
        self.endpoints = list(endpoints)
        self.curve = curve  # CURVE client keys for every socket (None: $RADIXCACHE_CURVE_KEYS)
        self.last_batch = [0.0] * len(self.endpoints)  # time.monotonic() of each one's last
        self.subscribers = [Subscriber(e, on_batch=partial(self._seen, rank), curve=curve)
                            for rank, e in enumerate(self.endpoints)]

    def _seen(self, rank: int, _batch: object) -> None:
        self.last_batch[rank] = time.monotonic()

    def up(self, rank: int, stale_s: float = STALE_S) -> bool:
        """True when replica ``rank`` sent a batch (heartbeats included) within ``stale_s``."""
        return time.monotonic() - self.last_batch[rank] < stale_s

    def start(self) -> Fleet:
        """Start every subscriber (each connects and syncs on its own thread)."""
        for s in self.subscribers:
            s.start()
        return self

    def wait_synced(self, timeout: float = 10.0) -> None:
        """``TimeoutError`` unless every subscriber applied a snapshot within ``timeout``."""
        for e, s in zip(self.endpoints, self.subscribers, strict=True):
            if not s.wait_synced(timeout):
                raise TimeoutError(f"no snapshot from {e.events} within {timeout:g} s")

    def close(self) -> None:
        """Stop every subscriber."""
        for s in self.subscribers:
            s.stop()

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until each mirror has applied its engine's last batch and equals its tree
        (the engines must be idle). ``TimeoutError`` (which engine) when one does not."""
        deadline = time.monotonic() + timeout
        for e, s in zip(self.endpoints, self.subscribers, strict=True):
            try:
                stream = cmd.stats_reply(send_command(e.commands, cmd.Stats(), timeout_s=timeout,
                                                      curve=self.curve)).stream
            except cmd.CommandError as exc:
                raise TimeoutError(f"{e.commands}: {exc}") from None
            if stream is None:
                raise TimeoutError(f"{e.commands}: its stats reply has no stream figures")
            seq, digest = stream.seq, stream.digest
            while True:
                with s.lock:
                    if s.seq >= seq and s.mirror.digest() == digest:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"mirror of {e.events} not equal to its engine")
                time.sleep(0.02)

    def merged(self) -> FleetTree:
        """The merged tree of the mirrors now (a replica that is down holds nothing)."""
        tree = FleetTree()
        for rank, s in enumerate(self.subscribers):
            if self.up(rank):
                with s.lock:
                    tree.add_mirror(rank, s.mirror)
        return tree
