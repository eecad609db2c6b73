"""The answers on top of a curve: the maximum, the capacity for 50/90/99% of it, the knee,
the pool statement, and why requests miss at each capacity.

Miss classes (they add up to the prompt tokens missed at each capacity C, tokens):

- compulsory: never seen before -- the misses left at block size 1 with infinite capacity;
- alignment: seen, but not as whole blocks of the curve's block size (diverged inside a
  block): block-1 hits at infinite capacity minus block-B hits at infinite capacity;
- capacity: seen and cacheable, but evicted at C: block-B hits at infinity minus at C.

A Mooncake-format trace has no tokens below its hash blocks: its alignment misses are 0 and
its compulsory misses include the partial-block ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixcache.analysis.stackdist import Curve
from radixcache.analysis.whatif import WhatIf

FRACTIONS = ("0.5", "0.9", "0.99")
# K+V bytes per token at 16-bit: 2 x layers x kv_heads x head_dim x 2 bytes
MODEL_BYTES_PER_TOKEN = {
    "llama-3-8b": 2 * 32 * 8 * 128 * 2,
    "llama-3-70b": 2 * 80 * 8 * 128 * 2,
    "qwen2.5-7b": 2 * 28 * 4 * 128 * 2,
}


def capacity_for(curve: Curve, fraction: float) -> int:
    """The smallest capacity (tokens) whose hits reach ``fraction`` of the maximum."""
    want = fraction * curve.max_hits
    return int(np.searchsorted(curve.cum, want - 1e-9, side="left")) * curve.block_tokens


def knee_tokens(curve: Curve) -> int:
    """The knee of hits against log capacity: the point farthest above the chord from one
    unit to saturation (Kneedle on the normalised curve); 0 for a curve with no hits."""
    top = curve.saturation_units
    if top < 2 or curve.max_hits == 0:
        return top * curve.block_tokens
    units = np.unique(np.geomspace(1, top, 512).round().astype(np.int64))
    x = np.log(units) / np.log(top)
    y = curve.hits(units) / curve.max_hits
    return int(units[int(np.argmax(y - x))]) * curve.block_tokens


def grid_tokens(curve: Curve, at: Sequence[int], points: int = 96) -> list[int]:
    """Capacities (tokens, ascending) for the table and JSON: whole blocks log-spaced up to
    1.25x saturation, plus every capacity in ``at`` exactly as given."""
    top = max(2, int(curve.saturation_units * 1.25))
    units = set(np.geomspace(1, top, points).round().astype(np.int64).tolist())
    units.add(0)
    b = curve.block_tokens
    return sorted({int(u) * b for u in units} | set(at))  # ``at`` as given: C holds C // b


def misses(w: WhatIf, caps_tokens: Sequence[int]) -> dict[str, list[int]]:
    """The three miss classes at each capacity (tokens), as in the module docstring."""
    c = w.curve
    units = np.asarray(caps_tokens, dtype=np.int64) // c.block_tokens
    hits = c.hits(units)
    seen = w.token_curve.max_hits if w.token_curve is not None else c.max_hits
    compulsory = c.prompt_tokens - seen
    alignment = seen - c.max_hits
    n = len(caps_tokens)
    return {
        "compulsory": [compulsory] * n,
        "capacity": [int(c.max_hits - h) for h in hits],
        "alignment": [alignment] * n,
    }


def summary(
    w: WhatIf, at: Sequence[int], pool_blocks: int | None, bytes_per_token: int | None
) -> dict[str, object]:
    """The ``--json`` object (its keys are a stable contract; see docs/whatif.md)."""
    c = w.curve
    caps = grid_tokens(c, at)
    hits = c.hits(np.asarray(caps, dtype=np.int64) // c.block_tokens)
    p = max(c.prompt_tokens, 1)
    out: dict[str, object] = {
        "source": w.source,
        "format": w.format.value,
        "requests": c.requests,
        "prompt_tokens": c.prompt_tokens,
        "block_size": c.block_tokens,
        "capacities_tokens": caps,
        "capacities_blocks": [x // c.block_tokens for x in caps],
        "hit_rate": [float(h) / p for h in hits],
        "max_hit_rate": c.max_hits / p,
        "capacity_for": {f: capacity_for(c, float(f)) for f in FRACTIONS},
        "knee_tokens": knee_tokens(c),
        "misses": misses(w, caps),
        "seconds": w.seconds,
        "policies": {
            pt.policy.value: {
                "capacities_tokens": [u * c.block_tokens for u in pt.capacities_units],
                "hit_rate": [h / p for h in pt.hits],
                "lru_hit_rate": [
                    float(x) / p for x in c.hits(np.asarray(pt.capacities_units, np.int64))
                ],
            }
            for pt in w.policies
        },
        "notes": w.notes,
    }
    if w.token_curve is not None:
        tc = w.token_curve
        out["hit_rate_block_size_1"] = [float(h) / p for h in tc.hits(np.asarray(caps))]
    if bytes_per_token is not None:
        out["capacities_gib"] = [x * bytes_per_token / 2**30 for x in caps]
    if pool_blocks is not None:
        out["pool"] = pool_statement(c, pool_blocks)
    return out


def pool_statement(c: Curve, pool_blocks: int) -> dict[str, float | int]:
    """What a pool of ``pool_blocks`` blocks (of the curve's block size) and twice it reach,
    as fractions of the maximum hit rate."""
    top = max(c.max_hits, 1)
    at1, at2 = (float(h) / top for h in c.hits(np.asarray([pool_blocks, 2 * pool_blocks])))
    return {"blocks": pool_blocks, "of_max": at1, "of_max_2x": at2}
