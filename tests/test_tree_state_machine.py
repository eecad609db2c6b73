"""Property test: the radix tree against a naive reference model, driven by hypothesis.

The model is the list of sequences that finished requests inserted. After every step:
``tree.check()``; a Mirror fed with the events (msgpack round trip) has the tree's digest
and refcounts; every node's path is a prefix of an inserted sequence and its K/V read
through the path's block table are its tokens; every running request reads its own tokens
back through its lease; each node's path pin count equals the holders below it.
"""

from __future__ import annotations

from dataclasses import dataclass

import hypothesis.strategies as st
from conftest import STATE_MACHINE_RUNS, read_kv, toks, write_kv
from hypothesis import settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from radixcache.core import events as ev
from radixcache.core.pool import KVPool, KVShape, PoolExhausted
from radixcache.core.tree import Lease, MatchResult, RadixNode, RadixTree
from radixcache.wire.mirror import Mirror, next_victims

VOCAB = 64
TOKEN = st.one_of(st.integers(0, 3), st.integers(0, VOCAB - 1))


@dataclass
class Running:
    full: list[int]
    match: MatchResult
    lease: Lease


def lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def path_of(node: RadixNode, B: int) -> tuple[list[int], list[int]]:
    """(tokens, block table) of the path root..node: each logical block from the deepest node."""
    chain = []
    n: RadixNode | None = node
    while n is not None and n.parent is not None:
        chain.append(n)
        n = n.parent
    tokens: list[int] = []
    table: list[int] = []
    for c in reversed(chain):
        if c.start % B:
            table[-1:] = c.blocks
        else:
            table.extend(c.blocks)
        tokens.extend(toks_of(c.tokens))
    return tokens, table


def toks_of(data: bytes) -> list[int]:
    return [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]


