"""Why a request missed (``radixcache.analysis.misses``), followed from real streams: a tree
driver's and a model engine's events through a mirror, as the inspector follows them."""

from __future__ import annotations

import numpy as np

from radixcache.analysis.follow import Follower
from radixcache.analysis.ghosts import Ghosts
from radixcache.analysis.misses import Cause, Span
from radixcache.core import events as ev
from radixcache.serving.driver import TreeDriver
from radixcache.serving.engine import Engine, EngineConfig
from radixcache.serving.loop import BatchSink, LoopConfig, Sampling, ServiceLoop
from radixcache.serving.model import ModelConfig
from radixcache.traffic.traces import path_tokens
from radixcache.traffic.workload_types import Vocabulary, Workload, WorkloadRequest
from radixcache.traffic.workloads import build_workload
from radixcache.wire import commands as cmd
from radixcache.wire.mirror import Mirror


class Followed:
    """A service in a loop whose batches go to a mirror with a ``Follower`` attached."""

    def __init__(self, service: TreeDriver | Engine) -> None:
        self.service = service
        self.mirror = Mirror()
        self.follower = Follower(self.mirror)
        self.batches: list[ev.Batch] = []
        self.mirror.load_snapshot(service.snapshot())
        self.loop = ServiceLoop(service, BatchSink(self._on_batch),
                                LoopConfig(digest_every=1, sampling=Sampling.EVERY_BATCH))

    def _on_batch(self, batch: ev.Batch) -> None:
        self.batches.append(batch)
        self.mirror.apply_batch(batch)  # every batch carries a Digest: the mirror is exact

    def serve(self, prompt: list[int], new: int = 1) -> int:
        """Serve one request to the end; returns its id (its RequestStart's)."""
        if isinstance(self.service, Engine):
            self.service.submit(prompt, new, [7] * new)
        else:
            req = WorkloadRequest(np.array(prompt, np.uint32), new,
                                  np.full(new, 7, np.uint32), "test", None)
            self.service.submit_workload(Workload("test", {}, [req], "test", Vocabulary()))
        start = len(self.batches)
        self.loop.run_until_idle()
        ids = [e.req for b in self.batches[start:] for e in b.events
               if isinstance(e, ev.RequestStart)]
        assert len(ids) == 1
        return ids[0]

    def evict_seqs(self, node: int) -> list[int]:
        """The batches whose events evicted (part of) ``node``, in order."""
        return [b.seq for b in self.batches for e in b.events
                if isinstance(e, ev.Evict) and e.node == node]


def test_a_first_request_was_never_seen_and_a_repeat_hits_whole():
    f = Followed(TreeDriver(64))
    a = f.serve(list(range(100, 140)))
    why = f.follower.misses.why(a)
    assert why is not None
    assert (why.prompt_tokens, why.hit_tokens, why.path) == (40, 0, [])
    assert why.spans == [Span(0, 40, Cause.NEVER_SEEN)]
    b = f.serve(list(range(100, 140)))
    why = f.follower.misses.why(b)
    assert why is not None and why.hit_tokens == 40 and why.spans == []
    assert [(s, e) for _, s, e in why.path] == [(0, 40)]  # one node, cut at the hit


def test_evicted_tokens_name_the_batch_that_evicted_them():
    f = Followed(TreeDriver(8))  # 128 tokens
    first = list(range(1000, 1064))
    a = f.serve(first)
    node = f.mirror.nodes[max(f.mirror.nodes)].id  # the one leaf
    for k in range(3):  # push it out
        f.serve(list(range(2000 + 100 * k, 2060 + 100 * k)))
    assert node not in f.mirror.nodes
    again = f.serve(first)
    why = f.follower.misses.why(again)
    assert why is not None and why.hit_tokens == 0
    # the leaf gave up its tail first (one block), then the rest: two spans, two batches
    tail, rest = f.evict_seqs(node)
    assert why.spans == [Span(0, 48, Cause.EVICTED, rest), Span(48, 64, Cause.EVICTED, tail)]
    assert f.follower.misses.why(a) is not None


def test_a_prompt_that_leaves_a_cached_sequence_inside_a_block():
    f = Followed(TreeDriver(64))
    f.serve(list(range(100, 150)))
    b = f.serve(list(range(100, 120)) + list(range(500, 530)))  # diverges at 20, in block 1
    why = f.follower.misses.why(b)
    assert why is not None and why.hit_tokens == 20
    assert why.spans == [Span(20, 32, Cause.DIVERGED), Span(32, 50, Cause.NEVER_SEEN)]
    assert why.path[-1][2] == 20  # the matched path ends where it diverged (a split node)


