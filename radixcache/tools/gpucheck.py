"""The GPU check behind ``radixcache doctor --gpu``: does reuse stay correct on the device, how
fast are boundary copies, and how much prefill do hits save. Finishes in well under 5 minutes
on one GPU; on a machine without CUDA ``cuda_unavailable()`` says why and nothing runs.

Three measurements:

1. reuse equality: the engine on ``cuda`` serves a full hit, a partial hit, a divergence inside
   a block (COW) and a next-turn continuation (in place) with the cache on and off; greedy
   tokens must be identical and logits within ``EQUAL_ATOL`` of the cache-off run and of the
   dense ``reference_logits`` recomputation.
2. COW bandwidth: ``KVPool.copy_slots_batch`` over many random (src, dst, slots) triples on a
   pool shaped like a mid-size model (32 layers, 8 KV heads, head dim 128, fp16), as useful
   bytes copied per second, against a plain large device-to-device tensor copy (read + write).
3. prefill speedup from hits: one forward of a 4,096-token prompt from scratch against the
   same forward with all but the last 256 tokens served from the pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from radixcache.core.pool import KVPool, KVShape
from radixcache.serving.engine import Engine, EngineConfig, RequestResult
from radixcache.serving.model import ModelConfig, SeqInput, TinyTransformer

EQUAL_ATOL = 1e-4
COW_SHAPE = KVShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype=torch.float16)
COW_PAIRS = 1024
Progress = Callable[[str], None]


class GpuReport(NamedTuple):
    """Every figure of the check; ``ok`` is True when reuse equality held."""

    device: str
    equality_requests: int
    equality_tokens_equal: bool
    equality_max_abs_diff: float
    cow_pairs: int
    cow_useful_gb_s: float  # slot bytes copied / s
    cow_moved_gb_s: float  # whole-block gather + where + scatter bytes / s
    copy_gb_s: float  # plain tensor copy, read + write bytes / s
    cow_fraction_of_copy: float  # cow_moved_gb_s / copy_gb_s
    prefill_full_ms: float
    prefill_hit_ms: float
    prefill_speedup: float

    @property
    def ok(self) -> bool:
        """Reuse equality held on the device."""
        return self.equality_tokens_equal and self.equality_max_abs_diff <= EQUAL_ATOL


def cuda_unavailable() -> str | None:
    """Why CUDA cannot be used here (a sentence), or None when a device is usable."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} was built without CUDA"
    try:
        if not torch.cuda.is_available():
            return f"no CUDA device visible (torch {torch.__version__}, CUDA {torch.version.cuda})"
        torch.zeros(1, device="cuda")  # initialises the context: a driver error shows here
    except (RuntimeError, AssertionError) as err:
        return f"CUDA initialisation failed: {err}"
    return None


def _sync() -> None:
    torch.cuda.synchronize()


