"""``radixcache bench model``: a checkpoint on the radix cache against transformers' ``generate``.

A random checkpoint with SmolLM2-135M's shapes (30 layers, hidden 576, 9 heads over 3 KV heads,
intermediate 1,536, vocabulary 49,152; the config written locally, nothing downloaded) serves
the multi-turn chat workload twice on each side, on the same prompts and answer lengths::

    batch 1, one request at a time      engine: cache on (turn t+1 reuses turn t)
                                        transformers: generate, its own KV cache per request
    the whole workload                  engine: continuous batching, every request queued
                                        transformers: generate in left-padded batches of 16

The batch-1 requests alternate between the two sides, request by request. Figures per turn:
TTFT p50/p99, prefill tokens/s (prompt tokens computed / TTFT) and decode
tokens/s at batch 1; requests/s on the whole workload. The workload's ids fold into the
vocabulary (``id % vocab``, which keeps every prompt a prefix of the next turn's) and answers
are cut to ``max_tokens``; the next turn's prompt holds the answer as served, cut, then the
new user text, as a client sends it (``chat_workload``). Transformers generates exactly as
many tokens (``min_new_tokens``, no end of sequence).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt
import torch

from radixcache.serving.checkpoint import Checkpoint
from radixcache.serving.engine import Engine, EngineConfig, RequestResult, percentiles
from radixcache.traffic.workload_types import WorkloadRequest
from radixcache.traffic.workloads import Workload, build_workload

SMOLLM2_135M: dict[str, Any] = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True)
Progress = Callable[[str, int, int], None]  # (phase, done, total)


class Timing(NamedTuple):
    """One request at batch 1."""

    turn: int
    prompt_tokens: int
    computed_tokens: int  # prompt tokens the prefill computed (not served from a cache)
    ttft_ms: float
    decode_tokens_per_s: float


def write_checkpoint(folder: Path, layers: int = 30) -> None:
    """A random Llama checkpoint with SmolLM2-135M's shapes (``layers`` of them), saved by
    transformers in ``folder``."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(**{**SMOLLM2_135M, "num_hidden_layers": layers})
    tf.LlamaForCausalLM(cfg).save_pretrained(folder)


HISTORIES = ("served", "trace")


def chat_workload(conversations: int, max_tokens: int, vocab: int,
                  history: str = "served") -> Workload:
    """The chat workload folded into ``vocab``, answers cut to ``max_tokens``, and each later
    turn's prompt rebuilt as a client sends it: the conversation so far as it was served (the
    previous prompt and the answer cut to its length) and then the turn's new user text.

    The trace's turn ``t+1`` is its turn ``t``'s prompt, the *whole* recorded answer and the
    new text; kept as it is, the next prompt would hold the part of the answer past
    ``max_tokens`` that nobody served (a client cannot send what it never received), and
    the cache would be charged for computing it. Both sides get the same rebuilt prompts.
    ``history="trace"`` keeps the trace's prompts as they are (the whole recorded answers)."""
    if history not in HISTORIES:
        raise ValueError(f"history {history!r}: one of {', '.join(HISTORIES)}")
    w = build_workload("chat", [str(conversations)])
    reqs = []
    served: dict[str, tuple[int, npt.NDArray[np.int64]]] = {}  # conversation: trace, served
    for r in w.requests:
        conv = r.tag.rsplit(" ", 1)[0]
        forced = None if r.forced_output is None else r.forced_output[:max_tokens]
        n = min(r.max_new_tokens, max_tokens) if forced is None else len(forced)
        prompt = r.prompt.astype(np.int64)
        if conv in served and history == "served":  # the trace's history: a prefix of it
            trace_len, so_far = served[conv]
            prompt = np.concatenate([so_far, prompt[trace_len:]])
        if forced is not None and r.forced_output is not None:
            full = np.concatenate([r.prompt, r.forced_output]).astype(np.int64)
            served[conv] = (full.size, np.concatenate([prompt, forced.astype(np.int64)]))
        reqs.append(r._replace(prompt=(prompt % vocab).astype(r.prompt.dtype),
                               forced_output=None if forced is None else forced % vocab,
                               max_new_tokens=n))
    return replace(w, requests=reqs)


def _turn(tag: str) -> int:
    """The turn of a chat request's tag (``chat c5 t2`` -> 2)."""
    last = tag.rsplit(" ", 1)[-1]
    return int(last[1:]) if last.startswith("t") and last[1:].isdigit() else 0


def _engine_one(engine: Engine, r: WorkloadRequest) -> Timing:
    """One request alone on ``engine`` (its cache kept across requests)."""
    h = engine.submit(r.prompt, r.max_new_tokens, r.forced_output)
    while not h.done():
        engine.step()
    m = h.result(0).metrics
    return Timing(_turn(r.tag), m.prompt_tokens, m.prefill_tokens, m.ttft_ms,
                  m.decode_tokens_per_s)


def engine_all(w: Workload, cfg: EngineConfig) -> float:
    """Seconds to serve the whole workload, every request queued (continuous batching)."""
    engine = Engine(cfg)
    t0 = time.perf_counter()
    run = engine.run_workload(w)
    while not all(h.done() for h in run.handles):
        engine.step()
    wall = time.perf_counter() - t0
    failed = [r for r in run.wait(0) if not isinstance(r, RequestResult)]
    engine.close()
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed: {failed[0]}")
    return wall