class TreeMachine(RuleBasedStateMachine):
    BLOCK = 16
    NUM_BLOCKS = 24
    MAX_PROMPT = 72
    MIN_GEN = 0
    MAX_GEN = 24

    def __init__(self) -> None:
        super().__init__()
        self.pool = KVPool(self.NUM_BLOCKS, self.BLOCK, KVShape(1, 1, 1), device="cpu")
        self.tree = RadixTree(self.pool, vocab_limit=VOCAB)
        self.mirror = Mirror(self.BLOCK, self.NUM_BLOCKS)
        self.mirror.load_snapshot(self.tree.snapshot())
        self.tree.take_events()
        self.inserted: list[list[int]] = []
        self.running: list[Running] = []
        self.pinned: list[MatchResult] = []
        self.lossless = True  # nothing evicted, reset or dropped since the model was emptied
        self.seq_no = 0

    # -- drawing -------------------------------------------------------------------------------
    def draw_seq(self, data: st.DataObject, limit: int) -> list[int]:
        """A new sequence, a fork of an inserted one at a random offset, or its continuation."""
        how = data.draw(st.sampled_from(["fork", "extend", "new"]), label="how")
        if self.inserted and how != "new":
            base = data.draw(st.sampled_from(self.inserted), label="base")
            cut = min(len(base), limit)
            if how == "fork":
                cut = data.draw(st.integers(0, cut), label="cut")
            tail = data.draw(st.lists(TOKEN, min_size=0 if cut else 1, max_size=limit - cut))
            return base[:cut] + tail
        return data.draw(st.lists(TOKEN, min_size=1, max_size=limit), label="new")

    def best_lcp(self, seq: list[int]) -> int:
        return max((lcp(seq, s) for s in self.inserted), default=0)

    def check_match(self, seq: list[int], m: MatchResult) -> None:
        best = self.best_lcp(seq)
        assert m.length <= best
        if self.lossless:
            assert m.length == best
        assert len(m.block_table) == (m.length + self.BLOCK - 1) // self.BLOCK
        assert read_kv(self.pool, m.block_table, m.length)[0] == seq[: m.length]

    # -- rules ---------------------------------------------------------------------------------
    @initialize(data=st.data())
    def warm(self, data: st.DataObject) -> None:
        for _ in range(data.draw(st.integers(0, 3), label="warm")):
            self.serve(data)

    @rule(data=st.data())
    def serve(self, data: st.DataObject) -> None:
        """A whole request: start, then finish at once."""
        if self.begin(data):
            self.finish(data, len(self.running) - 1)

    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        self.begin(data)

    def begin(self, data: st.DataObject) -> bool:
        """match_and_pin + allocate + write the uncached K/V; False when the pool is full."""
        prompt = self.draw_seq(data, self.MAX_PROMPT)
        gen = data.draw(st.lists(TOKEN, min_size=self.MIN_GEN, max_size=self.MAX_GEN), label="gen")
        full = prompt + gen
        m = self.tree.match_and_pin(toks(prompt))
        self.check_match(prompt, m)
        try:
            lease = self.tree.allocate(m, len(full))
        except PoolExhausted:
            self.tree.unpin(m.node)
            return False
        finally:
            self.lossless = self.lossless and self.tree.stats.evicted_nodes == 0
        assert lease.table[: len(m.block_table)][: m.length // self.BLOCK] == (
            m.block_table[: m.length // self.BLOCK]
        )
        assert read_kv(self.pool, lease.table, m.length)[0] == prompt[: m.length]
        write_kv(self.pool, lease.table, m.length, full)
        self.running.append(Running(full, m, lease))
        return True

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish_one(self, data: st.DataObject) -> None:
        self.finish(data, data.draw(st.integers(0, len(self.running) - 1), label="which"))

    def finish(self, data: st.DataObject, i: int) -> None:
        r = self.running.pop(i)
        n = len(r.full)
        lo = max(r.match.length, 1)  # the held tokens always include the matched prefix
        k = data.draw(st.one_of(st.just(n), st.integers(lo, n)), label="held")
        res = self.tree.insert(toks(r.full[:k]), r.lease)
        self.tree.unpin(r.match.node)
        assert r.lease.done
        cached = self.tree.match(toks(r.full[:k])).length
        if cached == k:
            self.inserted.append(r.full[:k])
        else:  # the tree could not take it (no block for a boundary copy): say so in the result
            assert res.node is None and res.new_tokens == 0
            self.lossless = False

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.running) - 1), label="which")
        r = self.running.pop(i)
        free = self.tree.alloc.free_count
        self.tree.release(r.lease)
        assert r.lease.done
        assert self.tree.alloc.free_count == free + len(r.lease.table) - r.lease.private_from
        self.tree.unpin(r.match.node)

    @rule(data=st.data())
    def match(self, data: st.DataObject) -> None:
        seq = self.draw_seq(data, self.MAX_PROMPT + self.MAX_GEN)
        self.check_match(seq, self.tree.match(toks(seq)))

    @precondition(lambda self: len(self.pinned) < 4)
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        seq = self.draw_seq(data, self.MAX_PROMPT)
        m = self.tree.match_and_pin(toks(seq))
        self.check_match(seq, m)
        self.pinned.append(m)

    @precondition(lambda self: self.pinned)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.pinned) - 1), label="which")
        self.tree.unpin(self.pinned.pop(i).node)

    @rule(n_tokens=st.integers(0, 160))
    def evict(self, n_tokens: int) -> None:
        free = self.tree.alloc.free_count
        lru = [n.id for n in self.tree.lru_order(1)]
        self.mirror_in_sync()
        res = self.tree.evict(n_tokens)
        events = self.tree.take_events()
        self.mirror.apply_batch(ev.Batch(0, 1, 0.0, "test", events))
        evicts = [e for e in events if isinstance(e, ev.Evict)]
        assert [e.node for e in evicts][:1] == (lru if n_tokens else [])
        gone = {e.node for e in evicts} - self.mirror.nodes.keys()  # leaves that went whole
        assert (len(gone), sum(e.tokens for e in evicts)) == (res.nodes, res.tokens)
        want = (n_tokens + self.BLOCK - 1) // self.BLOCK
        assert res.blocks >= want or self.tree.lru_order(1) == []
        # tail eviction frees as few as needed: beyond ``want`` only the boundary blocks that
        # merges of the cut leaves' parents dropped
        merges = sum(isinstance(e, ev.Merge) for e in events)
        assert res.blocks <= want + merges
        assert self.tree.alloc.free_count - free == res.blocks
        for e in evicts:  # a leaf that stays ends on a block boundary, its freed blocks gone
            if e.node in self.mirror.nodes:
                left = self.tree.node(e.node)
                assert left.end % self.BLOCK == 0 and not set(e.freed) & set(left.blocks)
        if res.tokens:
            self.lossless = False

    @rule(high=st.sampled_from([0.5, 0.75, 0.92, 1.0]), frac=st.sampled_from([0.5, 0.9, 1.0]))
    def watermarks(self, high: float, frac: float) -> None:
        self.tree.set_watermarks(high, high * frac)

    @precondition(lambda self: not self.running and not self.pinned)
    @rule()
    def reset(self) -> None:
        self.tree.reset()
        assert len(self.tree) == 0 and self.tree.alloc.free_count == self.NUM_BLOCKS
        self.inserted = []
        self.lossless = True

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def tree_checks(self) -> None:
        self.tree.check()

    @invariant()
    def mirror_in_sync(self) -> None:
        self.seq_no += 1
        batch = ev.Batch(self.seq_no, 1, 0.0, "test", self.tree.take_events())
        self.mirror.apply_batch(ev.decode_batch(ev.encode_batch(batch)))
        assert self.mirror.digest() == self.tree.digest()
        a = self.tree.alloc
        assert self.mirror.ref == [a.refcount(b) for b in range(a.num_blocks)]
        assert len(self.mirror.nodes) == len(self.tree) + 1
        victims = [n.id for n, _ in next_victims(self.mirror, 6)]
        assert victims == [n.id for n in self.tree.lru_order(6)]

    @invariant()
    def cached_paths_are_inserted_prefixes_with_their_kv(self) -> None:
        for node in self.tree.snapshot().nodes[1:]:
            tokens, table = path_of(self.tree.node(node.node), self.BLOCK)
            assert any(s[: len(tokens)] == tokens for s in self.inserted), tokens
            assert read_kv(self.pool, table, len(tokens))[0] == tokens

    @invariant()
    def running_requests_read_their_own_tokens(self) -> None:
        for r in self.running:
            assert read_kv(self.pool, r.lease.table, len(r.full)) == (r.full, r.full)

    @invariant()
    def pins_equal_holders(self) -> None:
        want: dict[int, int] = {}
        for m in [r.match for r in self.running] + self.pinned:
            n: RadixNode | None = m.node
            assert m.node.alive
            while n is not None:
                want[n.id] = want.get(n.id, 0) + 1
                n = n.parent
        got = {s.node: s.pins for s in self.tree.snapshot().nodes if s.pins}
        assert got == want


class SmallBlockMachine(TreeMachine):
    """Block size 4: many more split and copy points per token."""

    BLOCK = 4
    NUM_BLOCKS = 40
    MAX_PROMPT = 40
    MAX_GEN = 12


TestTreeMachine = TreeMachine.TestCase
TestSmallBlockMachine = SmallBlockMachine.TestCase
for _case in (TestTreeMachine, TestSmallBlockMachine):
    _case.settings = settings(settings(), max_examples=STATE_MACHINE_RUNS, stateful_step_count=50)
del _case  # a TestCase alias left at module level would be collected a third time
