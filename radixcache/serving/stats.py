"""The figures of a running cache: ``Totals`` (what a service counts as it goes) and ``Stats``
(one typed answer to ``stats``, the same fields for the engine and the tree driver).

``Stats`` is the only place these figures are named. The heartbeat's ``Counters`` event
(``Stats.counters``), the ``stats`` command's reply (``Stats.reply``, read back typed with
``Stats.of``) and ``/metrics``
(``serving.prometheus``) are all read from it, so the embedded and the served cache answer
with the same keys. Adding a figure: one field below (with a default when only one
implementation knows it) and where it is counted; every reply carries it.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from radixcache.core import events as ev
from radixcache.wire import commands as cmd

Figures = dict[str, float | int | str]


@dataclass(slots=True)
class Totals:
    """Running totals since start or the last reset (a service zeroes them on ``reset``)."""

    submitted: int = 0
    finished: int = 0
    rejected: int = 0
    cancelled: int = 0
    failed: int = 0  # by an exception inside a step (``RequestFailed``)
    steps: int = 0
    prompt_tokens: int = 0  # of admitted requests
    hit_tokens: int = 0  # served from the cache
    prefill_tokens: int = 0  # computed (the engine's model) or inserted (the driver)
    output_tokens: int = 0
    busy_s: float = 0.0  # wall time of steps that did work
    retractions: int = 0  # running requests retracted into the tree (``serving.reserve``)
    retracted_tokens: int = 0  # the computed tokens those retractions kept in the tree
    retracted_from_tree: int = 0  # of them, matched again when their request resumed
    retracted_recomputed: int = 0  # of them, computed again (evicted meanwhile)


class Stats(msgspec.Struct, frozen=True, kw_only=True):
    """A running cache's figures now. Counts are since start or since the ``generation``-th
    reset (0: never reset); ``waiting``, ``running``, ``paused`` and the pool figures are
    gauges. Tree figures (``splits`` ...) count the same way."""

    generation: int
    submitted: int
    finished: int
    rejected: int
    cancelled: int
    waiting: int
    running: int
    paused: bool
    steps: int
    prompt_tokens: int
    hit_tokens: int
    prefill_tokens: int
    output_tokens: int
    busy_s: float
    nodes: int
    used_blocks: int
    num_blocks: int
    splits: int
    merges: int
    cow_copies: int
    evicted_nodes: int
    evicted_tokens: int
    cache: str  # "on", or "off" (the engine computes every prompt from scratch)
    model: str
    device: str
    # the scheduler's (``serving.scheduler``); the tree driver serves in arrival order
    schedule: str = "fcfs"  # the policy: fcfs, lpm, dfs-weight
    held_for_sharing: int = 0  # requests held for a running request's insert, so far
    shared_in_forward: int = 0  # requests admitted beside the request whose blocks they read
    aged: int = 0  # requests that waited the aging bound, so far
    waiting_order: int = 0  # the waiting requests now, by why they wait
    waiting_sharing: int = 0
    waiting_pool: int = 0
    waiting_batch: int = 0
    waiting_paused: int = 0
    failed: int = 0  # requests an exception inside a step failed (the engine stepped on)
    kv_bytes_per_block: int = 0  # K and V of one block, every layer (the model's shape x dtype)
    kv_bytes_per_token: int = 0  # the same for one token slot
    # a checkpoint's folder (resolved path): its tokenizer.json is the text of the ids; empty
    # for the seeded model and the tree driver (the workloads' own word ids)
    model_dir: str = ""
    reserve: str = "grow"  # how running requests hold blocks: full, grow (``serving.reserve``)
    retractions: int = 0  # running requests retracted into the tree when a step found no block
    retracted_tokens: int = 0  # computed tokens those retractions put in the tree
    retracted_from_tree: int = 0  # of them, matched again when the request resumed
    retracted_recomputed: int = 0  # of them, computed again (evicted before it resumed)

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / prompt_tokens`` (0 when none)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """``output_tokens / busy_s`` (0 when idle)."""
        return self.output_tokens / self.busy_s if self.busy_s else 0.0

    def reply(self) -> cmd.StatsReply:
        """The ``stats`` command's reply of these figures (the loop and the command socket
        add theirs): every field, by name, in a msgpack map."""
        return cmd.StatsReply(msgspec.Raw(_ENCODER.encode(self)))

    @classmethod
    def of(cls, reply: cmd.AnyReply) -> Stats:
        """The figures the answer to ``stats`` carries (a newer engine's extra fields are
        skipped, a field an older one lacks takes its default); ``CommandError`` when
        ``reply`` is no ``StatsReply`` (``commands.stats_reply``) or its figures no ``Stats``."""
        try:
            return _DECODER.decode(cmd.stats_reply(reply).stats)
        except msgspec.DecodeError as exc:  # (ValidationError is one)
            raise cmd.CommandError(f"not a stats reply: {exc}") from None

    def counters(self) -> ev.Counters:
        """The heartbeat's ``Counters`` event of these figures."""
        return ev.Counters(self.generation, self.submitted, self.finished, self.rejected,
                           self.prompt_tokens, self.hit_tokens, self.evicted_nodes,
                           self.evicted_tokens, self.cow_copies, self.waiting, self.running,
                           self.paused, self.schedule)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Stats)
