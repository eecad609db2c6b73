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

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from radixcache.analysis.figures import Misses, PolicyFigures, PoolFigures, WhatIfFigures
from radixcache.analysis.stackdist import Curve
from radixcache.analysis.whatif import WhatIf
from radixcache.traffic.traces import TraceFormat

FRACTIONS = ("0.5", "0.9", "0.99")
# K+V bytes per token at 16-bit: 2 x layers x kv_heads x head_dim x 2 bytes
MODEL_BYTES_PER_TOKEN = {
    "llama-3-8b": 2 * 32 * 8 * 128 * 2,
    "llama-3-70b": 2 * 80 * 8 * 128 * 2,
    "qwen2.5-7b": 2 * 28 * 4 * 128 * 2,
}


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1,
               "float8_e5m2": 1}


def config_bytes_per_token(folder: Path) -> int:
    """K+V bytes per token of a Hugging Face model folder's ``config.json``: 2 x layers x KV
    heads x head dim x dtype bytes (``ValueError`` naming what is missing)."""
    path = folder / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read a model config: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: not a model config (want a JSON object)")
    cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
    layers, heads = cfg.get("num_hidden_layers"), cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads", heads)
    dim = cfg.get("head_dim")
    if dim is None and isinstance(cfg.get("hidden_size"), int) and isinstance(heads, int):
        dim = cfg["hidden_size"] // max(heads, 1)
    dtype = DTYPE_BYTES.get(str(cfg.get("torch_dtype", "bfloat16")))
    for name, v in (("num_hidden_layers", layers), ("num_key_value_heads", kv),
                    ("head_dim", dim)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{path}: no positive integer {name}")
    if dtype is None:
        raise ValueError(f"{path}: torch_dtype {cfg.get('torch_dtype')!r} is not one of "
                         f"{', '.join(DTYPE_BYTES)}")
    assert isinstance(layers, int) and isinstance(kv, int) and isinstance(dim, int)
    return 2 * layers * kv * dim * dtype


def capacity_for(curve: Curve, fraction: float) -> int:
    """The smallest capacity (tokens) whose hits reach ``fraction`` of the maximum."""
    return curve.units_reaching(fraction * curve.max_hits - 1e-9) * curve.block_tokens


def knee_tokens(curve: Curve, points: int = 512) -> int:
    """The knee: where the curve, hit rate against log capacity, bends from its steepest rise
    to flat (0 for a curve with no hits).

    Kneedle (Satopaa et al., 2011) takes the point farthest above the chord, which only
    works on a concave curve: a curve flat up to a large capacity, or S-shaped, lies below its
    chord from one block, and the farthest point is then the first block. So the chord here
    starts at the curve's steepest point (the largest slope over 1/32 of the log range) and
    ends at saturation: from there every curve is concave, and the knee is its upper bend.
    On a concave curve the steepest point is the first, and this is plain Kneedle."""
    top = curve.saturation_units
    if top < 2 or curve.max_hits == 0:
        return top * curve.block_tokens
    units = np.unique(np.geomspace(1, top, points).round().astype(np.int64))
    x = np.log(units) / np.log(top)
    y = curve.hits(units) / curve.max_hits
    steep = _steepest(x, y)
    xs, ys = x[steep:], y[steep:]
    if len(xs) < 3 or xs[-1] <= xs[0]:
        return int(units[-1]) * curve.block_tokens
    chord = ys[0] + (xs - xs[0]) * (ys[-1] - ys[0]) / (xs[-1] - xs[0])
    return int(units[steep + int(np.argmax(ys - chord))]) * curve.block_tokens


def _steepest(x: np.ndarray, y: np.ndarray, w: float = 1 / 32) -> int:
    """Index of the steepest point: the largest slope over a window of ``w`` of ``x``'s range
    centred on it (cut at the ends, and at least one step wide)."""
    i = np.arange(len(x))
    lo = np.searchsorted(x, x - w / 2, side="left")
    hi = np.maximum(np.searchsorted(x, x + w / 2, side="right") - 1, np.minimum(i + 1, len(x) - 1))
    lo = np.minimum(lo, np.maximum(hi - 1, 0))
    width = np.maximum(x[hi] - x[lo], 1e-12)
    return int(np.argmax((y[hi] - y[lo]) / width))


def grid_tokens(curve: Curve, at: Sequence[int], points: int = 96) -> list[int]:
    """Capacities (tokens, ascending) for the table and JSON: whole blocks log-spaced up to
    1.25x saturation, the last exact capacity of a joined curve, plus every capacity in
    ``at`` exactly as given."""
    top = max(2, int(curve.saturation_units * 1.25))
    units = set(np.geomspace(1, top, points).round().astype(np.int64).tolist())
    units.add(0)
    if curve.exact_cum is not None and curve.exact_units <= top:
        units.add(curve.exact_units)
    b = curve.block_tokens
    return sorted({int(u) * b for u in units} | set(at))  # ``at`` as given: C holds C // b


def misses(w: WhatIf, caps_tokens: Sequence[int]) -> Misses:
    """The miss classes at each capacity (tokens), as in the module docstring. Without the
    block-1 curve (``--alignment``) a token source's alignment misses are not told apart:
    ``compulsory`` then holds them too, and ``alignment`` is absent."""
    c = w.curve
    units = np.asarray(caps_tokens, dtype=np.int64) // c.block_tokens
    hits = c.hits(units)
    n = len(caps_tokens)
    known = w.token_curve is not None or w.format is TraceFormat.MOONCAKE
    seen = w.token_curve.max_hits if w.token_curve is not None else c.max_hits
    return Misses([c.prompt_tokens - seen] * n, [int(c.max_hits - h) for h in hits],
                  [seen - c.max_hits] * n if known else None)


def summary(
    w: WhatIf, at: Sequence[int], pool_blocks: int | None, bytes_per_token: int | None,
    price_per_gib: float | None = None,
) -> WhatIfFigures:
    """The figures ``--json`` prints (its keys are a stable contract; see docs/whatif.md)."""
    c = w.curve
    caps = grid_tokens(c, at)
    hits = c.hits(np.asarray(caps, dtype=np.int64) // c.block_tokens)
    p = max(c.prompt_tokens, 1)
    policies = {
        pt.policy.value: PolicyFigures(
            [u * c.block_tokens for u in pt.capacities_units], [h / p for h in pt.hits],
            [float(x) / p for x in c.hits(np.asarray(pt.capacities_units, np.int64))])
        for pt in w.policies
    }
    fig = WhatIfFigures(
        w.source, w.format.value, c.requests, c.prompt_tokens, c.block_tokens, caps,
        [x // c.block_tokens for x in caps], [float(h) / p for h in hits], c.max_hits / p,
        {f: capacity_for(c, float(f)) for f in FRACTIONS}, knee_tokens(c), misses(w, caps),
        w.seconds, policies, w.notes)
    if w.token_curve is not None:
        tc = w.token_curve
        fig.hit_rate_block_size_1 = [float(h) / p for h in tc.hits(np.asarray(caps))]
    _exactness(fig, c)
    if bytes_per_token is not None:
        fig.capacities_bytes = [x * bytes_per_token for x in caps]
        fig.capacities_gib = [x * bytes_per_token / 2**30 for x in caps]
        if price_per_gib is not None:
            fig.cost = [g * price_per_gib for g in fig.capacities_gib]
    if pool_blocks is not None:
        fig.pool = pool_statement(c, pool_blocks, "option")
    elif w.pool_tokens is not None:
        fig.pool = pool_statement(c, w.pool_tokens // c.block_tokens, "recording")
    if c.unit_step != 1.0:  # below about 100 sampled blocks a sample cannot resolve the curve
        fig.sample_rate = 1 / c.unit_step
        fig.sample_resolves_from_tokens = round(100 * c.unit_step) * c.block_tokens
    return fig


def _exactness(fig: WhatIfFigures, c: Curve) -> None:
    """Which points of ``fig`` are exact, the bounds of the others, and whether the knee and
    the capacities for 50/90/99% rest on exact points."""
    units = np.asarray(fig.capacities_blocks, np.int64)
    p = max(c.prompt_tokens, 1)
    fig.exact = [bool(e) for e in c.exact(units)]
    fig.bound_points = [None if b < 0 else 100 * float(b) / p for b in c.bounds(units)]
    if c.exact_cum is not None:  # joined: exact below, the sample above
        fig.exact_up_to_tokens = c.exact_units * c.block_tokens
    b = c.block_tokens
    fig.knee_exact = fig.knee_tokens // b <= c.exact_units
    fig.capacity_for_exact = {f: t // b <= c.exact_units for f, t in fig.capacity_for.items()}


def pool_statement(c: Curve, pool_blocks: int, given_by: str) -> PoolFigures:
    """What a pool of ``pool_blocks`` blocks (of the curve's block size, so its tokens are in
    the source's unit) and twice it reach, as fractions of the maximum hit rate; ``given_by``
    says who knows that pool (``option``: --pool-blocks, ``recording``: its engine)."""
    top = max(c.max_hits, 1)
    at1, at2 = (float(h) / top for h in c.hits(np.asarray([pool_blocks, 2 * pool_blocks])))
    return PoolFigures(pool_blocks, pool_blocks * c.block_tokens, at1, at2, given_by,
                       2 * pool_blocks <= c.exact_units)