def test_part_evicted_part_new():
    f = Followed(TreeDriver(8))
    f.serve(list(range(1000, 1064)))
    leaf = max(f.mirror.nodes)
    for k in range(3):
        f.serve(list(range(2000 + 100 * k, 2060 + 100 * k)))
    c = f.serve(list(range(1000, 1032)) + list(range(3000, 3010)))
    why = f.follower.misses.why(c)
    assert why is not None and why.hit_tokens == 0
    assert why.spans == [Span(0, 32, Cause.EVICTED, f.evict_seqs(leaf)[-1]),
                         Span(32, 42, Cause.NEVER_SEEN)]


def test_the_engine_computes_the_last_prompt_token_always():
    engine = Engine(EngineConfig(num_blocks=32, model=ModelConfig(vocab_size=1000)))
    try:
        f = Followed(engine)
        f.serve(list(range(100, 140)), 2)
        b = f.serve(list(range(100, 140)), 2)
        why = f.follower.misses.why(b)
        assert why is not None and (why.prompt_tokens, why.hit_tokens) == (40, 39)
        assert why.spans == [Span(39, 40, Cause.LAST_TOKEN)]
    finally:
        engine.close()


def test_a_match_given_up_for_room_is_a_capacity_miss():
    engine = Engine(EngineConfig(num_blocks=8, model=ModelConfig(vocab_size=1000)))
    try:
        f = Followed(engine)
        first = list(range(100, 164))  # 64 tokens + 1 out: 4 blocks cached
        f.serve(first, 1)
        # 40 shared tokens (mid block 2: the match needs a copy of that block), then new ones:
        # 128 tokens in all need every block, so the engine drops the match and evicts
        second = first[:40] + list(range(600, 687))
        b = f.serve(second, 1)
        why = f.follower.misses.why(b)
        assert why is not None and (why.hit_tokens, why.dropped) == (0, 40)
        assert why.spans == [Span(0, 40, Cause.CAPACITY), Span(40, 48, Cause.DIVERGED),
                             Span(48, 127, Cause.NEVER_SEEN)]
    finally:
        engine.close()


def test_a_reset_evicts_everything_at_its_seq():
    f = Followed(TreeDriver(64))
    f.serve(list(range(100, 140)))
    f.loop.command(cmd.Reset())
    reset_seq = f.batches[-1].seq
    b = f.serve(list(range(100, 140)))
    why = f.follower.misses.why(b)
    assert why is not None and why.spans == [Span(0, 40, Cause.EVICTED, reset_seq)]
    assert why.spans[0].line(frozenset(f.follower.misses.resets)) == \
        f"tokens 0-40 (40): evicted at seq {reset_seq} (engine reset)"


def test_ghosts_keep_each_spans_history_exact():
    g = Ghosts()
    seq = np.arange(10, 50, dtype="<u4").tobytes()
    g.insert(seq, 0, 1, 1)
    g.evict(seq, 20 * 4, 5, 2)  # the tail [20, 40) went out at version 5
    held, others = g.along(seq)
    assert [(lo, hi) for lo, hi, _, _ in held] == [(0, 20), (20, 40)]
    assert others == []
    assert [n.state_at(3) for _, _, n, _ in held] == [(True, 1), (True, 1)]
    assert [n.state_at(6) for _, _, n, _ in held] == [(True, 1), (False, 2)]
    assert [n.held for _, _, n, _ in held] == [True, False]
    assert held[0][2].state_at(1) is None  # before it first appeared
    g.insert(seq, 20 * 4, 9, 4)  # back in
    held, _ = g.along(seq)
    assert held[1][2].state_at(10) == (True, 4)
    assert held[1][2].state_at(8) == (False, 2)
    other = np.concatenate([np.arange(10, 30), np.arange(90, 95)]).astype("<u4").tobytes()
    held, others = g.along(other)
    assert [(lo, hi) for lo, hi, _, _ in held] == [(0, 20)]  # it stops at a node boundary
    assert [o.key[:4] for o in others] == [np.uint32(30).astype("<u4").tobytes()]
    assert g.tokens == 40


