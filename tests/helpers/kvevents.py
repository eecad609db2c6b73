"""Fakes of a foreign KV-event publisher for the kvevents tests.

``sglang_batches`` plays an SGLang-like cache (signed int64 hashes, tagged maps with
``cache_salt``/``session_id``, a first ``AllBlocksCleared``, two tiers, one removal per evicted
node) and returns its payloads with the (hash, medium) set it holds at the end.
``FlakyPublisher`` serves such payloads on a real PUB socket and replay ROUTER on 127.0.0.1,
dropping chosen live batches and answering each replay after a delay.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable

import msgspec
import zmq

from radixcache.wire.endpoints import from_u64, u64
from radixcache.wire.kvevents import END_SEQ, TOPIC

Key = tuple[int, str]


def _stored(hashes: list[int], parent: int | None, page: int, medium: str) -> dict[str, object]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": [h & 0xFFFF for h in hashes for _ in range(page)], "block_size": page,
            "lora_id": None, "medium": medium, "cache_salt": None, "session_id": None}


def _removed(hashes: list[int], medium: str) -> dict[str, object]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


class _Tier:
    """The hashes one tier holds: O(1) add, remove and random choice, in a seeded order."""

    def __init__(self) -> None:
        self.items: list[int] = []
        self.where: dict[int, int] = {}

    def add(self, h: int) -> None:
        if h not in self.where:
            self.where[h] = len(self.items)
            self.items.append(h)

    def remove(self, h: int) -> None:
        i = self.where.pop(h)
        last = self.items.pop()
        if last != h:
            self.items[i] = last
            self.where[last] = i


def sglang_batches(n: int, page: int, seed: int = 0, capacity: int = 40, rank: int = 0,
                   ) -> tuple[list[bytes], set[Key]]:
    """``n`` payloads of an SGLang-like cache of about ``capacity`` blocks per tier and the
    (hash, medium) keys it holds after them."""
    rng = random.Random(seed)
    parent_of: dict[int, int | None] = {}
    tiers = {"GPU": _Tier(), "CPU_PINNED": _Tier()}
    payloads = [msgspec.msgpack.encode([0.0, [{"type": "AllBlocksCleared"}], rank])]
    for i in range(1, n):
        events: list[dict[str, object]] = []
        gpu = tiers["GPU"].items
        under = rng.choice(gpu) if gpu and rng.random() < 0.7 else None
        length = rng.randint(1, 6 if page > 1 else 40)  # page size 1: one block per token
        chain = [rng.randrange(-(2**63), 2**63) for _ in range(length)]
        for h, p in zip(chain, [under, *chain[:-1]], strict=True):
            parent_of[h] = p
        events.append(_stored(chain, under, page, "GPU"))
        if gpu and rng.random() < 0.3:  # back a GPU block up to host memory
            h = rng.choice(gpu)
            events.append(_stored([h], parent_of[h], page, "CPU_PINNED"))
            tiers["CPU_PINNED"].add(h)
        for h in chain:
            tiers["GPU"].add(h)
        for medium, tier in tiers.items():
            if len(tier.items) > capacity:  # evict one "node": a few blocks at once
                gone = rng.sample(tier.items, min(len(tier.items) - capacity, 40))
                events.append(_removed(gone, medium))
                for h in gone:
                    tier.remove(h)
        payloads.append(msgspec.msgpack.encode([float(i), events, rank]))
    return payloads, {(h, m) for m, tier in tiers.items() for h in tier.items}


class FlakyPublisher:
    """A PUB + replay ROUTER on 127.0.0.1 that loses live batches and answers replays slowly.

    ``publish_all`` sends every payload at ``interval_s`` (skipping those ``drop(seq)`` picks on
    the PUB socket; they stay in the ring); replay requests are answered ``replay_delay_s``
    after they arrive, from a ring of the last ``ring`` batches.
    """

    def __init__(self, *, ring: int = 100_000, replay_delay_s: float = 0.0,
                 drop: Callable[[int], bool] = lambda seq: False, topic: bytes = TOPIC) -> None:
        self.topic = topic
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.pub = ctx.socket(zmq.XPUB)  # XPUB: it sees a subscriber arrive
        self.pub.setsockopt(zmq.LINGER, 0)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.endpoints = (f"tcp://127.0.0.1:{self.pub.bind_to_random_port('tcp://127.0.0.1')}",
                          f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}")
        self.ring: deque[tuple[int, bytes]] = deque(maxlen=ring)
        self.replay_delay_s = replay_delay_s
        self.drop = drop
        self.requests: list[int] = []
        self._due: deque[tuple[float, bytes, int]] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._todo: deque[bytes] = deque()
        self.interval_s = 0.0
        self._waiting_for = 0
        self.seq = -1
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, payloads: list[bytes], interval_s: float, *,
              subscribers: int = 1) -> FlakyPublisher:
        """Publish ``payloads`` one per ``interval_s`` on the publisher's thread, once
        ``subscribers`` SUB sockets have subscribed (so no test depends on connect timing)."""
        self._todo.extend(payloads)
        self.interval_s = interval_s
        self._waiting_for = subscribers
        self._thread.start()
        return self

    def done(self) -> bool:
        """Every payload was published."""
        return not self._todo

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            while self.pub.poll(0):
                if self.pub.recv()[:1] == b"\x01":
                    self._waiting_for -= 1
            if self._todo and now >= next_at and self._waiting_for <= 0:
                self._publish(self._todo.popleft())
                next_at = now + self.interval_s
            if self.router.poll(2):
                ident, _, start = self.router.recv_multipart()
                self.requests.append(from_u64(start))
                self._due.append((now + self.replay_delay_s, ident, from_u64(start)))
            while self._due and self._due[0][0] <= now:
                _, ident, first = self._due.popleft()
                for seq, payload in list(self.ring):
                    if seq >= first:
                        self.router.send_multipart([ident, b"", self.topic, u64(seq), payload])
                self.router.send_multipart([ident, b"", b"", END_SEQ, b""])

    def _publish(self, payload: bytes) -> None:
        self.seq += 1
        self.ring.append((self.seq, payload))
        if not self.drop(self.seq):
            self.pub.send_multipart([self.topic, u64(self.seq), payload])

    def close(self) -> None:
        """Stop the thread, close the sockets."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.pub.close(linger=0)
        self.router.close(linger=0)
