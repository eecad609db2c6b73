"""Text lines for `radixcache tree`: per node its id, token count, a text preview, its blocks
as a true count and ranges, and its pins.

Blocks are shown as runs of consecutive ids (``17 blocks b87-90,b1700-1712``), never as
first-last: ``b87-1727`` read as 1,641 blocks when the node held 17.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

from radixcache.core.tokens import TokenText as TokenText
from radixcache.wire.mirror import Mirror, MirrorNode

MAX_RANGES = 4
PREVIEW_TOKENS = 6


def block_ranges(blocks: Sequence[int], limit: int = MAX_RANGES) -> str:
    """``N blocks b3-5,b9`` (runs of consecutive ids in order, at most ``limit`` runs, then
    ``,…``); ``no blocks`` for none."""
    if not blocks:
        return "no blocks"
    runs: list[tuple[int, int]] = []
    for b in blocks:
        if runs and b == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((b, b))
    parts = [f"b{lo}" if lo == hi else f"b{lo}-{hi}" for lo, hi in runs[:limit]]
    more = ",…" if len(runs) > limit else ""
    unit = "block" if len(blocks) == 1 else "blocks"
    return f"{len(blocks)} {unit} {','.join(parts)}{more}"


def preview(n: MirrorNode, vocab: TokenText, tokens: int = PREVIEW_TOKENS) -> str:
    """The node's first ``tokens`` tokens as quoted words (``…`` when there are more)."""
    ids = memoryview(n.tokens).cast("I")[:tokens].tolist()
    more = "…" if n.num_tokens > tokens else ""
    return f'"{vocab.text(ids)}{more}"'


def node_label(n: MirrorNode, vocab: TokenText) -> str:
    """One node as a line: ``n12 [40 tok] "you are a …" 3 blocks b4-6 r1``."""
    return f"n{n.id} [{n.num_tokens} tok] {preview(n, vocab)} {block_ranges(n.blocks)} r{n.pins}"


class Line(NamedTuple):
    """A node to print at ``depth`` (1: a child of the root)."""

    depth: int
    node: MirrorNode


def walk(mirror: Mirror, limit: int) -> Iterator[Line]:
    """At most ``limit`` nodes depth-first, children by first token (a stable order)."""
    stack = [Line(1, c) for c in _children(mirror.root)]
    shown = 0
    while stack and shown < limit:
        line = stack.pop()
        yield line
        shown += 1
        stack.extend(Line(line.depth + 1, c) for c in _children(line.node))


def _children(n: MirrorNode) -> list[MirrorNode]:
    return [n.children[k] for k in sorted(n.children, reverse=True)]