class _Stamps:
    """A logits processor that only notes when each step's logits arrive."""

    def __init__(self) -> None:
        self.at: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.at.append(time.perf_counter())
        return scores


def _generate(hf: Any, ids: torch.Tensor, n: int, mask: torch.Tensor | None = None,
              stamps: _Stamps | None = None) -> None:
    import transformers as tf

    procs = tf.LogitsProcessorList([stamps] if stamps is not None else [])
    with torch.inference_mode():
        hf.generate(ids, attention_mask=mask if mask is not None else torch.ones_like(ids),
                    max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                    pad_token_id=0, logits_processor=procs)


def _hf_one(hf: Any, r: WorkloadRequest) -> Timing:
    """One request alone through ``generate`` (its own KV cache, nothing reused)."""
    ids = torch.from_numpy(r.prompt.astype(np.int64))[None]
    stamps = _Stamps()
    t0 = time.perf_counter()
    _generate(hf, ids, r.max_new_tokens, stamps=stamps)
    first, last = stamps.at[0], stamps.at[-1]
    rate = (len(stamps.at) - 1) / (last - first) if last > first else 0.0
    return Timing(_turn(r.tag), len(r.prompt), len(r.prompt), (first - t0) * 1e3, rate)


def batch1(hf: Any, w: Workload, cfg: EngineConfig,
           progress: Progress) -> tuple[list[Timing], list[Timing]]:
    """Every request at batch 1 on both sides, alternated request by request (so a machine
    that gets busier or quieter weighs on both alike): (engine's, transformers')."""
    engine = Engine(cfg)
    ours, theirs = [], []
    for i, r in enumerate(w.requests):
        ours.append(_engine_one(engine, r))
        theirs.append(_hf_one(hf, r))
        progress("batch 1, alternated", i + 1, len(w.requests))
    engine.close()
    return ours, theirs


def hf_padded(hf: Any, w: Workload, batch: int, progress: Progress) -> float:
    """Seconds for ``generate`` over the workload in left-padded batches of ``batch``."""
    reqs = w.requests
    t0 = time.perf_counter()
    for start in range(0, len(reqs), batch):
        group = reqs[start:start + batch]
        width = max(len(r.prompt) for r in group)
        ids = torch.zeros((len(group), width), dtype=torch.int64)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(group):
            ids[j, width - len(r.prompt):] = torch.from_numpy(r.prompt.astype(np.int64))
            mask[j, width - len(r.prompt):] = 1
        _generate(hf, ids, max(r.max_new_tokens for r in group), mask)
        progress("transformers, padded batches", start + len(group), len(reqs))
    return time.perf_counter() - t0


class TurnFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One side's figures over the requests of one turn class (``1``: first turns, ``2+``:
    the later ones, whose prompts the cache holds in part)."""

    requests: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float


class ModelReport(msgspec.Struct, frozen=True, kw_only=True):
    """The benchmark's report: its ``--json`` keys (stable) are these names."""

    model: str
    layers: int
    requests: int
    conversations: int
    max_tokens: int
    history: str  # later turns' prompts: "served" (the answers as cut) or "trace" (whole)
    threads: int
    engine: dict[str, TurnFigures]  # by turn class
    transformers: dict[str, TurnFigures]
    engine_requests_per_s: float
    transformers_padded16_requests_per_s: float


def _per_turn(rows: list[Timing]) -> dict[str, TurnFigures]:
    turns: dict[str, TurnFigures] = {}
    for label, later in (("1", False), ("2+", True)):
        sel = [t for t in rows if (t.turn >= 1) == later]
        if not sel:
            continue
        p50, p99 = percentiles([t.ttft_ms for t in sel])
        ttft_s = sum(t.ttft_ms for t in sel) / 1e3
        turns[label] = TurnFigures(
            requests=len(sel), ttft_p50_ms=round(p50, 2), ttft_p99_ms=round(p99, 2),
            prefill_tokens_per_s=round(sum(t.computed_tokens for t in sel) / ttft_s, 1),
            decode_tokens_per_s=round(float(np.median([t.decode_tokens_per_s
                                                       for t in sel])), 1))
    return turns


def run_bench(folder: Path, conversations: int, max_tokens: int, progress: Progress,
              blocks: int = 1024, history: str = "served") -> ModelReport:
    """Both sides on ``folder``'s checkpoint (``write_checkpoint``); the report's keys are
    stable (``--json``)."""
    import transformers as tf

    hf = tf.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    cfg = EngineConfig(num_blocks=blocks, device="cpu", record_events=False,
                       checkpoint=Checkpoint(str(folder), "float32"))
    w = chat_workload(conversations, max_tokens, hf.config.vocab_size, history)
    ours, theirs = batch1(hf, w, cfg, progress)
    progress("engine, whole workload", 0, 1)
    ours_all = engine_all(w, cfg)
    progress("engine, whole workload", 1, 1)
    theirs_all = hf_padded(hf, w, 16, progress)
    n = len(w.requests)
    return ModelReport(
        model="random SmolLM2-135M shapes", layers=hf.config.num_hidden_layers,
        requests=n, conversations=conversations, max_tokens=max_tokens, history=history,
        threads=torch.get_num_threads(),
        engine=_per_turn(ours), transformers=_per_turn(theirs),
        engine_requests_per_s=round(n / ours_all, 3),
        transformers_padded16_requests_per_s=round(n / theirs_all, 3),
    )
