"""A block view drawn as a radix tree: single-child block chains compressed into one node.

A conversation is a long chain of full blocks (at SGLang's page size 1, one block per token),
so one row per block is unreadable after a few dozen rows. A radix node here is a maximal chain
``b0 -> b1 -> ... -> bk`` where each block has exactly one alive child and the same holders
as the next (a change of tier or rank starts a new node, so a row never hides where a copy
ends). ``tree --kv-events`` and the inspector's KV-event screen both draw these rows.
"""

from __future__ import annotations

from typing import NamedTuple

from radixcache.core.tokens import TokenText
from radixcache.wire.endpoints import gc_paused
from radixcache.wire.kvevents.codec import BlockHash
from radixcache.wire.kvevents.view import Block, BlockView

HASH_WIDTH = 16
_U64 = 2**64 - 1


def hash_label(h: BlockHash) -> str:
    """One rendering for every hash: unsigned hex, ``HASH_WIDTH`` digits (an int64 is shown as
    its uint64 two's complement, a bytes hash by its first 8 bytes)."""
    text = h.hex() if isinstance(h, bytes) else f"{h & _U64:016x}"
    return text[:HASH_WIDTH].ljust(HASH_WIDTH, ".")


class RadixRow(NamedTuple):
    """One compressed chain: its blocks in path order, depth, child nodes, blocks below."""

    blocks: list[Block]
    depth: int
    children: int
    subtree: int  # blocks in this node and every node under it

    @property
    def tokens(self) -> int:
        """Tokens held by the chain."""
        return sum(len(b.tokens) for b in self.blocks)

    def preview(self, n: int = 8) -> list[int]:
        """The first ``n`` token ids of the chain."""
        out: list[int] = []
        for b in self.blocks:
            out.extend(b.tokens[:n - len(out)])
            if len(out) >= n:
                break
        return out

    def holders(self) -> str:
        """``GPU+CPU_PINNED`` and, when several ranks hold it, ``r0,1``."""
        first = self.blocks[0]
        ranks = first.ranks
        text = "+".join(first.media)
        return text if ranks == [0] else f"{text} r{','.join(map(str, ranks))}"


def _chain(view: BlockView, start: Block, seen: set[BlockHash]) -> tuple[list[Block], list[Block]]:
    """The maximal chain from ``start`` and the children of its last block."""
    chain = [start]
    seen.add(start.hash)
    kids = view.children(start.hash)
    while len(kids) == 1 and kids[0].hash not in seen and kids[0].holders == chain[-1].holders:
        chain.append(kids[0])
        seen.add(kids[0].hash)
        kids = view.children(kids[0].hash)
    return chain, [k for k in kids if k.hash not in seen]


def radix_rows(view: BlockView) -> list[RadixRow]:
    """Depth-first radix nodes from the roots. Each block appears at most once, so a loop in
    what a peer sent cannot make this run forever; blocks on a loop are not reachable from a
    root and do not appear (``len(view.blocks)`` still counts them)."""
    with gc_paused():  # 15k page-size-1 blocks: 238 ms with cyclic GC, 115 ms without
        return _rows(view)


def _rows(view: BlockView) -> list[RadixRow]:
    chains: list[list[Block]] = []
    meta: list[tuple[int, int, int]] = []  # depth, children, index of the parent row
    seen: set[BlockHash] = set()
    stack: list[tuple[int, int, Block]] = [(0, -1, b) for b in reversed(view.roots())]
    while stack:
        depth, parent, block = stack.pop()
        if block.hash in seen:
            continue
        chain, kids = _chain(view, block, seen)
        meta.append((depth, len(kids), parent))
        chains.append(chain)
        stack.extend((depth + 1, len(chains) - 1, k) for k in reversed(kids))
    subtree = [len(c) for c in chains]
    for i in range(len(chains) - 1, 0, -1):  # children follow their parent in pre-order
        if meta[i][2] >= 0:
            subtree[meta[i][2]] += subtree[i]
    return [RadixRow(c, m[0], m[1], s) for c, m, s in zip(chains, meta, subtree, strict=True)]


def top_prefixes(rows: list[RadixRow], k: int = 5) -> list[RadixRow]:
    """The ``k`` radix nodes with the most blocks held at or under them."""
    return sorted(rows, key=lambda r: r.subtree, reverse=True)[:k]


def row_label(row: RadixRow, text: TokenText | None = None) -> str:
    """``c9b22ad84b2b0000 ×12 [192 tok] "preview" GPU`` for one node."""
    head = hash_label(row.blocks[0].hash)
    count = f" ×{len(row.blocks)}" if len(row.blocks) > 1 else ""
    words = text.text(row.preview()) if text is not None else str(row.preview())
    kids = f"  {row.children} children" if row.children > 1 else ""
    return f"{head}{count} [{row.tokens} tok] {words[:40]}  {row.holders()}{kids}"


def tree_lines(view: BlockView, limit: int, text: TokenText | None = None) -> list[str]:
    """The radix tree as indented lines, at most ``limit`` nodes, then one line saying how
    many were left out (if any)."""
    rows = radix_rows(view)
    lines = [("  " * r.depth) + ("▸ " if r.children else "· ") + row_label(r, text)
             for r in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"… {len(rows) - limit:,} more nodes (--limit)")
    return lines
