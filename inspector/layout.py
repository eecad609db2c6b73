"""View-model of the tree pane: the flattened list of visible rows, and how a row reads.

The pane is virtual: it draws only the rows on screen from ``TreeLayout.rows``, a list of
``(node, depth)`` in depth-first order over expanded nodes. Building it walks every visible
node (about 1 µs each), so the app rebuilds it at most a few times a second for big trees, in
a Textual worker thread; between rebuilds rows of nodes that went away render as gone. The
walk copies each ``children`` dict with ``list(...)`` (atomic under the GIL): no lock needed.

A row reads like DESIGN.md's sketch::

    ▾ [1,482] "Summarize the..."  b0-92  r1  9m
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from rich.cells import cell_len, set_cell_size

from radixcache.core.tokens import TokenText as TokenText
from radixcache.wire.mirror import Mirror, MirrorNode


class Row(NamedTuple):
    """One visible line of the tree pane."""

    node: MirrorNode
    depth: int


def flatten(mirror: Mirror, collapsed: set[int], *, yield_every: int = 0) -> list[Row]:
    """Depth-first rows of every node whose ancestors are all expanded (root first), children
    in the mirror's order (a split or merge keeps the position of the child it replaces).

    ``yield_every > 0``: give up the GIL every that many rows (a background thread doing
    this must not hold the UI thread off for a whole switch interval at a time)."""
    rows: list[Row] = []
    append = rows.append
    stack = [Row(mirror.root, 0)]
    pop, push = stack.pop, stack.extend
    budget = yield_every
    while stack:
        row = pop()
        append(row)
        budget -= 1
        if budget == 0:
            time.sleep(0)
            budget = yield_every
        node = row.node
        if node.children and node.id not in collapsed:
            d = row.depth + 1
            push([Row(c, d) for c in reversed(list(node.children.values()))])
    return rows


def subtree_end(rows: list[Row], index: int) -> int:
    """Index just past the rows below ``rows[index]`` (its visible descendants)."""
    depth = rows[index].depth
    end = index + 1
    while end < len(rows) and rows[end].depth > depth:
        end += 1
    return end


def collapse(rows: list[Row], index: int) -> None:
    """Hide the visible descendants of ``rows[index]`` in place (O(descendants))."""
    del rows[index + 1 : subtree_end(rows, index)]


def expand(rows: list[Row], index: int, collapsed: set[int]) -> None:
    """Show the descendants of ``rows[index]`` in place, honouring ``collapsed`` below it."""
    row = rows[index]
    sub: list[Row] = []
    stack = [Row(c, row.depth + 1) for c in reversed(list(row.node.children.values()))]
    while stack:
        r = stack.pop()
        sub.append(r)
        if r.node.children and r.node.id not in collapsed:
            stack.extend(Row(c, r.depth + 1) for c in reversed(list(r.node.children.values())))
    rows[index + 1 : index + 1] = sub


def block_ranges(blocks: Sequence[int], limit: int = 24) -> str:
    """Block ids as compressed ranges: ``[3, 4, 5, 9]`` -> ``b3-5,9``; cut with ``…`` past
    ``limit`` characters. Empty list -> ``-``."""
    if not blocks:
        return "-"
    parts: list[str] = []
    lo = prev = blocks[0]
    for b in [*blocks[1:], None]:
        if b is not None and b == prev + 1:
            prev = b
            continue
        parts.append(str(lo) if lo == prev else f"{lo}-{prev}")
        if b is not None:
            lo = prev = b
    text = "b" + ",".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def human_count(n: int) -> str:
    """``1234`` -> ``1,234``; ``12345`` -> ``12.3k``; ``1234567`` -> ``1.2M``."""
    if n < 10_000:
        return f"{n:,}"
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.1f}M"


def human_age(seconds: float | None) -> str:
    """``4s``, ``12m``, ``3h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    return f"{s // 3600}h"


_PREVIEW_TOKENS = 8


def preview(node: MirrorNode, vocab: TokenText | None, width: int = 22) -> str:
    """The first words of a node's tokens (ids when ``vocab`` is None), quoted and cut."""
    if not node.tokens:
        return "root"
    return preview_text(node.tokens[: _PREVIEW_TOKENS * 4], vocab, width)


def preview_text(head: bytes, vocab: TokenText | None, width: int = 22) -> str:
    """The words of the first tokens in ``head`` (uint32 ids), quoted and cut to ``width``
    terminal cells (a CJK character takes two: counting characters overflowed the row)."""
    n = min(len(head) // 4, _PREVIEW_TOKENS)
    ids = [int(t) for t in np.frombuffer(head, dtype="<u4", count=n)]
    text = vocab.text(ids) if vocab is not None else " ".join(map(str, ids))
    if cell_len(text) > width - 2:
        text = set_cell_size(text, max(1, width - 3)).rstrip() + "…"
    return f'"{text}"'


_first = struct.Struct("<I").unpack_from


def first_token(node: MirrorNode) -> int | None:
    """The node's first token id (None for the root)."""
    return _first(node.tokens, 0)[0] if node.tokens else None
