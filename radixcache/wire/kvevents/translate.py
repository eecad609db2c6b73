"""Our tree events -> vLLM/SGLang KV events over the *full* blocks of each path.

Used by ``radixcache serve --kv-events vllm``: the hash chain is h(block) = H(h(previous block),
its tokens), so a router that matches vLLM's block hashes can match ours (docs/kv-events.md).
"""

from __future__ import annotations

import hashlib
from typing import assert_never

from radixcache.core import events as ev
from radixcache.wire.kvevents.codec import AllBlocksCleared, BlockRemoved, BlockStored, WireEvent
from radixcache.wire.mirror import Mirror, MirrorNode


# -- our tree events -> full-block hash chains -------------------------------------------------
def chain_hash(parent: int | None, tokens: bytes) -> int:
    """The hash of a full block after ``parent``: 63-bit blake2b of (parent, LE uint32 tokens)."""
    h = hashlib.blake2b(digest_size=8)
    h.update((parent if parent is not None else -1).to_bytes(8, "little", signed=True))
    h.update(tokens)
    return int.from_bytes(h.digest(), "little") & (2**63 - 1)


class KVTranslator:
    """Turns our events into BlockStored/BlockRemoved for the full blocks of every path.

    A full block ``[k*B, (k+1)*B)`` of a path is kept on the node whose span holds its last
    position; splits and merges move these hashes between nodes without any wire event, an
    eviction removes the evicted leaf's. Start it on the tree's state (empty or a snapshot).
    """

    def __init__(self, block_size: int, num_blocks: int) -> None:
        self.B = block_size
        self.mirror = Mirror(block_size, num_blocks)
        self.node_hashes: dict[int, list[int]] = {}

    @property
    def live_blocks(self) -> int:
        """Full blocks currently stored."""
        return sum(len(h) for h in self.node_hashes.values())

    def translate(self, events: list[ev.AnyEvent]) -> list[WireEvent]:
        """The wire events for ``events`` (applied in order to the translator's mirror)."""
        out: list[WireEvent] = []
        for e in events:
            match e:
                case ev.NodeCreated():
                    self.mirror.apply(e)
                    self._stored(self.mirror.nodes[e.node], out)
                case ev.Extend():
                    had = len(self.node_hashes.get(e.node, ()))
                    self.mirror.apply(e)
                    self._stored(self.mirror.nodes[e.node], out, skip=had)
                case ev.Split():
                    self._split(e)
                case ev.Merge():
                    hashes = self.node_hashes.pop(e.parent, []) + self.node_hashes.pop(e.child, [])
                    self.mirror.apply(e)
                    self._keep(e.child, hashes)
                case ev.Evict():
                    self._evict(e, out)
                case ev.Reset() | ev.Snapshot():
                    self._restart(e, out)
                case ev.Digest():
                    pass  # the mirror's digest check is not needed here
                case (ev.Pin() | ev.Access() | ev.BlockAlloc() | ev.BlockFree() | ev.Cow()
                      | ev.Watermark() | ev.RequestStart() | ev.RequestFinish() | ev.Counters()
                      | ev.Fault() | ev.RequestCached() | ev.Queue()
                      | ev.Retract()):
                    self.mirror.apply(e)  # no full block is stored or removed
                case _:
                    assert_never(e)
        return out

    def _evict(self, e: ev.Evict, out: list[WireEvent]) -> None:
        """The evicted leaf's full blocks are removed; after a tail eviction (schema 4) the
        node stays and keeps the hashes of the full blocks it still ends past."""
        hashes = self.node_hashes.pop(e.node, [])
        self.mirror.apply(e)
        left = self.mirror.nodes.get(e.node)
        keep = 0 if left is None else left.end // self.B - left.start // self.B
        self._keep(e.node, hashes[:keep])
        if hashes[keep:]:
            out.append(BlockRemoved(hashes[keep:]))

    def _keep(self, node: int, hashes: list[int]) -> None:
        if hashes:
            self.node_hashes[node] = hashes

    def _split(self, e: ev.Split) -> None:
        node = self.mirror.nodes[e.node]
        cut = (node.start + e.offset) // self.B - node.start // self.B
        hashes = self.node_hashes.pop(e.node, [])
        self.mirror.apply(e)
        self._keep(e.prefix, hashes[:cut])
        self._keep(e.node, hashes[cut:])

    def _restart(self, e: ev.Reset | ev.Snapshot, out: list[WireEvent]) -> None:
        self.mirror.apply(e)
        self.node_hashes.clear()
        out.append(AllBlocksCleared())
        stack = list(self.mirror.root.children.values())
        while stack:
            n = stack.pop()
            self._stored(n, out)
            stack.extend(n.children.values())

    def _stored(self, node: MirrorNode, out: list[WireEvent], skip: int = 0) -> None:
        """Hash the full blocks of ``node``; announce all but the first ``skip`` (those it
        already had before it was extended)."""
        B = self.B
        base = node.start // B * B
        first_end = base + B
        if first_end > node.end:
            return
        first_parent, lead = self._before(node, base)
        parent_hash = first_parent
        seq = lead + node.tokens
        hashes: list[int] = []
        for end in range(first_end, node.end + 1, B):
            parent_hash = chain_hash(parent_hash, seq[(end - B - base) * 4:(end - base) * 4])
            hashes.append(parent_hash)
        self.node_hashes[node.id] = hashes
        if len(hashes) <= skip:
            return
        tokens = memoryview(seq)[skip * B * 4 : len(hashes) * B * 4].cast("I").tolist()
        parent = hashes[skip - 1] if skip else first_parent
        out.append(BlockStored(hashes[skip:], parent, tokens, B))

    def _before(self, node: MirrorNode, base: int) -> tuple[int | None, bytes]:
        """The hash of the last full block ending at or before ``base`` and the ancestors'
        tokens of positions ``[base, node.start)``."""
        parts: list[bytes] = []
        parent_hash: int | None = None
        n = node.parent
        while n is not None and n.parent is not None:
            if n.end > base:
                lo = max(base, n.start) - n.start
                parts.append(n.tokens[lo * 4:])
            hashes = self.node_hashes.get(n.id)
            if hashes and parent_hash is None:
                parent_hash = hashes[-1]
            if n.start <= base and parent_hash is not None:
                break
            n = n.parent
        return parent_hash, b"".join(reversed(parts))
