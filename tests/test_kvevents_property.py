"""Property: any interleaving of live batches (lost, duplicated), slow, partial and abandoned
replay answers ends with the publisher's block set whenever its history is recoverable, and
reports the loss whenever it is not (issue 16)."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.wire.kvevents import KVStream, Sync
from tests.helpers.kvevents import sglang_batches

_END = -1


class SimPublisher:
    """The publisher's side: a ring of the last ``ring`` batches and a FIFO of replay asks,
    each answered frame by frame from the ring as it is when the answer starts."""

    def __init__(self, payloads: list[bytes], ring: int) -> None:
        self.payloads = payloads
        self.ring: deque[int] = deque(maxlen=ring)
        self.next = 0
        self.asked: deque[int] = deque()
        self.answer: deque[int] | None = None

    def publish(self) -> int | None:
        if self.next == len(self.payloads):
            return None
        self.ring.append(self.next)
        self.next += 1
        return self.next - 1

    def request(self, start: int) -> None:
        self.asked.append(start)

    def reset(self) -> None:
        self.asked.clear()  # a new connection: what was asked on the old one is never answered
        self.answer = None

    def reply_one(self, stream: KVStream, now: float) -> bool:
        if self.answer is None:
            if not self.asked:
                return False
            start = self.asked.popleft()
            self.answer = deque([s for s in self.ring if s >= start] + [_END])
        seq = self.answer.popleft()
        if not self.answer:
            self.answer = None
        if seq == _END:
            stream.merger.replay_end(now)
        else:
            stream.merger.replayed(seq, self.payloads[seq], now)
        return True


STEP = st.tuples(st.sampled_from(["live", "drop", "dup", "reply", "reply", "tick"]),
                 st.sampled_from([0.2, 1.1, 3.5]))


@settings(max_examples=120)
@given(n=st.integers(2, 24), page=st.sampled_from([1, 16]), seed=st.integers(0, 99),
       ring=st.sampled_from([3, 8, 1000]), steps=st.lists(STEP, max_size=80))
def test_random_interleavings_end_exact_or_report_the_loss(n, page, seed, ring, steps):
    payloads, held = sglang_batches(n, page, seed, capacity=30)
    pub = SimPublisher(payloads, ring)
    now = [0.0]
    stream = KVStream(pub, clock=lambda: now[0])
    for op, dt in steps:
        if op == "reply":
            pub.reply_one(stream, now[0])
        elif op == "tick":
            now[0] += dt
            stream.merger.tick(now[0])
        elif (seq := pub.publish()) is not None and op != "drop":
            for _ in range(2 if op == "dup" else 1):
                stream.merger.live(seq, payloads[seq], now[0])
    while (seq := pub.publish()) is not None:
        stream.merger.live(seq, payloads[seq], now[0])
    for _ in range(40):  # quiet: replays are answered, idle probes find a lost tail
        while pub.reply_one(stream, now[0]):
            pass
        now[0] += 1.1
        stream.merger.tick(now[0])
    health = stream.health()
    if ring >= n:  # the publisher never forgot anything: the history is recoverable
        assert stream.merger.stats.lost == 0
    if stream.merger.stats.lost == 0:
        assert stream.view.keys() == held
        assert health.sync is Sync.COMPLETE
        assert stream.last_seq == n - 1
    else:
        assert health.sync is Sync.INCOMPLETE
        assert health.since_seq is not None and health.since_seq <= stream.last_seq
