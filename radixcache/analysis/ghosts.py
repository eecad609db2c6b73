"""The ghost trie of ``radixcache.analysis.misses``: every token sequence a tree held, each
span with its in/out history.

A span's history alternates in, out, in, ... and is stamped (event counter, batch seq) per
change, so ``state_at(v)`` answers "was it in the tree just before event v, and since which
batch" with one bisection. Marking splits ghost nodes exactly at the changed span's ends, so a
node's history is the same for all of its tokens.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from radixcache.core.tokens import common_units

W = 4  # bytes per token
MAX_TOKENS = 16_000_000  # ghost tokens kept (64 MB of ids); past it, new spans are not kept


@dataclass(slots=True, eq=False)
class Ghost:
    key: bytes
    history: list[int]  # version, seq, version, seq ...: in, out, in, ... (in first)
    children: dict[bytes, Ghost] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        """In the tree now (an odd number of changes: in, out, ..., in)."""
        return len(self.history) % 4 == 2

    def state_at(self, version: int) -> tuple[bool, int] | None:
        """(in the tree, seq of that change) just before event ``version``; None before
        the span first appeared."""
        h = self.history
        i = bisect_left(h[0::2], version) - 1
        return None if i < 0 else (i % 2 == 0, h[2 * i + 1])


class Ghosts:
    """The ghost trie: every sequence the tree held, with each span's in/out history."""

    def __init__(self, max_tokens: int = MAX_TOKENS) -> None:
        self.root = Ghost(b"", [])
        self.max_tokens = max_tokens
        self.tokens = 0
        self.full = False  # MAX_TOKENS reached: spans first seen after that are not kept

    @staticmethod
    def _split(node: Ghost, k: int) -> None:
        rest = Ghost(node.key[k:], list(node.history), node.children)
        node.key, node.children = node.key[:k], {rest.key[:W]: rest}

    def _walk(self, seq: bytes, lo: int) -> tuple[list[Ghost], Ghost, int]:
        """The nodes covering ``seq[lo:]`` (byte offsets) as far as the trie holds it, split
        so that each lies inside it; and the node and byte offset where the trie's path along
        ``seq`` stops (on a node boundary: ``insert`` hangs the rest there)."""
        node, pos, n, out = self.root, 0, len(seq), []
        while pos < n:
            child = node.children.get(seq[pos : pos + W])
            if child is None:
                break
            key = child.key  # (``_common`` inline: this loop is most of following a stream)
            k = len(key) if seq.startswith(key, pos) else common_units(seq, pos, key) * W
            if pos < lo < pos + k:
                k = lo - pos
            if k < len(child.key):
                self._split(child, k)
            if pos + k > lo:
                out.append(child)
            node, pos = child, pos + k
        return out, node, pos

    def insert(self, seq: bytes, lo: int, version: int, seq_no: int) -> None:
        """The tree now holds ``seq``; ``seq[lo:]`` (bytes) is what changed."""
        known, node, pos = self._walk(seq, lo)
        for g in known:
            if not g.held:  # out: back in
                g.history += (version, seq_no)
        if pos == len(seq):
            return
        if self.tokens >= self.max_tokens:
            self.full = True
            return
        node.children[seq[pos : pos + W]] = Ghost(seq[pos:], [version, seq_no])
        self.tokens += (len(seq) - pos) // W

    def evict(self, seq: bytes, lo: int, version: int, seq_no: int) -> None:
        """The tree no longer holds ``seq[lo:]`` (bytes)."""
        for g in self._walk(seq, lo)[0]:
            if g.held:
                g.history += (version, seq_no)

    def evict_all(self, version: int, seq_no: int) -> None:
        """Everything held is out (an engine reset)."""
        stack = list(self.root.children.values())
        while stack:
            g = stack.pop()
            if g.held:
                g.history += (version, seq_no)
            stack.extend(g.children.values())

    def along(
        self, seq: bytes
    ) -> tuple[list[tuple[int, int, Ghost, Ghost]], list[Ghost]]:
        """The spans of ``seq`` the trie holds, as (start, end, node, its parent) in tokens,
        and the nodes that go on with other tokens where it stops (none when ``seq`` ended
        there)."""
        node, pos, n = self.root, 0, len(seq)
        out: list[tuple[int, int, Ghost, Ghost]] = []
        while pos < n:
            child = node.children.get(seq[pos : pos + W])
            if child is None:
                return out, list(node.children.values())
            k = _common(seq, pos, child.key)
            out.append((pos // W, (pos + k) // W, child, node))
            if k < len(child.key):
                return out, [child] if pos + k < n else []
            node, pos = child, pos + k
        return out, []


def _common(seq: bytes, pos: int, key: bytes) -> int:
    """Bytes of ``key`` that ``seq[pos:]`` starts with (whole tokens): one C compare when all
    of it does (the common case along a path), else the galloping search."""
    if seq.startswith(key, pos):
        return len(key)
    return common_units(seq, pos, key) * W