def _prefixes(mirror: Mirror) -> set[bytes]:
    """Every token prefix the tree holds (brute force: one bytes object per prefix)."""
    out: set[bytes] = set()
    for n in mirror.nodes.values():
        if n.parent is not None and not n.children:
            path = path_tokens(n)
            out.update(path[: 4 * i] for i in range(1, len(path) // 4 + 1))
    return out


def test_every_span_agrees_with_a_brute_force_history_of_the_tree():
    """Mixed workloads on a small pool, one request a step: each finished request's spans
    are checked token by token against the sets of prefixes the tree held after every batch
    (held at the match: hit; held before and not at the match: evicted at the batch that
    dropped it; never held before: never seen, or diverged inside a block)."""
    f = Followed(TreeDriver(64, step_requests=1))
    held_after: list[set[bytes]] = [set()]
    left_at: dict[bytes, list[int]] = {}

    def on_batch(batch: ev.Batch) -> None:
        f._on_batch(batch)
        now = _prefixes(f.mirror)
        for gone in held_after[-1] - now:
            left_at.setdefault(gone, []).append(batch.seq)
        held_after.append(now)
        ever.update(now)
        ever_by_seq.append(set(ever))

    ever: set[bytes] = set()
    ever_by_seq: list[set[bytes]] = [set()]
    f.loop.sink.on_batch = on_batch  # type: ignore[attr-defined]
    checked = 0
    prompts: list[bytes] = []  # by request id: the driver serves in submission order
    for line in ("system 6 --seed 1", "chat 4 --seed 2", "tot 2 3 --seed 3", "fork 6 --seed 4",
                 "system 6 --seed 1", "flood 8 --seed 5", "chat 4 --seed 2"):
        name, *args = line.split()
        workload = build_workload(name, args)
        prompts += [r.prompt.astype("<u4").tobytes() for r in workload.requests]
        f.service.submit_workload(workload)
        f.loop.run_until_idle()
    rejected = {e.req for b in f.batches for e in b.events
                if isinstance(e, ev.RequestFinish) and e.output_tokens == 0}
    for batch in f.batches:
        starts = [e for e in batch.events if isinstance(e, ev.RequestStart)]
        for start in starts:
            why = f.follower.misses.why(start.req)
            assert why is not None and why.seq == batch.seq
            if start.req in rejected:  # nothing was inserted: the stream names no prompt
                assert why.spans is None
                continue
            assert why.spans is not None
            prompt = prompts[start.req]
            before_held = held_after[batch.seq - 1]
            before_ever = ever_by_seq[batch.seq - 1]
            assert sum(s.end - s.start for s in why.spans) == why.missed
            pos = why.hit_tokens
            for s in why.spans:
                assert s.start == pos
                pos = s.end
                for i in range(s.start, s.end):
                    key = prompt[: 4 * (i + 1)]
                    assert key not in before_held
                    if s.cause is Cause.EVICTED:
                        assert key in before_ever
                        assert s.seq == max(q for q in left_at[key] if q < batch.seq)
                    else:
                        assert s.cause in (Cause.NEVER_SEEN, Cause.DIVERGED)
                        assert key not in before_ever
            assert pos == why.prompt_tokens
            checked += 1
    causes = {s.cause for w in f.follower.misses.all() for s in w.spans or ()}
    assert checked + len(rejected) == len(f.follower.misses.whys)
    assert checked > 40
    assert {Cause.EVICTED, Cause.NEVER_SEEN, Cause.DIVERGED} <= causes


def test_a_follower_that_fails_detaches_and_the_mirror_follows_on():
    f = Followed(TreeDriver(64))
    f.serve(list(range(100, 140)))
    follower = f.follower

    class BrokenGhosts(Ghosts):  # the history breaks at the next insert it records
        def insert(self, seq: bytes, lo: int, version: int, seq_no: int) -> None:
            raise RuntimeError("a bug in the analysis")

    follower.misses.ghosts = BrokenGhosts(follower.max_tokens)
    f.serve(list(range(100, 150)))  # the digests in every batch: the mirror stays exact
    assert follower.error is not None
    assert follower.error.startswith("RuntimeError: a bug in the analysis (at seq ")
    assert not f.mirror.watching(follower.observe)
    f.serve(list(range(300, 320)))
    assert f.mirror.digest() == f.service.digest()


def test_a_request_beside_one_computing_its_prefix_missed_it_in_flight():
    """Two requests with one prompt, admitted in the same step: neither could read the other's
    tokens at its match. The first computed them itself (never seen); the second lost them to
    batching: the first inserted them while the second ran (in flight, at that batch)."""
    engine = Engine(EngineConfig(num_blocks=32, model=ModelConfig(vocab_size=1000)))
    try:
        f = Followed(engine)
        prompt = list(range(100, 140))
        engine.submit(prompt, 2, [7, 7])
        engine.submit(prompt, 2, [7, 7])
        f.loop.run_until_idle()
        starts = [e for b in f.batches for e in b.events if isinstance(e, ev.RequestStart)]
        assert [e.hit_tokens for e in starts] == [0, 0]
        first, second = (f.follower.misses.why(e.req) for e in starts)
        assert first is not None and second is not None
        insert_seq = next(b.seq for b in f.batches for e in b.events
                          if isinstance(e, ev.NodeCreated))
        assert first.spans == [Span(0, 40, Cause.NEVER_SEEN)]
        assert second.spans == [Span(0, 40, Cause.IN_FLIGHT, insert_seq)]
        assert second.spans[0].line() == ("tokens 0-40 (40): in flight: another running "
                                          f"request was computing them (inserted at seq "
                                          f"{insert_seq})")
    finally:
        engine.close()


def test_a_snapshot_forward_keeps_the_history_and_one_back_starts_it_again():
    """A keyframe or resync at the current seq (or later) changes nothing the history knew:
    an eviction before it is still named. A snapshot of an earlier seq (a replay seeking
    back) starts the history again: what it does not hold was never seen."""
    f = Followed(TreeDriver(8))
    first = list(range(1000, 1064))
    f.serve(first)
    node = max(f.mirror.nodes)
    for k in range(3):
        f.serve(list(range(2000 + 100 * k, 2060 + 100 * k)))
    tail, rest = f.evict_seqs(node)  # the tail first, then the rest
    now = f.batches[-1].seq
    f.mirror.load_snapshot(f.service.snapshot(), now)  # forward: the same stream goes on
    again = f.serve(first)
    why = f.follower.misses.why(again)
    assert why is not None
    assert why.spans == [Span(0, 48, Cause.EVICTED, rest), Span(48, 64, Cause.EVICTED, tail)]
    assert f.follower.misses.since == 0
    f.mirror.load_snapshot(f.service.snapshot(), 1)  # back: a seek to seq 1
    assert f.follower.misses.since == 1
    assert 1000 in [int(np.frombuffer(n.tokens[:4], "<u4")[0]) for n in f.mirror.nodes.values()
                    if n.parent is not None]  # the reload holds `first`, not the 2000s
    forgot = f.serve(list(range(2000, 2060)))  # evicted before the reload: history is gone
    why = f.follower.misses.why(forgot)
    assert why is not None and why.spans == [Span(0, 60, Cause.NEVER_SEEN)]


def test_describe_lists_forty_spans_then_says_how_many_more():
    from radixcache.analysis.misses import Line, MissHistory, Why, describe

    history = MissHistory(Mirror())
    spans = [Span(i, i + 1, Cause.EVICTED if i % 2 else Cause.NEVER_SEEN, 7) for i in range(50)]
    history.whys[5] = Why(5, 3, 50, 0, [], spans=spans, finished=True)
    lines = describe(history, 5)
    assert lines[2:4] == [Line("  tokens 0-1 (1): never seen", Cause.NEVER_SEEN),
                          Line("  tokens 1-2 (1): evicted at seq 7", Cause.EVICTED)]
    assert len(lines) == 2 + 40 + 1
    assert lines[-1] == Line("  ... 10 more spans, tokens 40-50")


def test_the_follower_says_since_which_seq_it_followed():
    """A late join at seq 40: the curve and the history start there, not at 0."""
    driver = TreeDriver(64)
    mirror = Mirror()
    follower = Follower(mirror)
    mirror.load_snapshot(driver.snapshot(), 40)
    assert (follower.since, follower.misses.since) == (40, 40)
    mirror.apply_batch(ev.Batch(41, 1, 0.0, "test", [driver.watermark()]))
    mirror.load_snapshot(driver.snapshot(), 45)  # a resync forward: the same stretch goes on
    assert (follower.since, follower.misses.since) == (40, 40)
    mirror.load_snapshot(driver.snapshot(), 3)  # back (a new engine): start again
    assert (follower.since, follower.misses.since) == (3, 3)