def _timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``fn`` over ``repeat`` runs after one warm-up (device-synchronised)."""
    fn()
    _sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


# -- 1. reuse equality ---------------------------------------------------------------------------
def _serve(engine: Engine, prompt: list[int], max_new: int) -> RequestResult:
    h = engine.submit(prompt, max_new, keep_logits=True)
    while not h.done():
        engine.step()
    return h.result(0)


def _equality_prompts(rng: np.random.Generator) -> list[list[int]]:
    a = rng.integers(0, 100_000, 300).tolist()
    return [
        a,  # cold
        a,  # full hit (COW of the last block: the answer claims it)
        a[:256] + rng.integers(0, 100_000, 40).tolist(),  # partial hit on a block boundary
        a[:200] + rng.integers(0, 100_000, 33).tolist(),  # divergence inside a block (COW)
    ]


def check_equality(device: str = "cuda") -> tuple[int, bool, float]:
    """(requests, all tokens equal, max |logit difference|) over the reuse cases on ``device``."""
    cfg = EngineConfig(num_blocks=1024, device=device, record_events=False)
    on = Engine(cfg)
    off = Engine(EngineConfig(num_blocks=1024, device=device, record_events=False, cache=False))
    rng = np.random.default_rng(0)
    prompts = _equality_prompts(rng)
    first = _serve(on, prompts[0], 12)
    prompts.append(prompts[0] + first.tokens + rng.integers(0, 100_000, 20).tolist())  # in place
    equal, worst = True, 0.0
    for i, p in enumerate(prompts):
        r_on = first if i == 0 else _serve(on, p, 12)
        r_off = _serve(off, p, 12)
        assert r_on.logits is not None and r_off.logits is not None
        ref = on.model.reference_logits(p + r_on.tokens[:-1])[len(p) - 1 :].cpu()
        equal &= r_on.tokens == r_off.tokens == ref.argmax(-1).tolist()
        worst = max(worst, float((r_on.logits - r_off.logits).abs().max()),
                    float((r_on.logits - ref).abs().max()))
    on.tree.check()
    on.close()
    off.close()
    return len(prompts), equal, worst


# -- 2. COW bandwidth ------------------------------------------------------------------------------
def measure_cow(pairs: int = COW_PAIRS, num_blocks: int = 4096) -> tuple[float, float, float]:
    """(useful GB/s, moved GB/s, plain copy GB/s) of batched boundary copies on the GPU."""
    pool = KVPool(num_blocks, 16, COW_SHAPE, "cuda")
    rng = np.random.default_rng(1)
    perm = rng.permutation(num_blocks)
    src, dst = perm[:pairs].tolist(), perm[pairs : 2 * pairs].tolist()
    slots = rng.integers(1, 16, pairs).tolist()
    per_block = pool.bytes_per_block()
    per_slot = per_block // 16
    t = _timed(lambda: pool.copy_slots_batch(src, dst, slots), 5)
    useful = sum(slots) * per_slot / t / 1e9
    moved = 3 * pairs * per_block / t / 1e9  # read src and dst blocks, write dst blocks
    n = 2**30 // 2  # 1 GiB of fp16
    a = torch.empty(n, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    t_copy = _timed(lambda: b.copy_(a), 10)
    return useful, moved, 2 * n * 2 / t_copy / 1e9


# -- 3. prefill speedup ----------------------------------------------------------------------------
def measure_prefill(prompt_tokens: int = 4096, new_tokens: int = 256) -> tuple[float, float]:
    """(ms of a full prefill, ms of the same prompt with all but ``new_tokens`` cached)."""
    model = TinyTransformer(ModelConfig(), "cuda")
    blocks = -(-prompt_tokens // 16)
    pool = KVPool(blocks, 16, model.config.kv_shape(), model.device)
    table = list(range(blocks))
    prompt = np.random.default_rng(2).integers(0, 100_000, prompt_tokens)
    cut = prompt_tokens - new_tokens
    full = _timed(lambda: model.forward([SeqInput(prompt, 0, table)], pool.kv), 5)
    hit = _timed(lambda: model.forward([SeqInput(prompt[cut:], cut, table)], pool.kv), 5)
    return full * 1e3, hit * 1e3


def run_gpu_check(progress: Progress | None = None) -> GpuReport:
    """Run the three measurements on ``cuda`` (call only when ``cuda_unavailable()`` is None)."""
    say = progress or (lambda _: None)
    say("reuse equality on the GPU")
    n, equal, worst = check_equality()
    say("batched COW copy bandwidth")
    useful, moved, plain = measure_cow()
    torch.cuda.empty_cache()
    say("prefill speedup from hits")
    full_ms, hit_ms = measure_prefill()
    return GpuReport(
        torch.cuda.get_device_name(0), n, equal, worst, COW_PAIRS, useful, moved, plain,
        moved / plain if plain else 0.0, full_ms, hit_ms, full_ms / hit_ms if hit_ms else 0.0,
    )
